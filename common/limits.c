#include "common/limits.h"

int duet_limit_prompt_tokens(const duet_cluster_config_t *cfg, int context)
{
    int lim = cfg->router.max_prompt_tokens;
    return lim > 0 && lim < context ? lim : context;
}

size_t duet_limit_router_message_bytes(const duet_cluster_config_t *cfg)
{
    return (size_t)cfg->router.max_body_bytes + DUET_LIMIT_MESSAGE_SLACK;
}

size_t duet_limit_daemon_message_bytes(const duet_cluster_config_t *cfg, int context)
{
    size_t prompt = (size_t)duet_limit_prompt_tokens(cfg, context);
    size_t pages = prompt / (size_t)(cfg->page_size > 0 ? cfg->page_size : 1) + 2;
    return duet_limit_router_message_bytes(cfg) + 5 * (prompt + pages) + ((size_t)64 << 10);
}
