/* The decode request both front ends build their jobs from
 * (router/job/request.c): an OpenAI request's fields as a GenerateRequest,
 * a gRPC client's request with token ids and a capped max_tokens, and each
 * choice's own request id and seed (docs/api-logprobs.md "Seeds"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "router/job/request.h"

/* the model facts the builder reads: a 64-token context */
static void rt_init(duet_router_t *rt)
{
    memset(rt, 0, sizeof(*rt));
    rt->context_len = 64;
    rt->prompt_limit = 64;
    rt->vocab = 512;
    rt->max_tokens_limit = 1000;
    rt->default_max_tokens = 16;
}

static void parse(const char *body, duet_router_api_t api, duet_router_oai_req_t *req)
{
    duet_router_oai_limits_t lim = {1000, 512, 16};
    duet_router_oai_error_t err;
    assert_int_equal(duet_router_oai_parse(body, strlen(body), api, &lim, req, &err), DUET_OK);
}

static void test_from_oai(void **state)
{
    duet_router_t rt;
    duet_router_oai_req_t req;
    duet_router_gen_t gen;
    int32_t ids[] = {5, 6, 7};
    long live = duet_alloc_live();
    (void)state;

    rt_init(&rt);
    parse("{\"prompt\":[5,6,7],\"max_tokens\":100,\"temperature\":0.5,\"top_p\":1,"
          "\"top_k\":4,\"seed\":9,\"stop\":[\"x\",\"yz\"],\"stop_token_ids\":[3],"
          "\"ignore_eos\":true,\"logprobs\":2,\"echo\":true}",
          DUET_ROUTER_API_COMPLETIONS, &req);
    duet_router_gen_from_oai(&gen, &rt, &req, ids, 3);
    assert_int_equal(gen.g.prompt_case, DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS);
    assert_int_equal(gen.g.token_ids->n_ids, 3);
    assert_int_equal(gen.g.token_ids->ids[2], 7);
    assert_int_equal(gen.g.max_tokens, 64 - 3 + 1); /* the context's room */
    assert_true(gen.g.sampling->temperature == 0.5f);
    assert_true(gen.g.sampling->top_p == 0.0f); /* 1 = off */
    assert_int_equal(gen.g.sampling->top_k, 4);
    assert_true(gen.g.sampling->has_seed);
    assert_int_equal(gen.g.sampling->seed, 9);
    assert_int_equal(gen.g.n_stop, 2);
    assert_string_equal(gen.g.stop[1], "yz");
    assert_int_equal(gen.g.n_stop_token_ids, 1);
    assert_true(gen.g.ignore_eos && gen.g.logprobs && gen.g.prompt_logprobs);
    assert_int_equal(gen.g.top_logprobs, 2);
    assert_int_equal(gen.g.n, 0);
    duet_router_oai_req_cleanup(&req);

    parse("{\"prompt\":\"a\"}", DUET_ROUTER_API_COMPLETIONS, &req);
    duet_router_gen_from_oai(&gen, &rt, &req, ids, 1);
    assert_false(gen.g.sampling->has_seed);
    assert_int_equal(gen.g.sampling->seed, 0);
    assert_int_equal(gen.g.max_tokens, 16); /* completions' default */
    assert_false(gen.g.prompt_logprobs);
    duet_router_oai_req_cleanup(&req);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_choice(void **state)
{
    duet_router_t rt;
    duet_router_oai_req_t req;
    duet_router_gen_t base, c0, c2, one;
    int32_t ids[] = {5};
    (void)state;

    rt_init(&rt);
    parse("{\"prompt\":[5],\"seed\":9,\"n\":3}", DUET_ROUTER_API_COMPLETIONS, &req);
    duet_router_gen_from_oai(&base, &rt, &req, ids, 1);
    duet_router_gen_choice(&c0, &base.g, "cmpl-x", 0, 3);
    duet_router_gen_choice(&c2, &base.g, "cmpl-x", 2, 3);
    duet_router_gen_choice(&one, &base.g, "cmpl-x", 0, 1);
    /* every choice is its own decode request; n = 1 keeps the id */
    assert_string_equal(c0.g.request_id, "cmpl-x-0");
    assert_string_equal(c2.g.request_id, "cmpl-x-2");
    assert_string_equal(one.g.request_id, "cmpl-x");
    /* choice 0 keeps the seed, the others mix in their index */
    assert_int_equal(c0.g.sampling->seed, 9);
    assert_int_equal(one.g.sampling->seed, 9);
    assert_int_equal(c2.g.sampling->seed, duet_router_choice_seed(9, 2));
    assert_true(c2.g.sampling->seed != 9 && c2.g.sampling->has_seed);
    assert_true(c2.g.sampling->temperature == base.g.sampling->temperature);
    /* the base is not touched */
    assert_int_equal(base.g.sampling->seed, 9);
    assert_string_equal(base.g.request_id, "");
    assert_int_equal(c2.g.n, 0);
    duet_router_oai_req_cleanup(&req);

    /* unseeded: every choice samples unseeded */
    parse("{\"prompt\":[5],\"n\":2}", DUET_ROUTER_API_COMPLETIONS, &req);
    duet_router_gen_from_oai(&base, &rt, &req, ids, 1);
    duet_router_gen_choice(&c2, &base.g, "cmpl-y", 1, 2);
    assert_false(c2.g.sampling->has_seed);
    assert_int_equal(c2.g.sampling->seed, 0);
    duet_router_oai_req_cleanup(&req);
}

static void test_from_client(void **state)
{
    duet_router_t rt;
    Duet__V1__GenerateRequest in = DUET__V1__GENERATE_REQUEST__INIT;
    Duet__V1__SamplingParams sp = DUET__V1__SAMPLING_PARAMS__INIT;
    duet_router_gen_t gen, c1;
    int32_t ids[] = {1, 2, 3, 4};
    char *stop[] = {"end"};
    (void)state;

    rt_init(&rt);
    sp.seed = 7;
    sp.has_seed = true;
    in.request_id = "";
    in.model = "m";
    in.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TEXT;
    in.text = "hello";
    in.sampling = &sp;
    in.max_tokens = 500;
    in.n_stop = 1;
    in.stop = stop;
    in.logprobs = true;
    in.top_logprobs = 3;
    in.n = 2;
    duet_router_gen_from_client(&gen, &rt, &in, "cmpl-z", ids, 4);
    assert_string_equal(gen.g.request_id, "cmpl-z");
    assert_string_equal(gen.g.model, "");
    assert_int_equal(gen.g.prompt_case, DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS);
    assert_int_equal(gen.g.token_ids->n_ids, 4);
    assert_int_equal(gen.g.max_tokens, 64 - 4 + 1);
    /* the client's other fields go to decode as they came */
    assert_ptr_equal(gen.g.sampling, &sp);
    assert_int_equal(gen.g.n_stop, 1);
    assert_true(gen.g.logprobs);
    assert_int_equal(gen.g.top_logprobs, 3);
    /* and the client's message is left as protobuf-c will free it */
    assert_string_equal(in.request_id, "");
    assert_string_equal(in.model, "m");
    assert_int_equal(in.prompt_case, DUET__V1__GENERATE_REQUEST__PROMPT_TEXT);
    assert_string_equal(in.text, "hello");
    assert_int_equal(in.max_tokens, 500);
    duet_router_gen_choice(&c1, &gen.g, gen.g.request_id, 1, 2);
    assert_string_equal(c1.g.request_id, "cmpl-z-1");
    assert_int_equal(c1.g.sampling->seed, duet_router_choice_seed(7, 1));
    assert_int_equal(c1.g.n, 0);
    assert_int_equal(sp.seed, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_oai),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_from_client),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
