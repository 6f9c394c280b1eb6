/* duet bench-serve: a serving benchmark for OpenAI-compatible HTTP servers
 * (SSE streaming) and duet's gRPC Generate API.  Internal interfaces between
 * its files:
 *
 *   workload.c  requests: random lengths, shared prefix, Mooncake trace replay
 *   prompt.c    deterministic prompt tokens and text
 *   http.c      the OpenAI backend (libcurl multi, SSE parsing)
 *   grpc.c      the duet.v1.Generate backend (gRPC C core via common/rpc.h)
 *   run.c       the load generator: closed and open loop, progress bar
 *   metrics.c   TTFT/TPOT/ITL/E2E statistics, goodput, JSON, the summary
 *   plot.c      gnuplot PNGs
 *   cmd.c       the command line */
#ifndef DUET_TOOLS_BENCH_SERVE_BENCH_SERVE_H
#define DUET_TOOLS_BENCH_SERVE_BENCH_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/status.h"

/* ---- workload ------------------------------------------------------------ */

typedef struct {
    int32_t *ids;       /* prompt token ids */
    size_t n_ids;       /* input length asked for */
    int out_len;        /* output tokens asked for */
    int64_t arrival_ns; /* trace mode: offset from the start (scaled); else 0 */
} duet_bs_req_t;

typedef struct {
    duet_bs_req_t *reqs;
    size_t n;
    size_t truncated; /* trace requests whose input was cut to fit the context */
    bool has_times;   /* arrival_ns is meaningful (trace) */
} duet_bs_workload_t;

typedef enum { DUET_BS_RANDOM, DUET_BS_SHARED_PREFIX, DUET_BS_TRACE } duet_bs_dataset_t;

typedef struct {
    duet_bs_dataset_t dataset;
    size_t num_requests; /* 0: dataset default (random/prefix: 100; trace: every line) */
    uint64_t seed;
    int vocab_size;     /* prompt ids are drawn from [first_token_id, vocab_size) */
    int first_token_id; /* skip special tokens (BOS/EOS/UNK are 0..2 in Llama vocabs) */
    int max_context;    /* 0: no limit; else input + output <= max_context */
    /* random */
    int input_len, output_len;
    double range_ratio; /* lengths uniform in [len*(1-r), len*(1+r)] */
    /* shared prefix */
    int prefix_len, suffix_len, num_prefixes;
    /* trace */
    const char *trace_path;
    double trace_len_scale;    /* multiplies input_length */
    double trace_output_scale; /* multiplies output_length (< 0: trace_len_scale) */
    int trace_block_size;      /* tokens per hash id after scaling (0: 512 * len scale) */
    double trace_time_scale;   /* multiplies timestamps */
    /* mixed into every block of prompt content: the same lengths, prefix
     * structure and arrivals with other tokens (0: the unsalted content) */
    uint64_t salt;
} duet_bs_workload_config_t;

/* Build the workload.  Trace errors name the file, the line and the field. */
duet_status_t duet_bs_workload_build(const duet_bs_workload_config_t *cfg, duet_bs_workload_t *wl);
void duet_bs_workload_free(duet_bs_workload_t *wl);

/* Prompt content: token j of hash block `block` (equal blocks, equal
 * tokens), and the word a token id stands for in text prompts. */
int32_t duet_bs_prompt_token(uint64_t block, size_t j, int first_id, int vocab_size);
const char *duet_bs_prompt_word(int32_t id);
/* The text prompt of ids: one word per id, space separated (owned). */
char *duet_bs_prompt_text(const int32_t *ids, size_t n);

/* splitmix64: the one PRNG of the tool (seeded, reproducible). */
uint64_t duet_bs_rand(uint64_t *state);
double duet_bs_rand_unit(uint64_t *state); /* [0, 1) */

/* ---- one request's outcome -------------------------------------------------- */

typedef struct {
    bool ok;
    char error[200];
    int64_t start_ns, first_ns, end_ns; /* first_ns: first chunk carrying tokens */
    int64_t *chunk_ns;                  /* arrival of every token-bearing chunk */
    size_t n_chunks, cap_chunks;
    long prompt_tokens; /* the server's usage, else the tokens asked for */
    long output_tokens; /* usage, else tokens counted (gRPC ids, SSE chunks) */
    bool usage;         /* the server reported usage */
} duet_bs_result_t;

/* Record a token-bearing chunk at `now` (first_ns on the first one). */
void duet_bs_result_chunk(duet_bs_result_t *r, int64_t now);
void duet_bs_result_fail(duet_bs_result_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- backends ------------------------------------------------------------------ */

typedef enum { DUET_BS_OPENAI, DUET_BS_OPENAI_CHAT, DUET_BS_GRPC } duet_bs_backend_kind_t;

typedef struct {
    duet_bs_backend_kind_t kind;
    const char *base_url; /* http(s)://host:port (OpenAI) */
    const char *target;   /* host:port (gRPC) */
    const char *model;    /* NULL: the first of GET /v1/models (gRPC: none) */
    const char *api_key;  /* Bearer key; NULL for none */
    bool text_prompts;    /* send text built from words (chat always does) */
    bool ignore_eos;
    bool usage; /* stream_options.include_usage */
    double temperature;
    const char *extra_body; /* JSON object merged into each HTTP body */
    long timeout_ms;        /* per request */
} duet_bs_backend_config_t;

typedef struct duet_bs_backend duet_bs_backend_t;

/* Called by a backend's poll (on the polling thread) for each finished request. */
typedef void (*duet_bs_done_cb)(size_t idx, void *arg);

typedef struct {
    duet_status_t (*create)(const duet_bs_backend_config_t *cfg, duet_bs_backend_t **be_p);
    /* Start request idx; its outcome goes to *res (filled when done fires). */
    duet_status_t (*start)(duet_bs_backend_t *be, size_t idx, const duet_bs_req_t *req,
                           duet_bs_result_t *res);
    /* Move I/O for up to timeout_ns and report finished requests. */
    void (*poll)(duet_bs_backend_t *be, int64_t timeout_ns, duet_bs_done_cb done, void *arg);
    void (*destroy)(duet_bs_backend_t *be);
} duet_bs_backend_ops_t;

extern const duet_bs_backend_ops_t duet_bs_http_ops;
extern const duet_bs_backend_ops_t duet_bs_grpc_ops;

/* OpenAI: resolve the model name (GET /v1/models) when none was given and
 * send one short request to check the setup; turns usage off (with a note)
 * when the server refuses stream_options.  The model name is owned by *cfg
 * afterwards only through *model_p (free with duet_free). */
duet_status_t duet_bs_http_probe(duet_bs_backend_config_t *cfg, char **model_p);

/* ---- the load generator ------------------------------------------------------- */

typedef struct {
    double request_rate; /* 0: closed loop (or the trace's own times, see use_trace_times) */
    bool use_trace_times;
    int concurrency;   /* closed loop: N in flight; open loop: a cap (0 none) */
    double duration_s; /* no new requests after this (0: none) */
    uint64_t seed;     /* Poisson arrivals */
    bool progress;     /* draw the bar on stderr */
    const char *label; /* shown on the bar */
} duet_bs_run_config_t;

typedef struct {
    duet_bs_result_t *res; /* [launched] */
    size_t launched;
    int64_t start_ns, end_ns; /* the benchmark's wall time */
} duet_bs_run_t;

duet_status_t duet_bs_run(const duet_bs_run_config_t *cfg, const duet_bs_backend_ops_t *ops,
                          duet_bs_backend_t *be, const duet_bs_workload_t *wl, duet_bs_run_t *run);
void duet_bs_run_free(duet_bs_run_t *run);

/* ---- metrics ------------------------------------------------------------------ */

typedef struct {
    double mean, std, median, p90, p99, min, max;
    size_t n;
} duet_bs_stat_t;

typedef struct {
    double duration_s;
    size_t completed, failed, good;
    long total_input, total_output;
    double request_throughput, input_throughput, output_throughput, total_token_throughput;
    double goodput; /* good requests / s */
    duet_bs_stat_t ttft_ms, tpot_ms, itl_ms, e2el_ms;
} duet_bs_summary_t;

typedef struct {
    double slo_ttft_ms, slo_tpot_ms; /* 0: not set */
} duet_bs_slo_t;

/* Linear-interpolated percentile of sorted v[n] (numpy's default). */
double duet_bs_percentile(const double *sorted, size_t n, double pct);
duet_status_t duet_bs_summarize(const duet_bs_run_t *run, const duet_bs_slo_t *slo,
                                duet_bs_summary_t *s);
void duet_bs_summary_print(const duet_bs_summary_t *s, const char *title, const duet_bs_slo_t *slo);
/* One run as JSON: the summary plus per-request arrays (owned by the caller). */
cJSON *duet_bs_run_json(const duet_bs_run_t *run, const duet_bs_workload_t *wl,
                        const duet_bs_summary_t *s, double request_rate);
/* Sorted TTFT / TPOT samples in ms of the completed requests (owned). */
duet_status_t duet_bs_samples(const duet_bs_run_t *run, double **ttft, size_t *n_ttft,
                              double **tpot, size_t *n_tpot);

/* ---- plots ---------------------------------------------------------------------- */

typedef struct {
    const char *label; /* "rate 2/s", "concurrency 4" */
    double rate;       /* the sweep's x (request rate) */
    const duet_bs_run_t *run;
    const duet_bs_summary_t *sum;
} duet_bs_plot_series_t;

/* Write the data files and gnuplot script to dir and render cdf.png (TTFT
 * and TPOT CDFs) and, with more than one series, goodput.png.  Returns
 * DUET_ERR_NOT_FOUND (message says so) when gnuplot is missing; the data
 * and script are written anyway. */
duet_status_t duet_bs_plot(const char *dir, const duet_bs_plot_series_t *series, size_t n,
                           const duet_bs_slo_t *slo);

/* The `duet bench-serve` command. */
int duet_bs_main(int argc, char **argv);

#endif
