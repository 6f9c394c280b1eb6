/* node/replay.h (a grant is served once until it expires; bounded) and
 * the v2 page grant's binding of the prompt and sampling (node/grant.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "node/grant.h"
#include "node/replay.h"

static void test_replay_once(void **state)
{
    (void)state;
    duet_node_replay_t *t = duet_node_replay_create(64);
    uint64_t now = 1000000;
    assert_non_null(t);
    assert_int_equal(duet_node_replay_take(t, "dec-a", 7, now + 5000, now), DUET_OK);
    /* the same grant again: refused, while it (plus the skew) lasts */
    assert_int_equal(duet_node_replay_take(t, "dec-a", 7, now + 5000, now + 1), DUET_ERR_INVALID);
    assert_int_equal(
        duet_node_replay_take(t, "dec-a", 7, now + 5000, now + 5000 + DUET_NODE_GRANT_SKEW_MS - 1),
        DUET_ERR_INVALID);
    /* another transfer, another decode: their own */
    assert_int_equal(duet_node_replay_take(t, "dec-a", 8, now + 5000, now), DUET_OK);
    assert_int_equal(duet_node_replay_take(t, "dec-b", 7, now + 5000, now), DUET_OK);
    assert_int_equal(duet_node_replay_live(t, now), 3);
    /* expired: forgotten (the grant check refuses it by then anyway) */
    assert_int_equal(duet_node_replay_live(t, now + 5000 + DUET_NODE_GRANT_SKEW_MS), 0);
    duet_node_replay_destroy(t);
}

static void test_replay_bounded(void **state)
{
    (void)state;
    duet_node_replay_t *t = duet_node_replay_create(64); /* 48 live at most */
    uint64_t now = 5000000;
    uint64_t id = 1;
    int ok = 0;
    for (int i = 0; i < 64; i++)
        ok += duet_node_replay_take(t, "d", id++, now + 1000, now) == DUET_OK;
    assert_int_equal(ok, 48);
    assert_int_equal(duet_node_replay_take(t, "d", id++, now + 1000, now), DUET_ERR_EXHAUSTED);
    /* every earlier one is still refused: none was forgotten early */
    for (uint64_t k = 1; k <= 48; k++)
        assert_int_equal(duet_node_replay_take(t, "d", k, now + 1000, now), DUET_ERR_INVALID);
    /* once they expire the room comes back, over and over (rebuilds) */
    for (int round = 1; round <= 20; round++) {
        uint64_t later = now + (uint64_t)round * (1000 + DUET_NODE_GRANT_SKEW_MS + 1);
        for (int i = 0; i < 40; i++)
            assert_int_equal(duet_node_replay_take(t, "d", id++, later + 1000, later), DUET_OK);
        assert_int_equal(duet_node_replay_take(t, "d", id - 1, later + 1000, later),
                         DUET_ERR_INVALID);
    }
    duet_node_replay_destroy(t);
}

static void test_grant_binds_prompt(void **state)
{
    (void)state;
    uint8_t key[DUET_NODE_GRANT_KEY_LEN], mac[DUET_NODE_GRANT_LEN];
    int32_t pages[] = {3, 4, 5}, prompt[] = {1, 300, 400, 350, 450},
            other[] = {1, 300, 401, 350, 450};
    uint64_t now = duet_node_grant_now_ms();
    memset(key, 7, sizeof(key));
    duet_node_grant_t g = {.transfer_id = 99,
                           .decode_id = "dec",
                           .pages = pages,
                           .n_pages = 3,
                           .expiry_ms = now + 5000,
                           .prompt = prompt,
                           .n_prompt = 5,
                           .cached_pages = 0,
                           .temperature = 0.5f,
                           .top_p = 0.9f,
                           .top_k = 4,
                           .seed = 11};
    duet_node_grant_sign(key, &g, mac);
    assert_int_equal(duet_node_grant_verify(key, &g, mac, sizeof(mac), now), DUET_OK);
    duet_node_grant_t h = g;
    h.prompt = other; /* the same length, another prompt: a replay's */
    assert_int_equal(duet_node_grant_verify(key, &h, mac, sizeof(mac), now), DUET_ERR_INVALID);
    h = g;
    h.n_prompt = 4;
    assert_int_equal(duet_node_grant_verify(key, &h, mac, sizeof(mac), now), DUET_ERR_INVALID);
    h = g;
    h.cached_pages = 1;
    assert_int_equal(duet_node_grant_verify(key, &h, mac, sizeof(mac), now), DUET_ERR_INVALID);
    h = g;
    h.seed = 12;
    assert_int_equal(duet_node_grant_verify(key, &h, mac, sizeof(mac), now), DUET_ERR_INVALID);
    h = g;
    h.temperature = 0.6f;
    assert_int_equal(duet_node_grant_verify(key, &h, mac, sizeof(mac), now), DUET_ERR_INVALID);
    h = g;
    h.top_p = 1.0f;
    assert_int_equal(duet_node_grant_verify(key, &h, mac, sizeof(mac), now), DUET_ERR_INVALID);
    h = g;
    h.top_k = 5;
    assert_int_equal(duet_node_grant_verify(key, &h, mac, sizeof(mac), now), DUET_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_once),
        cmocka_unit_test(test_replay_bounded),
        cmocka_unit_test(test_grant_binds_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
