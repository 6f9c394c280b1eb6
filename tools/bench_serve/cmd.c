/* `duet bench-serve`: the command line.  See docs/bench-serve.md. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/alloc.h"
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
} duet__opts_t;

static void duet__usage(FILE *f)
{
    fprintf(
        f,
        "usage: duet bench-serve [options]\n"
        "server\n"
        "  --backend openai|openai-chat|grpc   /v1/completions (default), /v1/chat/completions,\n"
        "                      or duet.v1.Generate (duet-router's gRPC port)\n"
        "  --base-url URL      OpenAI server (default http://127.0.0.1:8000; https works)\n"
        "  --grpc-target H:P   gRPC server (--backend grpc)\n"
        "  --model NAME        model name (default: the first of GET /v1/models)\n"
        "  --api-key KEY       Bearer key (default: $OPENAI_API_KEY; HTTP only)\n"
        "  --prompt-format ids|text   token-id prompts (default; chat always sends text)\n"
        "  --ignore-eos        send ignore_eos: true (vLLM, SGLang, duet) for exact lengths\n"
        "  --no-usage          do not send stream_options.include_usage\n"
        "  --temperature X     (default 0)   --extra-body JSON   merged into each body\n"
        "  --timeout-ms N      per request (default 600000)\n"
        "load\n"
        "  --concurrency N     closed loop with N in flight; with --request-rate, a cap\n"
        "  --request-rate R    open loop, Poisson arrivals at R req/s; 'inf' all at once;\n"
        "                      a list 1,2,4 runs a sweep; 'trace' uses the trace's times\n"
        "  --num-requests N    (default: 100; trace: every line)\n"
        "  --duration SEC      no new requests after SEC seconds\n"
        "  --seed N            workload and arrivals (default 1)\n"
        "workload\n"
        "  --dataset random|shared-prefix|trace   (default random)\n"
        "  --random-input-len N (128)  --random-output-len N (32)  --range-ratio R (0, < 1)\n"
        "  --prefix-len N (64)  --suffix-len N (16)  --num-prefixes N (1)  --output-len N (32)\n"
        "  --trace FILE        Mooncake FAST'25 JSONL (timestamp, input_length,\n"
        "                      output_length, hash_ids)\n"
        "  --trace-len-scale X    multiplies input lengths (default 1)\n"
        "  --trace-output-scale X multiplies output lengths (default: the len scale)\n"
        "  --trace-block-size N   tokens per hash id (default: 512 x len scale)\n"
        "  --trace-time-scale X   multiplies timestamps (0.5: twice as fast; default 1)\n"
        "  --max-context N     cut inputs so input + output <= N (0: no limit)\n"
        "  --vocab-size N (512) --first-token-id N (3)   prompt ids in [first, vocab)\n"
        "results\n"
        "  --slo-ttft-ms X  --slo-tpot-ms X   goodput: requests/s that met both\n"
        "  --result-json FILE  --plot DIR (PNG via gnuplot)  --no-progress\n");
}

static int duet__bad(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "duet bench-serve: %s %s: %s\n", flag, value ? value : "", why);
    return 2;
}

static int duet__num(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo) || !(v <= hi)) {
        char why[96];
        snprintf(why, sizeof(why), "expected a number in [%g, %g]", lo, hi);
        return duet__bad(flag, s, why);
    }
    *out = v;
    return 0;
}

static int duet__int(const char *flag, const char *s, long lo, long hi, long *out)
{
    double v;
    if (duet__num(flag, s, (double)lo, (double)hi, &v) != 0)
        return 2;
    if (v != floor(v))
        return duet__bad(flag, s, "expected an integer");
    *out = (long)v;
    return 0;
}

static int duet__rates(duet__opts_t *o, const char *s)
{
    char buf[512], *save = NULL;
    if (strcmp(s, "trace") == 0) {
        o->run.use_trace_times = true;
        return 0;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (o->n_rates == DUET__MAX_RATES)
            return duet__bad("--request-rate", s, "at most 32 rates");
        if (strcmp(t, "inf") == 0) {
            o->rates[o->n_rates++] = INFINITY;
            continue;
        }
        if (duet__num("--request-rate", t, 1e-6, 1e9, &o->rates[o->n_rates]) != 0)
            return 2;
        o->n_rates++;
    }
    return o->n_rates ? 0 : duet__bad("--request-rate", s, "no rate");
}

static int duet__parse(duet__opts_t *o, int argc, char **argv)
{
    static const struct option opts[] = {
        {"backend", 1, 0, 'b'},
        {"base-url", 1, 0, 'u'},
        {"grpc-target", 1, 0, 'g'},
        {"model", 1, 0, 'm'},
        {"api-key", 1, 0, 'k'},
        {"prompt-format", 1, 0, 'F'},
        {"ignore-eos", 0, 0, 'e'},
        {"no-usage", 0, 0, 'U'},
        {"temperature", 1, 0, 'T'},
        {"extra-body", 1, 0, 'x'},
        {"timeout-ms", 1, 0, 't'},
        {"concurrency", 1, 0, 'c'},
        {"request-rate", 1, 0, 'r'},
        {"num-requests", 1, 0, 'n'},
        {"duration", 1, 0, 'd'},
        {"seed", 1, 0, 's'},
        {"dataset", 1, 0, 'D'},
        {"random-input-len", 1, 0, 'I'},
        {"random-output-len", 1, 0, 'O'},
        {"range-ratio", 1, 0, 'R'},
        {"prefix-len", 1, 0, 'P'},
        {"suffix-len", 1, 0, 'S'},
        {"num-prefixes", 1, 0, 'G'},
        {"output-len", 1, 0, 'o'},
        {"trace", 1, 0, 'f'},
        {"trace-len-scale", 1, 0, 'L'},
        {"trace-output-scale", 1, 0, 'Q'},
        {"trace-block-size", 1, 0, 'B'},
        {"trace-time-scale", 1, 0, 'Z'},
        {"max-context", 1, 0, 'C'},
        {"vocab-size", 1, 0, 'V'},
        {"first-token-id", 1, 0, 'W'},
        {"slo-ttft-ms", 1, 0, '1'},
        {"slo-tpot-ms", 1, 0, '2'},
        {"result-json", 1, 0, 'j'},
        {"plot", 1, 0, 'p'},
        {"no-progress", 0, 0, 'N'},
        {"help", 0, 0, 'h'},
        {0, 0, 0, 0},
    };
    long v;
    int c, rc = 0;
    int output_len = -1;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (strcmp(optarg, "openai") == 0)
                o->be.kind = DUET_BS_OPENAI;
            else if (strcmp(optarg, "openai-chat") == 0)
                o->be.kind = DUET_BS_OPENAI_CHAT;
            else if (strcmp(optarg, "grpc") == 0)
                o->be.kind = DUET_BS_GRPC;
            else
                rc = duet__bad("--backend", optarg, "expected openai, openai-chat or grpc");
            break;
        case 'u':
            o->be.base_url = optarg;
            break;
        case 'g':
            o->be.target = optarg;
            break;
        case 'm':
            o->be.model = optarg;
            break;
        case 'k':
            o->be.api_key = optarg;
            o->api_key_given = true;
            break;
        case 'F':
            if (strcmp(optarg, "ids") != 0 && strcmp(optarg, "text") != 0)
                rc = duet__bad("--prompt-format", optarg, "expected ids or text");
            o->be.text_prompts = strcmp(optarg, "text") == 0;
            break;
        case 'e':
            o->be.ignore_eos = true;
            break;
        case 'U':
            o->be.usage = false;
            break;
        case 'T':
            rc = duet__num("--temperature", optarg, 0, 100, &o->be.temperature);
            break;
        case 'x': {
            cJSON *e = cJSON_Parse(optarg);
            if (!cJSON_IsObject(e))
                rc = duet__bad("--extra-body", optarg, "expected a JSON object");
            cJSON_Delete(e);
            o->be.extra_body = optarg;
            break;
        }
        case 't':
            rc = duet__int("--timeout-ms", optarg, 1, 86400000, &o->be.timeout_ms);
            break;
        case 'c':
            if ((rc = duet__int("--concurrency", optarg, 1, 100000, &v)) == 0)
                o->run.concurrency = (int)v;
            break;
        case 'r':
            rc = duet__rates(o, optarg);
            break;
        case 'n':
            if ((rc = duet__int("--num-requests", optarg, 1, 100000000, &v)) == 0)
                o->wl.num_requests = (size_t)v;
            break;
        case 'd':
            rc = duet__num("--duration", optarg, 0.001, 1e7, &o->run.duration_s);
            break;
        case 's':
            if ((rc = duet__int("--seed", optarg, 0, 1L << 53, &v)) == 0)
                o->wl.seed = o->run.seed = (uint64_t)v;
            break;
        case 'D':
            if (strcmp(optarg, "random") == 0)
                o->wl.dataset = DUET_BS_RANDOM;
            else if (strcmp(optarg, "shared-prefix") == 0)
                o->wl.dataset = DUET_BS_SHARED_PREFIX;
            else if (strcmp(optarg, "trace") == 0)
                o->wl.dataset = DUET_BS_TRACE;
            else
                rc = duet__bad("--dataset", optarg, "expected random, shared-prefix or trace");
            break;
#define DUET__INTO(flag, lo, hi, field)                                                            \
    if ((rc = duet__int(flag, optarg, lo, hi, &v)) == 0)                                           \
        field = (int)v;                                                                            \
    break
        case 'I':
            DUET__INTO("--random-input-len", 1, 10000000, o->wl.input_len);
        case 'O':
            DUET__INTO("--random-output-len", 1, 10000000, o->wl.output_len);
        case 'P':
            DUET__INTO("--prefix-len", 0, 10000000, o->wl.prefix_len);
        case 'S':
            DUET__INTO("--suffix-len", 0, 10000000, o->wl.suffix_len);
        case 'G':
            DUET__INTO("--num-prefixes", 1, 1000000, o->wl.num_prefixes);
        case 'o':
            DUET__INTO("--output-len", 1, 10000000, output_len);
        case 'B':
            DUET__INTO("--trace-block-size", 1, 1000000, o->wl.trace_block_size);
        case 'C':
            DUET__INTO("--max-context", 0, 100000000, o->wl.max_context);
        case 'V':
            DUET__INTO("--vocab-size", 2, 100000000, o->wl.vocab_size);
        case 'W':
            DUET__INTO("--first-token-id", 0, 100000000, o->wl.first_token_id);
#undef DUET__INTO
        case 'R':
            rc = duet__num("--range-ratio", optarg, 0, 0.999, &o->wl.range_ratio);
            break;
        case 'f':
            o->wl.trace_path = optarg;
            break;
        case 'L':
            rc = duet__num("--trace-len-scale", optarg, 1e-6, 1e6, &o->wl.trace_len_scale);
            break;
        case 'Q':
            rc = duet__num("--trace-output-scale", optarg, 1e-6, 1e6, &o->wl.trace_output_scale);
            break;
        case 'Z':
            rc = duet__num("--trace-time-scale", optarg, 0, 1e6, &o->wl.trace_time_scale);
            break;
        case '1':
            rc = duet__num("--slo-ttft-ms", optarg, 1e-3, 1e9, &o->slo.slo_ttft_ms);
            break;
        case '2':
            rc = duet__num("--slo-tpot-ms", optarg, 1e-3, 1e9, &o->slo.slo_tpot_ms);
            break;
        case 'j':
            o->result_json = optarg;
            break;
        case 'p':
            o->plot_dir = optarg;
            break;
        case 'N':
            o->run.progress = false;
            break;
        case 'h':
            duet__usage(stdout);
            return 1;
        default:
            return 2;
        }
    }
    if (rc != 0)
        return rc;
    if (optind < argc)
        return duet__bad("unexpected argument", argv[optind], "(--help for usage)");
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
    if (o->be.kind == DUET_BS_GRPC && o->be.api_key != getenv("OPENAI_API_KEY"))
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
