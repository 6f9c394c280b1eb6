/* Colocated mode and conditional disaggregation (docs/design-notes.md
 * "Colocated mode and conditional disaggregation"): a decode instance
 * computes a prompt's KV into the request's own pages with its own engine
 * (its TP group), samples the first token the way a prefill daemon does
 * (output index 0 of the request's sampling stream), and hands the request
 * on exactly as if the KV had arrived: no link, no transfer, no Prefill
 * call.
 *
 * The decision is decode's, per request, at admission (pages held): the
 * instance's prefill_local mode; in "auto", local when the prompt is short
 * (prefill_local_max_tokens) and few sequences decode here
 * (prefill_local_max_running), since a local prefill stalls every running
 * sequence for its duration -- or when no prefill instance is known. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "decode/cache.h"
#include "decode/local_prefill.h"
#include "decode/lp.h"

/* A prefill instance the request could go to: its own target, or one with
 * an address in the config. */
static bool duet__remote_known(const duet_decode_t *dc, const duet_dc_req_t *req)
{
    const duet_cluster_config_t *c = dc->node.args.cluster;
    if (req->prefill_target[0] != '\0')
        return true;
    for (int i = 0; i < c->n_prefill; i++)
        if (c->prefill[i].address != NULL && c->prefill[i].address[0] != '\0')
            return true;
    return false;
}

bool duet_dc_local_wanted(duet_decode_t *dc, const duet_dc_req_t *req, int busy)
{
    const duet_instance_config_t *self = dc->node.args.self;
    /* the prefix cache held all it may: only the last page's tokens are
     * left, less than a prefill's transfer would cost (docs/prefix-cache.md) */
    if (duet_dc_cache_covers(dc, req) || req->recompute) /* (its KV transfer failed) */
        return true;
    switch (dc->local_mode) {
    case DUET_PREFILL_LOCAL_OFF:
        return false;
    case DUET_PREFILL_LOCAL_ALWAYS:
        return true;
    case DUET_PREFILL_LOCAL_AUTO:
        break;
    }
    if (req->local_asked || !duet__remote_known(dc, req))
        return true;
    return duet_dc_uncached_tokens(dc, req) <= self->prefill_local_max_tokens &&
           busy < self->prefill_local_max_running;
}

duet_status_t duet_dc_local_prefill(duet_decode_t *dc, duet_dc_req_t **reqs, int n,
                                    duet_dc_local_result_t *res)
{
    duet_status_t st;

    /* the decode step's arrays (max_seqs long): admission runs before the
     * step on this thread, so they are free here */
    for (int i = 0; i < n; i++) {
        duet_dc_req_t *req = reqs[i];
        int cached = req->n_prompt - duet_dc_uncached_tokens(dc, req);
        dc->seqs[i] = (duet_engine_seq_t){
            .tokens = req->prompt + cached,
            .n_tokens = req->n_prompt - cached,
            .start_pos = cached,
            .pages = req->pages,
            .n_pages = req->n_prompt_pages,
            .sample = true,
            .sampling = req->sampling,
            .sample_index = (uint64_t)req->first_index,
        };
        /* without memory for its logits it runs without; failed below */
        (void)duet_dc_lp_local_prepare(dc, req, &dc->seqs[i]);
    }
    pthread_mutex_lock(&dc->evlock);
    dc->prefills_local += (uint64_t)n;
    pthread_mutex_unlock(&dc->evlock);
    st = duet_engine_forward(dc->node.ke.engine, dc->seqs, n, dc->sampled);
    if (st != DUET_OK)
        return st;
    for (int i = 0; i < n; i++) {
        duet_dc_req_t *req = reqs[i];
        res[i].status = DUET_OK;
        res[i].msg[0] = '\0';
        if (dc->sampled[i] == DUET_ENGINE_NONFINITE) {
            /* broken weights: this request fails, not the daemon (as prefill) */
            res[i].status = DUET_ERR_INTERNAL;
            snprintf(res[i].msg, sizeof(res[i].msg),
                     "non-finite logits (NaN or inf) at the first output token: the model's "
                     "weights or activations are broken");
            continue;
        }
        req->kv_first_token = dc->sampled[i];
        if (duet_dc_lp_local_compute(dc, req, dc->sampled[i]) != DUET_OK) {
            res[i].status = DUET_ERR_NO_MEMORY;
            snprintf(res[i].msg, sizeof(res[i].msg), "%s", duet_error_msg());
            continue;
        }
        DUET_LOG_DEBUG("decode: %s prefilled locally (%d tokens)", req->request_id, req->n_prompt);
    }
    return DUET_OK;
}
