/* Page grants (node/grant.h). */
#include "node/grant.h"

#include <string.h>
#include <time.h>

static void duet__grant_put_u64(duet_hmac_sha256_t *h, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (56 - 8 * i));
    duet_hmac_sha256_update(h, b, sizeof(b));
}

static void duet__grant_put_u32(duet_hmac_sha256_t *h, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    duet_hmac_sha256_update(h, b, sizeof(b));
}

static uint32_t duet__grant_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

/* The signed encoding: a version tag, then every field at a fixed width or
 * length-prefixed, so no two grants encode alike. */
duet_status_t duet_node_grant_sign(const uint8_t key[DUET_NODE_GRANT_KEY_LEN],
                                   const duet_node_grant_t *g, uint8_t mac[DUET_NODE_GRANT_LEN])
{
    static const char tag[] = "duet page grant v2";
    size_t id_len = g->decode_id != NULL ? strlen(g->decode_id) : 0;
    duet_hmac_sha256_t h;
    duet_status_t st = duet_hmac_sha256_init(&h, key, DUET_NODE_GRANT_KEY_LEN);

    if (st != DUET_OK) {
        memset(mac, 0, DUET_NODE_GRANT_LEN);
        return st;
    }
    duet_hmac_sha256_update(&h, tag, sizeof(tag));
    duet__grant_put_u64(&h, g->transfer_id);
    duet__grant_put_u32(&h, (uint32_t)id_len);
    duet_hmac_sha256_update(&h, g->decode_id != NULL ? g->decode_id : "", id_len);
    /* (2: packed in chunks, and their size follows: a grant without
     * chunks encodes as before) */
    duet__grant_put_u32(&h, !g->packed ? 0u : g->chunk_pages > 0 ? 2u : 1u);
    duet__grant_put_u32(&h, g->packed ? (uint32_t)g->stage0 : 0u);
    if (g->packed && g->chunk_pages > 0)
        duet__grant_put_u32(&h, g->chunk_pages);
    duet__grant_put_u64(&h, g->expiry_ms);
    duet__grant_put_u64(&h, (uint64_t)g->n_pages);
    for (size_t i = 0; i < g->n_pages; i++)
        duet__grant_put_u32(&h, (uint32_t)g->pages[i]);
    duet__grant_put_u32(&h, g->cached_pages);
    duet__grant_put_u64(&h, (uint64_t)g->n_prompt);
    for (size_t i = 0; i < g->n_prompt; i++)
        duet__grant_put_u32(&h, (uint32_t)g->prompt[i]);
    duet__grant_put_u32(&h, duet__grant_float_bits(g->temperature));
    duet__grant_put_u32(&h, duet__grant_float_bits(g->top_p));
    duet__grant_put_u32(&h, (uint32_t)g->top_k);
    duet__grant_put_u64(&h, g->seed);
    return duet_hmac_sha256_final(&h, mac);
}

duet_status_t duet_node_grant_verify(const uint8_t key[DUET_NODE_GRANT_KEY_LEN],
                                     const duet_node_grant_t *g, const uint8_t *mac, size_t len,
                                     uint64_t now_ms)
{
    uint8_t want[DUET_NODE_GRANT_LEN];
    duet_status_t st;
    bool ok;

    if (len == 0)
        return duet_error(DUET_ERR_INVALID, "no page grant: decode grants the pages of every "
                                            "transfer (docs/security.md)");
    if (len != DUET_NODE_GRANT_LEN)
        return duet_error(DUET_ERR_INVALID, "page grant of %zu bytes, expected %d", len,
                          DUET_NODE_GRANT_LEN);
    if (now_ms > g->expiry_ms && now_ms - g->expiry_ms > DUET_NODE_GRANT_SKEW_MS)
        return duet_error(DUET_ERR_INVALID, "page grant expired %llu ms ago",
                          (unsigned long long)(now_ms - g->expiry_ms));
    /* a MAC that could not be computed matches nothing */
    if ((st = duet_node_grant_sign(key, g, want)) != DUET_OK)
        return duet_error_wrap(st, "page grant not checked: ");
    ok = duet_ct_equal(want, mac, DUET_NODE_GRANT_LEN);
    duet_wipe(want, sizeof(want));
    if (!ok)
        return duet_error(DUET_ERR_INVALID,
                          "page grant does not match: not issued by this link's decode for "
                          "transfer %llu and these %zu pages",
                          (unsigned long long)g->transfer_id, g->n_pages);
    return DUET_OK;
}

uint64_t duet_node_grant_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
