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
 * (prefill_local_max_running), since a local prefill slows every running
 * sequence -- or when no prefill instance is known.
 *
 * Chunked prefill (prefill_chunk_tokens > 0, the default): a LOCAL
 * request's prompt is computed in the decode steps, up to chunk_tokens
 * prompt tokens of local prefills per step in the same engine forward as
 * the running sequences (1 token each), so that no step waits for a whole
 * prompt.  A chunk is a sequence starting where the request's pages end;
 * the last one samples the first token.  With 0, admission prefills each
 * prompt whole in its own forward before the step (duet_dc_local_prefill). */
#include <limits.h>
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

int duet_dc_local_chunk(duet_decode_t *dc, duet_dc_req_t *req, int max, duet_engine_seq_t *seq)
{
    int start = req->n_prompt - duet_dc_uncached_tokens(dc, req);
    int n = req->n_prompt - req->local_done;

    if (n > max)
        n = max;
    bool last = req->local_done + n == req->n_prompt;
    /* a chunk is a sequence whose start_pos is what its pages hold so far;
     * only the last samples, at the request's first output index (0, or
     * where a migrated stream resumes: docs/migration.md) as a whole
     * prompt does */
    *seq = (duet_engine_seq_t){
        .tokens = req->prompt + req->local_done,
        .n_tokens = n,
        .start_pos = req->local_done,
        .pages = req->pages,
        .n_pages = req->n_prompt_pages,
        .sample = last,
        .sampling = req->sampling,
        .sample_index = (uint64_t)req->first_index,
    };
    /* without memory for its logits it runs without; its last chunk fails */
    (void)duet_dc_lp_local_prepare(dc, req, seq, req->local_done == start, last);
    return n;
}

int duet_dc_local_chunks(duet_decode_t *dc, int n_running, int max, duet_dc_req_t **reqs,
                         duet_engine_seq_t *seqs)
{
    int budget = dc->node.args.self->max_batch_tokens - n_running, n = 0;

    /* the step's tokens fit one engine chunk where they can; a local
     * prefill always makes progress */
    if (budget > dc->chunk_tokens)
        budget = dc->chunk_tokens;
    if (budget < 1)
        budget = 1;
    for (duet_dc_req_t *r = dc->local_head; r != NULL && budget > 0 && n < max; r = r->next) {
        budget -= duet_dc_local_chunk(dc, r, budget, &seqs[n]);
        reqs[n++] = r;
    }
    pthread_mutex_lock(&dc->evlock);
    dc->chunks_local += (uint64_t)n;
    pthread_mutex_unlock(&dc->evlock);
    return n;
}

void duet_dc_local_first(duet_decode_t *dc, duet_dc_req_t *req, int32_t sampled,
                         duet_dc_local_result_t *res)
{
    res->status = DUET_OK;
    res->msg[0] = '\0';
    if (sampled == DUET_ENGINE_NONFINITE) {
        /* broken weights: this request fails, not the daemon (as prefill) */
        res->status = DUET_ERR_INTERNAL;
        snprintf(res->msg, sizeof(res->msg),
                 "non-finite logits (NaN or inf) at the first output token: the model's "
                 "weights or activations are broken");
        return;
    }
    req->kv_first_token = sampled;
    if (duet_dc_lp_local_compute(dc, req, sampled) != DUET_OK) {
        res->status = DUET_ERR_NO_MEMORY;
        snprintf(res->msg, sizeof(res->msg), "%s", duet_error_msg());
        return;
    }
    DUET_LOG_DEBUG("decode: %s prefilled locally (%d tokens)", req->request_id, req->n_prompt);
}

duet_status_t duet_dc_local_prefill(duet_decode_t *dc, duet_dc_req_t **reqs, int n,
                                    duet_dc_local_result_t *res)
{
    duet_status_t st;

    /* the decode step's arrays (max_seqs long): admission runs before the
     * step on this thread, so they are free here */
    for (int i = 0; i < n; i++)
        (void)duet_dc_local_chunk(dc, reqs[i], INT_MAX, &dc->seqs[i]);
    pthread_mutex_lock(&dc->evlock);
    dc->chunks_local += (uint64_t)n;
    pthread_mutex_unlock(&dc->evlock);
    st = duet_engine_forward(dc->node.ke.engine, dc->seqs, n, dc->sampled);
    if (st != DUET_OK)
        return st;
    for (int i = 0; i < n; i++)
        duet_dc_local_first(dc, reqs[i], dc->sampled[i], &res[i]);
    return DUET_OK;
}
