/* bench-serve metrics, defined as vLLM's `bench serve` and SGLang's
 * bench_serving define them, over the requests that completed:
 *   TTFT  first token-bearing chunk - request start
 *   TPOT  (E2E - TTFT) / (output tokens - 1), requests with > 1 output token
 *   ITL   the gaps between consecutive token-bearing chunks, all requests
 *   E2E   end of the stream - request start
 *   throughput  completed requests, input, output tokens / benchmark time
 *   goodput     requests with TTFT <= --slo-ttft-ms and TPOT <= --slo-tpot-ms
 *               (each when set) / benchmark time
 * Statistics: mean, population std, median, p90, p99 (linear
 * interpolation between closest ranks, numpy's default). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "tools/bench_serve/bench_serve.h"

static int duet__cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double duet_bs_percentile(const double *v, size_t n, double pct)
{
    if (n == 0)
        return 0;
    double rank = pct / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (rank - (double)lo);
}

/* Sorts v in place. */
static void duet__stat(double *v, size_t n, duet_bs_stat_t *st)
{
    double sum = 0, sq = 0;
    memset(st, 0, sizeof(*st));
    st->n = n;
    if (n == 0)
        return;
    qsort(v, n, sizeof(double), duet__cmp);
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    st->mean = sum / (double)n;
    for (size_t i = 0; i < n; i++)
        sq += (v[i] - st->mean) * (v[i] - st->mean);
    st->std = sqrt(sq / (double)n);
    st->median = duet_bs_percentile(v, n, 50);
    st->p90 = duet_bs_percentile(v, n, 90);
    st->p99 = duet_bs_percentile(v, n, 99);
    st->min = v[0];
    st->max = v[n - 1];
}

static double duet__ms(int64_t ns)
{
    return (double)ns / 1e6;
}

static double duet__tpot(const duet_bs_result_t *r)
{
    if (r->output_tokens <= 1)
        return 0;
    return duet__ms(r->end_ns - r->first_ns) / (double)(r->output_tokens - 1);
}

duet_status_t duet_bs_samples(const duet_bs_run_t *run, double **ttft, size_t *n_ttft,
                              double **tpot, size_t *n_tpot)
{
    *ttft = DUET_NEW_ARRAY(double, run->launched + 1);
    *tpot = DUET_NEW_ARRAY(double, run->launched + 1);
    *n_ttft = *n_tpot = 0;
    if (*ttft == NULL || *tpot == NULL) {
        duet_free(*ttft);
        duet_free(*tpot);
        return duet_error(DUET_ERR_NO_MEMORY, "bench-serve: samples");
    }
    for (size_t i = 0; i < run->launched; i++) {
        const duet_bs_result_t *r = &run->res[i];
        if (!r->ok)
            continue;
        (*ttft)[(*n_ttft)++] = duet__ms(r->first_ns - r->start_ns);
        if (r->output_tokens > 1)
            (*tpot)[(*n_tpot)++] = duet__tpot(r);
    }
    qsort(*ttft, *n_ttft, sizeof(double), duet__cmp);
    qsort(*tpot, *n_tpot, sizeof(double), duet__cmp);
    return DUET_OK;
}

duet_status_t duet_bs_summarize(const duet_bs_run_t *run, const duet_bs_slo_t *slo,
                                duet_bs_summary_t *s)
{
    size_t n = run->launched, n_itl = 0, cap_itl = 0;
    double *ttft = DUET_NEW_ARRAY(double, n + 1), *tpot = DUET_NEW_ARRAY(double, n + 1);
    double *e2e = DUET_NEW_ARRAY(double, n + 1), *itl = NULL;
    size_t n_ok = 0, n_tpot = 0;
    duet_status_t st = DUET_OK;

    memset(s, 0, sizeof(*s));
    for (size_t i = 0; i < n; i++)
        cap_itl += run->res[i].n_chunks;
    itl = DUET_NEW_ARRAY(double, cap_itl + 1);
    if (ttft == NULL || tpot == NULL || e2e == NULL || itl == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "bench-serve: metrics");
        goto free_samples;
    }
    s->duration_s = (double)(run->end_ns - run->start_ns) / 1e9;
    for (size_t i = 0; i < n; i++) {
        const duet_bs_result_t *r = &run->res[i];
        if (!r->ok) {
            s->failed++;
            continue;
        }
        double t = duet__ms(r->first_ns - r->start_ns), tp = duet__tpot(r);
        ttft[n_ok] = t;
        e2e[n_ok++] = duet__ms(r->end_ns - r->start_ns);
        if (r->output_tokens > 1)
            tpot[n_tpot++] = tp;
        for (size_t k = 1; k < r->n_chunks && k < r->cap_chunks; k++)
            itl[n_itl++] = duet__ms(r->chunk_ns[k] - r->chunk_ns[k - 1]);
        s->total_input += r->prompt_tokens;
        s->total_output += r->output_tokens;
        if ((slo->slo_ttft_ms <= 0 || t <= slo->slo_ttft_ms) &&
            (slo->slo_tpot_ms <= 0 || tp <= slo->slo_tpot_ms))
            s->good++;
    }
    s->completed = n_ok;
    if (s->duration_s > 0) {
        s->request_throughput = (double)n_ok / s->duration_s;
        s->input_throughput = (double)s->total_input / s->duration_s;
        s->output_throughput = (double)s->total_output / s->duration_s;
        s->total_token_throughput = (double)(s->total_input + s->total_output) / s->duration_s;
        s->goodput = (double)s->good / s->duration_s;
    }
    duet__stat(ttft, n_ok, &s->ttft_ms);
    duet__stat(tpot, n_tpot, &s->tpot_ms);
    duet__stat(itl, n_itl, &s->itl_ms);
    duet__stat(e2e, n_ok, &s->e2el_ms);
free_samples:
    duet_free(ttft);
    duet_free(tpot);
    duet_free(e2e);
    duet_free(itl);
    return st;
}

void duet_bs_summary_print(const duet_bs_summary_t *s, const char *title, const duet_bs_slo_t *slo)
{
    const struct {
        const char *name;
        const duet_bs_stat_t *st;
    } rows[] = {{"TTFT", &s->ttft_ms},
                {"TPOT (excl. 1st token)", &s->tpot_ms},
                {"ITL", &s->itl_ms},
                {"E2E latency", &s->e2el_ms}};
    printf("================ %s ================\n", title);
    printf("%-40s%zu\n", "Successful requests:", s->completed);
    printf("%-40s%zu\n", "Failed requests:", s->failed);
    printf("%-40s%.2f\n", "Benchmark duration (s):", s->duration_s);
    printf("%-40s%ld\n", "Total input tokens:", s->total_input);
    printf("%-40s%ld\n", "Total generated tokens:", s->total_output);
    printf("%-40s%.2f\n", "Request throughput (req/s):", s->request_throughput);
    if (slo->slo_ttft_ms > 0 || slo->slo_tpot_ms > 0)
        printf("%-40s%.2f (%zu of %zu met the SLO)\n", "Request goodput (req/s):", s->goodput,
               s->good, s->completed);
    printf("%-40s%.2f\n", "Input token throughput (tok/s):", s->input_throughput);
    printf("%-40s%.2f\n", "Output token throughput (tok/s):", s->output_throughput);
    printf("%-40s%.2f\n", "Total token throughput (tok/s):", s->total_token_throughput);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char h[64];
        printf("---------------- %s (ms) ----------------\n", rows[i].name);
        snprintf(h, sizeof(h), "Mean %s (ms):", rows[i].name);
        printf("%-40s%.2f\n", h, rows[i].st->mean);
        snprintf(h, sizeof(h), "P50 %s (ms):", rows[i].name);
        printf("%-40s%.2f\n", h, rows[i].st->median);
        snprintf(h, sizeof(h), "P90 %s (ms):", rows[i].name);
        printf("%-40s%.2f\n", h, rows[i].st->p90);
        snprintf(h, sizeof(h), "P99 %s (ms):", rows[i].name);
        printf("%-40s%.2f\n", h, rows[i].st->p99);
    }
    printf("==================================================\n");
}

static void duet__json_stat(cJSON *o, const char *name, const duet_bs_stat_t *st)
{
    char k[64];
    const struct {
        const char *pre;
        double v;
    } f[] = {{"mean", st->mean},  {"std", st->std}, {"median", st->median},
             {"p50", st->median}, {"p90", st->p90}, {"p99", st->p99}};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        snprintf(k, sizeof(k), "%s_%s_ms", f[i].pre, name);
        cJSON_AddNumberToObject(o, k, f[i].v);
    }
}

cJSON *duet_bs_run_json(const duet_bs_run_t *run, const duet_bs_workload_t *wl,
                        const duet_bs_summary_t *s, double request_rate)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    if (isinf(request_rate))
        cJSON_AddStringToObject(o, "request_rate", "inf");
    else
        cJSON_AddNumberToObject(o, "request_rate", request_rate);
    cJSON_AddNumberToObject(o, "duration", s->duration_s);
    cJSON_AddNumberToObject(o, "num_requests", (double)run->launched);
    cJSON_AddNumberToObject(o, "completed", (double)s->completed);
    cJSON_AddNumberToObject(o, "failed", (double)s->failed);
    cJSON_AddNumberToObject(o, "good_requests", (double)s->good);
    cJSON_AddNumberToObject(o, "total_input_tokens", (double)s->total_input);
    cJSON_AddNumberToObject(o, "total_output_tokens", (double)s->total_output);
    cJSON_AddNumberToObject(o, "request_throughput", s->request_throughput);
    cJSON_AddNumberToObject(o, "request_goodput", s->goodput);
    cJSON_AddNumberToObject(o, "input_throughput", s->input_throughput);
    cJSON_AddNumberToObject(o, "output_throughput", s->output_throughput);
    cJSON_AddNumberToObject(o, "total_token_throughput", s->total_token_throughput);
    duet__json_stat(o, "ttft", &s->ttft_ms);
    duet__json_stat(o, "tpot", &s->tpot_ms);
    duet__json_stat(o, "itl", &s->itl_ms);
    duet__json_stat(o, "e2el", &s->e2el_ms);
    cJSON *in = cJSON_AddArrayToObject(o, "input_lens");
    cJSON *out = cJSON_AddArrayToObject(o, "output_lens");
    cJSON *asked = cJSON_AddArrayToObject(o, "requested_output_lens");
    cJSON *ttft = cJSON_AddArrayToObject(o, "ttfts_ms");
    cJSON *tpot = cJSON_AddArrayToObject(o, "tpots_ms");
    cJSON *e2e = cJSON_AddArrayToObject(o, "e2els_ms");
    cJSON *itls = cJSON_AddArrayToObject(o, "itls_ms");
    cJSON *errs = cJSON_AddArrayToObject(o, "errors");
    for (size_t i = 0; i < run->launched; i++) {
        const duet_bs_result_t *r = &run->res[i];
        cJSON *itl = cJSON_CreateArray();
        cJSON_AddItemToArray(in, cJSON_CreateNumber((double)r->prompt_tokens));
        cJSON_AddItemToArray(out, cJSON_CreateNumber(r->ok ? (double)r->output_tokens : 0));
        cJSON_AddItemToArray(asked, cJSON_CreateNumber(wl->reqs[i].out_len));
        cJSON_AddItemToArray(ttft,
                             cJSON_CreateNumber(r->ok ? duet__ms(r->first_ns - r->start_ns) : 0));
        cJSON_AddItemToArray(tpot, cJSON_CreateNumber(r->ok ? duet__tpot(r) : 0));
        cJSON_AddItemToArray(e2e,
                             cJSON_CreateNumber(r->ok ? duet__ms(r->end_ns - r->start_ns) : 0));
        for (size_t k = 1; r->ok && k < r->n_chunks && k < r->cap_chunks; k++)
            cJSON_AddItemToArray(itl,
                                 cJSON_CreateNumber(duet__ms(r->chunk_ns[k] - r->chunk_ns[k - 1])));
        cJSON_AddItemToArray(itls, itl);
        cJSON_AddItemToArray(errs, cJSON_CreateString(r->ok ? "" : r->error));
    }
    return o;
}
