/* The prefill side of page grants (node/grant.h): a request is queued only
 * when its decode granted exactly the pages it names. */
#include "node/grant.h"

#include "prefill/prefill.h"

duet_status_t duet_pf_grant_check(duet_prefill_t *pf, const Duet__V1__PrefillRequest *m,
                                  const duet_pf_req_t *req)
{
    const Duet__V1__SamplingParams *sp = m->sampling;
    uint64_t now = duet_node_grant_now_ms();
    /* what the senders will write: these pages (and, packed, the staging
     * run from dst_stage0 of as many pages), for this transfer id */
    duet_node_grant_t g = {
        .transfer_id = req->transfer_id,
        .decode_id = req->link->remote_id,
        .pages = req->dst_pages,
        .n_pages = m->n_dst_pages,
        .packed = req->packed,
        .stage0 = req->dst_stage0,
        .chunk_pages = req->packed ? m->chunk_pages : 0,
        .expiry_ms = m->grant_expiry_ms,
        /* and what is written there: the prompt and sampling as sent */
        .prompt = m->prompt_ids,
        .n_prompt = m->n_prompt_ids,
        .cached_pages = m->cached_pages,
        .temperature = sp != NULL ? sp->temperature : 0.0f,
        .top_p = sp != NULL ? sp->top_p : 0.0f,
        .top_k = sp != NULL ? sp->top_k : 0,
        .seed = sp != NULL ? sp->seed : 0,
    };
    duet_status_t st =
        duet_node_grant_verify(req->link->grant_key, &g, m->grant.data, m->grant.len, now);
    /* a verified grant is served once: a captured one replayed (the same
     * or another prompt, while its transfer runs or after) is refused */
    if (st == DUET_OK)
        st = duet_node_replay_take(pf->grants_seen, req->link->remote_id, req->transfer_id,
                                   m->grant_expiry_ms, now);
    if (st != DUET_OK)
        return duet_error_wrap(st, "%s: refused, nothing written: ", req->request_id);
    return DUET_OK;
}
