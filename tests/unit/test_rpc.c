/* common/rpc: a real server and client over 127.0.0.1 (ephemeral ports),
 * with raw-bytes echo methods.  The health service is in test_rpc_health.c. */
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

#define M_UNARY    "/test.Echo/Unary"
#define M_ASYNC    "/test.Echo/Async"
#define M_STREAM   "/test.Echo/Stream"
#define M_FAIL     "/test.Echo/Fail"
#define M_HANG     "/test.Echo/Hang"
#define M_INFINITE "/test.Echo/Infinite"
#define M_BIG      "/test.Echo/Big"
#define M_DENIED   "/test.Echo/Denied"

#define MAX_SPAWN 1024

/* cmocka asserts only work on the test's own thread: handlers and callbacks
 * run on gRPC threads, so they count failures here and the test checks. */
static atomic_int g_bad;
#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "CHECK failed %s:%d: %s\n", __FILE__, __LINE__, #x);                   \
            atomic_fetch_add(&g_bad, 1);                                                           \
        }                                                                                          \
    } while (0)

/* Poll `expr` for up to ms milliseconds; evaluates to its final truth. */
#define WAIT_FOR(expr, ms)                                                                         \
    ({                                                                                             \
        int64_t until_ = duet_now_ns() + (int64_t)(ms)*DUET_NS_PER_MS;                             \
        while (!(expr) && duet_now_ns() < until_)                                                  \
            sleep_ms(1);                                                                           \
        (expr);                                                                                    \
    })

typedef struct fx {
    duet_rpc_server_t *srv;
    duet_rpc_client_t *cli;
    duet_rpc_health_t *health;
    char target[64];
    int port;

    pthread_mutex_t lock;
    pthread_t spawned[MAX_SPAWN];
    int n_spawned;

    atomic_int cancels;             /* on_cancel callbacks */
    atomic_int cancel_fail_rc_bad;  /* terminal call in on_cancel not CANCELLED */
    atomic_int write_after_cancel;  /* writes refused with CANCELLED after cancel */
    atomic_int finish_after_cancel; /* finish returned CANCELLED */
    atomic_int exhausted;           /* DUET_ERR_EXHAUSTED seen by stream writers */
    atomic_int cq_wait_refused;     /* wait_writable refused on a CQ thread */
    atomic_int stream_writers_done;
    atomic_llong hang_deadline_left; /* ns left when the Hang handler ran */
    atomic_int checked;              /* admission checks that saw user-agent */
    atomic_int infinite_started;     /* Infinite handlers run */
} fx_t;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void fx_spawn(fx_t *fx, void *(*fn)(void *), void *arg)
{
    pthread_mutex_lock(&fx->lock);
    if (fx->n_spawned >= MAX_SPAWN) {
        CHECK(!"too many threads");
        pthread_mutex_unlock(&fx->lock);
        return;
    }
    CHECK(pthread_create(&fx->spawned[fx->n_spawned], NULL, fn, arg) == 0);
    fx->n_spawned++;
    pthread_mutex_unlock(&fx->lock);
}

/* ---- handlers ---- */

static void h_unary(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    CHECK(duet_rpc_call_kind(call) == DUET_RPC_UNARY);
    duet_status_t st = duet_rpc_call_reply(call, req, len);
    CHECK(st == DUET_OK || st == DUET_ERR_NO_MEMORY); /* the latter: test_alloc_failures */
}

typedef struct {
    duet_rpc_call_t *call;
    uint8_t data[64];
    size_t len;
    int delay_ms;
    fx_t *fx;
    uint32_t count;
} job_t;

static void *async_reply_main(void *p)
{
    job_t *job = p;
    sleep_ms(job->delay_ms);
    duet_rpc_call_reply(job->call, job->data, job->len);
    duet_free(job);
    return NULL;
}

/* Request: "<delay ms>:<payload>"; the reply (the payload) comes from another
 * thread after the delay. */
static void h_async(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    job_t *job = DUET_NEW(job_t);
    char buf[80];
    CHECK(job != NULL);
    CHECK(len < sizeof(buf));
    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    memcpy(buf, req, len);
    buf[len] = '\0';
    char *colon = strchr(buf, ':');
    CHECK(colon != NULL);
    job->call = call;
    job->delay_ms = atoi(buf);
    job->len = strlen(colon + 1);
    memcpy(job->data, colon + 1, job->len);
    fx_spawn(arg, async_reply_main, job);
}

static void *stream_writer_main(void *p)
{
    job_t *job = p;
    fx_t *fx = job->fx;
    for (uint32_t i = 0; i < job->count; i++) {
        duet_status_t st;
        while ((st = duet_rpc_call_write(job->call, &i, sizeof(i))) == DUET_ERR_EXHAUSTED) {
            atomic_fetch_add(&fx->exhausted, 1);
            st = duet_rpc_call_wait_writable(job->call, duet_deadline_in_ms(10000));
            if (st != DUET_OK)
                break;
        }
        if (st != DUET_OK) {
            /* Cancelled, or out of memory in the allocation tests. */
            duet_rpc_call_fail_status(job->call, st, NULL);
            job->call = NULL;
            break;
        }
    }
    if (job->call)
        duet_rpc_call_finish(job->call, GRPC_STATUS_OK, NULL);
    atomic_fetch_add(&fx->stream_writers_done, 1);
    duet_free(job);
    return NULL;
}

/* Request: uint32 count; streams 0..count-1 from another thread. */
static void h_stream(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    fx_t *fx = arg;
    if (len != sizeof(uint32_t)) {
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "want a uint32 count");
        return;
    }
    job_t *job = DUET_NEW(job_t);
    if (!job) { /* the allocation-failure test gets here */
        duet_rpc_call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "test out of memory");
        return;
    }
    if (duet_rpc_call_wait_writable(call, duet_deadline_in_ms(1000)) == DUET_ERR_INVALID)
        atomic_fetch_add(&fx->cq_wait_refused, 1);
    job->call = call;
    job->fx = fx;
    memcpy(&job->count, req, sizeof(job->count));
    fx_spawn(fx, stream_writer_main, job);
}

/* Request: "<code>:<message>". */
static void h_fail(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    char buf[128];
    CHECK(len < sizeof(buf));
    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    memcpy(buf, req, len);
    buf[len] = '\0';
    char *colon = strchr(buf, ':');
    CHECK(colon != NULL);
    duet_rpc_call_fail(call, (grpc_status_code)atoi(buf), colon + 1);
}

static void on_cancel_fail(duet_rpc_call_t *call, void *arg)
{
    fx_t *fx = arg;
    atomic_fetch_add(&fx->cancels, 1);
    /* Terminal function from inside the callback: allowed, reports it. */
    if (duet_rpc_call_fail(call, GRPC_STATUS_CANCELLED, "gone") != DUET_ERR_CANCELLED)
        atomic_fetch_add(&fx->cancel_fail_rc_bad, 1);
}

/* Never answers; the cancellation callback ends the call. */
static void h_hang(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    fx_t *fx = arg;
    int64_t dl = duet_rpc_call_deadline_ns(call);
    atomic_store(&fx->hang_deadline_left, dl == INT64_MAX ? -1 : dl - duet_now_ns());
    CHECK(duet_rpc_call_on_cancel(call, on_cancel_fail, fx) == DUET_OK);
}

static void on_cancel_count(duet_rpc_call_t *call, void *arg)
{
    atomic_fetch_add(&((fx_t *)arg)->cancels, 1);
}

static void *infinite_writer_main(void *p)
{
    job_t *job = p;
    fx_t *fx = job->fx;
    uint8_t msg[64];
    memset(msg, 'x', sizeof(msg));
    for (;;) {
        duet_status_t st = duet_rpc_call_write(job->call, msg, sizeof(msg));
        if (st == DUET_ERR_EXHAUSTED)
            st = duet_rpc_call_wait_writable(job->call, duet_deadline_in_ms(20000));
        if (st == DUET_ERR_CANCELLED) {
            if (duet_rpc_call_write(job->call, msg, sizeof(msg)) == DUET_ERR_CANCELLED)
                atomic_fetch_add(&fx->write_after_cancel, 1);
            break;
        }
        if (st != DUET_OK)
            break;
    }
    if (duet_rpc_call_finish(job->call, GRPC_STATUS_OK, NULL) == DUET_ERR_CANCELLED)
        atomic_fetch_add(&fx->finish_after_cancel, 1);
    atomic_fetch_add(&fx->stream_writers_done, 1);
    duet_free(job);
    return NULL;
}

/* Streams 64-byte messages until cancelled. */
static void h_infinite(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    fx_t *fx = arg;
    job_t *job = DUET_NEW(job_t);
    CHECK(job != NULL);
    atomic_fetch_add(&fx->infinite_started, 1);
    /* A client may cancel before the callback is in place: that is reported
     * instead of a callback. */
    if (duet_rpc_call_on_cancel(call, on_cancel_count, fx) == DUET_ERR_CANCELLED)
        atomic_fetch_add(&fx->cancels, 1);
    job->call = call;
    job->fx = fx;
    fx_spawn(fx, infinite_writer_main, job);
}

/* Request: uint32 size; replies with that many bytes. */
static void h_big(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    uint32_t n;
    CHECK(len == sizeof(n));
    memcpy(&n, req, sizeof(n));
    uint8_t *buf = duet_calloc(1, n);
    CHECK(buf != NULL);
    duet_rpc_call_reply(call, buf, n);
    duet_free(buf);
}

static grpc_status_code check_cb(duet_rpc_call_t *call, void *arg, const char **msg_p)
{
    fx_t *fx = arg;
    size_t n = 0;
    const char *ua = duet_rpc_call_metadata(call, "user-agent", &n);
    if (ua && n > 0)
        atomic_fetch_add(&fx->checked, 1);
    if (strcmp(duet_rpc_call_method(call), M_DENIED) == 0) {
        *msg_p = "no key";
        return GRPC_STATUS_PERMISSION_DENIED;
    }
    return GRPC_STATUS_OK;
}

/* ---- fixture ---- */

/* servers defer the sends of application threads (defer_sends) */
static bool g_defer;

static duet_status_t fx_server_start(fx_t *fx, const char *addr, size_t max_msg, size_t queue)
{
    duet_rpc_server_config_t cfg;
    duet_status_t st;

    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = addr;
    cfg.n_threads = 2;
    if (max_msg)
        cfg.max_message_bytes = max_msg;
    if (queue)
        cfg.stream_queue_limit = queue;
    cfg.shutdown_grace_ms = 2000;
    cfg.check = check_cb;
    cfg.check_arg = fx;
    cfg.defer_sends = g_defer;
    st = duet_rpc_server_create(&cfg, &fx->srv);
    if (st != DUET_OK)
        return st;
    assert_int_equal(duet_rpc_server_add_method(fx->srv, M_UNARY, DUET_RPC_UNARY, h_unary, fx),
                     DUET_OK);
    assert_int_equal(duet_rpc_server_add_method(fx->srv, M_ASYNC, DUET_RPC_UNARY, h_async, fx),
                     DUET_OK);
    assert_int_equal(
        duet_rpc_server_add_method(fx->srv, M_STREAM, DUET_RPC_SERVER_STREAMING, h_stream, fx),
        DUET_OK);
    assert_int_equal(duet_rpc_server_add_method(fx->srv, M_FAIL, DUET_RPC_UNARY, h_fail, fx),
                     DUET_OK);
    assert_int_equal(duet_rpc_server_add_method(fx->srv, M_HANG, DUET_RPC_UNARY, h_hang, fx),
                     DUET_OK);
    assert_int_equal(
        duet_rpc_server_add_method(fx->srv, M_INFINITE, DUET_RPC_SERVER_STREAMING, h_infinite, fx),
        DUET_OK);
    assert_int_equal(duet_rpc_server_add_method(fx->srv, M_BIG, DUET_RPC_UNARY, h_big, fx),
                     DUET_OK);
    assert_int_equal(duet_rpc_server_add_method(fx->srv, M_DENIED, DUET_RPC_UNARY, h_unary, fx),
                     DUET_OK);
    /* Duplicates and bad paths are refused. */
    assert_int_equal(duet_rpc_server_add_method(fx->srv, M_UNARY, DUET_RPC_UNARY, h_unary, fx),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_rpc_server_add_method(fx->srv, "noslash", DUET_RPC_UNARY, h_unary, fx),
                     DUET_ERR_INVALID);
    assert_int_equal(duet_rpc_health_create(fx->srv, DUET_RPC_HEALTH_SERVING, &fx->health),
                     DUET_OK);
    assert_int_equal(duet_rpc_server_start(fx->srv), DUET_OK);
    fx->port = duet_rpc_server_port(fx->srv);
    assert_true(fx->port > 0);
    snprintf(fx->target, sizeof(fx->target), "127.0.0.1:%d", fx->port);
    return DUET_OK;
}

static void fx_join_spawned(fx_t *fx)
{
    pthread_mutex_lock(&fx->lock);
    int n = fx->n_spawned;
    fx->n_spawned = 0;
    pthread_mutex_unlock(&fx->lock);
    for (int i = 0; i < n; i++)
        pthread_join(fx->spawned[i], NULL);
}

static void fx_server_stop(fx_t *fx)
{
    duet_rpc_server_destroy(fx->srv);
    fx->srv = NULL;
    duet_rpc_health_destroy(fx->health);
    fx->health = NULL;
    fx_join_spawned(fx);
}

static fx_t *fx_create(size_t client_max_msg)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    duet_rpc_client_config_t ccfg;
    assert_non_null(fx);
    pthread_mutex_init(&fx->lock, NULL);
    assert_int_equal(fx_server_start(fx, "127.0.0.1:0", 1u << 20, 16), DUET_OK);
    duet_rpc_client_config_init(&ccfg);
    ccfg.n_threads = 2;
    if (client_max_msg)
        ccfg.max_message_bytes = client_max_msg;
    assert_int_equal(duet_rpc_client_create(&ccfg, &fx->cli), DUET_OK);
    return fx;
}

static void fx_destroy(fx_t *fx)
{
    duet_rpc_client_destroy(fx->cli);
    if (fx->srv)
        fx_server_stop(fx);
    fx_join_spawned(fx);
    pthread_mutex_destroy(&fx->lock);
    free(fx);
    assert_int_equal(atomic_load(&g_bad), 0);
}

/* ---- tests ---- */

static void test_status_mapping(void **state)
{
    (void)state;
    assert_int_equal(duet_rpc_status_to_grpc(DUET_OK), GRPC_STATUS_OK);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_INVALID), GRPC_STATUS_INVALID_ARGUMENT);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_NOT_FOUND), GRPC_STATUS_NOT_FOUND);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_EXHAUSTED), GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_TIMEOUT), GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_CANCELLED), GRPC_STATUS_CANCELLED);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_UNSUPPORTED), GRPC_STATUS_UNIMPLEMENTED);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_PEER), GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_SHUTDOWN), GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_CONFIG), GRPC_STATUS_FAILED_PRECONDITION);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_MISMATCH), GRPC_STATUS_FAILED_PRECONDITION);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_IO), GRPC_STATUS_INTERNAL);
    assert_int_equal(duet_rpc_status_to_grpc(DUET_ERR_NO_MEMORY), GRPC_STATUS_INTERNAL);
    assert_int_equal(duet_rpc_status_from_grpc(GRPC_STATUS_OK), DUET_OK);
    assert_int_equal(duet_rpc_status_from_grpc(GRPC_STATUS_UNAVAILABLE), DUET_ERR_PEER);
    assert_int_equal(duet_rpc_status_from_grpc(GRPC_STATUS_DEADLINE_EXCEEDED), DUET_ERR_TIMEOUT);
    assert_int_equal(duet_rpc_status_from_grpc(GRPC_STATUS_UNIMPLEMENTED), DUET_ERR_UNSUPPORTED);
    assert_int_equal(duet_rpc_status_from_grpc(GRPC_STATUS_FAILED_PRECONDITION), DUET_ERR_MISMATCH);
    assert_int_equal(duet_rpc_status_from_grpc(GRPC_STATUS_DATA_LOSS), DUET_ERR_INTERNAL);
    /* Every duet code survives a round trip where gRPC has a distinct code. */
    const duet_status_t round[] = {
        DUET_OK,           DUET_ERR_INVALID,   DUET_ERR_NOT_FOUND,   DUET_ERR_EXHAUSTED,
        DUET_ERR_TIMEOUT,  DUET_ERR_CANCELLED, DUET_ERR_UNSUPPORTED, DUET_ERR_PEER,
        DUET_ERR_MISMATCH, DUET_ERR_TOO_LONG,  DUET_ERR_INTERNAL};
    for (size_t i = 0; i < sizeof(round) / sizeof(round[0]); i++)
        assert_int_equal(duet_rpc_status_from_grpc(duet_rpc_status_to_grpc(round[i])), round[i]);
    assert_string_equal(duet_rpc_code_name(GRPC_STATUS_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
    assert_string_equal(duet_rpc_code_name((grpc_status_code)99), "UNKNOWN_CODE");
}

static void test_unary_echo(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    duet_rpc_result_t res;

    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, "hello", 5,
                                           duet_deadline_in_ms(5000), &res),
                     DUET_OK);
    assert_int_equal(res.code, GRPC_STATUS_OK);
    assert_int_equal(res.len, 5);
    assert_memory_equal(res.data, "hello", 5);
    duet_rpc_result_cleanup(&res);

    /* Empty request and reply (an all-default protobuf message is 0 bytes). */
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, NULL, 0,
                                           duet_deadline_in_ms(5000), &res),
                     DUET_OK);
    assert_int_equal(res.len, 0);
    assert_null(res.data);
    duet_rpc_result_cleanup(&res);

    /* Close to the 1 MiB server limit, many slices. */
    size_t big = (1u << 20) - 64;
    uint8_t *buf = duet_malloc(big);
    for (size_t i = 0; i < big; i++)
        buf[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, buf, big,
                                           duet_deadline_in_ms(10000), &res),
                     DUET_OK);
    assert_int_equal(res.len, big);
    assert_memory_equal(res.data, buf, big);
    duet_rpc_result_cleanup(&res);
    duet_free(buf);

    /* The admission check saw the metadata and can refuse. */
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_DENIED, "x", 1,
                                           duet_deadline_in_ms(5000), &res),
                     DUET_ERR_PEER);
    assert_int_equal(res.code, GRPC_STATUS_PERMISSION_DENIED);
    assert_string_equal(res.message, "no key");
    duet_rpc_result_cleanup(&res);
    assert_true(atomic_load(&fx->checked) >= 4);

    /* Local argument errors. */
    assert_int_equal(
        duet_rpc_client_unary(fx->cli, fx->target, "bad", "x", 1, duet_deadline_in_ms(5000), &res),
        DUET_ERR_INVALID);
    duet_rpc_result_cleanup(&res);

    /* The server frees a call when RECV_CLOSE completes, just after the
     * client has its reply. */
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 0, 5000));
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

typedef struct {
    fx_t *fx;
    int index;
    int ok;
} async_client_t;

static void *async_client_main(void *p)
{
    async_client_t *ac = p;
    char req[32], want[16];
    duet_rpc_result_t res;
    snprintf(req, sizeof(req), "%d:reply-%d", 20 + ac->index * 5, ac->index);
    snprintf(want, sizeof(want), "reply-%d", ac->index);
    duet_status_t st = duet_rpc_client_unary(ac->fx->cli, ac->fx->target, M_ASYNC, req, strlen(req),
                                             duet_deadline_in_ms(5000), &res);
    ac->ok = st == DUET_OK && res.len == strlen(want) && memcmp(res.data, want, res.len) == 0;
    duet_rpc_result_cleanup(&res);
    return NULL;
}

static void test_async_unary(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    enum { N = 8 };
    pthread_t th[N];
    async_client_t ac[N];

    int64_t t0 = duet_now_ns();
    for (int i = 0; i < N; i++) {
        ac[i] = (async_client_t){fx, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, async_client_main, &ac[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_true(ac[i].ok);
    }
    /* Concurrent, not serialised behind each other's delays (sum 440 ms). */
    assert_true(duet_now_ns() - t0 < 400 * DUET_NS_PER_MS);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_stream_many_in_order(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    duet_rpc_messages_t msgs;
    uint32_t n = 10000;

    assert_int_equal(duet_rpc_client_stream_collect(fx->cli, fx->target, M_STREAM, &n, sizeof(n),
                                                    duet_deadline_in_ms(30000), 20000, &msgs),
                     DUET_OK);
    assert_int_equal(msgs.code, GRPC_STATUS_OK);
    assert_int_equal(msgs.count, n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v;
        assert_int_equal(msgs.len[i], sizeof(v));
        memcpy(&v, msgs.data[i], sizeof(v));
        assert_int_equal(v, i);
    }
    duet_rpc_messages_cleanup(&msgs);
    /* The 16-entry queue filled and the writer waited: backpressure worked. */
    assert_true(atomic_load(&fx->exhausted) > 0);
    assert_int_equal(atomic_load(&fx->cq_wait_refused), 1);

    /* More than the caller accepts: cancelled with DUET_ERR_EXHAUSTED. */
    n = 500;
    assert_int_equal(duet_rpc_client_stream_collect(fx->cli, fx->target, M_STREAM, &n, sizeof(n),
                                                    duet_deadline_in_ms(30000), 100, &msgs),
                     DUET_ERR_EXHAUSTED);
    assert_int_equal(msgs.count, 100);
    duet_rpc_messages_cleanup(&msgs);
    assert_true(WAIT_FOR(atomic_load(&fx->stream_writers_done) == 2, 5000));
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_unimplemented_fast(void **state)
{
    (void)state;
    fx_t *fx = fx_create(0);
    duet_rpc_result_t res;
    duet_rpc_messages_t msgs;

    int64_t t0 = duet_now_ns();
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, "/test.Echo/Nope", "x", 1,
                                           duet_deadline_in_ms(20000), &res),
                     DUET_ERR_UNSUPPORTED);
    assert_int_equal(res.code, GRPC_STATUS_UNIMPLEMENTED);
    assert_non_null(strstr(res.message, "/test.Echo/Nope"));
    duet_rpc_result_cleanup(&res);
    assert_int_equal(duet_rpc_client_stream_collect(fx->cli, fx->target, "/other.Svc/Stream", "", 0,
                                                    duet_deadline_in_ms(20000), 10, &msgs),
                     DUET_ERR_UNSUPPORTED);
    assert_int_equal(msgs.code, GRPC_STATUS_UNIMPLEMENTED);
    duet_rpc_messages_cleanup(&msgs);
    assert_true(duet_now_ns() - t0 < 2 * DUET_NS_PER_S);
    fx_destroy(fx);
}

static void test_handler_fail(void **state)
{
    (void)state;
    fx_t *fx = fx_create(0);
    duet_rpc_result_t res;
    const char *req = "9:page size 16 != 32";

    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_FAIL, req, strlen(req),
                                           duet_deadline_in_ms(5000), &res),
                     DUET_ERR_MISMATCH);
    assert_int_equal(res.code, GRPC_STATUS_FAILED_PRECONDITION);
    assert_string_equal(res.message, "page size 16 != 32");
    assert_non_null(strstr(duet_error_msg(), "page size 16 != 32"));
    assert_null(res.data);
    duet_rpc_result_cleanup(&res);

    /* fail(OK) is a handler bug: the client gets INTERNAL, not a hang. */
    req = "0:oops";
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_FAIL, req, strlen(req),
                                           duet_deadline_in_ms(5000), &res),
                     DUET_ERR_INTERNAL);
    assert_int_equal(res.code, GRPC_STATUS_INTERNAL);
    duet_rpc_result_cleanup(&res);
    fx_destroy(fx);
}

static void test_deadline_cancels_handler(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    duet_rpc_result_t res;

    int64_t t0 = duet_now_ns();
    assert_int_equal(
        duet_rpc_client_unary(fx->cli, fx->target, M_HANG, "x", 1, duet_deadline_in_ms(300), &res),
        DUET_ERR_TIMEOUT);
    int64_t took = duet_now_ns() - t0;
    assert_int_equal(res.code, GRPC_STATUS_DEADLINE_EXCEEDED);
    duet_rpc_result_cleanup(&res);
    assert_true(took >= 250 * DUET_NS_PER_MS && took < 3 * DUET_NS_PER_S);
    /* The handler saw the deadline. */
    long long left = atomic_load(&fx->hang_deadline_left);
    /* gRPC rounds the timeout it sends up a little. */
    if (!(left > 100 * DUET_NS_PER_MS && left <= 400 * DUET_NS_PER_MS))
        print_error("deadline left at the handler: %lld ns\n", left);
    assert_true(left > 100 * DUET_NS_PER_MS && left <= 400 * DUET_NS_PER_MS);
    /* The server noticed and told the handler exactly once. */
    assert_true(WAIT_FOR(atomic_load(&fx->cancels) == 1, 5000));
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 0, 5000));
    sleep_ms(50);
    assert_int_equal(atomic_load(&fx->cancels), 1);
    assert_int_equal(atomic_load(&fx->cancel_fail_rc_bad), 0);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

typedef struct {
    atomic_int messages;
    atomic_int done;
    atomic_int code;
    atomic_int after_done;
} stream_rec_t;

static void rec_on_message(duet_rpc_stream_t *s, const uint8_t *data, size_t len, void *arg)
{
    stream_rec_t *r = arg;
    if (atomic_load(&r->done))
        atomic_fetch_add(&r->after_done, 1);
    atomic_fetch_add(&r->messages, 1);
}

static void rec_on_done(duet_rpc_stream_t *s, grpc_status_code code, const char *msg, void *arg)
{
    stream_rec_t *r = arg;
    atomic_store(&r->code, (int)code);
    atomic_fetch_add(&r->done, 1);
}

static void test_client_cancel_mid_stream(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    stream_rec_t rec;
    duet_rpc_stream_t *s = NULL;

    memset(&rec, 0, sizeof(rec));
    assert_int_equal(duet_rpc_client_stream(fx->cli, fx->target, M_INFINITE, NULL, 0,
                                            duet_deadline_in_ms(60000), rec_on_message, rec_on_done,
                                            &rec, &s),
                     DUET_OK);
    assert_true(WAIT_FOR(atomic_load(&rec.messages) >= 100, 10000));
    duet_rpc_stream_cancel(s);
    duet_rpc_stream_cancel(s); /* idempotent */
    assert_true(WAIT_FOR(atomic_load(&rec.done) == 1, 5000));
    assert_int_equal(atomic_load(&rec.code), GRPC_STATUS_CANCELLED);
    /* Server side: on_cancel once, later writes refused, finish reports it. */
    assert_true(WAIT_FOR(atomic_load(&fx->stream_writers_done) == 1, 10000));
    assert_int_equal(atomic_load(&fx->cancels), 1);
    assert_int_equal(atomic_load(&fx->write_after_cancel), 1);
    assert_int_equal(atomic_load(&fx->finish_after_cancel), 1);
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 0, 5000));
    duet_rpc_stream_cancel(s); /* after on_done: a no-op */
    sleep_ms(50);
    assert_int_equal(atomic_load(&rec.done), 1);
    assert_int_equal(atomic_load(&rec.after_done), 0);
    duet_rpc_stream_release(s);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_oversized_messages(void **state)
{
    (void)state;
    fx_t *fx = fx_create(8u << 20);
    duet_rpc_result_t res;
    size_t n = 2u << 20; /* server limit is 1 MiB */
    uint8_t *buf = duet_calloc(1, n);

    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, buf, n,
                                           duet_deadline_in_ms(10000), &res),
                     DUET_ERR_EXHAUSTED);
    assert_int_equal(res.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    duet_rpc_result_cleanup(&res);
    duet_free(buf);

    /* A reply larger than this client accepts. */
    duet_rpc_client_config_t ccfg;
    duet_rpc_client_t *small;
    duet_rpc_client_config_init(&ccfg);
    ccfg.max_message_bytes = 64 * 1024;
    assert_int_equal(duet_rpc_client_create(&ccfg, &small), DUET_OK);
    uint32_t want = 128 * 1024;
    assert_int_equal(duet_rpc_client_unary(small, fx->target, M_BIG, &want, sizeof(want),
                                           duet_deadline_in_ms(10000), &res),
                     DUET_ERR_EXHAUSTED);
    assert_int_equal(res.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    duet_rpc_result_cleanup(&res);
    want = 1000;
    assert_int_equal(duet_rpc_client_unary(small, fx->target, M_BIG, &want, sizeof(want),
                                           duet_deadline_in_ms(10000), &res),
                     DUET_OK);
    assert_int_equal(res.len, 1000);
    duet_rpc_result_cleanup(&res);
    duet_rpc_client_destroy(small);
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 0, 5000));
    fx_destroy(fx);
}

typedef struct {
    fx_t *fx;
    duet_status_t st;
    duet_rpc_result_t res;
} bg_call_t;

static void *bg_call_main(void *p)
{
    bg_call_t *bg = p;
    const char *req = "300:late but fine";
    bg->st = duet_rpc_client_unary(bg->fx->cli, bg->fx->target, M_ASYNC, req, strlen(req),
                                   duet_deadline_in_ms(10000), &bg->res);
    return NULL;
}

static void test_shutdown_with_inflight(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    enum { N = 3 };
    stream_rec_t rec[N];
    duet_rpc_stream_t *s[N];
    bg_call_t bg = {.fx = fx};
    pthread_t th;

    for (int i = 0; i < N; i++) {
        memset(&rec[i], 0, sizeof(rec[i]));
        assert_int_equal(duet_rpc_client_stream(fx->cli, fx->target, M_INFINITE, NULL, 0,
                                                duet_deadline_in_ms(60000), rec_on_message,
                                                rec_on_done, &rec[i], &s[i]),
                         DUET_OK);
    }
    for (int i = 0; i < N; i++)
        assert_true(WAIT_FOR(atomic_load(&rec[i].messages) > 0, 10000));
    assert_int_equal(pthread_create(&th, NULL, bg_call_main, &bg), 0);
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == N + 1, 5000));

    int64_t t0 = duet_now_ns();
    assert_int_equal(duet_rpc_server_shutdown(fx->srv, 800), DUET_ERR_TIMEOUT);
    int64_t took = duet_now_ns() - t0;
    assert_true(took >= 700 * DUET_NS_PER_MS && took < 5 * DUET_NS_PER_S);
    assert_int_equal(duet_rpc_server_active_calls(fx->srv), 0);
    /* The unary call finished inside the grace period. */
    pthread_join(th, NULL);
    assert_int_equal(bg.st, DUET_OK);
    assert_int_equal(bg.res.len, strlen("late but fine"));
    duet_rpc_result_cleanup(&bg.res);
    /* The streams were cancelled: handlers told, clients got an error. */
    assert_int_equal(atomic_load(&fx->cancels), N);
    for (int i = 0; i < N; i++) {
        assert_true(WAIT_FOR(atomic_load(&rec[i].done) == 1, 5000));
        assert_int_not_equal(atomic_load(&rec[i].code), GRPC_STATUS_OK);
        duet_rpc_stream_release(s[i]);
    }
    assert_true(WAIT_FOR(atomic_load(&fx->stream_writers_done) == N, 5000));
    assert_int_equal(atomic_load(&fx->finish_after_cancel), N);
    fx_server_stop(fx);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_graceful_shutdown(void **state)
{
    (void)state;
    fx_t *fx = fx_create(0);
    bg_call_t bg = {.fx = fx};
    pthread_t th;

    assert_int_equal(pthread_create(&th, NULL, bg_call_main, &bg), 0);
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 1, 5000));
    int64_t t0 = duet_now_ns();
    assert_int_equal(duet_rpc_server_shutdown(fx->srv, 10000), DUET_OK);
    assert_true(duet_now_ns() - t0 < 5 * DUET_NS_PER_S);
    pthread_join(th, NULL);
    assert_int_equal(bg.st, DUET_OK);
    duet_rpc_result_cleanup(&bg.res);
    /* Shut down twice is refused; destroy after shutdown is fine. */
    assert_int_equal(duet_rpc_server_shutdown(fx->srv, 0), DUET_ERR_INVALID);
    fx_destroy(fx);
}

static int free_port(void)
{
    duet_rpc_server_config_t cfg;
    duet_rpc_server_t *srv;
    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = "127.0.0.1:0";
    cfg.n_threads = 1;
    assert_int_equal(duet_rpc_server_create(&cfg, &srv), DUET_OK);
    int port = duet_rpc_server_port(srv);
    duet_rpc_server_destroy(srv); /* never started */
    return port;
}

static void test_no_server_unavailable_fast(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    duet_rpc_client_config_t ccfg;
    duet_rpc_client_t *cli;
    duet_rpc_result_t res;
    duet_rpc_messages_t msgs;
    char target[64];

    snprintf(target, sizeof(target), "127.0.0.1:%d", free_port());
    duet_rpc_client_config_init(&ccfg);
    assert_int_equal(duet_rpc_client_create(&ccfg, &cli), DUET_OK);
    for (int i = 0; i < 3; i++) {
        int64_t t0 = duet_now_ns();
        assert_int_equal(
            duet_rpc_client_unary(cli, target, M_UNARY, "x", 1, duet_deadline_in_ms(20000), &res),
            DUET_ERR_PEER);
        assert_int_equal(res.code, GRPC_STATUS_UNAVAILABLE);
        duet_rpc_result_cleanup(&res);
        assert_true(duet_now_ns() - t0 < 2 * DUET_NS_PER_S);
    }
    int64_t t0 = duet_now_ns();
    assert_int_equal(duet_rpc_client_stream_collect(cli, target, M_STREAM, "", 0,
                                                    duet_deadline_in_ms(20000), 10, &msgs),
                     DUET_ERR_PEER);
    assert_int_equal(msgs.code, GRPC_STATUS_UNAVAILABLE);
    duet_rpc_messages_cleanup(&msgs);
    assert_true(duet_now_ns() - t0 < 2 * DUET_NS_PER_S);

    /* A port that is taken cannot be bound twice (no SO_REUSEPORT sharing). */
    duet_rpc_server_config_t cfg;
    duet_rpc_server_t *a, *b;
    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = "127.0.0.1:0";
    assert_int_equal(duet_rpc_server_create(&cfg, &a), DUET_OK);
    snprintf(target, sizeof(target), "127.0.0.1:%d", duet_rpc_server_port(a));
    cfg.bind_addr = target;
    assert_int_equal(duet_rpc_server_create(&cfg, &b), DUET_ERR_IO);
    duet_rpc_server_destroy(a);

    duet_rpc_client_destroy(cli);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_server_restart_same_port(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    duet_rpc_result_t res;
    char addr[64];

    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, "a", 1,
                                           duet_deadline_in_ms(5000), &res),
                     DUET_OK);
    duet_rpc_result_cleanup(&res);
    fx_server_stop(fx);

    int64_t t0 = duet_now_ns();
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, "b", 1,
                                           duet_deadline_in_ms(20000), &res),
                     DUET_ERR_PEER);
    duet_rpc_result_cleanup(&res);
    assert_true(duet_now_ns() - t0 < 2 * DUET_NS_PER_S);

    /* Down long enough for the channel to back off past its first retry. */
    sleep_ms(1500);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", fx->port);
    int old_port = fx->port;
    assert_int_equal(fx_server_start(fx, addr, 1u << 20, 16), DUET_OK);
    assert_int_equal(fx->port, old_port);
    /* The cached channel reconnects; calls fail fast until it has. */
    int attempts = 0;
    duet_status_t st;
    t0 = duet_now_ns();
    do {
        attempts++;
        st = duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, "c", 1, duet_deadline_in_ms(5000),
                                   &res);
        if (st == DUET_OK) {
            assert_int_equal(res.len, 1);
            assert_memory_equal(res.data, "c", 1);
        } else {
            assert_int_equal(st, DUET_ERR_PEER);
            sleep_ms(20);
        }
        duet_rpc_result_cleanup(&res);
    } while (st != DUET_OK && duet_now_ns() - t0 < 5 * DUET_NS_PER_S);
    int64_t took = duet_now_ns() - t0;
    print_message("restart: reconnected after %d attempt(s), %.1f ms\n", attempts,
                  (double)took / 1e6);
    assert_int_equal(st, DUET_OK);
    /* A failed call resets the reconnect backoff: no waiting out a backoff
     * period (1 s here, gRPC's default would be up to 120 s). */
    assert_true(took < 300 * DUET_NS_PER_MS);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_client_destroy_cancels_streams(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    stream_rec_t rec;

    memset(&rec, 0, sizeof(rec));
    /* No handle kept: the stream lives on its own until on_done. */
    assert_int_equal(duet_rpc_client_stream(fx->cli, fx->target, M_INFINITE, NULL, 0,
                                            duet_deadline_in_ms(60000), rec_on_message, rec_on_done,
                                            &rec, NULL),
                     DUET_OK);
    assert_true(WAIT_FOR(atomic_load(&rec.messages) > 10, 10000));
    duet_rpc_client_destroy(fx->cli);
    fx->cli = NULL;
    assert_int_equal(atomic_load(&rec.done), 1);
    assert_int_equal(atomic_load(&rec.code), GRPC_STATUS_CANCELLED);
    assert_true(WAIT_FOR(atomic_load(&fx->cancels) == 1, 5000));
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 0, 5000));
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

typedef struct {
    fx_t *fx;
    int seed;
    int bad;
} stress_t;

static void *stress_main(void *p)
{
    stress_t *st = p;
    unsigned seed = (unsigned)st->seed;
    for (int i = 0; i < 40; i++) {
        stream_rec_t rec;
        duet_rpc_stream_t *s;
        memset(&rec, 0, sizeof(rec));
        if (duet_rpc_client_stream(st->fx->cli, st->fx->target, M_INFINITE, NULL, 0,
                                   duet_deadline_in_ms(30000), rec_on_message, rec_on_done, &rec,
                                   &s) != DUET_OK) {
            st->bad++;
            continue;
        }
        int wait_us = rand_r(&seed) % 3000;
        struct timespec ts = {0, wait_us * 1000L};
        nanosleep(&ts, NULL);
        duet_rpc_stream_cancel(s);
        if (!WAIT_FOR(atomic_load(&rec.done) == 1, 10000) ||
            atomic_load(&rec.code) != GRPC_STATUS_CANCELLED || atomic_load(&rec.after_done))
            st->bad++;
        duet_rpc_stream_release(s);
        sleep_ms(1);
        if (atomic_load(&rec.done) != 1)
            st->bad++;

        duet_rpc_result_t res;
        if (duet_rpc_client_unary(st->fx->cli, st->fx->target, M_UNARY, "ping", 4,
                                  duet_deadline_in_ms(10000), &res) != DUET_OK ||
            res.len != 4)
            st->bad++;
        duet_rpc_result_cleanup(&res);
    }
    return NULL;
}

/* Cancels racing the server at every stage of a stream's life. */
static void test_cancel_stress(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    enum { T = 4 };
    pthread_t th[T];
    stress_t st[T];

    for (int i = 0; i < T; i++) {
        st[i] = (stress_t){fx, i + 1, 0};
        assert_int_equal(pthread_create(&th[i], NULL, stress_main, &st[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(st[i].bad, 0);
    }
    /* Every stream the server saw was cancelled exactly once. */
    assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 0, 10000));
    int started = atomic_load(&fx->infinite_started);
    print_message("stress: %d of %d streams reached a handler\n", started, T * 40);
    assert_int_equal(atomic_load(&fx->cancels), started);
    assert_int_equal(atomic_load(&fx->stream_writers_done), started);
    assert_int_equal(atomic_load(&fx->finish_after_cancel), started);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

/* The streaming tests again with every send of the writer threads started
 * by the server's sender thread: order kept, backpressure, cancellation,
 * shutdown with streams in flight, nothing leaked. */
static void test_deferred_sends(void **state)
{
    g_defer = true;
    test_stream_many_in_order(state);
    test_client_cancel_mid_stream(state);
    test_shutdown_with_inflight(state);
    test_cancel_stress(state);
    g_defer = false;
}

/* Every allocation in client and server fails in turn: each call ends (no
 * hang until its deadline), nothing leaks, and service resumes. */
static void test_alloc_failures(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    fx_t *fx = fx_create(0);
    duet_rpc_result_t res;
    duet_rpc_messages_t msgs;
    int ok_unary = 0, ok_stream = 0;

    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, "warm", 4,
                                           duet_deadline_in_ms(5000), &res),
                     DUET_OK);
    duet_rpc_result_cleanup(&res);
    for (long n = 0; n < 24; n++) {
        uint32_t count = 3;
        int64_t t0 = duet_now_ns();
        duet_alloc_fail_after(n);
        duet_status_t su = duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, "hello", 5,
                                                 duet_deadline_in_ms(5000), &res);
        duet_status_t ss =
            duet_rpc_client_stream_collect(fx->cli, fx->target, M_STREAM, &count, sizeof(count),
                                           duet_deadline_in_ms(5000), 10, &msgs);
        duet_alloc_fail_after(-1);
        assert_true(duet_now_ns() - t0 < 4 * DUET_NS_PER_S);
        if (su == DUET_OK) {
            ok_unary++;
            assert_int_equal(res.len, 5);
            assert_memory_equal(res.data, "hello", 5);
        }
        if (ss == DUET_OK) {
            ok_stream++;
            assert_int_equal(msgs.count, 3);
        }
        duet_rpc_result_cleanup(&res);
        duet_rpc_messages_cleanup(&msgs);
        assert_true(WAIT_FOR(duet_rpc_server_active_calls(fx->srv) == 0, 5000));
    }
    /* Late in the sweep there is enough memory for everything. */
    assert_true(ok_unary > 0 && ok_stream > 0);
    assert_true(duet_alloc_failures() > 0);
    assert_int_equal(duet_rpc_client_unary(fx->cli, fx->target, M_UNARY, "after", 5,
                                           duet_deadline_in_ms(5000), &res),
                     DUET_OK);
    duet_rpc_result_cleanup(&res);
    fx_destroy(fx);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_bad_configs(void **state)
{
    (void)state;
    duet_rpc_server_config_t cfg;
    duet_rpc_server_t *srv = NULL;
    duet_rpc_client_config_t ccfg;
    duet_rpc_client_t *cli = NULL;

    duet_rpc_server_config_init(&cfg);
    cfg.n_threads = 0;
    assert_int_equal(duet_rpc_server_create(&cfg, &srv), DUET_ERR_INVALID);
    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = "not an address";
    assert_int_equal(duet_rpc_server_create(&cfg, &srv), DUET_ERR_IO);
    assert_null(srv);
    duet_rpc_client_config_init(&ccfg);
    ccfg.reconnect_backoff_ms = 1;
    assert_int_equal(duet_rpc_client_create(&ccfg, &cli), DUET_ERR_INVALID);
    assert_null(cli);
    duet_rpc_server_destroy(NULL);
    duet_rpc_client_destroy(NULL);
    duet_rpc_health_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_mapping),
        cmocka_unit_test(test_bad_configs),
        cmocka_unit_test(test_unary_echo),
        cmocka_unit_test(test_async_unary),
        cmocka_unit_test(test_stream_many_in_order),
        cmocka_unit_test(test_unimplemented_fast),
        cmocka_unit_test(test_handler_fail),
        cmocka_unit_test(test_deadline_cancels_handler),
        cmocka_unit_test(test_client_cancel_mid_stream),
        cmocka_unit_test(test_oversized_messages),
        cmocka_unit_test(test_shutdown_with_inflight),
        cmocka_unit_test(test_graceful_shutdown),
        cmocka_unit_test(test_no_server_unavailable_fast),
        cmocka_unit_test(test_server_restart_same_port),
        cmocka_unit_test(test_client_destroy_cancels_streams),
        cmocka_unit_test(test_cancel_stress),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_deferred_sends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
