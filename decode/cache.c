/* Decode's prefix cache (docs/prefix-cache.md): at admission a request's
 * pages begin with the longest cached prefix of its prompt, so that prefill
 * is asked only for the pages after it (or, when only the last page's
 * tokens are left, nobody is: the decode engine computes them itself); once
 * the prompt's KV is complete its full pages are kept for the next prompt
 * (node/prefix.h, as on prefill), and at its end the pages of its
 * generated tokens too.  Scheduler thread only (it decides; the ranks
 * follow its page tables). */
#include "common/alloc.h"
#include "common/log.h"
#include "decode/cache.h"
#include "node/prefix.h"

duet_status_t duet_dc_cache_take(duet_decode_t *dc, duet_dc_req_t *req)
{
    /* prompt logprobs need every prompt row's logits: cached pages hold
     * KV, not logits, so such a request computes its whole prompt (and
     * still leaves its pages to the cache) */
    duet_status_t st =
        duet_node_prefix_take(&dc->node, req->prompt, req->n_prompt, !req->prompt_logprobs,
                              &req->hashes, req->pages, req->n_pages, &req->n_cached_pages);
    if (st == DUET_OK)
        req->pages_held = true;
    return st;
}

void duet_dc_cache_keep(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet_node_prefix_keep(&dc->node, req->n_prompt, req->hashes, req->pages, req->n_cached_pages);
}

void duet_dc_cache_keep_generated(duet_decode_t *dc, duet_dc_req_t *req)
{
    int ps = dc->node.args.cluster->page_size;
    int first = duet_kv_prefix_insert_pages(req->n_prompt, ps); /* kept at kv_ready */
    int last = duet_kv_prefix_insert_pages(req->n_prompt + req->n_out - 1, ps);
    duet_kv_page_hash_t parent = {0, 0}, *hashes;
    int32_t *tokens;

    /* prompt logprobs: its prompt pages were not kept either (cache_take);
     * pages [first, last) are the request's own (n_cached_pages <= first),
     * written by its prefill and its decode steps */
    if (!req->kv_whole || req->n_out < 2 || last <= first || req->prompt_logprobs ||
        !duet_kv_pool_cache_enabled(dc->node.pages) || (first > 0 && req->hashes == NULL))
        return;
    if (first > 0)
        parent = req->hashes[first - 1];
    hashes = DUET_NEW_ARRAY(duet_kv_page_hash_t, (size_t)(last - first));
    tokens = DUET_NEW_ARRAY(int32_t, (size_t)(last - first) * (size_t)ps);
    if (hashes == NULL || tokens == NULL) {
        DUET_LOG_DEBUG("decode: %s: no memory to keep its generated pages", req->request_id);
        goto out_free;
    }
    for (int t = first * ps; t < last * ps; t++)
        tokens[t - first * ps] = t < req->n_prompt ? req->prompt[t] : req->out[t - req->n_prompt];
    if (duet_kv_page_hash_chain_from(parent, tokens, last - first, ps, hashes) != DUET_OK) {
        DUET_LOG_DEBUG("decode: %s: hashing its generated pages failed: %s", req->request_id,
                       duet_error_msg());
        goto out_free;
    }
    int added = duet_kv_pool_cache_insert(dc->node.pages, hashes, req->pages + first, last - first);
    DUET_LOG_DEBUG("decode: %s: %d of %d generated pages to the prefix cache", req->request_id,
                   added, last - first);
out_free:
    duet_free(tokens);
    duet_free(hashes);
}

void duet_dc_cache_check_writes(duet_decode_t *dc)
{
    uint64_t n = 0;
    if (dc->node.ke.xfer == NULL || dc->node.pages == NULL)
        return;
    for (int r = 0; r < dc->node.ke.tp; r++) {
        duet_xfer_stats_t s;
        duet_xfer_rank_stats(duet_xfer_rank(dc->node.ke.xfer, r), &s);
        n += s.unsolicited;
    }
    if (n == dc->unsolicited_seen)
        return;
    /* which pages they hit is unknown: none of the cache is trusted */
    int gone = duet_kv_pool_cache_forget(dc->node.pages);
    DUET_LOG_WARN("decode: %llu slice(s) landed that no live transfer expected (a replayed "
                  "grant or a rogue prefill, docs/security.md): the prefix cache is dropped "
                  "(%d pages)",
                  (unsigned long long)(n - dc->unsolicited_seen), gone);
    dc->unsolicited_seen = n;
}

int duet_dc_uncached_tokens(const duet_decode_t *dc, const duet_dc_req_t *req)
{
    return req->n_prompt - req->n_cached_pages * dc->node.args.cluster->page_size;
}

bool duet_dc_cache_covers(const duet_decode_t *dc, const duet_dc_req_t *req)
{
    return req->n_cached_pages > 0 &&
           req->n_cached_pages ==
               duet_kv_prefix_lookup_pages(req->n_prompt, dc->node.args.cluster->page_size);
}
