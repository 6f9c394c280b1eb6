/* Prefill's prefix cache (docs/prefix-cache.md): a request's pages are the
 * longest cached prefix of its prompt (found by page id, referenced) plus
 * new pages for the rest; only the rest is computed, and its full pages
 * are kept once computed (node/prefix.h, as on decode).  Scheduler thread
 * only: it decides, the ranks follow the page table it hands them (DESIGN
 * §3 rule 1). */
#include "common/alloc.h"
#include "node/prefix.h"
#include "prefill/prefill.h"

duet_status_t duet_pf_cache_take(duet_prefill_t *pf, duet_pf_req_t *req)
{
    duet_status_t st;

    req->n_hit = 0;
    req->src_pages = DUET_NEW_ARRAY(int32_t, (size_t)req->n_pages);
    if (req->src_pages == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "prefill: no memory");
    /* prompt logprobs need every prompt row's logits: no cached prefix */
    st = duet_node_prefix_take(&pf->node, req->prompt, req->n_prompt, !req->prompt_logprobs,
                               &req->hashes, req->src_pages, req->n_pages, &req->n_hit);
    if (st != DUET_OK) {
        duet_free(req->src_pages);
        req->src_pages = NULL;
    }
    return st;
}

void duet_pf_cache_keep(duet_prefill_t *pf, duet_pf_req_t *req)
{
    duet_node_prefix_keep(&pf->node, req->n_prompt, req->hashes, req->src_pages, req->n_hit);
}
