#include "decode/limits.h"

#include "common/limits.h"

int duet_dc_limits_prompt(const duet_decode_t *dc, uint32_t resumed)
{
    int64_t max = (int64_t)duet_limit_prompt_tokens(dc->node.args.cluster, dc->max_ctx) + resumed;
    return max < dc->max_ctx ? (int)max : dc->max_ctx;
}

duet_status_t duet_dc_limits_check(const duet_decode_t *dc, const Duet__V1__GenerateRequest *g,
                                   uint32_t resumed)
{
    const duet_router_config_t *rc = &dc->node.args.cluster->router;
    int prompt_max = duet_dc_limits_prompt(dc, resumed);

    if (g->max_tokens > (uint32_t)rc->max_tokens_limit)
        return duet_error(DUET_ERR_INVALID,
                          "max_tokens: %u is over the limit of %d (router.max_tokens_limit)",
                          g->max_tokens, rc->max_tokens_limit);
    if (g->n_stop > DUET_LIMIT_STOP_STRINGS)
        return duet_error(DUET_ERR_INVALID, "stop: %zu strings, at most %d are allowed", g->n_stop,
                          DUET_LIMIT_STOP_STRINGS);
    if (g->n_stop_token_ids > DUET_LIMIT_STOP_TOKEN_IDS)
        return duet_error(DUET_ERR_INVALID, "stop_token_ids: %zu ids, at most %d are allowed",
                          g->n_stop_token_ids, DUET_LIMIT_STOP_TOKEN_IDS);
    if (g->prompt_case == DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS && g->token_ids != NULL &&
        g->token_ids->n_ids > (size_t)prompt_max)
        return duet_error(DUET_ERR_TOO_LONG,
                          "token_ids: the prompt has %zu tokens, at most %d are allowed (%s)",
                          g->token_ids->n_ids, prompt_max,
                          prompt_max < dc->max_ctx                 ? "router.max_prompt_tokens"
                          : dc->node.args.cluster->max_context > 0 ? "the context, kv.max_context"
                                                                   : "the model context");
    return DUET_OK;
}
