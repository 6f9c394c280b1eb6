#include "router/base/metrics.h"

#include <string.h>

#include "common/rpc.h"

static const double duet__bounds[DUET_ROUTER_HIST_BUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};

static const int duet__codes[DUET_ROUTER_METRICS_N_CODES - 1] = {200, 400, 401, 404, 405, 408, 413,
                                                                 429, 500, 501, 502, 503, 504};

void duet_router_metrics_init(duet_router_metrics_t *m)
{
    memset(m, 0, sizeof(*m));
}

void duet_router_hist_observe(duet_router_hist_t *h, int64_t ns)
{
    double s = (double)(ns < 0 ? 0 : ns) / 1e9;
    size_t i = 0;
    while (i < DUET_ROUTER_HIST_BUCKETS && s > duet__bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)(ns < 0 ? 0 : ns), memory_order_relaxed);
}

void duet_router_metrics_http(duet_router_metrics_t *m, duet_router_route_t route, int status)
{
    size_t i = 0;
    while (i < DUET_ROUTER_METRICS_N_CODES - 1 && duet__codes[i] != status)
        i++;
    atomic_fetch_add_explicit(&m->http[route][i], 1, memory_order_relaxed);
}

void duet_router_metrics_grpc(duet_router_metrics_t *m, int grpc_code)
{
    if (grpc_code < 0 || grpc_code > 16)
        grpc_code = 2; /* UNKNOWN */
    atomic_fetch_add_explicit(&m->grpc[grpc_code], 1, memory_order_relaxed);
}

const char *duet_router_route_name(duet_router_route_t r)
{
    static const char *const names[] = {"/v1/completions",
                                        "/v1/chat/completions",
                                        "/v1/models",
                                        "/health",
                                        "/metrics",
                                        "/workers",
                                        "other"};
    return r < DUET_ROUTER_ROUTE_COUNT ? names[r] : "other";
}

static void duet__hist(duet_router_buf_t *b, const char *name, const char *help,
                       duet_router_hist_t *h)
{
    uint64_t cum = 0;
    duet_router_buf_printf(b, "# HELP duet_router_%s %s\n# TYPE duet_router_%s histogram\n", name,
                           help, name);
    for (size_t i = 0; i <= DUET_ROUTER_HIST_BUCKETS; i++) {
        cum += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        if (i < DUET_ROUTER_HIST_BUCKETS)
            duet_router_buf_printf(b, "duet_router_%s_bucket{le=\"%g\"} %llu\n", name,
                                   duet__bounds[i], (unsigned long long)cum);
        else
            duet_router_buf_printf(b, "duet_router_%s_bucket{le=\"+Inf\"} %llu\n", name,
                                   (unsigned long long)cum);
    }
    duet_router_buf_printf(
        b, "duet_router_%s_sum %.9f\nduet_router_%s_count %llu\n", name,
        (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9, name,
        (unsigned long long)atomic_load_explicit(&h->count, memory_order_relaxed));
}

static void duet__counter(duet_router_buf_t *b, const char *name, const char *help,
                          _Atomic uint64_t *v)
{
    duet_router_buf_printf(b,
                           "# HELP duet_router_%s %s\n# TYPE duet_router_%s counter\n"
                           "duet_router_%s %llu\n",
                           name, help, name, name,
                           (unsigned long long)atomic_load_explicit(v, memory_order_relaxed));
}

void duet_router_metrics_render(duet_router_metrics_t *m, duet_router_buf_t *b)
{
    duet_router_buf_puts(b, "# HELP duet_router_http_requests_total HTTP responses by route and "
                            "status code\n# TYPE duet_router_http_requests_total counter\n");
    for (int r = 0; r < DUET_ROUTER_ROUTE_COUNT; r++) {
        for (int c = 0; c < DUET_ROUTER_METRICS_N_CODES; c++) {
            uint64_t v = atomic_load_explicit(&m->http[r][c], memory_order_relaxed);
            if (v == 0)
                continue;
            if (c < DUET_ROUTER_METRICS_N_CODES - 1)
                duet_router_buf_printf(b,
                                       "duet_router_http_requests_total{route=\"%s\",code=\"%d\"} "
                                       "%llu\n",
                                       duet_router_route_name(r), duet__codes[c],
                                       (unsigned long long)v);
            else
                duet_router_buf_printf(b,
                                       "duet_router_http_requests_total{route=\"%s\",code="
                                       "\"other\"} %llu\n",
                                       duet_router_route_name(r), (unsigned long long)v);
        }
    }
    duet_router_buf_puts(b, "# HELP duet_router_grpc_requests_total gRPC Generate calls by "
                            "status\n# TYPE duet_router_grpc_requests_total counter\n");
    for (int c = 0; c < 17; c++) {
        uint64_t v = atomic_load_explicit(&m->grpc[c], memory_order_relaxed);
        if (v)
            duet_router_buf_printf(b, "duet_router_grpc_requests_total{code=\"%s\"} %llu\n",
                                   duet_rpc_code_name((grpc_status_code)c), (unsigned long long)v);
    }
    duet__hist(b, "time_to_first_token_seconds", "Admission to first token", &m->ttft);
    duet__hist(b, "inter_token_latency_seconds", "Time between streamed tokens", &m->itl);
    duet__hist(b, "request_duration_seconds", "Admission to the end of the response", &m->duration);
    duet__hist(b, "queue_wait_seconds", "Time spent in the router's admission queue",
               &m->queue_wait);
    duet__hist(b, "time_per_output_token_seconds",
               "Per finished request of 2+ tokens: first to last token over tokens - 1", &m->tpot);
    duet__counter(b, "prompt_tokens_admitted_total", "Prompt tokens of created requests",
                  &m->prompt_tokens_admitted);
    duet_router_buf_printf(
        b,
        "# HELP duet_router_prompt_tokens_waiting Prompt tokens of requests without a first token "
        "yet (queued or being prefilled)\n# TYPE duet_router_prompt_tokens_waiting gauge\n"
        "duet_router_prompt_tokens_waiting %lld\n",
        (long long)atomic_load_explicit(&m->prompt_tokens_waiting, memory_order_relaxed));
    duet__counter(b, "retries_total", "Requests retried on another worker pair", &m->retries);
    duet_router_buf_puts(b, "# HELP duet_router_migrations_total Started streams moved to "
                            "another decode, by reason\n# TYPE duet_router_migrations_total "
                            "counter\n");
    static const char *const reasons[DUET_ROUTER_MIGRATE_N] = {"unavailable", "stall", "error",
                                                                "drain"};
    for (int i = 0; i < DUET_ROUTER_MIGRATE_N; i++)
        duet_router_buf_printf(
            b, "duet_router_migrations_total{reason=\"%s\"} %llu\n", reasons[i],
            (unsigned long long)atomic_load_explicit(&m->migrations[i], memory_order_relaxed));
    duet__counter(b, "client_disconnects_total", "Requests cancelled by the client",
                  &m->disconnects);
    duet__counter(b, "stream_errors_total", "Streams ended by an error after the first token",
                  &m->stream_errors);
    duet__counter(b, "prompt_tokens_total", "Prompt tokens of finished requests",
                  &m->prompt_tokens);
    duet__counter(b, "generation_tokens_total", "Generated tokens of finished requests",
                  &m->generation_tokens);
    duet__counter(b, "workers_joined_total", "Workers found through DNS (discover groups)",
                  &m->workers_joined);
    duet__counter(b, "workers_left_total",
                  "Discovered workers taken out of rotation for good (gone from DNS, restarted)",
                  &m->workers_left);
    duet__counter(b, "discovery_lookup_failures_total", "Failed DNS lookups of discover groups",
                  &m->discovery_failures);
    duet_router_buf_printf(
        b,
        "# HELP duet_router_routes_total Launches by route: colocated (the decode prefills "
        "locally) or disaggregated (a prefill worker named)\n"
        "# TYPE duet_router_routes_total counter\n"
        "duet_router_routes_total{route=\"colocated\"} %llu\n"
        "duet_router_routes_total{route=\"disaggregated\"} %llu\n",
        (unsigned long long)atomic_load_explicit(&m->routes_colocated, memory_order_relaxed),
        (unsigned long long)atomic_load_explicit(&m->routes_disaggregated, memory_order_relaxed));
}
