/* Prefill's prefix cache (docs/prefix-cache.md): a request's pages are the
 * longest cached prefix of its prompt (found by page id, referenced) plus
 * new pages for the rest; only the rest is computed, and its full pages
 * are kept once computed.  Scheduler thread only: it decides, the ranks
 * follow the page table it hands them (DESIGN §3 rule 1). */
#include "common/alloc.h"
#include "prefill/prefill.h"

duet_status_t duet_pf_cache_take(duet_prefill_t *pf, duet_pf_req_t *req)
{
    int ps = pf->node.args.cluster->page_size;
    int n_ins = duet_kv_prefix_insert_pages(req->n_prompt, ps);
    duet_status_t st;

    req->n_hit = 0;
    req->src_pages = DUET_NEW_ARRAY(int32_t, (size_t)req->n_pages);
    if (req->src_pages == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "prefill: no memory");
    /* prompt logprobs need every prompt row's logits: no cached prefix */
    if (duet_kv_pool_cache_enabled(pf->node.pages) && n_ins > 0 && !req->prompt_logprobs) {
        if (req->hashes == NULL) {
            req->hashes = DUET_NEW_ARRAY(duet_kv_page_hash_t, (size_t)n_ins);
            if (req->hashes == NULL) {
                st = duet_error(DUET_ERR_NO_MEMORY, "prefill: no memory");
                goto err_free;
            }
            duet_kv_page_hash_chain(req->prompt, n_ins, ps, req->hashes);
        }
        req->n_hit = duet_kv_pool_cache_match(pf->node.pages, req->hashes,
                                              duet_kv_prefix_lookup_pages(req->n_prompt, ps),
                                              req->n_prompt, ps, req->src_pages);
    }
    st = duet_kv_pool_alloc(pf->node.pages, req->n_pages - req->n_hit, req->src_pages + req->n_hit);
    if (st != DUET_OK)
        goto err_release;
    return DUET_OK;

err_release:
    duet_kv_pool_release_chain(pf->node.pages, req->src_pages, req->n_hit);
    req->n_hit = 0;
err_free:
    duet_free(req->src_pages);
    req->src_pages = NULL;
    return st;
}

void duet_pf_cache_keep(duet_prefill_t *pf, duet_pf_req_t *req)
{
    int n_ins = duet_kv_prefix_insert_pages(req->n_prompt, pf->node.args.cluster->page_size);
    if (req->hashes != NULL && n_ins > req->n_hit)
        duet_kv_pool_cache_insert(pf->node.pages, req->hashes + req->n_hit,
                                  req->src_pages + req->n_hit, n_ins - req->n_hit);
}
