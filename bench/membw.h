/* STREAM-like memory bandwidth for benchmarks that report "% of copy
 * bandwidth" (header-only).
 *
 * duet_bench_membw_copy(threads, bytes): copies an array of `bytes` bytes
 * into another with `threads` threads (each thread first-touches and then
 * copies its own contiguous slice with memcpy, as STREAM's copy kernel
 * compiles to), 5 times, and returns the best rate in GB/s (1e9 bytes/s)
 * counting read + write bytes (2 x bytes per pass), as STREAM does.
 * Returns 0 when memory or threads are not available.  Use arrays far larger
 * than the last-level cache (STREAM's rule: 4x; 256 MiB here).
 *
 * A kernel that only reads (decode streaming weights) can exceed the copy
 * figure: "% of copy" is the convention of BENCHMARKS.md, not a ceiling. */
#ifndef DUET_BENCH_MEMBW_H
#define DUET_BENCH_MEMBW_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"

/* A barrier whose party count can shrink (when a thread fails to start). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int parties, waiting;
    unsigned phase;
} duet__membw_barrier_t;

static inline void duet__membw_barrier_release_if_full(duet__membw_barrier_t *b)
{
    if (b->waiting > 0 && b->waiting >= b->parties) {
        b->waiting = 0;
        b->phase++;
        pthread_cond_broadcast(&b->cv);
    }
}

static inline void duet__membw_barrier_wait(duet__membw_barrier_t *b)
{
    pthread_mutex_lock(&b->mu);
    unsigned phase = b->phase;
    b->waiting++;
    duet__membw_barrier_release_if_full(b);
    while (phase == b->phase)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

static inline void duet__membw_barrier_shrink(duet__membw_barrier_t *b, int parties)
{
    pthread_mutex_lock(&b->mu);
    b->parties = parties;
    duet__membw_barrier_release_if_full(b);
    pthread_mutex_unlock(&b->mu);
}

typedef struct {
    char *dst;
    const char *src;
    size_t len;
    duet__membw_barrier_t *barrier;
    int passes;
    double *times; /* [passes], written by thread 0 */
} duet__membw_slice_t;

static inline double duet__membw_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void *duet__membw_thread(void *argp)
{
    duet__membw_slice_t *s = argp;
    /* First touch by the thread that will copy the slice. */
    memset(s->dst, 0, s->len);
    memset((char *)s->src, 1, s->len);
    for (int p = 0; p < s->passes; p++) {
        double t0;
        duet__membw_barrier_wait(s->barrier);
        t0 = duet__membw_now();
        memcpy(s->dst, s->src, s->len);
        __asm__ volatile("" : : "r"(s->dst) : "memory");
        duet__membw_barrier_wait(s->barrier);
        if (s->times != NULL)
            s->times[p] = duet__membw_now() - t0;
    }
    return NULL;
}

static inline double duet_bench_membw_copy(int threads, size_t bytes)
{
    enum { PASSES = 5 };
    double times[PASSES], best = 0;
    duet__membw_slice_t *sl;
    pthread_t *tid;
    duet__membw_barrier_t barrier = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
    char *a, *b;
    int started = 0;

    if (threads < 1 || bytes < (size_t)threads * 4096)
        return 0;
    bytes &= ~(size_t)4095;
    a = duet_aligned_alloc(4096, bytes);
    b = duet_aligned_alloc(4096, bytes);
    sl = duet_calloc((size_t)threads, sizeof(*sl));
    tid = duet_calloc((size_t)threads, sizeof(*tid));
    if (a == NULL || b == NULL || sl == NULL || tid == NULL)
        goto out;
    barrier.parties = threads;
    for (int t = 0; t < threads; t++) {
        size_t lo = bytes / 4096 * t / threads * 4096, hi = bytes / 4096 * (t + 1) / threads * 4096;
        sl[t].dst = a + lo;
        sl[t].src = b + lo;
        sl[t].len = hi - lo;
        sl[t].barrier = &barrier;
        sl[t].passes = PASSES;
        sl[t].times = t == 0 ? times : NULL; /* thread 0 times the pass, between barriers */
    }
    for (; started < threads; started++) {
        if (pthread_create(&tid[started], NULL, duet__membw_thread, &sl[started]) != 0)
            break;
    }
    if (started < threads)
        duet__membw_barrier_shrink(&barrier, started);
    for (int t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    if (started < threads)
        goto out;
    for (int p = 1; p < PASSES; p++) { /* pass 0 warms up */
        double gbs = 2.0 * (double)bytes / times[p] / 1e9;
        if (gbs > best)
            best = gbs;
    }
out:
    duet_free(tid);
    duet_free(sl);
    duet_aligned_free(b);
    duet_aligned_free(a);
    return best;
}

#endif
