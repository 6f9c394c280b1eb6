/* The timing rule of a remote prefill (node/deadline.h). */
#include "node/deadline.h"

#include "common/clock.h"
#include "node/grant.h"

int64_t duet_node_deadline_transfer(const duet_cluster_config_t *c, int64_t now_ns)
{
    return now_ns +
           ((int64_t)c->transfer_queue_timeout_ms + c->transfer_timeout_ms) * DUET_NS_PER_MS;
}

int64_t duet_node_deadline_started(const duet_cluster_config_t *c, int64_t now_ns)
{
    return now_ns + (int64_t)c->transfer_timeout_ms * DUET_NS_PER_MS;
}

int64_t duet_node_deadline_prefill_call(const duet_cluster_config_t *c, int64_t now_ns)
{
    return now_ns + ((int64_t)c->transfer_queue_timeout_ms + c->transfer_timeout_ms +
                     c->rpc_timeout_ms) *
                        DUET_NS_PER_MS;
}

uint64_t duet_node_deadline_grant_expiry(const duet_cluster_config_t *c)
{
    return duet_node_grant_now_ms() + (uint64_t)c->transfer_queue_timeout_ms +
           (uint64_t)c->transfer_timeout_ms + (uint64_t)c->rpc_timeout_ms;
}

int64_t duet_node_deadline_send(const duet_cluster_config_t *c, int64_t now_ns,
                                int64_t call_deadline_ns)
{
    int64_t deadline = duet_node_deadline_started(c, now_ns);
    int64_t rpc_ns = (int64_t)c->rpc_timeout_ms * DUET_NS_PER_MS;
    if (call_deadline_ns != INT64_MAX && call_deadline_ns - rpc_ns < deadline)
        deadline = call_deadline_ns - rpc_ns;
    return deadline;
}

int64_t duet_node_deadline_rpc(const duet_cluster_config_t *c, int64_t now_ns)
{
    return now_ns + (int64_t)c->rpc_timeout_ms * DUET_NS_PER_MS;
}

int duet_node_batch_tokens(const duet_cluster_config_t *c, int max_batch_tokens,
                           double tokens_per_s)
{
    int limit = max_batch_tokens > 0 ? max_batch_tokens : 1;
    if (tokens_per_s > 0) {
        double fit = tokens_per_s * (double)c->transfer_timeout_ms / 2000.0;
        if (fit < (double)limit)
            limit = fit >= 1.0 ? (int)fit : 1;
    }
    return limit;
}
