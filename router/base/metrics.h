/* Router metrics: lock-free counters and histograms (atomics) updated from
 * any thread, rendered as Prometheus text (exposition format 0.0.4).
 *
 * Names (all prefixed duet_router_):
 *   http_requests_total{route,code}       HTTP responses by route and status
 *   grpc_requests_total{code}             gRPC Generate calls by status name
 *   time_to_first_token_seconds           histogram, admission to first token
 *   inter_token_latency_seconds           histogram, between streamed chunks
 *                                         (per token when a chunk has several)
 *   request_duration_seconds              histogram, admission to the end
 *   queue_wait_seconds                    histogram, time spent queued
 *   retries_total, client_disconnects_total, stream_errors_total,
 *   prompt_tokens_total, generation_tokens_total
 *   time_per_output_token_seconds         histogram, per finished request with
 *                                         2+ tokens: first to last token over
 *                                         tokens - 1 (TPOT; SLO attainment is
 *                                         a bucket over the count)
 *   prompt_tokens_admitted_total          prompt tokens of created requests
 *                                         (the rate prefill must absorb)
 *   prompt_tokens_waiting                 gauge, prompt tokens of requests
 *                                         without a first token yet (queued
 *                                         here or being prefilled)
 *   workers_joined_total, workers_left_total   discovered workers (workers.h)
 *   discovery_lookup_failures_total            failed DNS lookups of groups
 *   migrations_total{reason}              started streams moved to another
 *                                         decode: unavailable, stall, error
 *                                         (docs/migration.md)
 *   routes_total{route}                   launches: "colocated" (a decode
 *                                         that prefills itself, no prefill
 *                                         named) or "disaggregated"
 * Gauges (queue depth, in flight, per-worker health/load) are appended by
 * the caller of duet_router_metrics_render. */
#ifndef DUET_ROUTER_BASE_METRICS_H
#define DUET_ROUTER_BASE_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "router/base/buf.h"

#define DUET_ROUTER_HIST_BUCKETS 16

typedef struct {
    _Atomic uint64_t buckets[DUET_ROUTER_HIST_BUCKETS + 1]; /* last = +Inf */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_ns;
} duet_router_hist_t;

typedef enum {
    DUET_ROUTER_ROUTE_COMPLETIONS,
    DUET_ROUTER_ROUTE_CHAT,
    DUET_ROUTER_ROUTE_MODELS,
    DUET_ROUTER_ROUTE_HEALTH,
    DUET_ROUTER_ROUTE_METRICS,
    DUET_ROUTER_ROUTE_WORKERS,
    DUET_ROUTER_ROUTE_OTHER,
    DUET_ROUTER_ROUTE_COUNT
} duet_router_route_t;

#define DUET_ROUTER_METRICS_N_CODES 14

/* migrations_total's reasons (docs/migration.md) */
enum {
    DUET_ROUTER_MIGRATE_UNAVAILABLE,
    DUET_ROUTER_MIGRATE_STALL,
    DUET_ROUTER_MIGRATE_ERROR,
    DUET_ROUTER_MIGRATE_DRAIN, /* its decode drained (SIGTERM) */
    DUET_ROUTER_MIGRATE_N
};

typedef struct {
    _Atomic uint64_t http[DUET_ROUTER_ROUTE_COUNT][DUET_ROUTER_METRICS_N_CODES];
    _Atomic uint64_t grpc[17];
    duet_router_hist_t ttft, itl, duration, queue_wait, tpot;
    _Atomic uint64_t retries, disconnects, stream_errors, prompt_tokens, generation_tokens;
    _Atomic uint64_t workers_joined, workers_left, discovery_failures;
    /* per-role autoscaling signals (docs/deploy.md "Scaling P and D apart") */
    _Atomic uint64_t prompt_tokens_admitted;
    _Atomic int64_t prompt_tokens_waiting;
    /* launches by route: whole requests to a colocated decode, or a decode
     * with a prefill (docs/design-notes.md "Colocated mode ...") */
    _Atomic uint64_t routes_colocated, routes_disaggregated;
    _Atomic uint64_t migrations[DUET_ROUTER_MIGRATE_N];
} duet_router_metrics_t;

void duet_router_metrics_init(duet_router_metrics_t *m);
void duet_router_hist_observe(duet_router_hist_t *h, int64_t ns);
/* Count an HTTP response (status 100..599; unknown ones count as "other"). */
void duet_router_metrics_http(duet_router_metrics_t *m, duet_router_route_t route, int status);
void duet_router_metrics_grpc(duet_router_metrics_t *m, int grpc_code);
const char *duet_router_route_name(duet_router_route_t r);

/* Append the counters and histograms. */
void duet_router_metrics_render(duet_router_metrics_t *m, duet_router_buf_t *b);

#endif
