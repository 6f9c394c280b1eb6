/* bench-serve's gRPC backend: duet.v1.Generate/Generate (duet-router), one
 * server stream a request over common/rpc.h.  Each TokenChunk message is a
 * chunk (timestamped on the client's completion-queue thread as it
 * arrives); its ids are the output tokens, and Finished gives the prompt
 * and completion counts. */
#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/rpc.h"
#include "common/rpc_pb.h"
#include "common/sync.h"
#include "duet/v1/generate.pb-c.h"
#include "tools/bench_serve/bench_serve.h"

typedef struct duet__gcall {
    size_t idx;
    size_t n_ids;
    long tokens;
    duet_bs_result_t *res;
    struct duet__gcall *next; /* on the done list */
    duet_bs_backend_t *be;
} duet__gcall_t;

struct duet_bs_backend {
    duet_bs_backend_config_t cfg;
    duet_rpc_client_t *cli;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    duet__gcall_t *done; /* finished, not yet reported */
};

static void duet__on_message(duet_rpc_stream_t *stream, const uint8_t *data, size_t len, void *arg)
{
    duet__gcall_t *c = arg;
    int64_t now = duet_now_ns();
    (void)stream;
    Duet__V1__GenerateResponse *r = duet__v1__generate_response__unpack(NULL, len, data);
    if (r == NULL) {
        duet_bs_result_fail(c->res, "a GenerateResponse that does not parse");
        return;
    }
    if (r->kind_case == DUET__V1__GENERATE_RESPONSE__KIND_CHUNK && r->chunk->n_ids > 0) {
        duet_bs_result_chunk(c->res, now);
        c->tokens += (long)r->chunk->n_ids;
    } else if (r->kind_case == DUET__V1__GENERATE_RESPONSE__KIND_FINISHED) {
        c->res->prompt_tokens = r->finished->prompt_tokens;
        c->res->output_tokens = r->finished->completion_tokens;
        c->res->usage = true;
        c->res->end_ns = now;
    }
    duet__v1__generate_response__free_unpacked(r, NULL);
}

static void duet__on_done(duet_rpc_stream_t *stream, grpc_status_code code, const char *msg,
                          void *arg)
{
    duet__gcall_t *c = arg;
    duet_bs_backend_t *be = c->be;
    (void)stream;
    if (c->res->end_ns == 0)
        c->res->end_ns = duet_now_ns();
    if (code != GRPC_STATUS_OK)
        duet_bs_result_fail(c->res, "gRPC %s: %.150s", duet_rpc_code_name(code), msg ? msg : "");
    else if (c->res->n_chunks == 0)
        duet_bs_result_fail(c->res, "no tokens streamed");
    if (!c->res->usage) {
        c->res->prompt_tokens = (long)c->n_ids;
        c->res->output_tokens = c->tokens;
    }
    pthread_mutex_lock(&be->mu);
    c->next = be->done;
    be->done = c;
    pthread_cond_signal(&be->cv);
    pthread_mutex_unlock(&be->mu);
}

static duet_status_t duet__grpc_create(const duet_bs_backend_config_t *cfg,
                                       duet_bs_backend_t **be_p)
{
    duet_rpc_client_config_t cc;
    duet_status_t st;
    duet_bs_backend_t *be = DUET_NEW(duet_bs_backend_t);
    if (be == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: backend");
    be->cfg = *cfg;
    duet_rpc_client_config_init(&cc);
    cc.n_threads = 2;
    if ((st = duet_rpc_client_create(&cc, &be->cli)) != DUET_OK) {
        duet_free(be);
        return st;
    }
    pthread_mutex_init(&be->mu, NULL);
    duet_cond_init_monotonic(&be->cv);
    *be_p = be;
    return DUET_OK;
}

static duet_status_t duet__grpc_start(duet_bs_backend_t *be, size_t idx, const duet_bs_req_t *req,
                                      duet_bs_result_t *res)
{
    Duet__V1__GenerateRequest g = DUET__V1__GENERATE_REQUEST__INIT;
    Duet__V1__SamplingParams sp = DUET__V1__SAMPLING_PARAMS__INIT;
    Duet__V1__TokenIds tids = DUET__V1__TOKEN_IDS__INIT;
    uint8_t *buf = NULL;
    size_t len = 0;
    char *text = NULL;
    duet_status_t st;
    duet__gcall_t *c = DUET_NEW(duet__gcall_t);

    memset(res, 0, sizeof(*res));
    res->ok = true;
    if (c == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: request %zu", idx);
    c->idx = idx;
    c->n_ids = req->n_ids;
    c->res = res;
    c->be = be;
    if (be->cfg.text_prompts) {
        if ((text = duet_bs_prompt_text(req->ids, req->n_ids)) == NULL) {
            st = duet_error(DUET_ERR_NO_MEMORY, "bench-serve: prompt %zu", idx);
            goto free_call;
        }
        g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TEXT;
        g.text = text;
    } else {
        tids.n_ids = req->n_ids;
        tids.ids = req->ids;
        g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
        g.token_ids = &tids;
    }
    sp.temperature = (float)be->cfg.temperature;
    g.sampling = &sp;
    g.max_tokens = (uint32_t)req->out_len;
    g.ignore_eos = be->cfg.ignore_eos;
    g.model = (char *)(be->cfg.model ? be->cfg.model : "");
    if ((st = duet_pb_pack(&g.base, &buf, &len)) != DUET_OK)
        goto free_call;
    res->start_ns = duet_now_ns();
    st = duet_rpc_client_stream(
        be->cli, be->cfg.target, "/duet.v1.Generate/Generate", buf, len,
        duet_deadline_in_ms(be->cfg.timeout_ms > 0 ? be->cfg.timeout_ms : -1), duet__on_message,
        duet__on_done, c, NULL);
    duet_free(buf);
    duet_free(text);
    if (st != DUET_OK)
        duet_free(c);
    return st;
free_call:
    duet_free(text);
    duet_free(c);
    return st;
}

static void duet__grpc_poll(duet_bs_backend_t *be, int64_t timeout_ns, duet_bs_done_cb done,
                            void *arg)
{
    duet__gcall_t *list;
    pthread_mutex_lock(&be->mu);
    if (be->done == NULL && timeout_ns > 0) {
        struct timespec ts = duet_deadline_timespec(duet_now_ns() + timeout_ns);
        pthread_cond_timedwait(&be->cv, &be->mu, &ts);
    }
    list = be->done;
    be->done = NULL;
    pthread_mutex_unlock(&be->mu);
    while (list != NULL) {
        duet__gcall_t *next = list->next;
        size_t idx = list->idx;
        duet_free(list);
        done(idx, arg);
        list = next;
    }
}

static void duet__grpc_destroy(duet_bs_backend_t *be)
{
    if (be == NULL)
        return;
    duet_rpc_client_destroy(be->cli); /* open streams end: on_done queues them */
    while (be->done != NULL) {
        duet__gcall_t *next = be->done->next;
        duet_free(be->done);
        be->done = next;
    }
    pthread_cond_destroy(&be->cv);
    pthread_mutex_destroy(&be->mu);
    duet_free(be);
}

const duet_bs_backend_ops_t duet_bs_grpc_ops = {
    .create = duet__grpc_create,
    .start = duet__grpc_start,
    .poll = duet__grpc_poll,
    .destroy = duet__grpc_destroy,
};
