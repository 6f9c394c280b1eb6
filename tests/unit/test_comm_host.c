/* The host comm backend: sums are correct and bitwise identical on every
 * rank, gathers and broadcasts land, a missing rank becomes a deadline error
 * naming it, mismatched collectives are reported instead of computed, and
 * the comm.fail_after fault point fails the group. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "common/alloc.h"
#include "common/fault.h"
#include "engine/comm.h"

#define N 1000

typedef struct {
    duet_comm_t *comm;
    int mode; /* 0 normal, 1 skip (rank 1 never calls), 2 mismatch */
    duet_status_t st;
    char msg[256];
    float buf[N];
    float gathered[8 * 4];
    int32_t bcast[4];
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    int r = a->comm->rank;
    for (int i = 0; i < N; i++)
        a->buf[i] = 0.1f * (float)(i % 7) + (float)r * 1e-3f + 1e-7f * (float)i;
    if (a->mode == 1 && r == 1) {
        a->st = DUET_OK;
        return NULL;
    }
    size_t count = (a->mode == 2 && r == 2) ? N - 1 : N;
    a->st = duet_comm_all_reduce_sum(a->comm, a->buf, count, DUET_DTYPE_F32);
    if (a->st != DUET_OK) {
        snprintf(a->msg, sizeof(a->msg), "%s", duet_error_msg());
        return NULL;
    }
    float mine[4] = {(float)r, (float)r + 0.5f, (float)(r * r), -1.0f};
    a->st = duet_comm_all_gather(a->comm, mine, a->gathered, sizeof(mine));
    if (a->st != DUET_OK)
        return NULL;
    int32_t v[4] = {r, r, r, r};
    if (r == 0)
        v[0] = 42, v[1] = 43, v[2] = 44, v[3] = 45;
    a->st = duet_comm_broadcast(a->comm, v, sizeof(v), 0);
    memcpy(a->bcast, v, sizeof(v));
    if (a->st == DUET_OK)
        a->st = duet_comm_barrier(a->comm);
    return NULL;
}

static void run_group(int size, int mode, int timeout_ms, rank_arg_t *args)
{
    duet_comm_host_group_t *g;
    pthread_t th[8];
    assert_int_equal(duet_comm_host_group_create(size, N * sizeof(float), timeout_ms, &g), DUET_OK);
    for (int r = 0; r < size; r++) {
        memset(&args[r], 0, sizeof(args[r]));
        assert_int_equal(duet_comm_host_create(g, r, &args[r].comm), DUET_OK);
        args[r].mode = mode;
    }
    for (int r = 0; r < size; r++)
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++)
        args[r].comm->ops->destroy(args[r].comm);
    duet_comm_host_group_destroy(g);
}

static void test_collectives(void **state)
{
    (void)state;
    static rank_arg_t args[8];
    long live = duet_alloc_live();
    for (int size = 1; size <= 8; size *= 2) {
        run_group(size, 0, 5000, args);
        for (int r = 0; r < size; r++) {
            assert_int_equal(args[r].st, DUET_OK);
            /* identical bits on every rank */
            assert_memory_equal(args[r].buf, args[0].buf, sizeof(args[0].buf));
            for (int q = 0; q < size; q++) {
                assert_true(args[r].gathered[q * 4 + 0] == (float)q);
                assert_true(args[r].gathered[q * 4 + 2] == (float)(q * q));
            }
            assert_int_equal(args[r].bcast[0], 42);
            assert_int_equal(args[r].bcast[3], 45);
        }
        for (int i = 0; i < N; i++) {
            double want = 0;
            for (int r = 0; r < size; r++)
                want += 0.1f * (float)(i % 7) + (float)r * 1e-3f + 1e-7f * (float)i;
            assert_true(fabs(args[0].buf[i] - want) < 1e-5);
        }
    }
    assert_int_equal(duet_alloc_live(), live);
}

static void test_missing_rank_times_out(void **state)
{
    (void)state;
    static rank_arg_t args[4];
    run_group(4, 1, 200, args);
    for (int r = 0; r < 4; r++) {
        if (r == 1)
            continue;
        assert_int_equal(args[r].st, DUET_ERR_TIMEOUT);
        assert_non_null(strstr(args[r].msg, "all_reduce"));
        assert_non_null(strstr(args[r].msg, "waiting for rank(s) 1"));
    }
}

static void test_mismatch_is_reported(void **state)
{
    (void)state;
    static rank_arg_t args[4];
    run_group(4, 2, 5000, args);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(args[r].st, DUET_ERR_INTERNAL);
        assert_non_null(strstr(args[r].msg, "collective mismatch"));
    }
}

/* The fault point comm.fail_after=N: the last rank fails its collective
 * N+1, which aborts the group: every rank's collective fails, naming it. */
static void test_fault_fails_the_group(void **state)
{
    (void)state;
    static rank_arg_t args[4];
    if (duet_fault_arm("comm.fail_after", 0) != DUET_OK)
        skip(); /* fault injection compiled out */
    run_group(4, 0, 5000, args);
    duet_fault_disarm("comm.fail_after");
    for (int r = 0; r < 4; r++) {
        assert_int_equal(args[r].st, DUET_ERR_INTERNAL);
        assert_non_null(strstr(args[r].msg, "comm.fail_after=0"));
    }
    run_group(4, 0, 5000, args); /* disarmed: groups made after are healthy */
    for (int r = 0; r < 4; r++)
        assert_int_equal(args[r].st, DUET_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_missing_rank_times_out),
        cmocka_unit_test(test_mismatch_is_reported),
        cmocka_unit_test(test_fault_fails_the_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
