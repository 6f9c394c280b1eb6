/* GPU engine benchmark (not a test): decode and prefill tokens/s of the
 * cuda backend on one model directory, next to two ceilings measured in
 * the same run on the same GPU (../shared/BENCHMARKS.md):
 *  - HBM bandwidth: a device-to-device copy of 1 GiB, bytes read + written;
 *    decode roofline = batch * bandwidth / bytes per step (every weight
 *    matrix once, lm_head included, plus the batch's KV reads);
 *  - cuBLAS(Lt) bf16 GEMM throughput, 8192^3 on random data; prefill is
 *    reported as achieved TFLOP/s (2 * params * tokens for the matrices,
 *    plus causal attention) against it;
 *  - cuBLASLt FP8 (e4m3 x e4m3, bf16 out) GEMM throughput, 8192^3, with
 *    per-tensor scales and with the outer-vector scales the FP8 path uses:
 *    an FP8 checkpoint's prefill is reported against the latter, and its
 *    decode roofline counts 1 byte per linear weight (lm_head 2).
 *
 *   bench_gpu --model DIR [--model DIR2] [--tp N] [--batches 1,16,64]
 *             [--ctx 16,1024,4096,8192] [--decode 128]
 *             [--prompts 512,1024,2048,4096,8192] [--reps 3]
 *             [--temperature T] [--top-k K] [--top-p P]
 *
 * Two --model: both benchmarked in the same run, one after the other (an
 * engine at a time), then DIR2's decode tok/s over DIR's for every (B, C):
 * e.g. an FP8 checkpoint (duet mkmodel --fp8 channel) against its bf16
 * original (docs/fp8.md).
 *
 * decode, for each context length C of --ctx (ascending) and batch B: the
 * sequences' C-token contexts are computed once per C (one sequence per
 * forward), then each B runs 3 warm-up steps and --decode timed steps of
 * greedy sampling from position C on (graphs as configured:
 * DUET_CUDA_GRAPHS=0 turns them off); the fraction of the roofline is
 * printed per (B, C).  A (B, C) whose KV does not fit the pool the device
 * could hold is reported as skipped.  --temperature > 0 samples the decode
 * steps instead (with --top-k/--top-p; DUET_CUDA_SAMPLING=host draws on
 * the host, for comparison).  prefill: one sequence of P tokens,
 * the next token sampled; median of --reps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "engine/engine.h"

#ifdef DUET_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "bench/gpu_bench.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                               \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

typedef struct {
    const char *model, *model2;
    int tp, decode, reps;
    int batches[8], n_batches;
    int ctx[8], n_ctx;
    int prompts[16], n_prompts;
    duet_sampling_t sampling; /* the decode steps' */
} args_t;

static int parse(int argc, char **argv, args_t *a)
{
    memset(a, 0, sizeof(*a));
    a->tp = 1;
    a->n_ctx = duet_bench_list("16", a->ctx, 8);
    a->decode = 128;
    a->reps = 3;
    a->n_batches = duet_bench_list("1,16,64", a->batches, 8);
    a->n_prompts = duet_bench_list("512,1024,2048,4096,8192", a->prompts, 16);
    a->sampling = duet_sampling_greedy();
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--model") == 0 && a->model == NULL)
            a->model = v;
        else if (strcmp(k, "--model") == 0)
            a->model2 = v;
        else if (strcmp(k, "--tp") == 0)
            a->tp = atoi(v);
        else if (strcmp(k, "--ctx") == 0)
            a->n_ctx = duet_bench_list(v, a->ctx, 8);
        else if (strcmp(k, "--decode") == 0)
            a->decode = atoi(v);
        else if (strcmp(k, "--reps") == 0)
            a->reps = atoi(v);
        else if (strcmp(k, "--batches") == 0)
            a->n_batches = duet_bench_list(v, a->batches, 8);
        else if (strcmp(k, "--prompts") == 0)
            a->n_prompts = duet_bench_list(v, a->prompts, 16);
        else if (strcmp(k, "--temperature") == 0)
            a->sampling.temperature = (float)atof(v);
        else if (strcmp(k, "--top-k") == 0)
            a->sampling.top_k = atoi(v);
        else if (strcmp(k, "--top-p") == 0)
            a->sampling.top_p = (float)atof(v);
        else
            return -1;
    }
    for (int i = 0; i < a->n_ctx; i++) /* ascending */
        for (int j = i + 1; j < a->n_ctx; j++)
            if (a->ctx[j] < a->ctx[i]) {
                int t = a->ctx[i];
                a->ctx[i] = a->ctx[j];
                a->ctx[j] = t;
            }
    return a->model != NULL && a->tp > 0 && a->n_ctx > 0 && a->ctx[0] > 0 && a->decode > 0 &&
                   a->reps > 0 && duet_sampling_check(&a->sampling) == DUET_OK
               ? 0
               : -1;
}

static double now_s(void)
{
    return (double)duet_now_ns() / 1e9;
}

/* TFLOP/s of a bf16 TN GEMM m = n = k = 8192 (float32 accumulate) */
static double gemm_tflops(void)
{
    const int m = 8192, n = 8192, k = 8192;
    size_t elems = (size_t)m * k;
    uint16_t *h = malloc(elems * 2);
    void *A, *B, *C, *ws;
    size_t wsb = 32u << 20;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int found = 0;
    float alpha = 1, beta = 0, ms = 0;
    cudaEvent_t e0, e1;
    uint64_t s = 12345;

    for (size_t i = 0; i < elems; i++) { /* random bf16 in [-1, 1) */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float f = (float)((s >> 40) & 0xffffff) / 8388608.0f - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (uint16_t)(u >> 16);
    }
    CK(cudaMalloc(&A, elems * 2));
    CK(cudaMalloc(&B, elems * 2));
    CK(cudaMalloc(&C, (size_t)m * n * 2));
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemcpy(A, h, elems * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, h, elems * 2, cudaMemcpyHostToDevice));
    free(h);
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t w64 = wsb;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w64,
                                         sizeof(w64));
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found) !=
            CUBLAS_STATUS_SUCCESS ||
        found < 1)
        return -1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 5; i++)
        cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, ws, wsb, 0);
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < 20; i++)
        cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, ws, wsb, 0);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFree(ws);
    return 2.0 * m * n * (double)k * 20 / (ms / 1e3) / 1e12;
}

/* TFLOP/s of an e4m3 TN GEMM m = n = k = 8192, bf16 out, float32
 * accumulate, scales per tensor (outer = false) or per row of A and column
 * of B (outer: cuBLASLt's outer-vector mode, as the engine's FP8 path);
 * 0 when cuBLASLt has no algorithm for it. */
static double gemm_fp8_tflops(bool outer)
{
    const int m = 8192, n = 8192, k = 8192;
    size_t elems = (size_t)m * k;
    uint8_t *h = malloc(elems);
    float *hs = malloc((size_t)m * sizeof(float));
    void *A, *B, *C, *ws, *sa, *sb;
    size_t wsb = 32u << 20;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int found = 0;
    float alpha = 1, beta = 0, ms = 0;
    cudaEvent_t e0, e1;
    uint64_t s = 777;

    for (size_t i = 0; i < elems; i++) { /* random finite e4m3 */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (uint8_t)((s >> 40) % 0x7e) | (uint8_t)((s >> 50) & 0x80);
    }
    for (int i = 0; i < m; i++)
        hs[i] = 1.0f / 64;
    CK(cudaMalloc(&A, elems));
    CK(cudaMalloc(&B, elems));
    CK(cudaMalloc(&C, (size_t)m * n * 2));
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMalloc(&sa, (size_t)m * sizeof(float)));
    CK(cudaMalloc(&sb, (size_t)n * sizeof(float)));
    CK(cudaMemcpy(A, h, elems, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, h, elems, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sa, hs, (size_t)m * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sb, hs, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    free(hs);
    cublasLtCreate(&lt);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (outer) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                       sizeof(mode));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                       sizeof(mode));
    }
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t w64 = wsb;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w64,
                                         sizeof(w64));
    double tf = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found >= 1) {
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int i = 0; i < 5; i++)
            cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, ws, wsb,
                           0);
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < 20; i++)
            cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, ws, wsb,
                           0);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        tf = cudaGetLastError() == cudaSuccess ? 2.0 * m * n * (double)k * 20 / (ms / 1e3) / 1e12
                                               : 0;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFree(ws);
    cudaFree(sa);
    cudaFree(sb);
    return tf;
}

/* DUET_BENCH_PROFILE=decode|prefill: cudaProfilerStart/Stop around the
 * first timed decode step of every (batch, ctx), or the first timed
 * prefill of every prompt length, for a profiler started with profiling
 * off (tests/gpu/profile.sh: ncu --profile-from-start off). */
static void profile_mark(const char *what, bool start, bool stop)
{
    const char *v = getenv("DUET_BENCH_PROFILE");
    if (v == NULL || strcmp(v, what) != 0 || !(start || stop))
        return;
    (void)cudaDeviceSynchronize();
    if (start)
        (void)cudaProfilerStart();
    else
        (void)cudaProfilerStop();
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* decode tok/s per (ctx, batch) of one model, 0 when skipped */
typedef struct {
    double tps[8][8];
} decode_results_t;

static int bench_model(const args_t *ap, const char *model, const struct cudaDeviceProp *pp,
                       double bw, double tf, double tf8, decode_results_t *out)
{
    args_t a = *ap;
    struct cudaDeviceProp prop = *pp;
    a.model = model;
    memset(out, 0, sizeof(*out));

    int max_b = 1, max_p = 1, max_ctx = a.ctx[a.n_ctx - 1];
    for (int i = 0; i < a.n_batches; i++)
        max_b = a.batches[i] > max_b ? a.batches[i] : max_b;
    for (int i = 0; i < a.n_prompts; i++)
        max_p = a.prompts[i] > max_p ? a.prompts[i] : max_p;
    int ps = 16, chunk = max_p > 8192 ? max_p : 8192;
    duet_engine_opts_t eo;
    duet_engine_t *e = NULL;
    duet_engine_opts_default(&eo);
    eo.model_dir = a.model;
    eo.backend = "cuda";
    eo.tp = a.tp;
    eo.page_size = ps;
    eo.max_batch_tokens = chunk > max_b ? chunk : max_b;
    eo.max_seqs = max_b;
    /* the pool for every batch at the longest context, or as much of it as
     * the device holds */
    int want = max_b * ((max_ctx + a.decode + 8 + ps - 1) / ps);
    if (want < max_p / ps + 2)
        want = max_p / ps + 2;
    for (eo.n_pages = want; eo.n_pages >= max_p / ps + 2; eo.n_pages = eo.n_pages * 3 / 4) {
        if (duet_engine_create(&eo, &e) == DUET_OK)
            break;
        e = NULL;
    }
    if (e == NULL) {
        fprintf(stderr, "engine: %s\n", duet_error_msg());
        return 1;
    }
    const duet_model_config_t *cfg = &duet_engine_model(e)->cfg;
    double mat_params = (double)cfg->n_layers * ((double)cfg->hidden * cfg->head_dim *
                                                     (cfg->n_heads * 2.0 + cfg->n_kv_heads * 2.0) +
                                                 3.0 * cfg->hidden * cfg->intermediate) +
                        (double)cfg->vocab * cfg->hidden;
    /* FP8 checkpoints: 1 byte per linear weight (scales negligible), lm_head bf16 */
    bool fp8 = cfg->quant.method != DUET_QUANT_NONE && getenv("DUET_CUDA_FP8") == NULL;
    double lm_params = (double)cfg->vocab * cfg->hidden;
    double wbytes = fp8 ? (mat_params - lm_params) * 1.0 + lm_params * 2.0 : mat_params * 2.0;
    double tf_ref = fp8 && tf8 > 0 ? tf8 : tf;
    double kv_tok = (double)cfg->n_layers * 2.0 * cfg->n_kv_heads * cfg->head_dim * 2.0;

    size_t n_tok = (size_t)(max_p > max_ctx ? max_p : max_ctx);
    int32_t *tokens = duet_malloc(n_tok * sizeof(int32_t));
    int32_t *pages = duet_malloc((size_t)eo.n_pages * sizeof(int32_t));
    int32_t *next = duet_malloc((size_t)max_b * sizeof(int32_t));
    int32_t *cur = duet_malloc((size_t)max_b * sizeof(int32_t));
    duet_engine_seq_t *seqs = duet_calloc((size_t)max_b, sizeof(duet_engine_seq_t));
    for (size_t i = 0; i < n_tok; i++)
        tokens[i] = (int32_t)(((unsigned)i * 7919u + 13u) % (unsigned)(cfg->vocab - 2));
    for (int i = 0; i < eo.n_pages; i++)
        pages[i] = i;

    printf("bench_gpu: %s on %s (%d SMs), cuda backend tp %d, graphs %s\n", a.model, prop.name,
           prop.multiProcessorCount, a.tp,
           getenv("DUET_CUDA_GRAPHS") && strcmp(getenv("DUET_CUDA_GRAPHS"), "0") == 0 ? "off"
                                                                                      : "on");
    if (a.sampling.temperature > 0.0f)
        printf("  decode sampling: temperature %g top_k %d top_p %g, on the %s\n",
               (double)a.sampling.temperature, a.sampling.top_k, (double)a.sampling.top_p,
               getenv("DUET_CUDA_SAMPLING") != NULL &&
                       strcmp(getenv("DUET_CUDA_SAMPLING"), "host") == 0
                   ? "host"
                   : "device");
    printf("  model: hidden %d layers %d heads %d/%d hd %d ffn %d vocab %d: %.2f B matrix params, "
           "weights %s (%.2f GB read per decode step)\n",
           cfg->hidden, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim,
           cfg->intermediate, cfg->vocab, mat_params / 1e9,
           fp8 ? (cfg->quant.per_channel ? "fp8 e4m3 per channel" : "fp8 e4m3 per tensor") : "bf16",
           wbytes / 1e9);
    printf("  HBM copy bandwidth      %8.0f GB/s (1 GiB D2D, read + write)\n", bw);
    printf("  cuBLASLt bf16 GEMM      %8.0f TFLOP/s (8192^3, random data)\n", tf);
    if (fp8)
        printf("  cuBLASLt fp8 GEMM       %8.0f TFLOP/s (8192^3, outer-vector scales; prefill "
               "below against it)\n",
               tf8);
    printf("  KV pool %d pages of %d tokens (%.1f GB)%s\n", eo.n_pages, ps,
           (double)eo.n_pages * ps * kv_tok / 1e9, eo.n_pages < want ? ", less than asked" : "");

    for (int ci = 0; ci < a.n_ctx; ci++) {
        int C = a.ctx[ci], per_seq = (C + a.decode + 8 + ps - 1) / ps;
        int fit = eo.n_pages / per_seq, filled = fit < max_b ? fit : max_b;
        /* every sequence's context, one sequence (in chunks) per forward */
        for (int s = 0; s < filled; s++) {
            for (int p0 = 0; p0 < C; p0 += chunk) {
                int n = C - p0 < chunk ? C - p0 : chunk;
                duet_engine_seq_t q = {.tokens = tokens + p0,
                                       .n_tokens = n,
                                       .start_pos = p0,
                                       .pages = pages + s * per_seq,
                                       .n_pages = per_seq,
                                       .sample = p0 + n == C,
                                       .sampling = duet_sampling_greedy()};
                if (duet_engine_forward(e, &q, 1, next + s) != DUET_OK)
                    goto fail;
            }
        }
        for (int bi = 0; bi < a.n_batches; bi++) {
            int B = a.batches[bi];
            if (B > filled) {
                printf("  decode batch %-3d ctx %-6d skipped: %d sequences of %d tokens need %d "
                       "pages, the pool has %d\n",
                       B, C, B, C, B * per_seq, eo.n_pages);
                continue;
            }
            for (int s = 0; s < B; s++)
                seqs[s] = (duet_engine_seq_t){.tokens = &cur[s],
                                              .n_tokens = 1,
                                              .start_pos = C - 1,
                                              .pages = pages + s * per_seq,
                                              .n_pages = per_seq,
                                              .sample = true,
                                              .sampling = a.sampling};
            for (int s = 0; s < B; s++)
                seqs[s].sampling.seed = (uint64_t)s;
            double t0 = 0;
            for (int step = 0; step < a.decode + 3; step++) {
                if (step == 3)
                    t0 = now_s();
                profile_mark("decode", step == 3, false);
                for (int s = 0; s < B; s++) {
                    cur[s] = next[s];
                    seqs[s].start_pos++;
                    seqs[s].sample_index++;
                }
                if (duet_engine_forward(e, seqs, B, next) != DUET_OK)
                    goto fail;
                profile_mark("decode", false, step == 3);
            }
            double t = now_s() - t0;
            double avg_ctx = C + 3 + a.decode / 2.0;
            double roof = B * bw * 1e9 / (wbytes + B * avg_ctx * kv_tok);
            double tps = (double)B * a.decode / t;
            printf("  decode batch %-3d ctx %-6d %8.1f tok/s  %7.2f ms/step  roofline %8.1f tok/s "
                   "(%.2f)\n",
                   B, C, tps, 1e3 * t / a.decode, roof, tps / roof);
            out->tps[ci][bi] = tps;
        }
    }
    for (int pi = 0; pi < a.n_prompts; pi++) {
        int P = a.prompts[pi];
        double times[16];
        int reps = a.reps < 16 ? a.reps : 16;
        for (int r = 0; r <= reps; r++) { /* the first run warms up */
            duet_engine_seq_t s = {.tokens = tokens,
                                   .n_tokens = P,
                                   .pages = pages,
                                   .n_pages = eo.n_pages,
                                   .sample = true,
                                   .sampling = duet_sampling_greedy()};
            double t0 = now_s();
            profile_mark("prefill", r == 1, false);
            if (duet_engine_forward(e, &s, 1, next) != DUET_OK)
                goto fail;
            profile_mark("prefill", false, r == 1);
            if (r > 0)
                times[r - 1] = now_s() - t0;
        }
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        double t = times[reps / 2];
        double flops =
            2.0 * mat_params * P - 2.0 * (double)cfg->vocab * cfg->hidden * (P - 1) +
            4.0 * (double)P * (P + 1) / 2.0 * cfg->head_dim * cfg->n_heads * cfg->n_layers;
        printf("  prefill %-5d tokens     %8.0f tok/s  %7.1f ms  %6.0f TFLOP/s (%.0f%% of GEMM)\n",
               P, P / t, 1e3 * t, flops / t / 1e12, 100.0 * flops / t / 1e12 / tf_ref);
    }
    duet_engine_destroy(e);
    duet_free(tokens);
    duet_free(pages);
    duet_free(next);
    duet_free(cur);
    duet_free(seqs);
    return 0;
fail:
    fprintf(stderr, "forward: %s\n", duet_error_msg());
    duet_engine_destroy(e);
    return 1;
}

int main(int argc, char **argv)
{
    args_t a;
    struct cudaDeviceProp prop;
    decode_results_t r1, r2;
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: bench_gpu --model DIR [--model DIR2] [--tp N] [--batches 1,16,64] "
                        "[--ctx N] [--decode N] [--prompts 512,...] [--reps N]\n");
        return 2;
    }
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        fprintf(stderr, "bench_gpu: no CUDA device\n");
        return 1;
    }
    double bw = duet_bench_copy_bandwidth();
    double tf = gemm_tflops();
    double tf8 = gemm_fp8_tflops(true);
    printf("bench_gpu: cuBLASLt fp8 GEMM %.0f TFLOP/s with per-tensor scales, %.0f with "
           "outer-vector scales (8192^3; 0: no algorithm)\n",
           gemm_fp8_tflops(false), tf8);
    int rc = bench_model(&a, a.model, &prop, bw, tf, tf8, &r1);
    if (rc != 0 || a.model2 == NULL)
        return rc;
    if ((rc = bench_model(&a, a.model2, &prop, bw, tf, tf8, &r2)) != 0)
        return rc;
    printf("bench_gpu: decode tok/s of %s over %s (same GPU, same run)\n", a.model2, a.model);
    for (int ci = 0; ci < a.n_ctx; ci++)
        for (int bi = 0; bi < a.n_batches; bi++)
            if (r1.tps[ci][bi] > 0 && r2.tps[ci][bi] > 0)
                printf("  decode batch %-3d ctx %-6d ratio %.2f (%.1f / %.1f tok/s)\n",
                       a.batches[bi], a.ctx[ci], r2.tps[ci][bi] / r1.tps[ci][bi], r2.tps[ci][bi],
                       r1.tps[ci][bi]);
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "bench_gpu: this build has no CUDA backend\n");
    return 1;
}
#endif
