/* The fields that shape a completion's choices (docs/api-logprobs.md):
 * n and best_of, logprobs / top_logprobs, echo, and access to a request's
 * prompts.  OpenAI's shapes: legacy completions take `logprobs` as the
 * number of alternatives (0..5) and `echo`; chat takes `logprobs` as a
 * bool and `top_logprobs` 0..20, and has no echo. */
#include <cjson/cJSON.h>
#include <math.h>

#include "router/openai/openai.h"
#include "router/openai/openai_internal.h"

static duet_status_t duet__parse_logprobs(const cJSON *root, duet_router_oai_req_t *req,
                                          duet_router_oai_error_t *err)
{
    const cJSON *lp = duet__oai_field(root, "logprobs"),
                *top = duet__oai_field(root, "top_logprobs");

    if (req->api == DUET_ROUTER_API_COMPLETIONS) {
        if (lp != NULL && !cJSON_IsFalse(lp)) {
            if (!duet__oai_int_in(lp, 0, DUET_ROUTER_OAI_TOP_MAX_COMPLETIONS))
                return duet_router_oai_fail(
                    err, 400, "logprobs", NULL,
                    "logprobs must be an integer 0..%d (the number of most likely tokens to "
                    "return with each token's logprob) or null",
                    DUET_ROUTER_OAI_TOP_MAX_COMPLETIONS);
            req->logprobs = true;
            req->top_logprobs = (int)lp->valuedouble;
        }
        if (top != NULL && !duet__oai_int_in(top, 0, 0))
            return duet_router_oai_fail(err, 400, "top_logprobs", NULL,
                                        "top_logprobs is a chat field: completions take the "
                                        "number of alternatives in logprobs (0..%d)",
                                        DUET_ROUTER_OAI_TOP_MAX_COMPLETIONS);
        return DUET_OK;
    }
    if (lp != NULL && !cJSON_IsBool(lp))
        return duet_router_oai_fail(err, 400, "logprobs", NULL,
                                    "logprobs must be a boolean for chat completions (the number "
                                    "of alternatives goes in top_logprobs)");
    req->logprobs = lp != NULL && cJSON_IsTrue(lp);
    if (top != NULL) {
        if (!duet__oai_int_in(top, 0, DUET_ROUTER_OAI_TOP_MAX_CHAT))
            return duet_router_oai_fail(err, 400, "top_logprobs", NULL,
                                        "top_logprobs must be an integer 0..%d",
                                        DUET_ROUTER_OAI_TOP_MAX_CHAT);
        if (!req->logprobs && top->valuedouble > 0)
            return duet_router_oai_fail(err, 400, "top_logprobs", NULL,
                                        "top_logprobs needs logprobs: true");
        req->top_logprobs = (int)top->valuedouble;
    }
    return DUET_OK;
}

duet_status_t duet_router_oai_parse_choices(const void *root_json, duet_router_oai_req_t *req,
                                            duet_router_oai_error_t *err)
{
    const cJSON *root = root_json, *v;
    duet_status_t st;

    req->n = 1;
    if ((v = duet__oai_field(root, "n")) != NULL) {
        if (!duet__oai_int_in(v, 1, DUET_ROUTER_OAI_N_MAX))
            return duet_router_oai_fail(err, 400, "n", NULL, "n must be an integer 1..%d",
                                        DUET_ROUTER_OAI_N_MAX);
        req->n = (int)v->valuedouble;
    }
    if ((v = duet__oai_field(root, "best_of")) != NULL && !duet__oai_int_in(v, req->n, req->n))
        return duet_router_oai_fail(err, 400, "best_of", NULL,
                                    "best_of must equal n (%d): choosing the best of more "
                                    "samples is not supported",
                                    req->n);
    size_t choices = (size_t)req->n * duet_router_oai_n_prompts(req);
    if (choices > DUET_ROUTER_OAI_CHOICES_MAX)
        return duet_router_oai_fail(
            err, 400, "n", NULL, "n (%d) x prompts (%zu) = %zu choices, at most %d per request",
            req->n, duet_router_oai_n_prompts(req), choices, DUET_ROUTER_OAI_CHOICES_MAX);
    if ((st = duet__parse_logprobs(root, req, err)) != DUET_OK)
        return st;
    if ((v = duet__oai_field(root, "echo")) != NULL) {
        if (!cJSON_IsBool(v))
            return duet_router_oai_fail(err, 400, "echo", NULL, "echo must be a boolean");
        if (cJSON_IsTrue(v) && req->api == DUET_ROUTER_API_CHAT)
            return duet_router_oai_fail(err, 400, "echo", NULL,
                                        "echo is a completions field: chat completions do not "
                                        "echo the prompt");
        req->echo = cJSON_IsTrue(v);
    }
    return DUET_OK;
}

size_t duet_router_oai_n_prompts(const duet_router_oai_req_t *req)
{
    return 1 + req->n_more_prompts;
}

duet_router_oai_prompt_t duet_router_oai_prompt(const duet_router_oai_req_t *req, size_t i)
{
    if (i == 0)
        return (duet_router_oai_prompt_t){req->has_text, req->prompt_text, req->prompt_text_len,
                                          req->prompt_ids, req->n_prompt_ids};
    return req->more_prompts[i - 1];
}
