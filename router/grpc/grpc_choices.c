/* The choices of one duet.v1.Generate call (docs/api-logprobs.md "gRPC"):
 * `n` jobs, one per choice, like HTTP's fan-out (http_choice.c).
 *
 * n = 1: decode's messages are forwarded as they came and its `finished`
 * message is the reply (the stream as before `n` existed).  n > 1: every
 * chunk and each choice's `finished` is re-encoded with the choice's
 * `index`; chunks of several choices interleave; the stream ends with OK
 * once every choice finished.  Choices 1..n-1 follow choice 0
 * (duet_router_job_start_after: fork-style sharing of the prompt's pages).
 * The first failure ends the call: the other choices are cancelled and,
 * once all ended, the call fails with that status.
 *
 * The call state is reference-counted: the handler holds one while it
 * starts the jobs, each started job's sink one until its on_end, a running
 * on_cancel one.  Its lock is never held while calling into a job or the
 * call's terminal function (on_cancel may end a job synchronously). */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "router/grpc/grpc_internal.h"

typedef struct duet__gcall duet__gcall_t;

typedef struct {
    duet__gcall_t *g;
    uint32_t index;
    duet_router_job_t *job; /* the creator's reference, until the call state goes */
    bool ended;             /* under g->lock */
} duet__gchoice_t;

struct duet__gcall {
    duet_router_t *rt;
    duet_rpc_call_t *call;
    atomic_int refs;
    uint32_t n;
    pthread_mutex_t lock; /* the fields below and the choices' `ended` */
    uint32_t n_ended;
    bool failed;
    grpc_status_code code;
    char msg[320];
    duet__gchoice_t ch[]; /* [n] */
};

static void duet__gcall_unref(duet__gcall_t *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    for (uint32_t i = 0; i < g->n; i++)
        duet_router_job_release(g->ch[i].job);
    pthread_mutex_destroy(&g->lock);
    duet_free(g);
}

/* Write resp to the call; false when the client cannot keep up (or no
 * memory). */
static bool duet__write(duet__gcall_t *g, const Duet__V1__GenerateResponse *resp)
{
    uint8_t stack[1024], *buf = stack;
    size_t len = duet__v1__generate_response__get_packed_size(resp);
    bool ok;

    if (len > sizeof(stack) && (buf = duet_malloc(len)) == NULL)
        return false;
    duet__v1__generate_response__pack(resp, buf);
    ok = duet_rpc_call_write(g->call, buf, len) != DUET_ERR_EXHAUSTED;
    if (buf != stack)
        duet_free(buf);
    return ok;
}

static bool duet__gchoice_on_chunk(void *arg, const Duet__V1__TokenChunk *chunk, const uint8_t *raw,
                                   size_t len)
{
    duet__gchoice_t *c = arg;
    duet__gcall_t *g = c->g;
    Duet__V1__GenerateResponse resp = DUET__V1__GENERATE_RESPONSE__INIT;
    Duet__V1__TokenChunk mine;

    if (g->n == 1) /* as decode sent it */
        return duet_rpc_call_write(g->call, raw, len) != DUET_ERR_EXHAUSTED;
    pthread_mutex_lock(&g->lock);
    bool failed = g->failed; /* the others are being cancelled */
    pthread_mutex_unlock(&g->lock);
    if (failed)
        return true;
    mine = *chunk; /* shallow: only index differs */
    mine.index = c->index;
    resp.kind_case = DUET__V1__GENERATE_RESPONSE__KIND_CHUNK;
    resp.chunk = &mine;
    return duet__write(g, &resp);
}

/* n > 1: a choice's finished message, with its index. */
static void duet__write_finished(duet__gchoice_t *c, const uint8_t *raw, size_t len)
{
    Duet__V1__GenerateResponse *resp = duet__v1__generate_response__unpack(NULL, len, raw);

    if (resp == NULL || resp->kind_case != DUET__V1__GENERATE_RESPONSE__KIND_FINISHED) {
        DUET_LOG_WARN("request choice %u: unreadable finished message", c->index);
    } else {
        resp->finished->index = c->index;
        if (!duet__write(c->g, resp))
            DUET_LOG_WARN("choice %u: its finished message did not fit the stream", c->index);
    }
    if (resp != NULL)
        duet__v1__generate_response__free_unpacked(resp, NULL);
}

static void duet__gchoice_on_end(void *arg, const duet_router_job_end_t *end)
{
    duet__gchoice_t *c = arg;
    duet__gcall_t *g = c->g;
    duet_router_job_t *others[DUET_ROUTER_OAI_CHOICES_MAX];
    uint32_t n_others = 0;

    /* its finished message goes out before it counts as ended: the last
     * choice's end finishes the stream after every queued message */
    pthread_mutex_lock(&g->lock);
    bool failed = g->failed;
    pthread_mutex_unlock(&g->lock);
    if (end->ok && !failed && g->n > 1)
        duet__write_finished(c, end->raw, end->raw_len);
    pthread_mutex_lock(&g->lock);
    c->ended = true;
    bool last = ++g->n_ended == g->n;
    if (!end->ok && !g->failed) {
        g->failed = true;
        g->code = end->code;
        snprintf(g->msg, sizeof(g->msg), "%s", end->message ? end->message : "");
        for (uint32_t i = 0; i < g->n && n_others < DUET_ROUTER_OAI_CHOICES_MAX; i++)
            if (!g->ch[i].ended)
                others[n_others++] = g->ch[i].job;
    }
    failed = g->failed;
    pthread_mutex_unlock(&g->lock);
    /* the jobs stay referenced by g, which this sink's reference keeps */
    for (uint32_t i = 0; i < n_others; i++)
        duet_router_job_cancel(others[i]);
    if (last) {
        duet_router_metrics_grpc(&g->rt->metrics, failed ? g->code : GRPC_STATUS_OK);
        if (failed)
            duet_rpc_call_fail(g->call, g->code, g->msg);
        else if (g->n == 1)
            duet_rpc_call_reply(g->call, end->raw, end->raw_len);
        else
            duet_rpc_call_finish(g->call, GRPC_STATUS_OK, NULL);
    }
    duet__gcall_unref(g); /* the sink's */
}

static const duet_router_sink_t duet__gchoice_sink = {duet__gchoice_on_chunk, duet__gchoice_on_end};

static void duet__gcall_on_cancel(duet_rpc_call_t *call, void *arg)
{
    duet__gcall_t *g = arg;

    (void)call;
    /* a job may end right here (queued, waiting): g stays until we let go */
    atomic_fetch_add(&g->refs, 1);
    for (uint32_t i = 0; i < g->n; i++)
        duet_router_job_cancel(g->ch[i].job);
    duet__gcall_unref(g);
}

void duet_router_grpc_run(duet_router_t *rt, duet_rpc_call_t *call,
                          const Duet__V1__GenerateRequest *in, int64_t deadline_ns)
{
    uint32_t n = in->n > 1 ? in->n : 1, started = 0;
    duet__gcall_t *g = duet_malloc(sizeof(*g) + n * sizeof(g->ch[0]));
    grpc_status_code code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    const char *msg = "out of memory";
    duet_status_t st = DUET_OK;

    if (g == NULL)
        goto fail_call;
    memset(g, 0, sizeof(*g) + n * sizeof(g->ch[0]));
    g->rt = rt;
    g->call = call;
    g->n = n;
    atomic_init(&g->refs, 1); /* the handler's */
    pthread_mutex_init(&g->lock, NULL);
    /* decode sees one choice: its own request id and seed, no n */
    for (uint32_t i = 0; i < n && st == DUET_OK; i++) {
        g->ch[i].g = g;
        g->ch[i].index = i;
        st = duet_router_job_create_choice(rt, in, in->request_id, (int)i, (int)n, deadline_ns,
                                           &duet__gchoice_sink, &g->ch[i], &g->ch[i].job);
    }
    if (st != DUET_OK)
        goto fail_call;
    if (duet_rpc_call_on_cancel(call, duet__gcall_on_cancel, g) != DUET_OK) {
        code = GRPC_STATUS_CANCELLED;
        msg = "cancelled";
        goto fail_call;
    }
    for (; started < n; started++) {
        atomic_fetch_add(&g->refs, 1); /* the sink's, dropped by on_end */
        st = started == 0 ? duet_router_job_start(g->ch[0].job)
                          : duet_router_job_start_after(g->ch[started].job, g->ch[0].job);
        if (st != DUET_OK) {
            atomic_fetch_sub(&g->refs, 1);
            break;
        }
    }
    if (st != DUET_OK) {
        code = duet_router_job_start_code(st);
        msg = duet_error_msg();
        if (started == 0) /* nothing runs: answer now */
            goto fail_call;
        /* the running ones end the call: this failure is its status */
        duet_router_job_end_t end = {.ok = false, .code = code, .message = msg};
        for (uint32_t i = started; i < n; i++) {
            atomic_fetch_add(&g->refs, 1);
            duet__gchoice_on_end(&g->ch[i], &end);
        }
    }
    duet__gcall_unref(g); /* the handler's */
    return;

fail_call:
    duet_router_metrics_grpc(&rt->metrics, code);
    duet_rpc_call_fail(call, code, msg); /* after this on_cancel cannot run */
    if (g != NULL)
        duet__gcall_unref(g);
}
