/* duet.v1.Prefill: Bootstrap, Prefill, Abort, Info.  Requests are validated
 * here, before anything is queued. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/pb_strings.h"
#include "common/rpc_pb.h"
#include "duet/v1/prefill.pb-c.h"
#include "engine/tp.h"
#include "node/info.h"
#include "prefill/prefill.h"
#include "transfer/xfer_pack.h"

static void duet__pf_prefill_on_cancel(duet_rpc_call_t *call, void *arg)
{
    duet_pf_req_t *req = arg;
    /* no locks here (common/rpc.h): the scheduler sees the flag */
    req->aborted = true;
}

/* Until the engine is up only health answers. */
static bool duet__pf_not_ready(duet_prefill_t *pf, duet_rpc_call_t *call)
{
    if (atomic_load(&pf->node.ready))
        return false;
    duet_rpc_call_fail(call, GRPC_STATUS_UNAVAILABLE, "prefill is starting");
    return true;
}

static duet_status_t duet__pf_sampling_parse(const Duet__V1__SamplingParams *sp,
                                             duet_sampling_t *out)
{
    *out = duet_sampling_greedy();
    if (sp != NULL) {
        out->temperature = sp->temperature;
        out->top_k = sp->top_k;
        out->top_p = sp->top_p > 0 ? sp->top_p : 1.0f;
        out->seed = sp->seed;
    }
    return duet_sampling_check(out);
}

static duet_status_t
duet__pf_prefill_validate(duet_prefill_t *pf, const Duet__V1__PrefillRequest *m, duet_pf_req_t *req)
{
    const duet_model_config_t *cfg = &pf->node.ke.model_cfg;
    int ps = pf->node.args.cluster->page_size;
    duet_status_t st;

    if (m->request_id == NULL || m->request_id[0] == '\0' ||
        strlen(m->request_id) >= sizeof(req->request_id))
        return duet_error(DUET_ERR_INVALID, "request_id must be 1..%zu bytes",
                          sizeof(req->request_id) - 1);
    snprintf(req->request_id, sizeof(req->request_id), "%s", m->request_id);
    if (m->transfer_id == 0)
        return duet_error(DUET_ERR_INVALID, "%s: transfer_id must be set", m->request_id);
    if (m->n_prompt_ids == 0)
        return duet_error(DUET_ERR_INVALID, "%s: empty prompt", m->request_id);
    /* a migrated stream's resumed output counts against the context only */
    int64_t pmax = (int64_t)duet_limit_prompt_tokens(pf->node.args.cluster, cfg->max_pos) +
                   m->first_output_index;
    int prompt_max = pmax < cfg->max_pos ? (int)pmax : cfg->max_pos;
    if (m->n_prompt_ids > (size_t)prompt_max)
        return duet_error(DUET_ERR_TOO_LONG,
                          "%s: prompt_ids: %zu tokens, at most %d are allowed (%s)", m->request_id,
                          m->n_prompt_ids, prompt_max,
                          prompt_max < cfg->max_pos                ? "router.max_prompt_tokens"
                          : pf->node.args.cluster->max_context > 0 ? "the context, kv.max_context"
                                                                   : "the model context");
    for (size_t i = 0; i < m->n_prompt_ids; i++) {
        if (m->prompt_ids[i] < 0 || m->prompt_ids[i] >= cfg->vocab)
            return duet_error(DUET_ERR_INVALID, "%s: token id %d out of range 0..%d", m->request_id,
                              m->prompt_ids[i], cfg->vocab - 1);
    }
    size_t all = (m->n_prompt_ids + (size_t)ps - 1) / (size_t)ps;
    int skip_max = duet_kv_prefix_lookup_pages((int)m->n_prompt_ids, ps);
    if (m->cached_pages > (uint32_t)skip_max)
        return duet_error(DUET_ERR_INVALID,
                          "%s: cached_pages %u: a prompt of %zu tokens has at most %d cached "
                          "pages (its last token is always computed)",
                          m->request_id, m->cached_pages, m->n_prompt_ids, skip_max);
    size_t pages = all - m->cached_pages;
    if (m->n_dst_pages != pages)
        return duet_error(DUET_ERR_INVALID,
                          "%s: %zu destination pages for %zu tokens with %u cached (need %zu)",
                          m->request_id, m->n_dst_pages, m->n_prompt_ids, m->cached_pages, pages);
    /* one that can never fit is refused now, not queued (docs/limits.md) */
    if ((int)all > duet_kv_pool_total(pf->node.pages))
        return duet_error(DUET_ERR_INVALID,
                          "%s: the prompt needs %zu KV pages (%zu tokens), this prefill's pool "
                          "holds %d pages of %d tokens (n_pages)",
                          m->request_id, all, m->n_prompt_ids, duet_kv_pool_total(pf->node.pages),
                          ps);
    if (m->packed && duet_engine_kv_mirrored(pf->node.ke.engine))
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: packed transfer asked, but this prefill moves KV through its host "
                          "mirror (transfer path %s)",
                          m->request_id, pf->node.ke.path);
    if (m->packed && m->dst_stage_page < 0)
        return duet_error(DUET_ERR_INVALID, "%s: dst_stage_page %d is negative", m->request_id,
                          (int)m->dst_stage_page);
    req->packed = m->packed;
    req->dst_stage0 = m->packed ? m->dst_stage_page : -1;
    /* (chunks of a whole request or more: one transfer) */
    req->chunk_pages =
        m->packed && m->chunk_pages > 0 && m->chunk_pages < pages ? (int)m->chunk_pages : 0;
    /* (a count past the last layer asks for nothing: the transfer layer
     * never announces the end) */
    req->progress_layers =
        m->packed && m->kv_progress_layers <= INT32_MAX ? (int)m->kv_progress_layers : 0;
    if ((st = duet__pf_sampling_parse(m->sampling, &req->sampling)) != DUET_OK)
        return duet_error_wrap(st, "%s: ", m->request_id);
    req->first_index = m->first_output_index;
    req->announce_start = m->announce_start;
    if ((m->logprobs || m->prompt_logprobs) &&
        (st = duet_logprob_params_check(m->top_logprobs > INT32_MAX ? -1 : (int)m->top_logprobs,
                                        m->prompt_logprobs, (int)m->n_prompt_ids, cfg->vocab)) !=
            DUET_OK)
        return duet_error_wrap(st, "%s: ", m->request_id);
    req->logprobs = m->logprobs;
    req->prompt_logprobs = m->prompt_logprobs;
    req->top_logprobs = (int)m->top_logprobs;
    req->n_prompt = (int)m->n_prompt_ids;
    req->skip = (int)m->cached_pages;
    req->transfer_id = m->transfer_id;
    req->prompt = duet_malloc(m->n_prompt_ids * sizeof(int32_t));
    req->dst_pages = duet_malloc(pages * sizeof(int32_t));
    if (req->prompt == NULL || req->dst_pages == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", m->request_id);
    memcpy(req->prompt, m->prompt_ids, m->n_prompt_ids * sizeof(int32_t));
    memcpy(req->dst_pages, m->dst_pages, pages * sizeof(int32_t));
    req->link = duet_node_link_find(&pf->node, m->decode_id ? m->decode_id : "", true);
    if (req->link == NULL)
        return duet_error(DUET_ERR_MISMATCH,
                          "%s: decode %s has not bootstrapped with this prefill (or its "
                          "transfer connection failed): bootstrap again",
                          m->request_id, m->decode_id ? m->decode_id : "?");
    for (size_t i = 0; i < pages; i++) {
        if (req->dst_pages[i] < 0)
            return duet_error(DUET_ERR_INVALID, "%s: negative destination page", m->request_id);
    }
    if (req->packed) {
        /* the staging this request takes on every rank (transfer/xfer_pack.h) */
        int total = pf->node.stage != NULL ? duet_kv_pool_total(pf->node.stage) : 0;
        if (total == 0 || req->link->plan == NULL)
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: packed transfer asked, but this prefill has %s", m->request_id,
                              total == 0 ? "no staging arena (stage_pages)"
                                         : "no slice plan for that decode yet");
        const duet_kv_layout_t *l = duet_engine_kv_layout(pf->node.ke.engine);
        for (int s = 0; s < pf->node.ke.tp; s++) {
            const duet_slice_run_t *runs;
            int n_runs = duet_slice_plan_src_runs(req->link->plan, s, &runs);
            int staged = req->chunk_pages > 0 ? req->chunk_pages : (int)pages;
            int units = duet_xfer_pack_units(l, staged, duet_xfer_pack_slots(runs, n_runs));
            req->stage_units = units > req->stage_units ? units : req->stage_units;
        }
        if (req->stage_units > total)
            return duet_error(DUET_ERR_EXHAUSTED,
                              "%s: a packed transfer needs %d staging units, this prefill has %d "
                              "(stage_pages)",
                              m->request_id, req->stage_units, total);
    }
    return DUET_OK;
}

static void duet__pf_prefill_serve(duet_rpc_call_t *call, const uint8_t *data, size_t len,
                                   void *arg)
{
    duet_prefill_t *pf = arg;
    Duet__V1__PrefillRequest *m = duet__v1__prefill_request__unpack(NULL, len, data);
    duet_pf_req_t *req = DUET_NEW(duet_pf_req_t);
    duet_status_t st;

    if (duet__pf_not_ready(pf, call))
        goto out;
    if (duet_pb_check_nul(&duet__v1__prefill_request__descriptor, data, len) != DUET_OK) {
        duet_rpc_call_fail_status(call, DUET_ERR_INVALID, duet_error_msg());
        goto out;
    }
    if (m == NULL || req == NULL) {
        duet_rpc_call_fail(call, m ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INVALID_ARGUMENT,
                           m ? "no memory" : "malformed PrefillRequest");
        goto out;
    }
    req->call = call;
    req->src_stage0 = -1;
    if ((st = duet__pf_prefill_validate(pf, m, req)) != DUET_OK) {
        duet_rpc_call_fail_status(call, st, duet_error_msg());
        duet_pf_req_free(pf, req);
        req = NULL;
        goto out;
    }
    /* before anything is queued: only the pages decode granted */
    if ((st = duet_pf_grant_check(pf, m, req)) != DUET_OK) {
        DUET_LOG_WARN("prefill: Prefill from %s: %s", m->decode_id, duet_error_msg());
        duet_rpc_call_fail(call,
                           st == DUET_ERR_EXHAUSTED ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                                    : GRPC_STATUS_PERMISSION_DENIED,
                           duet_error_msg());
        duet_pf_req_free(pf, req);
        req = NULL;
        goto out;
    }
    /* already cancelled: on_cancel will not run, so flag it here */
    if (duet_rpc_call_on_cancel(call, duet__pf_prefill_on_cancel, req) != DUET_OK)
        req->aborted = true;
    duet_pf_submit(pf, req);
    req = NULL;
out:
    duet_free(req);
    if (m != NULL)
        duet__v1__prefill_request__free_unpacked(m, NULL);
}

static void duet__pf_abort_serve(duet_rpc_call_t *call, const uint8_t *data, size_t len, void *arg)
{
    duet_prefill_t *pf = arg;
    if (duet__pf_not_ready(pf, call))
        return;
    Duet__V1__AbortRequest *m = duet__v1__abort_request__unpack(NULL, len, data);
    Duet__V1__AbortResponse resp = DUET__V1__ABORT_RESPONSE__INIT;

    if (m == NULL) {
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "malformed AbortRequest");
        return;
    }
    resp.found = duet_pf_abort(pf, m->caller_id ? m->caller_id : "", m->transfer_id);
    DUET_LOG_DEBUG("prefill: Abort from %s for transfer %llu: %s", m->caller_id ? m->caller_id : "",
                   (unsigned long long)m->transfer_id, resp.found ? "found" : "not found");
    duet__v1__abort_request__free_unpacked(m, NULL);
    duet_pb_reply(call, &resp.base);
}

static void duet__pf_info_serve(duet_rpc_call_t *call, const uint8_t *data, size_t len, void *arg)
{
    duet_prefill_t *pf = arg;
    Duet__V1__InfoResponse r = DUET__V1__INFO_RESPONSE__INIT;
    if (duet__pf_not_ready(pf, call))
        return;

    duet_node_info_fill(&pf->node, &r);
    pthread_mutex_lock(&pf->lock);
    r.queue_depth = (uint32_t)pf->n_queued;
    r.running = (uint32_t)pf->n_inflight;
    r.requests_total = pf->requests_total;
    r.requests_failed = pf->requests_failed;
    r.queue_tokens = pf->queue_tokens > 0 ? (uint64_t)pf->queue_tokens : 0;
    r.prefill_tokens_per_s = pf->tokens_per_s;
    r.prompt_tokens_mean = (uint32_t)(pf->prompt_mean + 0.5);
    pthread_mutex_unlock(&pf->lock);
    duet_pb_reply(call, &r.base);
}

static void duet__pf_bootstrap_serve(duet_rpc_call_t *call, const uint8_t *data, size_t len,
                                     void *arg)
{
    if (!duet__pf_not_ready(arg, call))
        duet_node_link_serve_bootstrap(&((duet_prefill_t *)arg)->node, call, data, len);
}

duet_status_t duet_pf_service_register(duet_prefill_t *pf)
{
    static const struct {
        const char *path;
        duet_rpc_handler_cb cb;
    } methods[] = {
        {"/duet.v1.Prefill/Bootstrap", duet__pf_bootstrap_serve},
        {"/duet.v1.Prefill/Prefill", duet__pf_prefill_serve},
        {"/duet.v1.Prefill/Abort", duet__pf_abort_serve},
        {"/duet.v1.Prefill/Info", duet__pf_info_serve},
    };
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        /* Prefill is served as a stream: a call with announce_start gets
         * a {started} message before its reply (the rest are unary on
         * the wire either way) */
        duet_status_t st = duet_rpc_server_add_method(
            pf->node.srv, methods[i].path,
            methods[i].cb == duet__pf_prefill_serve ? DUET_RPC_SERVER_STREAMING : DUET_RPC_UNARY,
            methods[i].cb, pf);
        if (st != DUET_OK)
            return st;
    }
    return DUET_OK;
}

duet_status_t duet_pf_validate(duet_prefill_t *pf, const Duet__V1__PrefillRequest *m,
                               duet_pf_req_t *req)
{
    return duet__pf_prefill_validate(pf, m, req);
}
