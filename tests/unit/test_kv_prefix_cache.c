/* The KV pool's prefix cache (kv/prefix_cache.h): the chained page ids,
 * match and insert with their references, idle pages in LRU order,
 * eviction by allocation under pressure (scattered and contiguous), and
 * the page accounting free + cached_idle + in_use == total throughout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kv/pool.h"
#include "common/sha256.h"
#include "kv/prefix_cache.h"

#define PS 4

static void check_accounting(duet_kv_pool_t *pool)
{
    duet_kv_pool_stats_t s;
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.free + s.cached_idle + s.in_use, s.total);
    assert_int_equal(duet_kv_pool_free_count(pool), s.free + s.cached_idle);
    assert_true(s.shared <= s.cached);
}

static void test_hash_chain(void **state)
{
    (void)state;
    int32_t a[4 * PS], b[4 * PS], c[4 * PS];
    duet_kv_page_hash_t ha[4], hb[4], hc[4], again[4];

    for (int i = 0; i < 4 * PS; i++)
        a[i] = b[i] = i + 1;
    b[2 * PS + 1] = 999; /* differs in page 2 */
    duet_kv_page_hash_chain(a, 4, PS, ha);
    duet_kv_page_hash_chain(b, 4, PS, hb);
    duet_kv_page_hash_chain(a, 4, PS, again);
    assert_memory_equal(ha, again, sizeof(ha)); /* pure */
    for (int i = 0; i < 2; i++)
        assert_memory_equal(&ha[i], &hb[i], sizeof(ha[i]));
    for (int i = 2; i < 4; i++) /* the chain: every later page differs too */
        assert_memory_not_equal(&ha[i], &hb[i], sizeof(ha[i]));
    /* the same tokens at another position are another page */
    memcpy(c, a + PS, 3 * PS * sizeof(int32_t));
    duet_kv_page_hash_chain(c, 3, PS, hc);
    assert_memory_not_equal(&hc[0], &ha[1], sizeof(hc[0]));
    /* all ids distinct (no trivial collisions) */
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            assert_memory_not_equal(&ha[i], &ha[j], sizeof(ha[i]));
    /* continued from a parent: the same ids as the whole chain (decode
     * hashes a request's generated pages after its prompt's) */
    duet_kv_page_hash_chain_from(ha[1], a + 2 * PS, 2, PS, again);
    assert_memory_equal(&again[0], &ha[2], 2 * sizeof(ha[0]));
    duet_kv_page_hash_chain_from((duet_kv_page_hash_t){0, 0}, a, 4, PS, again);
    assert_memory_equal(again, ha, sizeof(ha));
    /* what a prompt may look up / insert */
    assert_int_equal(duet_kv_prefix_lookup_pages(8, PS), 1); /* last token computed */
    assert_int_equal(duet_kv_prefix_lookup_pages(9, PS), 2);
    assert_int_equal(duet_kv_prefix_lookup_pages(1, PS), 0);
    assert_int_equal(duet_kv_prefix_insert_pages(8, PS), 2);
    assert_int_equal(duet_kv_prefix_insert_pages(7, PS), 1);
}

/* A page id by its definition: SHA-256 of the parent id (lo, hi: 64-bit
 * little endian) and the page's tokens (32-bit little endian), the
 * digest's first 16 bytes as (lo, hi) little endian; page sizes up to 100
 * (the chain buffers 256 bytes: 100 tokens cross it). */
static duet_kv_page_hash_t ref_page_hash(duet_kv_page_hash_t parent, const int32_t *tok, int ps)
{
    uint8_t msg[16 + 4 * 100], d[DUET_SHA256_LEN];
    duet_kv_page_hash_t h = {0, 0};
    for (int b = 0; b < 8; b++) {
        msg[b] = (uint8_t)(parent.lo >> (8 * b));
        msg[8 + b] = (uint8_t)(parent.hi >> (8 * b));
    }
    for (int t = 0; t < ps; t++)
        for (int b = 0; b < 4; b++)
            msg[16 + 4 * t + b] = (uint8_t)((uint32_t)tok[t] >> (8 * b));
    duet_sha256(msg, 16 + 4 * (size_t)ps, d);
    for (int b = 0; b < 8; b++) {
        h.lo |= (uint64_t)d[b] << (8 * b);
        h.hi |= (uint64_t)d[8 + b] << (8 * b);
    }
    return h;
}

static void test_hash_chain_definition(void **state)
{
    (void)state;
    static const int sizes[] = {1, 4, 16, 59, 60, 61, 100};
    int32_t tok[3 * 100];
    duet_kv_page_hash_t h[3];
    for (int i = 0; i < 3 * 100; i++)
        tok[i] = (int32_t)(i * 2654435761u) ^ (i & 1 ? -1 : 0); /* negative ids too */
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        int ps = sizes[k];
        duet_kv_page_hash_t parent = {0, 0};
        duet_kv_page_hash_chain(tok, 3, ps, h);
        for (int i = 0; i < 3; i++) {
            duet_kv_page_hash_t want = ref_page_hash(parent, tok + i * ps, ps);
            assert_memory_equal(&h[i], &want, sizeof(want));
            parent = want;
        }
    }
}

static void test_match_insert_refs(void **state)
{
    (void)state;
    duet_kv_pool_t *pool;
    int32_t tok[3 * PS], pages[3], hit[3];
    duet_kv_page_hash_t h[3];
    duet_kv_pool_stats_t s;

    for (int i = 0; i < 3 * PS; i++)
        tok[i] = 7 * i;
    duet_kv_page_hash_chain(tok, 3, PS, h);
    assert_int_equal(duet_kv_pool_create(8, &pool), DUET_OK);
    /* without a cache: nothing found, nothing kept */
    assert_int_equal(duet_kv_pool_alloc(pool, 3, pages), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_insert(pool, h, pages, 3), 0);
    assert_int_equal(duet_kv_pool_cache_match(pool, h, 3, 12, PS, hit), 0);
    assert_int_equal(duet_kv_pool_release(pool, pages, 3), 3);

    assert_int_equal(duet_kv_pool_cache_enable(pool), DUET_OK);
    assert_true(duet_kv_pool_cache_enabled(pool));
    assert_int_equal(duet_kv_pool_cache_match(pool, h, 3, 12, PS, hit), 0);
    /* request A computes 3 pages and inserts 2 (its full prompt pages) */
    assert_int_equal(duet_kv_pool_alloc(pool, 3, pages), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_insert(pool, h, pages, 2), 2);
    assert_int_equal(duet_kv_pool_refs(pool, pages[0]), 2);
    /* inserting again (same pages, or a second copy of the same ids) adds nothing */
    assert_int_equal(duet_kv_pool_cache_insert(pool, h, pages, 2), 0);
    int32_t other[2];
    assert_int_equal(duet_kv_pool_alloc(pool, 2, other), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_insert(pool, h, other, 2), 0);
    assert_int_equal(duet_kv_pool_release(pool, other, 2), 2);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.cached, 2);
    assert_int_equal(s.shared, 2);
    assert_int_equal(s.in_use, 3);
    check_accounting(pool);
    /* request B shares them while A still holds them */
    assert_int_equal(duet_kv_pool_cache_match(pool, h, 3, 12, PS, hit), 2);
    assert_int_equal(hit[0], pages[0]);
    assert_int_equal(hit[1], pages[1]);
    assert_int_equal(duet_kv_pool_refs(pool, pages[0]), 3);
    /* A ends (cancelled, say): its uncached page is free, the shared ones stay */
    assert_int_equal(duet_kv_pool_release(pool, pages, 3), 1);
    assert_int_equal(duet_kv_pool_refs(pool, hit[0]), 2);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.in_use, 2);
    assert_int_equal(s.cached_idle, 0);
    check_accounting(pool);
    /* B ends: idle cached, not free, but available */
    assert_int_equal(duet_kv_pool_release(pool, hit, 2), 0);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.cached_idle, 2);
    assert_int_equal(s.free, 6);
    assert_int_equal(duet_kv_pool_free_count(pool), 8);
    assert_int_equal(s.lookups, 2); /* the one without a cache is not counted */
    assert_int_equal(s.hit_pages, 2);
    assert_int_equal(s.hit_tokens, 2 * PS);
    assert_int_equal(s.lookup_tokens, 24);
    assert_int_equal(s.inserted_pages, 2);
    check_accounting(pool);
    /* a different first page finds nothing */
    duet_kv_page_hash_t miss = h[0];
    miss.hi ^= 1;
    assert_int_equal(duet_kv_pool_cache_match(pool, &miss, 1, 4, PS, hit), 0);
    /* a chain broken in the middle stops there */
    duet_kv_page_hash_t part[2] = {h[0], miss};
    assert_int_equal(duet_kv_pool_cache_match(pool, part, 2, 8, PS, hit), 1);
    assert_int_equal(duet_kv_pool_release(pool, hit, 1), 0);
    assert_int_equal(duet_kv_pool_cache_clear(pool), 2);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.free, 8);
    assert_int_equal(s.cached, 0);
    assert_int_equal(s.evictions, 2);
    duet_kv_pool_destroy(pool);
}

/* Fill the cache with n one-page prompts, oldest first; pages[i] holds
 * prompt i's page. */
static void fill(duet_kv_pool_t *pool, int n, duet_kv_page_hash_t *h, int32_t *pages)
{
    for (int i = 0; i < n; i++) {
        int32_t tok[PS] = {i, i, i, 100 + i};
        duet_kv_page_hash_chain(tok, 1, PS, &h[i]);
        assert_int_equal(duet_kv_pool_alloc(pool, 1, &pages[i]), DUET_OK);
        assert_int_equal(duet_kv_pool_cache_insert(pool, &h[i], &pages[i], 1), 1);
        assert_int_equal(duet_kv_pool_release(pool, &pages[i], 1), 0);
    }
}

/* Forgetting the cache (decode, after a slice nobody granted landed):
 * idle pages are freed, held ones lose the cache's reference and are never
 * matched again, and go free with their request. */
static void test_forget(void **state)
{
    (void)state;
    duet_kv_pool_t *pool;
    duet_kv_page_hash_t h[4];
    int32_t pages[4], hit[4];
    duet_kv_pool_stats_t s;

    assert_int_equal(duet_kv_pool_create(8, &pool), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_enable(pool), DUET_OK);
    fill(pool, 4, h, pages);
    /* a request holds prompt 1's page */
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[1], 1, 4, PS, hit), 1);
    assert_int_equal(duet_kv_pool_cache_forget(pool), 4);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.cached, 0);
    assert_int_equal(s.in_use, 1);
    assert_int_equal(s.free, 7);
    check_accounting(pool);
    for (int i = 0; i < 4; i++)
        assert_int_equal(duet_kv_pool_cache_match(pool, &h[i], 1, 4, PS, hit + 1), 0);
    assert_int_equal(duet_kv_pool_release(pool, hit, 1), 1);
    assert_int_equal(duet_kv_pool_free_count(pool), 8);
    /* the cache works again afterwards */
    fill(pool, 1, h, pages);
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[0], 1, 4, PS, hit), 1);
    assert_int_equal(duet_kv_pool_release(pool, hit, 1), 0);
    check_accounting(pool);
    duet_kv_pool_destroy(pool);
}

static void test_lru_eviction(void **state)
{
    (void)state;
    duet_kv_pool_t *pool;
    duet_kv_page_hash_t h[8];
    int32_t pages[8], hit, got[8];
    duet_kv_pool_stats_t s;

    assert_int_equal(duet_kv_pool_create(8, &pool), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_enable(pool), DUET_OK);
    fill(pool, 8, h, pages);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.free, 0);
    assert_int_equal(s.cached_idle, 8);
    /* an allocation that cannot succeed evicts nothing */
    int32_t too_many[9];
    assert_int_equal(duet_kv_pool_alloc(pool, 9, too_many), DUET_ERR_EXHAUSTED);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.cached_idle, 8);
    /* touch prompt 0: now the most recent */
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[0], 1, PS + 1, PS, &hit), 1);
    assert_int_equal(duet_kv_pool_release(pool, &hit, 1), 0);
    /* hold prompt 1: not evictable */
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[1], 1, PS + 1, PS, &hit), 1);
    /* pressure: 2 pages must come from the LRU end: prompts 2 and 3 */
    assert_int_equal(duet_kv_pool_alloc(pool, 2, got), DUET_OK);
    int32_t probe;
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[2], 1, PS, PS, &probe), 0);
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[3], 1, PS, PS, &probe), 0);
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[4], 1, PS, PS, &probe), 1);
    assert_int_equal(duet_kv_pool_release(pool, &probe, 1), 0);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.evictions, 2);
    check_accounting(pool);
    /* everything but the held page and the two taken: the rest is evicted,
     * the held one never */
    assert_int_equal(duet_kv_pool_alloc(pool, 5, got + 2), DUET_OK);
    for (int i = 0; i < 7; i++)
        assert_int_not_equal(got[i], hit);
    assert_int_equal(duet_kv_pool_refs(pool, hit), 2);
    /* nothing idle left: fails, nothing taken */
    assert_int_equal(duet_kv_pool_alloc(pool, 1, got + 7), DUET_ERR_EXHAUSTED);
    check_accounting(pool);
    assert_int_equal(duet_kv_pool_release(pool, got, 7), 7);
    assert_int_equal(duet_kv_pool_release(pool, &hit, 1), 0);
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.cached, 1);
    assert_int_equal(s.in_use, 0);
    check_accounting(pool);
    /* destroy with cached pages left: nothing leaks (ASan) */
    duet_kv_pool_destroy(pool);
}

/* A chain released with duet_kv_pool_release_chain loses its last pages
 * to eviction first, so what stays of it is still a prefix that matches. */
static void test_chain_eviction_order(void **state)
{
    (void)state;
    duet_kv_pool_t *pool;
    duet_kv_page_hash_t h[4];
    int32_t tok[4 * PS], pages[4], got[4], probe[4];

    assert_int_equal(duet_kv_pool_create(4, &pool), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_enable(pool), DUET_OK);
    for (int i = 0; i < 4 * PS; i++)
        tok[i] = 7 + i;
    duet_kv_page_hash_chain(tok, 4, PS, h);
    assert_int_equal(duet_kv_pool_alloc(pool, 4, pages), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_insert(pool, h, pages, 4), 4);
    assert_int_equal(duet_kv_pool_release_chain(pool, pages, 4), 0);
    check_accounting(pool);
    /* pressure for one page: the chain's last page goes */
    assert_int_equal(duet_kv_pool_alloc(pool, 1, got), DUET_OK);
    assert_int_equal(got[0], pages[3]);
    assert_int_equal(duet_kv_pool_cache_match(pool, h, 4, 4 * PS + 1, PS, probe), 3);
    /* a match and a chain release keep that order: then the third page */
    assert_int_equal(duet_kv_pool_release_chain(pool, probe, 3), 0);
    assert_int_equal(duet_kv_pool_alloc(pool, 1, got + 1), DUET_OK);
    assert_int_equal(got[1], pages[2]);
    assert_int_equal(duet_kv_pool_cache_match(pool, h, 4, 4 * PS + 1, PS, probe), 2);
    assert_int_equal(duet_kv_pool_release_chain(pool, probe, 2), 0);
    assert_int_equal(duet_kv_pool_release_chain(pool, got, 2), 2);
    check_accounting(pool);
    duet_kv_pool_destroy(pool);
}

static void test_run_eviction(void **state)
{
    (void)state;
    duet_kv_pool_t *pool;
    duet_kv_page_hash_t h[8];
    int32_t pages[8], first = -1, held[2];

    assert_int_equal(duet_kv_pool_create(8, &pool), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_enable(pool), DUET_OK);
    fill(pool, 8, h, pages);
    /* hold pages 1 and 5: a run of 3 must avoid them, evicting idle ones */
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[1], 1, PS + 1, PS, &held[0]), 1);
    assert_int_equal(duet_kv_pool_cache_match(pool, &h[5], 1, PS + 1, PS, &held[1]), 1);
    assert_int_equal(duet_kv_pool_alloc_run(pool, 3, &first), DUET_OK);
    assert_true(first == 2);
    for (int p = first; p < first + 3; p++)
        assert_int_equal(duet_kv_pool_refs(pool, p), 1);
    check_accounting(pool);
    /* a run of 4 cannot exist around the held pages (6..7 is 2 long, 0 is 1) */
    int32_t none;
    assert_int_equal(duet_kv_pool_alloc_run(pool, 3, &none), DUET_ERR_EXHAUSTED);
    check_accounting(pool);
    assert_int_equal(duet_kv_pool_release_run(pool, first, 3), 3);
    assert_int_equal(duet_kv_pool_release(pool, held, 2), 0);
    check_accounting(pool);
    duet_kv_pool_destroy(pool);
}

/* Many requests sharing and dropping prefixes in random order: the
 * accounting holds after every step, and at the end only idle cached pages
 * and free pages are left. */
static void test_random_churn(void **state)
{
    (void)state;
    enum { N = 64, REQS = 6, MAXP = 6 };
    duet_kv_pool_t *pool;
    int32_t held[REQS][MAXP];
    int n_held[REQS] = {0};
    uint32_t rng = 12345;

    assert_int_equal(duet_kv_pool_create(N / 2, &pool), DUET_OK);
    assert_int_equal(duet_kv_pool_cache_enable(pool), DUET_OK);
    for (int step = 0; step < 2000; step++) {
        rng = rng * 1664525u + 1013904223u;
        int r = (int)((rng >> 8) % REQS);
        if (n_held[r] > 0) {
            duet_kv_pool_release(pool, held[r], n_held[r]);
            n_held[r] = 0;
        } else {
            /* prompts from a few families: shared prefixes */
            int family = (int)((rng >> 16) % 3), np = 1 + (int)((rng >> 20) % MAXP);
            int32_t tok[MAXP * PS];
            duet_kv_page_hash_t h[MAXP];
            for (int i = 0; i < np * PS; i++)
                tok[i] = family * 1000 + (i < 2 * PS ? i : i + (int)(rng >> 28));
            duet_kv_page_hash_chain(tok, np, PS, h);
            int k = duet_kv_pool_cache_match(pool, h, np - 1, np * PS, PS, held[r]);
            if (duet_kv_pool_alloc(pool, np - k, held[r] + k) != DUET_OK) {
                duet_kv_pool_release(pool, held[r], k);
                check_accounting(pool);
                continue;
            }
            duet_kv_pool_cache_insert(pool, h + k, held[r] + k, np - k);
            n_held[r] = np;
        }
        check_accounting(pool);
    }
    for (int r = 0; r < REQS; r++)
        duet_kv_pool_release(pool, held[r], n_held[r]);
    duet_kv_pool_stats_t s;
    duet_kv_pool_stats(pool, &s);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.free + s.cached_idle, s.total);
    assert_true(s.evictions > 0);
    assert_true(s.hit_pages > 0);
    duet_kv_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_chain),           cmocka_unit_test(test_hash_chain_definition),
        cmocka_unit_test(test_match_insert_refs),
        cmocka_unit_test(test_chain_eviction_order), cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_run_eviction),         cmocka_unit_test(test_random_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
