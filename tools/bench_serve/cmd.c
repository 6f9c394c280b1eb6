/* `duet bench-serve`: the command line.  See docs/bench-serve.md. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/alloc.h"
#include "common/flags.h"
#include "tools/bench_serve/bench_serve.h"

#define DUET__MAX_RATES 32

typedef struct {
    duet_bs_workload_config_t wl;
    duet_bs_backend_config_t be;
    duet_bs_run_config_t run;
    duet_bs_slo_t slo;
    double rates[DUET__MAX_RATES];
    size_t n_rates;
    const char *result_json, *plot_dir;
    bool api_key_given; /* --api-key, not $OPENAI_API_KEY */
    bool reuse_prompts; /* every rate of a sweep sends the same prompts */
} duet__opts_t;

static int duet__bad(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "duet bench-serve: %s %s: %s\n", flag, value ? value : "", why);
    return 2;
}

/* --request-rate: a list of rates, 'inf', or 'trace' (dest: the options). */
static duet_status_t duet__rates(void *dest, const char *flag, const char *s)
{
    duet__opts_t *o = dest;
    char buf[512], *save = NULL;
    if (strcmp(s, "trace") == 0) {
        o->run.use_trace_times = true;
        return DUET_OK;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        double v;
        if (o->n_rates == DUET__MAX_RATES)
            return duet_error(DUET_ERR_CONFIG, "%s %s: at most 32 rates", flag, s);
        if (strcmp(t, "inf") == 0) {
            o->rates[o->n_rates++] = INFINITY;
            continue;
        }
        errno = 0;
        v = strtod(t, &end);
        if (errno != 0 || end == t || *end != '\0' || !(v >= 1e-6) || !(v <= 1e9))
            return duet_error(DUET_ERR_CONFIG, "%s %s: expected a number in [%g, %g]", flag, t,
                              1e-6, 1e9);
        o->rates[o->n_rates++] = v;
    }
    if (o->n_rates == 0)
        return duet_error(DUET_ERR_CONFIG, "%s %s: no rate", flag, s);
    return DUET_OK;
}

/* --extra-body: a JSON object, kept as text (dest: the backend's field). */
static duet_status_t duet__extra_body(void *dest, const char *flag, const char *s)
{
    cJSON *e = cJSON_Parse(s);
    bool ok = cJSON_IsObject(e);
    cJSON_Delete(e);
    if (!ok)
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected a JSON object", flag, s);
    *(const char **)dest = s;
    return DUET_OK;
}

static const char *const duet__backends[] = {"openai", "openai-chat", "grpc", NULL};
static const char *const duet__datasets[] = {"random", "shared-prefix", "trace", NULL};
static const char *const duet__formats[] = {"ids", "text", NULL};

/* Returns 0 (run), 1 (--help printed: exit 0) or 2 (bad command line). */
static int duet__parse(duet__opts_t *o, int argc, char **argv)
{
    int backend = (int)o->be.kind, dataset = (int)o->wl.dataset, format = o->be.text_prompts;
    int output_len = -1, timeout_ms = (int)o->be.timeout_ms;
    int64_t num_requests = (int64_t)o->wl.num_requests, seed = (int64_t)o->wl.seed;
    const char *api_key = NULL;
    bool help = false;
    const duet_flag_t flags[] = {
        {.type = DUET_FLAG_HEADING, .help = "server"},
        {"backend", DUET_FLAG_CHOICE, &backend, .choices = duet__backends,
         .arg = "openai|openai-chat|grpc",
         .help = "/v1/completions (default), /v1/chat/completions,\n"
                 "or duet.v1.Generate (duet-router's gRPC port)"},
        {"base-url", DUET_FLAG_STRING, &o->be.base_url, .arg = "URL",
         .help = "OpenAI server (default http://127.0.0.1:8000; https works)"},
        {"grpc-target", DUET_FLAG_STRING, &o->be.target, .arg = "H:P",
         .help = "gRPC server (--backend grpc)"},
        {"model", DUET_FLAG_STRING, &o->be.model, .arg = "NAME",
         .help = "model name (default: the first of GET /v1/models)"},
        {"api-key", DUET_FLAG_STRING, &api_key, .arg = "KEY",
         .help = "Bearer key (default: $OPENAI_API_KEY; HTTP only)"},
        {"prompt-format", DUET_FLAG_CHOICE, &format, .choices = duet__formats, .arg = "ids|text",
         .help = "token-id prompts (default; chat always sends text)"},
        {"ignore-eos", DUET_FLAG_TRUE, &o->be.ignore_eos,
         .help = "send ignore_eos: true (vLLM, SGLang, duet) for exact lengths"},
        {"no-usage", DUET_FLAG_FALSE, &o->be.usage,
         .help = "do not send stream_options.include_usage"},
        {"temperature", DUET_FLAG_DOUBLE, &o->be.temperature, 0, 100, .arg = "X",
         .help = "(default 0)"},
        {"extra-body", DUET_FLAG_FUNC, &o->be.extra_body, .fn = duet__extra_body, .arg = "JSON",
         .help = "merged into each body"},
        {"timeout-ms", DUET_FLAG_INT, &timeout_ms, 1, 86400000, .arg = "N",
         .help = "per request (default 600000)"},
        {.type = DUET_FLAG_HEADING, .help = "load"},
        {"concurrency", DUET_FLAG_INT, &o->run.concurrency, 1, 100000, .arg = "N",
         .help = "closed loop with N in flight; with --request-rate, a cap"},
        {"request-rate", DUET_FLAG_FUNC, o, .fn = duet__rates, .arg = "R",
         .help = "open loop, Poisson arrivals at R req/s; 'inf' all at once;\n"
                 "a list 1,2,4 runs a sweep; 'trace' uses the trace's times"},
        {"num-requests", DUET_FLAG_INT64, &num_requests, 1, 100000000, .arg = "N",
         .help = "(default: 100; trace: every line)"},
        {"duration", DUET_FLAG_DOUBLE, &o->run.duration_s, 0.001, 1e7, .arg = "SEC",
         .help = "no new requests after SEC seconds"},
        {"seed", DUET_FLAG_INT64, &seed, 0, 9007199254740992.0, .arg = "N",
         .help = "workload and arrivals (default 1)"},
        {"reuse-prompts", DUET_FLAG_TRUE, &o->reuse_prompts,
         .help = "send every rate of a sweep the same prompts; by default each\n"
                 "rate gets its own (same lengths, shared prefixes and trace\n"
                 "blocks, other tokens), so a prefix cache does not carry\n"
                 "hits from one rate to the next"},
        {.type = DUET_FLAG_HEADING, .help = "workload"},
        {"dataset", DUET_FLAG_CHOICE, &dataset, .choices = duet__datasets,
         .arg = "random|shared-prefix|trace", .help = "(default random)"},
        {"random-input-len", DUET_FLAG_INT, &o->wl.input_len, 1, 10000000, .arg = "N",
         .help = "(default 128)"},
        {"random-output-len", DUET_FLAG_INT, &o->wl.output_len, 1, 10000000, .arg = "N",
         .help = "(default 32)"},
        {"range-ratio", DUET_FLAG_DOUBLE, &o->wl.range_ratio, 0, 0.999, .arg = "R",
         .help = "lengths uniform in len x [1 - R, 1 + R] (default 0)"},
        {"prefix-len", DUET_FLAG_INT, &o->wl.prefix_len, 0, 10000000, .arg = "N",
         .help = "shared-prefix: (default 64)"},
        {"suffix-len", DUET_FLAG_INT, &o->wl.suffix_len, 0, 10000000, .arg = "N",
         .help = "shared-prefix: (default 16)"},
        {"num-prefixes", DUET_FLAG_INT, &o->wl.num_prefixes, 1, 1000000, .arg = "N",
         .help = "shared-prefix: (default 1)"},
        {"output-len", DUET_FLAG_INT, &output_len, 1, 10000000, .arg = "N",
         .help = "shared-prefix: (default 32)"},
        {"trace", DUET_FLAG_STRING, &o->wl.trace_path, .arg = "FILE",
         .help = "Mooncake FAST'25 JSONL (timestamp, input_length,\n"
                 "output_length, hash_ids)"},
        {"trace-len-scale", DUET_FLAG_DOUBLE, &o->wl.trace_len_scale, 1e-6, 1e6, .arg = "X",
         .help = "multiplies input lengths (default 1)"},
        {"trace-output-scale", DUET_FLAG_DOUBLE, &o->wl.trace_output_scale, 1e-6, 1e6, .arg = "X",
         .help = "multiplies output lengths (default: the len scale)"},
        {"trace-block-size", DUET_FLAG_INT, &o->wl.trace_block_size, 1, 1000000, .arg = "N",
         .help = "tokens per hash id (default: 512 x len scale)"},
        {"trace-time-scale", DUET_FLAG_DOUBLE, &o->wl.trace_time_scale, 0, 1e6, .arg = "X",
         .help = "multiplies timestamps (0.5: twice as fast; default 1)"},
        {"max-context", DUET_FLAG_INT, &o->wl.max_context, 0, 100000000, .arg = "N",
         .help = "cut inputs so input + output <= N (0: no limit)"},
        {"vocab-size", DUET_FLAG_INT, &o->wl.vocab_size, 2, 100000000, .arg = "N",
         .help = "prompt ids in [first, vocab) (default 512)"},
        {"first-token-id", DUET_FLAG_INT, &o->wl.first_token_id, 0, 100000000, .arg = "N",
         .help = "(default 3)"},
        {.type = DUET_FLAG_HEADING, .help = "results"},
        {"slo-ttft-ms", DUET_FLAG_DOUBLE, &o->slo.slo_ttft_ms, 1e-3, 1e9, .arg = "X",
         .help = "goodput: requests/s that met both SLOs"},
        {"slo-tpot-ms", DUET_FLAG_DOUBLE, &o->slo.slo_tpot_ms, 1e-3, 1e9, .arg = "X"},
        {"result-json", DUET_FLAG_STRING, &o->result_json, .arg = "FILE"},
        {"plot", DUET_FLAG_STRING, &o->plot_dir, .arg = "DIR", .help = "PNG via gnuplot"},
        {"no-progress", DUET_FLAG_FALSE, &o->run.progress, .help = "no progress bar"},
        {"help", DUET_FLAG_STOP, &help, .help = "this help"},
    };

    if (duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, NULL, NULL) != DUET_OK) {
        fprintf(stderr, "duet bench-serve: %s\n", duet_error_msg());
        return 2;
    }
    if (help) {
        printf("usage: duet bench-serve [options]   (flags: --KEY VALUE or --KEY=VALUE)\n");
        duet_flags_help(stdout, flags, DUET_FLAGS_N(flags));
        return 1;
    }
    o->be.kind = (duet_bs_backend_kind_t)backend;
    o->wl.dataset = (duet_bs_dataset_t)dataset;
    o->be.text_prompts = format == 1;
    o->be.timeout_ms = timeout_ms;
    o->wl.num_requests = (size_t)num_requests;
    o->wl.seed = o->run.seed = (uint64_t)seed;
    if (api_key != NULL) {
        o->be.api_key = api_key;
        o->api_key_given = true;
    }
    if (o->wl.dataset == DUET_BS_SHARED_PREFIX && output_len < 0)
        output_len = 32;
    if (output_len > 0)
        o->wl.output_len = output_len;
    if (o->wl.dataset == DUET_BS_TRACE && o->wl.trace_path == NULL)
        return duet__bad("--dataset trace", NULL, "needs --trace FILE");
    if (o->wl.dataset != DUET_BS_TRACE && o->run.use_trace_times)
        return duet__bad("--request-rate", "trace", "needs --dataset trace");
    if (o->wl.dataset == DUET_BS_SHARED_PREFIX && o->wl.prefix_len + o->wl.suffix_len < 1)
        return duet__bad("--prefix-len", NULL, "prefix plus suffix must be at least 1 token");
    if (o->be.kind == DUET_BS_GRPC && o->be.target == NULL)
        return duet__bad("--backend grpc", NULL, "needs --grpc-target HOST:PORT");
    if (o->be.kind == DUET_BS_GRPC && o->api_key_given)
        return duet__bad("--api-key", NULL, "is for HTTP; the gRPC client sends no metadata");
    /* no rate and no concurrency: a trace replays its own times, else one at a time */
    if (o->n_rates == 0 && !o->run.use_trace_times && o->run.concurrency == 0) {
        if (o->wl.dataset == DUET_BS_TRACE)
            o->run.use_trace_times = true;
        else
            o->run.concurrency = 1;
    }
    if (o->n_rates == 0)
        o->rates[o->n_rates++] = 0;
    return 0;
}

static cJSON *duet__config_json(const duet__opts_t *o, char **argv, int argc)
{
    static const char *const backends[] = {"openai", "openai-chat", "grpc"};
    static const char *const datasets[] = {"random", "shared-prefix", "trace"};
    char date[32];
    time_t t = time(NULL);
    struct tm tm;
    cJSON *c = cJSON_CreateObject(), *cmd;
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    cJSON_AddStringToObject(c, "date", date);
    cJSON_AddStringToObject(c, "backend", backends[o->be.kind]);
    cJSON_AddStringToObject(c, "server",
                            o->be.kind == DUET_BS_GRPC ? o->be.target : o->be.base_url);
    cJSON_AddStringToObject(c, "model", o->be.model ? o->be.model : "");
    cJSON_AddStringToObject(c, "dataset", datasets[o->wl.dataset]);
    cJSON_AddNumberToObject(c, "seed", (double)o->wl.seed);
    cJSON_AddNumberToObject(c, "max_concurrency", o->run.concurrency);
    cJSON_AddBoolToObject(c, "trace_times", o->run.use_trace_times);
    cJSON_AddBoolToObject(c, "reuse_prompts", o->reuse_prompts);
    cJSON_AddNumberToObject(c, "slo_ttft_ms", o->slo.slo_ttft_ms);
    cJSON_AddNumberToObject(c, "slo_tpot_ms", o->slo.slo_tpot_ms);
    cJSON_AddItemToObject(c, "argv", cmd = cJSON_CreateArray());
    for (int i = 0; i < argc; i++)
        cJSON_AddItemToArray(cmd, cJSON_CreateString(argv[i]));
    return c;
}

static int duet__write_json(const char *path, cJSON *root)
{
    char *s = cJSON_Print(root);
    FILE *f = s ? fopen(path, "w") : NULL;
    if (f == NULL || fputs(s, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "duet bench-serve: --result-json %s: %s\n", path, strerror(errno));
        free(s);
        return 1;
    }
    free(s);
    return 0;
}

int duet_bs_main(int argc, char **argv)
{
    duet__opts_t o = {
        .wl = {.dataset = DUET_BS_RANDOM,
               .seed = 1,
               .vocab_size = 512,
               .first_token_id = 3,
               .input_len = 128,
               .output_len = 32,
               .prefix_len = 64,
               .suffix_len = 16,
               .num_prefixes = 1,
               .trace_len_scale = 1,
               .trace_output_scale = -1,
               .trace_time_scale = 1},
        .be = {.kind = DUET_BS_OPENAI,
               .base_url = "http://127.0.0.1:8000",
               .usage = true,
               .timeout_ms = 600000,
               .api_key = getenv("OPENAI_API_KEY")},
        .run = {.seed = 1, .progress = isatty(2)},
    };
    duet_bs_workload_t wl = {0};
    duet_bs_run_t runs[DUET__MAX_RATES] = {{0}};
    duet_bs_summary_t sums[DUET__MAX_RATES];
    duet_bs_plot_series_t series[DUET__MAX_RATES];
    duet_bs_backend_t *be = NULL;
    const duet_bs_backend_ops_t *ops;
    char *model = NULL, labels[DUET__MAX_RATES][48];
    cJSON *root = NULL, *jruns;
    size_t done = 0;
    int rc = duet__parse(&o, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (duet_bs_workload_build(&o.wl, &wl) != DUET_OK) {
        fprintf(stderr, "duet bench-serve: %s\n", duet_error_msg());
        return 1;
    }
    if (wl.truncated)
        fprintf(stderr, "duet bench-serve: %zu of %zu prompts cut to fit --max-context %d\n",
                wl.truncated, wl.n, o.wl.max_context);
    rc = 1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    ops = o.be.kind == DUET_BS_GRPC ? &duet_bs_grpc_ops : &duet_bs_http_ops;
    if (o.be.kind != DUET_BS_GRPC && duet_bs_http_probe(&o.be, &model) != DUET_OK) {
        fprintf(stderr, "duet bench-serve: %s\n", duet_error_msg());
        goto release_all;
    }
    if (ops->create(&o.be, &be) != DUET_OK) {
        fprintf(stderr, "duet bench-serve: %s\n", duet_error_msg());
        goto release_all;
    }
    root = duet__config_json(&o, argv, argc);
    jruns = cJSON_AddArrayToObject(root, "runs");
    for (done = 0; done < o.n_rates; done++) {
        duet_bs_run_config_t rcfg = o.run;
        if (done > 0 && !o.reuse_prompts) {
            /* the same workload with other tokens: what a rate sends is new to the server */
            duet_bs_workload_free(&wl);
            o.wl.salt = done;
            if (duet_bs_workload_build(&o.wl, &wl) != DUET_OK) {
                fprintf(stderr, "duet bench-serve: %s\n", duet_error_msg());
                goto release_all;
            }
        }
        rcfg.request_rate = o.rates[done];
        if (o.run.use_trace_times)
            snprintf(labels[done], sizeof(labels[done]), "trace times x%g", o.wl.trace_time_scale);
        else if (rcfg.request_rate > 0)
            snprintf(labels[done], sizeof(labels[done]), "rate %g/s", rcfg.request_rate);
        else
            snprintf(labels[done], sizeof(labels[done]), "concurrency %d", rcfg.concurrency);
        rcfg.label = labels[done];
        if (duet_bs_run(&rcfg, ops, be, &wl, &runs[done]) != DUET_OK ||
            duet_bs_summarize(&runs[done], &o.slo, &sums[done]) != DUET_OK) {
            fprintf(stderr, "duet bench-serve: %s\n", duet_error_msg());
            done++;
            goto release_all;
        }
        duet_bs_summary_print(&sums[done], labels[done], &o.slo);
        for (size_t i = 0; i < runs[done].launched && sums[done].failed; i++)
            if (!runs[done].res[i].ok) {
                fprintf(stderr, "duet bench-serve: %zu requests failed; the first: %s\n",
                        sums[done].failed, runs[done].res[i].error);
                break;
            }
        cJSON_AddItemToArray(jruns,
                             duet_bs_run_json(&runs[done], &wl, &sums[done], rcfg.request_rate));
        series[done] =
            (duet_bs_plot_series_t){labels[done], rcfg.request_rate, &runs[done], &sums[done]};
    }
    rc = 0;
    if (o.result_json != NULL && duet__write_json(o.result_json, root) != 0)
        rc = 1;
    if (o.plot_dir != NULL && duet_bs_plot(o.plot_dir, series, done, &o.slo) != DUET_OK) {
        fprintf(stderr, "duet bench-serve: %s\n", duet_error_msg());
        rc = 1;
    }
    for (size_t k = 0; k < done; k++)
        if (sums[k].completed == 0) {
            fprintf(stderr, "duet bench-serve: no request completed\n");
            rc = 1;
        }
release_all:
    if (be != NULL)
        ops->destroy(be); /* first: a stream still open writes into its result */
    for (size_t k = 0; k < done; k++)
        duet_bs_run_free(&runs[k]);
    cJSON_Delete(root);
    duet_free(model);
    duet_bs_workload_free(&wl);
    curl_global_cleanup();
    return rc;
}
