/* The prefix cache on a daemon's request (node/prefix.h). */
#include "node/prefix.h"

#include "common/alloc.h"
#include "common/log.h"

duet_status_t duet_node_prefix_take(duet_node_t *node, const int32_t *prompt, int n_prompt,
                                    bool lookup, duet_kv_page_hash_t **hashes_p, int32_t *pages,
                                    int n_pages, int *n_hit_p)
{
    int ps = node->args.cluster->page_size;
    int n_ins = duet_kv_prefix_insert_pages(n_prompt, ps);
    int n_hit = 0;
    duet_status_t st;

    *n_hit_p = 0;
    if (duet_kv_pool_cache_enabled(node->pages) && n_ins > 0 && lookup) {
        if (*hashes_p == NULL) {
            *hashes_p = DUET_NEW_ARRAY(duet_kv_page_hash_t, (size_t)n_ins);
            if (*hashes_p == NULL)
                return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", node->role);
            /* without ids (libcrypto out of memory) the request runs
             * uncached: no lookup, nothing kept */
            if (duet_kv_page_hash_chain(prompt, n_ins, ps, *hashes_p) != DUET_OK) {
                DUET_LOG_WARN("%s: no prefix cache for this request: %s", node->role,
                              duet_error_msg());
                duet_free(*hashes_p);
                *hashes_p = NULL;
            }
        }
    }
    if (*hashes_p != NULL && duet_kv_pool_cache_enabled(node->pages) && n_ins > 0 && lookup) {
        n_hit = duet_kv_pool_cache_match(
            node->pages, *hashes_p, duet_kv_prefix_lookup_pages(n_prompt, ps), n_prompt, ps, pages);
    }
    st = duet_kv_pool_alloc(node->pages, n_pages - n_hit, pages + n_hit);
    if (st != DUET_OK) {
        duet_kv_pool_release_chain(node->pages, pages, n_hit);
        return st;
    }
    *n_hit_p = n_hit;
    return DUET_OK;
}

void duet_node_prefix_keep(duet_node_t *node, int n_prompt, const duet_kv_page_hash_t *hashes,
                           const int32_t *pages, int n_hit)
{
    int n_ins = duet_kv_prefix_insert_pages(n_prompt, node->args.cluster->page_size);
    if (hashes != NULL && n_ins > n_hit)
        duet_kv_pool_cache_insert(node->pages, hashes + n_hit, pages + n_hit, n_ins - n_hit);
}
