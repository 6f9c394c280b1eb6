/* Fork-join pool: a generation counter announces work, a pending counter
 * reports completion.  Both sides spin for a bounded time (when allowed) and
 * then sleep on a futex.  A sleeper count on each side means the waking side
 * only pays for a futex syscall when somebody actually sleeps; the increment
 * of the count and the re-check of the counter are seq_cst on both sides
 * (Dekker style), so a wake-up cannot be lost. */
#include "engine/cpu/pool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/sync.h"

/* How long a waiting thread spins before it sleeps.  A decode step issues
 * its dispatches a few microseconds apart; this covers those gaps without
 * burning a core for long when the rank goes idle. */
#define DUET__POOL_SPIN_NS (100 * 1000)
/* Pause iterations before the spinning thread starts to sched_yield() (every
 * 64 iterations): with more runnable threads than CPUs (other processes, or
 * ranks sharing cores) the thread being waited for may need our CPU. */
#define DUET__POOL_SPIN_BEFORE_YIELD 1024

typedef struct {
    duet_cpu_pool_t *pool;
    int index;
} duet__pool_worker_t;

struct duet_cpu_pool {
    int n_threads;
    bool spin;
    char name[12];
    duet_cpu_pool_fn fn; /* written by the caller before gen is bumped */
    void *arg;
    pthread_t *threads;           /* [n_threads - 1] */
    duet__pool_worker_t *workers; /* [n_threads - 1] */
    void **scratch;               /* [n_threads] */
    int started;                  /* helper threads created so far */

    _Alignas(64) atomic_uint gen; /* bumped once per dispatch (and at stop) */
    atomic_int gen_sleepers;      /* helpers sleeping (or about to) on gen */
    atomic_bool stop;

    _Alignas(64) atomic_int pending; /* helpers that have not finished fn */
    atomic_int pending_sleeping;     /* the caller sleeps on pending */
};

static void duet__futex_wait(void *addr, int expected)
{
    /* EAGAIN (value changed) and EINTR both just send the caller back to
     * re-check its condition. */
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void duet__futex_wake(void *addr, int count)
{
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

static inline void duet__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Pacing of a spin-wait, called after the i-th failed check: pauses, and
 * every 64 checks reads the clock; false once DUET__POOL_SPIN_NS passed
 * since the first check (*until starts at 0), then the caller sleeps. */
static inline bool duet__pool_spin_on(unsigned i, int64_t *until)
{
    if ((i & 63) == 0) {
        int64_t now = duet_now_ns();
        if (*until == 0)
            *until = now + DUET__POOL_SPIN_NS;
        else if (now >= *until)
            return false;
        /* Let a descheduled peer run when the CPUs are shared. */
        if (i >= DUET__POOL_SPIN_BEFORE_YIELD)
            sched_yield();
    }
    duet__cpu_relax();
    return true;
}

/* Returns the new generation once it differs from seen. */
static unsigned duet__pool_wait_gen(duet_cpu_pool_t *pool, unsigned seen)
{
    unsigned g;
    int64_t until = 0;
    for (unsigned i = 0; pool->spin; i++) {
        g = atomic_load_explicit(&pool->gen, memory_order_acquire);
        if (g != seen)
            return g;
        if (!duet__pool_spin_on(i, &until))
            break;
    }
    atomic_fetch_add(&pool->gen_sleepers, 1);
    while ((g = atomic_load(&pool->gen)) == seen)
        duet__futex_wait(&pool->gen, (int)seen);
    atomic_fetch_sub(&pool->gen_sleepers, 1);
    return g;
}

static void duet__pool_wait_done(duet_cpu_pool_t *pool)
{
    int p;
    int64_t until = 0;
    for (unsigned i = 0; pool->spin; i++) {
        if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0)
            return;
        if (!duet__pool_spin_on(i, &until))
            break;
    }
    atomic_store(&pool->pending_sleeping, 1);
    while ((p = atomic_load(&pool->pending)) != 0)
        duet__futex_wait(&pool->pending, p);
    atomic_store(&pool->pending_sleeping, 0);
}

static void *duet__pool_main(void *argp)
{
    duet__pool_worker_t *w = argp;
    duet_cpu_pool_t *pool = w->pool;
    unsigned seen = 0;

    duet_thread_set_name("%sw%d", pool->name, w->index);
    for (;;) {
        seen = duet__pool_wait_gen(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_acquire))
            break;
        pool->fn(pool->arg, w->index, pool->n_threads);
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->pending_sleeping))
            duet__futex_wake(&pool->pending, 1);
    }
    return NULL;
}

static void duet__pool_stop(duet_cpu_pool_t *pool)
{
    atomic_store(&pool->stop, true);
    atomic_fetch_add(&pool->gen, 1);
    duet__futex_wake(&pool->gen, INT_MAX);
    for (int i = 0; i < pool->started; i++)
        pthread_join(pool->threads[i], NULL);
    pool->started = 0;
}

static void duet__pool_free(duet_cpu_pool_t *pool)
{
    if (pool->scratch != NULL) {
        for (int i = 0; i < pool->n_threads; i++)
            duet_aligned_free(pool->scratch[i]);
    }
    duet_free(pool->scratch);
    duet_free(pool->workers);
    duet_free(pool->threads);
    duet_free(pool);
}

duet_status_t duet_cpu_pool_create(int n_threads, bool spin, const char *name,
                                   duet_cpu_pool_t **pool_p)
{
    duet_cpu_pool_t *pool;
    sigset_t all, old;
    int rc = 0;

    if (n_threads < 1 || n_threads > DUET_CPU_POOL_MAX_THREADS)
        return duet_error(DUET_ERR_INVALID, "cpu pool: threads %d out of range [1, %d]", n_threads,
                          DUET_CPU_POOL_MAX_THREADS);
    pool = DUET_NEW(duet_cpu_pool_t);
    if (pool == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu pool: out of memory");
    pool->n_threads = n_threads;
    pool->spin = spin;
    snprintf(pool->name, sizeof(pool->name), "%s", name != NULL ? name : "pool");
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->gen_sleepers, 0);
    atomic_init(&pool->stop, false);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->pending_sleeping, 0);

    pool->scratch = DUET_NEW_ARRAY(void *, (size_t)n_threads);
    if (pool->scratch == NULL)
        goto err_free;
    for (int i = 0; i < n_threads; i++) {
        pool->scratch[i] = duet_aligned_alloc(64, DUET_CPU_POOL_SCRATCH_BYTES);
        if (pool->scratch[i] == NULL)
            goto err_free;
    }
    if (n_threads > 1) {
        pool->threads = DUET_NEW_ARRAY(pthread_t, (size_t)n_threads - 1);
        pool->workers = DUET_NEW_ARRAY(duet__pool_worker_t, (size_t)n_threads - 1);
        if (pool->threads == NULL || pool->workers == NULL)
            goto err_free;
    }

    /* Helpers inherit a fully blocked signal mask: signals are the
     * daemon's main thread's business. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 1; i < n_threads; i++) {
        duet__pool_worker_t *w = &pool->workers[i - 1];
        w->pool = pool;
        w->index = i;
        rc = pthread_create(&pool->threads[i - 1], NULL, duet__pool_main, w);
        if (rc != 0)
            break;
        pool->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        goto err_stop;

    *pool_p = pool;
    return DUET_OK;

err_stop:
    duet_error(DUET_ERR_EXHAUSTED, "cpu pool %s: pthread_create: %s", pool->name, strerror(rc));
    duet__pool_stop(pool);
    duet__pool_free(pool);
    return DUET_ERR_EXHAUSTED;
err_free:
    duet__pool_free(pool);
    return duet_error(DUET_ERR_NO_MEMORY, "cpu pool: out of memory");
}

void duet_cpu_pool_destroy(duet_cpu_pool_t *pool)
{
    if (pool == NULL)
        return;
    duet__pool_stop(pool);
    duet__pool_free(pool);
}

int duet_cpu_pool_size(const duet_cpu_pool_t *pool)
{
    return pool->n_threads;
}

void *duet_cpu_pool_scratch(duet_cpu_pool_t *pool, int ti)
{
    return pool->scratch[ti];
}

void duet_cpu_pool_run(duet_cpu_pool_t *pool, duet_cpu_pool_fn fn, void *arg)
{
    if (pool->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->gen, 1); /* seq_cst: publishes fn, arg, pending */
    if (atomic_load(&pool->gen_sleepers) > 0)
        duet__futex_wake(&pool->gen, INT_MAX);
    fn(arg, 0, pool->n_threads);
    duet__pool_wait_done(pool);
}
