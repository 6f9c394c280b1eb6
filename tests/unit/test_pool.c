/* engine/cpu/pool: every worker runs exactly once per dispatch, writes are
 * visible when run() returns, spinning and sleeping modes, oversubscription,
 * idle workers sleep, destroy with idle workers, names, scratch, failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "engine/cpu/pool.h"

#define MAXT 16

typedef struct {
    atomic_int runs[MAXT];
    atomic_int bad_nt;
    long data[MAXT]; /* plain writes, read by the caller after run() */
    long round;
} count_t;

static void count_fn(void *arg, int ti, int nt)
{
    count_t *c = arg;
    if (ti < 0 || ti >= MAXT || nt < 1 || nt > MAXT) {
        atomic_fetch_add(&c->bad_nt, 1);
        return;
    }
    atomic_fetch_add(&c->runs[ti], 1);
    c->data[ti] = c->round * 1000 + ti;
}

/* n dispatches; after each, every worker ran exactly once and its plain
 * write is visible. */
static void dispatch_many(int threads, bool spin, int rounds)
{
    duet_cpu_pool_t *pool = NULL;
    count_t c;

    memset(&c, 0, sizeof(c));
    assert_int_equal(duet_cpu_pool_create(threads, spin, "t", &pool), DUET_OK);
    assert_int_equal(duet_cpu_pool_size(pool), threads);
    for (int r = 0; r < rounds; r++) {
        c.round = r;
        duet_cpu_pool_run(pool, count_fn, &c);
        for (int t = 0; t < threads; t++) {
            if (atomic_load(&c.runs[t]) != 1 || c.data[t] != (long)r * 1000 + t)
                fail_msg("threads %d spin %d round %d worker %d: runs %d data %ld", threads,
                         (int)spin, r, t, atomic_load(&c.runs[t]), c.data[t]);
            atomic_store(&c.runs[t], 0);
        }
    }
    assert_int_equal(atomic_load(&c.bad_nt), 0);
    duet_cpu_pool_destroy(pool);
}

static void test_pool_dispatch_spin(void **state)
{
    (void)state;
    dispatch_many(1, true, 20000);
    dispatch_many(2, true, 20000);
    dispatch_many(3, true, 2000); /* oversubscribes a 2-CPU machine: slow by design */
}

static void test_pool_dispatch_nospin(void **state)
{
    (void)state;
    for (int t = 1; t <= 3; t++)
        dispatch_many(t, false, 5000);
}

/* More workers than CPUs, as when the engine runs 8 ranks on 2 cores. */
static void test_pool_oversubscribed(void **state)
{
    (void)state;
    dispatch_many(MAXT, false, 500);
}

/* Several pools driven at once from different threads (ranks). */
typedef struct {
    int threads;
    int rounds;
    atomic_int failures;
} rank_arg_t;

static void *rank_main(void *argp)
{
    rank_arg_t *ra = argp;
    duet_cpu_pool_t *pool = NULL;
    count_t *c = duet_calloc(1, sizeof(*c));
    if (c == NULL || duet_cpu_pool_create(ra->threads, false, "rk", &pool) != DUET_OK) {
        atomic_fetch_add(&ra->failures, 1);
        duet_free(c);
        return NULL;
    }
    for (int r = 0; r < ra->rounds; r++) {
        duet_cpu_pool_run(pool, count_fn, c);
        for (int t = 0; t < ra->threads; t++) {
            if (atomic_exchange(&c->runs[t], 0) != 1)
                atomic_fetch_add(&ra->failures, 1);
        }
    }
    duet_cpu_pool_destroy(pool);
    duet_free(c);
    return NULL;
}

static void test_pool_many_ranks(void **state)
{
    (void)state;
    pthread_t tid[8];
    rank_arg_t ra = {.threads = 2, .rounds = 300};
    atomic_init(&ra.failures, 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&tid[i], NULL, rank_main, &ra), 0);
    for (int i = 0; i < 8; i++)
        pthread_join(tid[i], NULL);
    assert_int_equal(atomic_load(&ra.failures), 0);
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* After a dispatch, idle workers stop spinning quickly and sleep: the
 * process burns (almost) no CPU while the pool is idle.  Then destroy must
 * wake and join the sleeping workers. */
static void idle_then_destroy(bool spin)
{
    duet_cpu_pool_t *pool = NULL;
    count_t c;
    struct timespec pause = {0, 300 * 1000 * 1000};
    double t0, used;

    memset(&c, 0, sizeof(c));
    assert_int_equal(duet_cpu_pool_create(3, spin, "idle", &pool), DUET_OK);
    duet_cpu_pool_run(pool, count_fn, &c);
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL); /* past the spin window */
    t0 = cpu_seconds();
    nanosleep(&pause, NULL);
    used = cpu_seconds() - t0;
    /* Two spinning workers would use ~0.6 s here. */
    if (used > 0.05)
        fail_msg("spin %d: idle pool used %.3f s of CPU in 0.3 s", (int)spin, used);
    duet_cpu_pool_run(pool, count_fn, &c); /* wakes sleepers */
    for (int t = 0; t < 3; t++)
        assert_int_equal(atomic_load(&c.runs[t]), 2);
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    duet_cpu_pool_destroy(pool);
}

static void test_pool_idle_sleeps_and_destroy(void **state)
{
    (void)state;
    idle_then_destroy(true);
    idle_then_destroy(false);
}

static void test_pool_create_destroy(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    for (int i = 0; i < 50; i++) {
        duet_cpu_pool_t *pool = NULL;
        assert_int_equal(duet_cpu_pool_create(1 + i % 4, i % 2 == 0, "cd", &pool), DUET_OK);
        duet_cpu_pool_destroy(pool); /* never dispatched, workers may still be spinning */
    }
    duet_cpu_pool_destroy(NULL);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_pool_invalid_and_oom(void **state)
{
    (void)state;
    duet_cpu_pool_t *pool = NULL;
    long live = duet_alloc_live();
    int failed = 0;

    assert_int_equal(duet_cpu_pool_create(0, true, "x", &pool), DUET_ERR_INVALID);
    assert_int_equal(duet_cpu_pool_create(-3, true, "x", &pool), DUET_ERR_INVALID);
    assert_int_equal(duet_cpu_pool_create(DUET_CPU_POOL_MAX_THREADS + 1, true, "x", &pool),
                     DUET_ERR_INVALID);
    assert_null(pool);
    /* Every allocation of create failing in turn: an error, no leak. */
    for (long k = 0; k < 16; k++) {
        duet_alloc_fail_after(k);
        duet_status_t st = duet_cpu_pool_create(3, true, "oom", &pool);
        duet_alloc_fail_after(-1);
        if (st == DUET_OK) {
            duet_cpu_pool_destroy(pool);
            pool = NULL;
            break;
        }
        assert_int_equal(st, DUET_ERR_NO_MEMORY);
        assert_null(pool);
        failed++;
        assert_int_equal(duet_alloc_live(), live);
    }
    assert_true(failed > 0);
    assert_int_equal(duet_alloc_live(), live);
}

static int find_thread_name(const char *want)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int found = 0;
    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL && !found) {
        char path[300], name[32] = "";
        FILE *f;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(name, sizeof(name), f) != NULL) {
            name[strcspn(name, "\n")] = '\0';
            found = strcmp(name, want) == 0;
        }
        fclose(f);
    }
    closedir(d);
    return found;
}

static void test_pool_thread_names(void **state)
{
    (void)state;
    duet_cpu_pool_t *pool = NULL;
    count_t c;
    memset(&c, 0, sizeof(c));
    assert_int_equal(duet_cpu_pool_create(3, false, "r5", &pool), DUET_OK);
    duet_cpu_pool_run(pool, count_fn, &c); /* every helper has named itself by now */
    if (find_thread_name("r5w1") < 0)
        skip();
    assert_int_equal(find_thread_name("r5w1"), 1);
    assert_int_equal(find_thread_name("r5w2"), 1);
    assert_int_equal(find_thread_name("r5w3"), 0);
    duet_cpu_pool_destroy(pool);
}

typedef struct {
    duet_cpu_pool_t *pool;
    unsigned char *seen[MAXT];
    atomic_int bad;
} scratch_arg_t;

static void scratch_fn(void *arg, int ti, int nt)
{
    scratch_arg_t *s = arg;
    unsigned char *p = duet_cpu_pool_scratch(s->pool, ti);
    (void)nt;
    if (p == NULL || ((uintptr_t)p & 63) != 0) {
        atomic_fetch_add(&s->bad, 1);
        return;
    }
    memset(p, ti + 1, DUET_CPU_POOL_SCRATCH_BYTES); /* all of it is usable */
    s->seen[ti] = p;
}

static void test_pool_scratch(void **state)
{
    (void)state;
    duet_cpu_pool_t *pool = NULL;
    scratch_arg_t s;
    memset(&s, 0, sizeof(s));
    assert_int_equal(duet_cpu_pool_create(3, true, "s", &pool), DUET_OK);
    s.pool = pool;
    duet_cpu_pool_run(pool, scratch_fn, &s);
    assert_int_equal(atomic_load(&s.bad), 0);
    for (int t = 0; t < 3; t++) {
        /* Each worker's buffer holds only its own bytes: no overlap. */
        assert_int_equal(s.seen[t][0], t + 1);
        assert_int_equal(s.seen[t][DUET_CPU_POOL_SCRATCH_BYTES - 1], t + 1);
    }
    duet_cpu_pool_destroy(pool);
}

static void test_pool_split(void **state)
{
    (void)state;
    for (long n = 0; n < 40; n++) {
        for (int nt = 1; nt <= 7; nt++) {
            long next = 0;
            for (int t = 0; t < nt; t++) {
                long b, e;
                duet_cpu_split(n, t, nt, &b, &e);
                assert_int_equal(b, next);
                assert_true(e >= b && e - b <= n / nt + 1);
                next = e;
            }
            assert_int_equal(next, n);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_dispatch_spin),
        cmocka_unit_test(test_pool_dispatch_nospin),
        cmocka_unit_test(test_pool_oversubscribed),
        cmocka_unit_test(test_pool_many_ranks),
        cmocka_unit_test(test_pool_idle_sleeps_and_destroy),
        cmocka_unit_test(test_pool_create_destroy),
        cmocka_unit_test(test_pool_invalid_and_oom),
        cmocka_unit_test(test_pool_thread_names),
        cmocka_unit_test(test_pool_scratch),
        cmocka_unit_test(test_pool_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
