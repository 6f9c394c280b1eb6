/* A fork-join thread pool for one CPU rank.
 *
 * The rank thread is worker 0 and participates; n_threads - 1 helper threads
 * wait for work.  duet_cpu_pool_run() is called by one thread at a time (the
 * rank thread) and returns when every worker has finished fn.  Workers spin
 * briefly before sleeping (futex/condvar) unless spinning is disabled, which
 * the engine does when ranks x threads exceed the CPU count. */
#ifndef DUET_ENGINE_CPU_POOL_H
#define DUET_ENGINE_CPU_POOL_H

#include <stdbool.h>

#include "common/status.h"

typedef struct duet_cpu_pool duet_cpu_pool_t;

#define DUET_CPU_POOL_MAX_THREADS 256
/* Per-worker scratch memory (see duet_cpu_pool_scratch). */
#define DUET_CPU_POOL_SCRATCH_BYTES ((size_t)2 << 20)

/* fn(arg, ti, nt): ti in [0, nt) is this worker's index, nt the pool size. */
typedef void (*duet_cpu_pool_fn)(void *arg, int ti, int nt);

/* name is used for thread names ("r0w1"); spin: allow short spinning.
 * Fails with DUET_ERR_INVALID for n_threads outside [1, MAX_THREADS],
 * DUET_ERR_NO_MEMORY or DUET_ERR_EXHAUSTED (thread creation). */
duet_status_t duet_cpu_pool_create(int n_threads, bool spin, const char *name,
                                   duet_cpu_pool_t **pool_p);
void duet_cpu_pool_destroy(duet_cpu_pool_t *pool);
int duet_cpu_pool_size(const duet_cpu_pool_t *pool);
void duet_cpu_pool_run(duet_cpu_pool_t *pool, duet_cpu_pool_fn fn, void *arg);

/* Worker ti's scratch buffer: DUET_CPU_POOL_SCRATCH_BYTES, 64-byte aligned,
 * owned by the pool.  Only worker ti may use it, and only inside a
 * dispatched fn; contents do not survive from one dispatch to the next
 * (another kernel may use it in between). */
void *duet_cpu_pool_scratch(duet_cpu_pool_t *pool, int ti);

/* Split [0, n) into nt near-equal parts; part ti is [*begin_p, *end_p). */
static inline void duet_cpu_split(long n, int ti, int nt, long *begin_p, long *end_p)
{
    *begin_p = n * ti / nt;
    *end_p = n * (ti + 1) / nt;
}

#endif
