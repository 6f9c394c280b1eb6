/* common/rpc_health.c: grpc.health.v1.Health Check and Watch through a real
 * server and client over 127.0.0.1, messages packed with protobuf-c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <pthread.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/rpc.h"
#include "grpc/health/v1/health.pb-c.h"

#define M_CHECK "/grpc.health.v1.Health/Check"
#define M_WATCH "/grpc.health.v1.Health/Watch"

/* Poll `expr` for up to ms milliseconds; evaluates to its final truth. */
#define WAIT_FOR(expr, ms)                                                                         \
    ({                                                                                             \
        int64_t until_ = duet_now_ns() + (int64_t)(ms)*DUET_NS_PER_MS;                             \
        while (!(expr) && duet_now_ns() < until_)                                                  \
            sleep_ms(1);                                                                           \
        (expr);                                                                                    \
    })

typedef struct {
    duet_rpc_server_t *srv;
    duet_rpc_client_t *cli;
    duet_rpc_health_t *health;
    char target[64];
} fx_t;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static fx_t *fx_create(void)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    duet_rpc_server_config_t cfg;
    duet_rpc_client_config_t ccfg;

    assert_non_null(fx);
    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = "127.0.0.1:0";
    assert_int_equal(duet_rpc_server_create(&cfg, &fx->srv), DUET_OK);
    assert_int_equal(duet_rpc_health_create(fx->srv, DUET_RPC_HEALTH_SERVING, &fx->health),
                     DUET_OK);
    assert_int_equal(duet_rpc_server_start(fx->srv), DUET_OK);
    snprintf(fx->target, sizeof(fx->target), "127.0.0.1:%d", duet_rpc_server_port(fx->srv));
    duet_rpc_client_config_init(&ccfg);
    assert_int_equal(duet_rpc_client_create(&ccfg, &fx->cli), DUET_OK);
    return fx;
}

static void fx_destroy(fx_t *fx)
{
    duet_rpc_client_destroy(fx->cli);
    duet_rpc_server_destroy(fx->srv);
    duet_rpc_health_destroy(fx->health);
    free(fx);
}

static duet_rpc_health_status_t health_check(fx_t *fx, const char *service, duet_status_t *st_p)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    uint8_t buf[512];
    duet_rpc_result_t res;
    req.service = (char *)service;
    size_t n = grpc__health__v1__health_check_request__pack(&req, buf);
    *st_p = duet_rpc_client_unary(fx->cli, fx->target, M_CHECK, buf, n, duet_deadline_in_ms(5000),
                                  &res);
    duet_rpc_health_status_t status = DUET_RPC_HEALTH_UNKNOWN;
    if (*st_p == DUET_OK) {
        Grpc__Health__V1__HealthCheckResponse *resp =
            grpc__health__v1__health_check_response__unpack(NULL, res.len, res.data);
        assert_non_null(resp);
        status = (duet_rpc_health_status_t)resp->status;
        grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
    }
    duet_rpc_result_cleanup(&res);
    return status;
}

typedef struct {
    pthread_mutex_t lock;
    int statuses[32];
    atomic_int n;
    atomic_int done;
    atomic_int code;
} watch_rec_t;

static void watch_on_message(duet_rpc_stream_t *s, const uint8_t *data, size_t len, void *arg)
{
    watch_rec_t *w = arg;
    Grpc__Health__V1__HealthCheckResponse *resp =
        grpc__health__v1__health_check_response__unpack(NULL, len, data);
    int status = resp ? (int)resp->status : -1;
    if (resp)
        grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
    pthread_mutex_lock(&w->lock);
    int i = atomic_load(&w->n);
    if (i < 32)
        w->statuses[i] = status;
    atomic_store(&w->n, i + 1);
    pthread_mutex_unlock(&w->lock);
}

static void watch_on_done(duet_rpc_stream_t *s, grpc_status_code code, const char *msg, void *arg)
{
    watch_rec_t *w = arg;
    atomic_store(&w->code, (int)code);
    atomic_fetch_add(&w->done, 1);
}

static duet_rpc_stream_t *watch_start(fx_t *fx, const char *service, watch_rec_t *w)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    uint8_t buf[512];
    duet_rpc_stream_t *s;
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->lock, NULL);
    req.service = (char *)service;
    size_t n = grpc__health__v1__health_check_request__pack(&req, buf);
    assert_int_equal(duet_rpc_client_stream(fx->cli, fx->target, M_WATCH, buf, n,
                                            duet_deadline_in_ms(60000), watch_on_message,
                                            watch_on_done, w, &s),
                     DUET_OK);
    return s;
}

static int watch_status(watch_rec_t *w, int i)
{
    pthread_mutex_lock(&w->lock);
    int s = w->statuses[i];
    pthread_mutex_unlock(&w->lock);
    return s;
}

static void test_health(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create();
    duet_status_t st;
    watch_rec_t wd, wu, wall;

    assert_int_equal(health_check(fx, "", &st), DUET_RPC_HEALTH_SERVING);
    assert_int_equal(st, DUET_OK);
    health_check(fx, "duet.v1.Decode", &st);
    assert_int_equal(st, DUET_ERR_NOT_FOUND);
    assert_int_equal(duet_rpc_health_set(fx->health, "duet.v1.Decode", DUET_RPC_HEALTH_SERVING),
                     DUET_OK);
    assert_int_equal(health_check(fx, "duet.v1.Decode", &st), DUET_RPC_HEALTH_SERVING);
    assert_int_equal(st, DUET_OK);
    assert_int_equal(duet_rpc_health_set(fx->health, "x", DUET_RPC_HEALTH_SERVICE_UNKNOWN),
                     DUET_ERR_INVALID);

    /* Watch: current status at once, then every change. */
    duet_rpc_stream_t *sd = watch_start(fx, "duet.v1.Decode", &wd);
    duet_rpc_stream_t *su = watch_start(fx, "duet.v1.Later", &wu);
    duet_rpc_stream_t *sall = watch_start(fx, "", &wall);
    assert_true(WAIT_FOR(
        atomic_load(&wd.n) == 1 && atomic_load(&wu.n) == 1 && atomic_load(&wall.n) == 1, 5000));
    assert_int_equal(watch_status(&wd, 0), DUET_RPC_HEALTH_SERVING);
    assert_int_equal(watch_status(&wu, 0), DUET_RPC_HEALTH_SERVICE_UNKNOWN);
    assert_int_equal(watch_status(&wall, 0), DUET_RPC_HEALTH_SERVING);
    assert_true(WAIT_FOR(duet_rpc_health_watchers(fx->health) == 3, 5000));

    assert_int_equal(duet_rpc_health_set(fx->health, "duet.v1.Decode", DUET_RPC_HEALTH_NOT_SERVING),
                     DUET_OK);
    assert_true(WAIT_FOR(atomic_load(&wd.n) == 2, 5000));
    assert_int_equal(watch_status(&wd, 1), DUET_RPC_HEALTH_NOT_SERVING);
    assert_int_equal(health_check(fx, "duet.v1.Decode", &st), DUET_RPC_HEALTH_NOT_SERVING);
    /* Setting the same status again sends nothing. */
    assert_int_equal(duet_rpc_health_set(fx->health, "duet.v1.Decode", DUET_RPC_HEALTH_NOT_SERVING),
                     DUET_OK);
    assert_int_equal(duet_rpc_health_set(fx->health, "duet.v1.Later", DUET_RPC_HEALTH_SERVING),
                     DUET_OK);
    assert_true(WAIT_FOR(atomic_load(&wu.n) == 2, 5000));
    assert_int_equal(watch_status(&wu, 1), DUET_RPC_HEALTH_SERVING);
    assert_int_equal(duet_rpc_health_clear(fx->health, "duet.v1.Later"), DUET_OK);
    assert_true(WAIT_FOR(atomic_load(&wu.n) == 3, 5000));
    assert_int_equal(watch_status(&wu, 2), DUET_RPC_HEALTH_SERVICE_UNKNOWN);
    sleep_ms(50);
    assert_int_equal(atomic_load(&wd.n), 2);
    assert_int_equal(atomic_load(&wall.n), 1);

    /* A cancelled watcher is dropped by the server. */
    duet_rpc_stream_cancel(su);
    assert_true(WAIT_FOR(atomic_load(&wu.done) == 1, 5000));
    assert_int_equal(atomic_load(&wu.code), GRPC_STATUS_CANCELLED);
    assert_true(WAIT_FOR(duet_rpc_health_watchers(fx->health) == 2, 5000));

    /* Server shutdown drains: NOT_SERVING, then the stream ends, well within
     * the grace period. */
    int64_t t0 = duet_now_ns();
    assert_int_equal(duet_rpc_server_shutdown(fx->srv, 5000), DUET_OK);
    assert_true(duet_now_ns() - t0 < 2 * DUET_NS_PER_S);
    assert_true(WAIT_FOR(atomic_load(&wall.done) == 1 && atomic_load(&wd.done) == 1, 5000));
    assert_int_equal(atomic_load(&wall.n), 2);
    assert_int_equal(watch_status(&wall, 1), DUET_RPC_HEALTH_NOT_SERVING);
    assert_int_equal(atomic_load(&wall.code), GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(atomic_load(&wd.n), 2); /* already NOT_SERVING */
    assert_int_equal(atomic_load(&wd.code), GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(duet_rpc_health_set(fx->health, "", DUET_RPC_HEALTH_SERVING),
                     DUET_ERR_SHUTDOWN);
    assert_int_equal(duet_rpc_health_get(fx->health, ""), DUET_RPC_HEALTH_NOT_SERVING);
    duet_rpc_stream_release(sd);
    duet_rpc_stream_release(su);
    duet_rpc_stream_release(sall);
    pthread_mutex_destroy(&wd.lock);
    pthread_mutex_destroy(&wu.lock);
    pthread_mutex_destroy(&wall.lock);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_health_bad_requests(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create();
    duet_rpc_result_t res;
    duet_status_t st;
    char longname[300];

    /* Not a HealthCheckRequest (field 1 declared as a varint). */
    const uint8_t junk[] = {0x08, 0x96, 0x01, 0x0a, 0x40};
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_CHECK, junk, sizeof(junk),
                                           duet_deadline_in_ms(5000), &res),
                     DUET_ERR_INVALID);
    assert_int_equal(res.code, GRPC_STATUS_INVALID_ARGUMENT);
    duet_rpc_result_cleanup(&res);
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    health_check(fx, longname, &st);
    assert_int_equal(st, DUET_ERR_INVALID);
    assert_int_equal(duet_rpc_health_set(fx->health, longname, DUET_RPC_HEALTH_SERVING),
                     DUET_ERR_INVALID);
    /* UNKNOWN is a settable status, distinct from an unknown service. */
    assert_int_equal(duet_rpc_health_set(fx->health, "svc", DUET_RPC_HEALTH_UNKNOWN), DUET_OK);
    assert_int_equal(health_check(fx, "svc", &st), DUET_RPC_HEALTH_UNKNOWN);
    assert_int_equal(st, DUET_OK);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health),
        cmocka_unit_test(test_health_bad_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
