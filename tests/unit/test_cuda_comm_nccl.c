/* The nccl comm backend with two ranks on two GPUs (skipped with fewer):
 *  - all_reduce (bf16 and f32, device buffers), all_gather and broadcast
 *    of device and of host memory give the host comm's results (sums of
 *    small integers, exact in bf16);
 *  - a rank that never joins turns the other's init into
 *    DUET_ERR_TIMEOUT within the deadline, naming the wait;
 *  - a rank that skips a collective turns the other's wait into
 *    DUET_ERR_TIMEOUT naming the collective, and the first rank's next
 *    call fails promptly (the group is aborted) instead of hanging. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "common/clock.h"
#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include "engine/comm_nccl.h"
#include "tests/gpu/cuda_test_util.h"

#define N 4099

typedef struct {
    duet_comm_nccl_group_t *grp;
    int rank, mode; /* 0 collectives, 1 never join, 2 skip a collective */
    duet_status_t st, st2;
    char msg[512];
    int64_t waited_ms;
    float red_bf16[N], red_f32[N], gathered[2 * 8];
    int32_t bcast_host[5], bcast_dev[5];
} arg_t;

/* No cmocka asserts on these threads: failures go into a->st / a->msg. */
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            a->st = DUET_ERR_INTERNAL;                                                             \
            snprintf(a->msg, sizeof(a->msg), "check failed at line %d: %s (%s)", __LINE__, #cond,  \
                     duet_error_msg());                                                            \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void *rank_main(void *p)
{
    arg_t *a = p;
    duet_kv_layout_t kv = {1, 2, 4, 1, 8, 2};
    duet_backend_rank_opts_t o = {.rank = a->rank, .tp = 2, .device = a->rank, .kv_layout = kv};
    const duet_backend_ops_t *ops = &duet_backend_cuda;
    duet_backend_rank_t *br = NULL;
    duet_comm_t *c = NULL;
    void *d16 = NULL, *d32 = NULL, *dm = NULL, *dg = NULL, *dv = NULL;
    static float x[2][N];
    float mine[8];
    int32_t v[5];
    int64_t t0;

    if (a->mode == 1 && a->rank == 1)
        return NULL;
    CHECK(ops->rank_create(&o, &br) == DUET_OK);
    t0 = duet_now_ns();
    a->st = duet_comm_nccl_create(a->grp, a->rank, br, &c);
    a->waited_ms = (duet_now_ns() - t0) / DUET_NS_PER_MS;
    if (a->st != DUET_OK) {
        snprintf(a->msg, sizeof(a->msg), "%s", duet_error_msg());
        goto out;
    }
    for (int i = 0; i < N; i++)
        x[a->rank][i] = (float)((i % 13) + a->rank * 3);
    d16 = duet_test_dev_bf16(ops, br, x[a->rank], N);
    d32 = ops->alloc(br, N * sizeof(float));
    CHECK(d16 != NULL && d32 != NULL);
    CHECK(ops->upload(br, d32, x[a->rank], N * sizeof(float)) == DUET_OK);
    if (a->mode == 2) {
        if (a->rank == 0) {
            t0 = duet_now_ns();
            a->st = c->ops->all_reduce_sum(c, d32, N, DUET_DTYPE_F32);
            if (a->st == DUET_OK)
                a->st = ops->sync(br);
            a->waited_ms = (duet_now_ns() - t0) / DUET_NS_PER_MS;
            snprintf(a->msg, sizeof(a->msg), "%s", duet_error_msg());
            a->st2 = c->ops->barrier(c);
        } else {
            struct timespec ts = {3, 0};
            nanosleep(&ts, NULL); /* never calls all_reduce; then finds the group aborted */
            a->st2 = c->ops->barrier(c);
            a->st = DUET_OK;
        }
        goto out;
    }
    CHECK(c->ops->all_reduce_sum(c, d16, N, DUET_DTYPE_BF16) == DUET_OK);
    CHECK(c->ops->all_reduce_sum(c, d32, N, DUET_DTYPE_F32) == DUET_OK);
    CHECK(duet_test_host_f32(ops, br, d16, a->red_bf16, N) == 0);
    CHECK(ops->download(br, a->red_f32, d32, N * sizeof(float)) == DUET_OK);
    for (int i = 0; i < 8; i++)
        mine[i] = (float)(a->rank * 100 + i);
    dm = ops->alloc(br, sizeof(mine));
    dg = ops->alloc(br, 2 * sizeof(mine));
    CHECK(dm != NULL && dg != NULL);
    CHECK(ops->upload(br, dm, mine, sizeof(mine)) == DUET_OK);
    CHECK(c->ops->all_gather(c, dm, dg, sizeof(mine)) == DUET_OK);
    CHECK(ops->download(br, a->gathered, dg, 2 * sizeof(mine)) == DUET_OK);
    for (int i = 0; i < 5; i++)
        a->bcast_host[i] = a->rank == 0 ? 40 + i : -1;
    CHECK(c->ops->broadcast(c, a->bcast_host, sizeof(a->bcast_host), 0) == DUET_OK);
    for (int i = 0; i < 5; i++)
        v[i] = a->rank == 0 ? 70 + i : -1;
    dv = ops->alloc(br, sizeof(v));
    CHECK(dv != NULL);
    CHECK(ops->upload(br, dv, v, sizeof(v)) == DUET_OK);
    CHECK(c->ops->broadcast(c, dv, sizeof(v), 0) == DUET_OK);
    CHECK(ops->download(br, a->bcast_dev, dv, sizeof(v)) == DUET_OK);
    CHECK(c->ops->barrier(c) == DUET_OK);
    a->st = DUET_OK;
out:
    if (br != NULL) {
        ops->free(br, d16);
        ops->free(br, d32);
        ops->free(br, dm);
        ops->free(br, dg);
        ops->free(br, dv);
    }
    if (c != NULL)
        c->ops->destroy(c);
    if (br != NULL)
        ops->rank_destroy(br);
    return NULL;
}

static void run(int mode, int timeout_ms, arg_t *args)
{
    duet_comm_nccl_group_t *g;
    pthread_t th[2];
    assert_int_equal(duet_comm_nccl_group_create(2, timeout_ms, &g), DUET_OK);
    for (int r = 0; r < 2; r++) {
        memset(&args[r], 0, sizeof(args[r]));
        args[r].grp = g;
        args[r].rank = r;
        args[r].mode = mode;
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    duet_comm_nccl_group_destroy(g);
}

static bool two_gpus(void)
{
    if (duet_cuda_device_count() >= 2)
        return true;
    fprintf(stderr, "fewer than 2 CUDA devices: skipped\n");
    return false;
}

static void test_collectives(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    if (!two_gpus())
        skip();
    static arg_t a[2];
    run(0, 30000, a);
    for (int r = 0; r < 2; r++) {
        if (a[r].st != DUET_OK)
            fprintf(stderr, "rank %d: %s\n", r, a[r].msg);
        assert_int_equal(a[r].st, DUET_OK);
        for (int i = 0; i < N; i++) {
            float want = (float)(2 * (i % 13) + 3);
            assert_true(a[r].red_bf16[i] == want);
            assert_true(a[r].red_f32[i] == want);
        }
        for (int q = 0; q < 2; q++)
            for (int i = 0; i < 8; i++)
                assert_true(a[r].gathered[q * 8 + i] == (float)(q * 100 + i));
        for (int i = 0; i < 5; i++) {
            assert_int_equal(a[r].bcast_host[i], 40 + i);
            assert_int_equal(a[r].bcast_dev[i], 70 + i);
        }
    }
    fprintf(stderr, "nccl collectives on 2 ranks ok\n");
}

static void test_init_deadline(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    if (!two_gpus())
        skip();
    static arg_t a[2];
    run(1, 2000, a);
    fprintf(stderr, "init without a peer: %s after %lld ms: %s\n", duet_status_name(a[0].st),
            (long long)a[0].waited_ms, a[0].msg);
    assert_int_equal(a[0].st, DUET_ERR_TIMEOUT);
    assert_true(a[0].waited_ms >= 1900 && a[0].waited_ms < 15000);
    assert_non_null(strstr(a[0].msg, "init"));
}

static void test_collective_deadline(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    if (!two_gpus())
        skip();
    static arg_t a[2];
    run(2, 1500, a);
    fprintf(stderr, "all_reduce without a peer: %s after %lld ms: %s; next call %s / %s\n",
            duet_status_name(a[0].st), (long long)a[0].waited_ms, a[0].msg,
            duet_status_name(a[0].st2), duet_status_name(a[1].st2));
    assert_int_equal(a[0].st, DUET_ERR_TIMEOUT);
    assert_true(a[0].waited_ms >= 1400 && a[0].waited_ms < 15000);
    assert_non_null(strstr(a[0].msg, "all_reduce"));
    assert_int_not_equal(a[0].st2, DUET_OK);
    assert_int_not_equal(a[1].st2, DUET_OK);
}
#else
static void test_collectives(void **state)
{
    (void)state;
    skip();
}

static void test_init_deadline(void **state)
{
    (void)state;
    skip();
}

static void test_collective_deadline(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_init_deadline),
        cmocka_unit_test(test_collective_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
