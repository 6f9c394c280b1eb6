/* Log-probabilities (docs/api-logprobs.md): engine/logprobs against a
 * direct double computation, the top list's order and ties, the request
 * checks, and node/logprob_pb's checks of a received TokenLogprob. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/logprobs.h"
#include "node/logprob_pb.h"

static void test_compute(void **state)
{
    enum { V = 1000 };
    static float logits[V];
    duet_logprob_t lp;
    double sum = 0.0;
    (void)state;

    /* large values: a float sum of exp would lose the small terms */
    for (int i = 0; i < V; i++)
        logits[i] = 80.0f + (float)((i * 7919) % 1000) / 37.0f;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - 200.0);
    double lse = 200.0 + log(sum);
    assert_int_equal(duet_logprob_compute(logits, V, 17, 20, &lp), DUET_OK);
    assert_int_equal(lp.id, 17);
    assert_true(fabs(lp.logprob - ((double)logits[17] - lse)) < 1e-5);
    assert_int_equal(lp.n_top, 20);
    for (int k = 0; k < 20; k++) {
        assert_true(fabs(lp.top_logprobs[k] - ((double)logits[lp.top_ids[k]] - lse)) < 1e-5);
        if (k > 0)
            assert_true(logits[lp.top_ids[k]] <= logits[lp.top_ids[k - 1]]);
    }
    /* every token outside the list is no more likely than its last */
    for (int i = 0; i < V; i++) {
        bool in = false;
        for (int k = 0; k < 20; k++)
            in = in || lp.top_ids[k] == i;
        if (!in)
            assert_true(logits[i] <= logits[lp.top_ids[19]]);
    }
    /* probabilities sum to 1 */
    double p = 0.0;
    for (int i = 0; i < V; i++) {
        duet_logprob_t one;
        assert_int_equal(duet_logprob_compute(logits, V, i, 0, &one), DUET_OK);
        assert_int_equal(one.n_top, 0);
        p += exp((double)one.logprob);
    }
    assert_true(fabs(p - 1.0) < 1e-4);
}

static void test_ties_and_bounds(void **state)
{
    float logits[6] = {1.0f, 3.0f, 3.0f, 0.5f, 3.0f, -2.0f};
    duet_logprob_t lp;
    (void)state;

    assert_int_equal(duet_logprob_compute(logits, 6, 0, 4, &lp), DUET_OK);
    int want[4] = {1, 2, 4, 0}; /* equal logits: lower id first */
    for (int k = 0; k < 4; k++)
        assert_int_equal(lp.top_ids[k], want[k]);
    assert_true(fabs(lp.top_logprobs[0] - lp.top_logprobs[2]) == 0.0f);
    assert_int_equal(duet_logprob_compute(logits, 6, 6, 0, &lp), DUET_ERR_INVALID);
    assert_int_equal(duet_logprob_compute(logits, 6, -1, 0, &lp), DUET_ERR_INVALID);
    assert_int_equal(duet_logprob_compute(logits, 6, 0, 7, &lp), DUET_ERR_INVALID);
    assert_int_equal(duet_logprob_compute(logits, 6, 0, -1, &lp), DUET_ERR_INVALID);
    assert_int_equal(duet_logprob_compute(logits, 6, 0, 6, &lp), DUET_OK);
    assert_int_equal(lp.n_top, 6);

    assert_int_equal(duet_logprob_params_check(20, false, 10, 512), DUET_OK);
    assert_int_equal(duet_logprob_params_check(21, false, 10, 512), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "top_logprobs"));
    assert_int_equal(duet_logprob_params_check(7, false, 10, 6), DUET_ERR_INVALID);
    assert_int_equal(duet_logprob_params_check(0, true, 4096, 128256), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "prompt_logprobs"));
    assert_int_equal(duet_logprob_params_check(0, true, 1024, 128256), DUET_OK);
}

static void test_pb(void **state)
{
    float logits[8] = {0.1f, 2.0f, -1.0f, 0.7f, 0.0f, 1.5f, -3.0f, 0.2f};
    duet_logprob_t lp, back;
    Duet__V1__TokenLogprob m;
    Duet__V1__TopLogprob tops[DUET_LOGPROBS_TOP_MAX], *ptrs[DUET_LOGPROBS_TOP_MAX];
    (void)state;

    assert_int_equal(duet_logprob_compute(logits, 8, 3, 3, &lp), DUET_OK);
    duet_node_logprob_to_pb(&lp, &m, tops, ptrs);
    assert_int_equal(duet_node_logprob_from_pb(&m, 8, 3, &back), DUET_OK);
    assert_memory_equal(&back.top_ids, &lp.top_ids, 3 * sizeof(int32_t));
    assert_true(back.logprob == lp.logprob && back.id == 3 && back.n_top == 3);
    /* what a peer must not send */
    assert_int_equal(duet_node_logprob_from_pb(&m, 8, 2, &back), DUET_ERR_INVALID);
    assert_int_equal(duet_node_logprob_from_pb(NULL, 8, 3, &back), DUET_ERR_INVALID);
    assert_int_equal(duet_node_logprob_from_pb(&m, 3, 3, &back), DUET_ERR_INVALID);
    m.logprob = 0.5f;
    assert_int_equal(duet_node_logprob_from_pb(&m, 8, 3, &back), DUET_ERR_INVALID);
    m.logprob = NAN;
    assert_int_equal(duet_node_logprob_from_pb(&m, 8, 3, &back), DUET_ERR_INVALID);
    m.logprob = lp.logprob;
    tops[1].id = 99;
    assert_int_equal(duet_node_logprob_from_pb(&m, 8, 3, &back), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "alternative 1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compute),
        cmocka_unit_test(test_ties_and_bounds),
        cmocka_unit_test(test_pb),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
