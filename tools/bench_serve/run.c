/* bench-serve's load generator.  One thread launches requests and polls the
 * backend:
 *   closed loop   --concurrency N: a new request as soon as one finishes;
 *   open loop     --request-rate R: Poisson arrivals (exponential gaps from
 *                 the seeded PRNG; R = inf sends everything at once), or
 *                 the trace's own (scaled) timestamps; --concurrency caps
 *                 the requests in flight (an arrival waits for a slot).
 * No request starts after --duration; those in flight finish. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "tools/bench_serve/bench_serve.h"

typedef struct {
    duet_bs_run_t *run;
    size_t inflight, finished, failed;
    int64_t last_done_ns;
} duet__state_t;

static void duet__on_done(size_t idx, void *arg)
{
    duet__state_t *s = arg;
    s->inflight--;
    s->finished++;
    if (!s->run->res[idx].ok)
        s->failed++;
    s->last_done_ns = duet_now_ns();
}

static void duet__progress(const duet_bs_run_config_t *cfg, const duet__state_t *s, size_t total,
                           int64_t elapsed_ns, bool last)
{
    enum { W = 30 };
    char bar[W + 1];
    size_t fill = total ? s->finished * W / total : 0;
    for (size_t i = 0; i < W; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[W] = '\0';
    fprintf(stderr, "\r%s [%s] %zu/%zu done, %zu in flight, %zu failed, %.1f s%s",
            cfg->label ? cfg->label : "bench-serve", bar, s->finished, total, s->inflight,
            s->failed, (double)elapsed_ns / 1e9, last ? "\n" : "   ");
    fflush(stderr);
}

void duet_bs_run_free(duet_bs_run_t *run)
{
    if (run == NULL || run->res == NULL)
        return;
    for (size_t i = 0; i < run->launched; i++)
        duet_free(run->res[i].chunk_ns);
    duet_free(run->res);
    memset(run, 0, sizeof(*run));
}

duet_status_t duet_bs_run(const duet_bs_run_config_t *cfg, const duet_bs_backend_ops_t *ops,
                          duet_bs_backend_t *be, const duet_bs_workload_t *wl, duet_bs_run_t *run)
{
    const bool open = cfg->use_trace_times || cfg->request_rate > 0;
    const bool burst = cfg->request_rate > 0 && isinf(cfg->request_rate);
    const int64_t limit_ns = cfg->duration_s > 0 ? (int64_t)(cfg->duration_s * 1e9) : INT64_MAX;
    uint64_t rng = cfg->seed;
    duet__state_t s = {.run = run};
    int64_t next_ns, last_bar = 0;

    memset(run, 0, sizeof(*run));
    run->res = DUET_NEW_ARRAY(duet_bs_result_t, wl->n ? wl->n : 1);
    if (run->res == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: %zu results", wl->n);
    run->start_ns = duet_now_ns();
    next_ns = run->start_ns;
    s.last_done_ns = run->start_ns;
    for (;;) {
        int64_t now = duet_now_ns(), due = INT64_MAX;
        bool issuing = now - run->start_ns < limit_ns;
        while (issuing && run->launched < wl->n) {
            if (cfg->concurrency > 0 && s.inflight >= (size_t)cfg->concurrency)
                break;
            if (open) {
                due = cfg->use_trace_times ? run->start_ns + wl->reqs[run->launched].arrival_ns
                                           : next_ns;
                if (now < due)
                    break;
            }
            size_t i = run->launched++;
            if (ops->start(be, i, &wl->reqs[i], &run->res[i]) != DUET_OK) {
                duet_bs_result_fail(&run->res[i], "%s", duet_error_msg());
                run->res[i].start_ns = run->res[i].end_ns = now;
                s.inflight++;
                duet__on_done(i, &s);
            } else {
                s.inflight++;
            }
            if (open && !cfg->use_trace_times && !burst) {
                double u = duet_bs_rand_unit(&rng);
                next_ns += (int64_t)(-log(1.0 - u) / cfg->request_rate * 1e9);
            }
            due = INT64_MAX;
        }
        if ((run->launched == wl->n || !issuing) && s.inflight == 0)
            break;
        int64_t timeout = 20 * DUET_NS_PER_MS;
        if (due != INT64_MAX && due - now < timeout)
            timeout = due - now > 0 ? due - now : 0;
        if (issuing && limit_ns != INT64_MAX && run->start_ns + limit_ns - now < timeout)
            timeout = run->start_ns + limit_ns - now;
        ops->poll(be, timeout, duet__on_done, &s);
        now = duet_now_ns();
        if (cfg->progress && now - last_bar > 100 * DUET_NS_PER_MS) {
            duet__progress(cfg, &s, wl->n, now - run->start_ns, false);
            last_bar = now;
        }
    }
    run->end_ns = s.last_done_ns;
    if (cfg->progress)
        duet__progress(cfg, &s, run->launched, duet_now_ns() - run->start_ns, true);
    return DUET_OK;
}
