/* The prefill side of page grants (node/grant.h): a request is queued only
 * when its decode granted exactly the pages it names. */
#include "node/grant.h"

#include "prefill/prefill.h"

duet_status_t duet_pf_grant_check(const Duet__V1__PrefillRequest *m, const duet_pf_req_t *req)
{
    /* what the senders will write: these pages (and, packed, the staging
     * run from dst_stage0 of as many pages), for this transfer id */
    duet_node_grant_t g = {
        .transfer_id = req->transfer_id,
        .decode_id = req->link->remote_id,
        .pages = req->dst_pages,
        .n_pages = m->n_dst_pages,
        .packed = req->packed,
        .stage0 = req->dst_stage0,
        .expiry_ms = m->grant_expiry_ms,
    };
    duet_status_t st = duet_node_grant_verify(req->link->grant_key, &g, m->grant.data, m->grant.len,
                                              duet_node_grant_now_ms());
    if (st != DUET_OK)
        return duet_error_wrap(st, "%s: refused, nothing written: ", req->request_id);
    return DUET_OK;
}
