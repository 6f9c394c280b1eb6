/* Dense layers: y[n][rows] = x[n][cols] . W^T (+ bias), through the
 * skinny GEMV kernel (gemv.cu) for decode-sized n, else cuBLASLt.
 *
 * cuBLASLt is column-major.  Row-major W[rows][cols] is the column-major
 * cols x rows matrix, x[n][cols] is cols x n and y[n][rows] is rows x n,
 * so y = op(A) B with A = W transposed (lda = cols), B = x (ldb = cols),
 * m = rows, n = n, k = cols: the "TN" product.  bf16 A, B, C/D, float32
 * compute and scale; the optional bias is added in the epilogue (bf16, D's
 * type).  A plan (descriptors + the heuristic's first algorithm) is cached
 * per (m, n, k, bias, pointer alignment); heuristics are a host-side query,
 * so a plan can also be made while a graph is being recorded.  The
 * workspace is fixed, which keeps the calls capturable.
 *
 * FP8 weights (w->fp8): n <= the GEMV limit runs gemm_fp8.cu's FP8 GEMV;
 * larger n quantizes x per token (duet__cuda_fp8_quant_rows) and runs
 * cuBLASLt's e4m3 x e4m3 GEMM (float32 accumulation, bf16 out) with the
 * outer-vector scale mode: A's scale the weight's per-row scales, B's the
 * per-token activation scales, so D = s_w[r] s_x[t] sum qw qx exactly as
 * the math says; the bias in the epilogue.  Where cuBLASLt offers no
 * algorithm for that mode, the GEMM runs unscaled into bf16 and
 * duet__cuda_fp8_rescale applies both scales and the bias (one more
 * rounding).  DUET_CUDA_FP8_GEMM=0 runs every n through the FP8 GEMV
 * instead (exact weights, bf16 activations: for accuracy checks).
 * docs/fp8.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/cuda/cuda_internal.h"

static duet_status_t duet__lt_err(cublasStatus_t s, const char *what, int m, int n, int k)
{
    return duet_error(DUET_ERR_INTERNAL, "cublasLt %s (m %d n %d k %d): %s (%s)", what, m, n, k,
                      cublasLtGetStatusString(s), cublasLtGetStatusName(s));
}

duet_status_t duet__cuda_gemm_init(duet_backend_rank_t *r)
{
    const char *g = getenv("DUET_CUDA_GEMV");
    int v = g != NULL ? atoi(g) : DUET__CUDA_GEMV_MAX_N;
    r->gemv_max_n = v < 0 ? 0 : (v > DUET__CUDA_GEMV_MAX_N ? DUET__CUDA_GEMV_MAX_N : v);
    g = getenv("DUET_CUDA_FP8");
    r->fp8_off = g != NULL && strcmp(g, "0") == 0;
    g = getenv("DUET_CUDA_FP8_GEMM");
    r->fp8_gemv_only = g != NULL && strcmp(g, "0") == 0;
    g = getenv("DUET_CUDA_GEMV_PDL");
    r->gemv_pdl = !(g != NULL && strcmp(g, "0") == 0);
    cublasStatus_t s = cublasLtCreate(&r->lt);
    if (s != CUBLAS_STATUS_SUCCESS)
        return duet__lt_err(s, "create", 0, 0, 0);
    DUET__CUDA_TRY(cudaMalloc(&r->lt_ws, DUET__CUDA_LT_WORKSPACE));
    return DUET_OK;
}

static void duet__plan_free(duet__gemm_plan_t *p)
{
    if (!p->used)
        return;
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c);
    cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof(*p));
}

void duet__cuda_gemm_cleanup(duet_backend_rank_t *r)
{
    cudaFree(r->fp8_xq);
    cudaFree(r->fp8_sx);
    r->fp8_xq = NULL;
    r->fp8_sx = NULL;
    r->fp8_xq_bytes = 0;
    r->fp8_sx_n = 0;
    for (int i = 0; i < DUET__CUDA_GEMM_PLANS; i++)
        duet__plan_free(&r->plans[i]);
    if (r->lt != NULL)
        cublasLtDestroy(r->lt);
    cudaFree(r->lt_ws);
    r->lt = NULL;
    r->lt_ws = NULL;
}

static unsigned duet__align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 2 && (a % al) != 0)
        al >>= 1;
    return al;
}

static duet_status_t duet__plan_make(duet_backend_rank_t *r, duet__gemm_plan_t *p, int kind, int m,
                                     int n, int k, const void *bias, unsigned align)
{
    const cudaDataType_t ab = kind == DUET__GEMM_BF16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    uint64_t ws = DUET__CUDA_LT_WORKSPACE;
    int found = 0;
    cublasStatus_t s;

    memset(p, 0, sizeof(*p));
    if ((s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) !=
        CUBLAS_STATUS_SUCCESS)
        return duet__lt_err(s, "matmul desc", m, n, k);
    p->used = true; /* from here duet__plan_free undoes what exists */
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    if (kind == DUET__GEMM_FP8_OUTER) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                       sizeof(mode));
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                       sizeof(mode));
        /* placeholders (device memory) for the heuristic; every call sets
         * the weight's and the activations' scale vectors */
        const void *ph = r->lt_ws;
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ph,
                                       sizeof(ph));
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ph,
                                       sizeof(ph));
    }
    if (bias != NULL) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = CUDA_R_16BF;
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                       sizeof(bt));
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                       sizeof(bias));
    }
    if ((s = cublasLtMatrixLayoutCreate(&p->a, ab, (uint64_t)k, (uint64_t)m, k)) !=
            CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->b, ab, (uint64_t)k, (uint64_t)n, k)) !=
            CUBLAS_STATUS_SUCCESS ||
        (s = cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, (uint64_t)m, (uint64_t)n, m)) !=
            CUBLAS_STATUS_SUCCESS) {
        duet__plan_free(p);
        return duet__lt_err(s, "matrix layout", m, n, k);
    }
    if ((s = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS) {
        duet__plan_free(p);
        return duet__lt_err(s, "preference", m, n, k);
    }
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    uint32_t al = align;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                         sizeof(al));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                         sizeof(al));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                         sizeof(al));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                         sizeof(al));
    s = cublasLtMatmulAlgoGetHeuristic(r->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res,
                                       &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found < 1) {
        duet__plan_free(p);
        return s != CUBLAS_STATUS_SUCCESS
                   ? duet__lt_err(s, "heuristic", m, n, k)
                   : duet_error(DUET_ERR_UNSUPPORTED, "cublasLt: no algorithm for m %d n %d k %d",
                                m, n, k);
    }
    p->algo = res.algo;
    p->kind = kind;
    p->m = m;
    p->n = n;
    p->k = k;
    p->bias = bias != NULL;
    p->align = align;
    return DUET_OK;
}

static duet_status_t duet__plan_get(duet_backend_rank_t *r, int kind, int m, int n, int k,
                                    const void *bias, unsigned align, duet__gemm_plan_t **p_p)
{
    duet__gemm_plan_t *victim = NULL;
    duet_status_t st;

    for (int i = 0; i < DUET__CUDA_GEMM_PLANS; i++) {
        duet__gemm_plan_t *p = &r->plans[i];
        if (p->used && p->kind == kind && p->m == m && p->n == n && p->k == k &&
            p->bias == (bias != NULL) && p->align == align) {
            p->last_use = ++r->gemm_clock;
            *p_p = p;
            return DUET_OK;
        }
        if (victim == NULL || !p->used || (victim->used && p->last_use < victim->last_use))
            victim = p;
    }
    duet__plan_free(victim);
    if ((st = duet__plan_make(r, victim, kind, m, n, k, bias, align)) != DUET_OK)
        return st;
    victim->last_use = ++r->gemm_clock;
    *p_p = victim;
    return DUET_OK;
}

/* The quantized activations of n tokens x k columns: grown eagerly (to the
 * batch capacity and the widest FP8 weight), so that a decode step being
 * recorded finds them sized by its eager run. */
static duet_status_t duet__fp8_scratch(duet_backend_rank_t *r, int n, int k)
{
    if ((size_t)n * (size_t)k <= r->fp8_xq_bytes && n <= r->fp8_sx_n)
        return DUET_OK;
    if (r->capturing)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: fp8 scratch grows while recording",
                          r->rank);
    int rows = n > r->cap_tokens ? n : r->cap_tokens;
    int cols = k > r->fp8_max_cols ? k : r->fp8_max_cols;
    /* queued kernels and recorded graphs may read the old buffers */
    DUET__CUDA_TRY(cudaStreamSynchronize(r->stream));
    duet__cuda_graphs_reset(r);
    cudaFree(r->fp8_xq);
    cudaFree(r->fp8_sx);
    r->fp8_xq = NULL;
    r->fp8_sx = NULL;
    r->fp8_xq_bytes = 0;
    r->fp8_sx_n = 0;
    DUET__CUDA_TRY(cudaMalloc(&r->fp8_xq, (size_t)rows * (size_t)cols));
    DUET__CUDA_TRY(cudaMalloc((void **)&r->fp8_sx, (size_t)rows * sizeof(float)));
    r->fp8_xq_bytes = (size_t)rows * (size_t)cols;
    r->fp8_sx_n = rows;
    return DUET_OK;
}

static duet_status_t duet__gemm_fp8(duet_backend_rank_t *r, void *y, const void *x, int n,
                                    const duet_weight_t *w, const void *bias)
{
    int m = w->rows, k = w->cols;
    float alpha = 1.0f, beta = 0.0f;
    unsigned align = duet__align_of(y);
    duet__gemm_plan_t *p;
    duet_status_t st;
    cublasStatus_t s;

    if (n <= r->gemv_max_n && duet__cuda_gemv_fp8_supported(x, w->d, n, m, k))
        return duet__cuda_gemv_fp8(r->stream, y, x, n, w->d, w->scale, m, k, bias, r->gemv_pdl);
    if (r->fp8_gemv_only && duet__cuda_gemv_fp8_supported(x, w->d, 1, m, k)) {
        for (int t = 0; t < n; t += DUET__CUDA_GEMV_MAX_N) {
            int c = n - t < DUET__CUDA_GEMV_MAX_N ? n - t : DUET__CUDA_GEMV_MAX_N;
            if ((st = duet__cuda_gemv_fp8(r->stream, (char *)y + (size_t)t * (size_t)m * 2,
                                          (const char *)x + (size_t)t * (size_t)k * 2, c, w->d,
                                          w->scale, m, k, bias, r->gemv_pdl)) != DUET_OK)
                return st;
        }
        return DUET_OK;
    }
    if (bias != NULL && duet__align_of(bias) < align)
        align = duet__align_of(bias);
    if (align < 16)
        return duet_error(DUET_ERR_INTERNAL, "cuda fp8 gemm: output not 16-byte aligned");
    if ((st = duet__fp8_scratch(r, n, k)) != DUET_OK ||
        (st = duet__cuda_fp8_quant_rows(r->stream, r->fp8_xq, r->fp8_sx, x, n, k)) != DUET_OK)
        return st;
    if (r->fp8_outer >= 0) {
        st = duet__plan_get(r, DUET__GEMM_FP8_OUTER, m, n, k, bias, align, &p);
        if (st == DUET_OK) {
            const void *sa = w->scale, *sb = r->fp8_sx;
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa,
                                           sizeof(sa));
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb,
                                           sizeof(sb));
            if (bias != NULL)
                cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias));
            s = cublasLtMatmul(r->lt, p->desc, &alpha, w->d, p->a, r->fp8_xq, p->b, &beta, y, p->c,
                               y, p->c, &p->algo, r->lt_ws, DUET__CUDA_LT_WORKSPACE, r->stream);
            if (s == CUBLAS_STATUS_SUCCESS) {
                r->fp8_outer = 1;
                return DUET_OK;
            }
            if (r->fp8_outer == 1) /* worked before: a real failure */
                return duet__lt_err(s, "fp8 matmul", m, n, k);
        } else if (r->fp8_outer == 1) {
            return st;
        }
    }
    if ((st = duet__plan_get(r, DUET__GEMM_FP8_PLAIN, m, n, k, NULL, align, &p)) != DUET_OK)
        return st;
    s = cublasLtMatmul(r->lt, p->desc, &alpha, w->d, p->a, r->fp8_xq, p->b, &beta, y, p->c, y, p->c,
                       &p->algo, r->lt_ws, DUET__CUDA_LT_WORKSPACE, r->stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return duet__lt_err(s, "fp8 matmul", m, n, k);
    if (r->fp8_outer == 0) { /* the plain GEMM takes this shape: the scale mode is the problem */
        DUET_LOG_WARN("cuda rank %d: cuBLASLt has no FP8 GEMM with outer-vector scales here "
                      "(m %d n %d k %d); scaling in a separate kernel",
                      r->rank, m, n, k);
        r->fp8_outer = -1;
    }
    return duet__cuda_fp8_rescale(r->stream, y, w->scale, r->fp8_sx, bias, n, m);
}

duet_status_t duet__cuda_gemm(duet_backend_rank_t *r, void *y, const void *x, int n,
                              const duet_weight_t *w, const void *bias)
{
    int m = w->rows, k = w->cols;
    unsigned align = duet__align_of(y);
    duet__gemm_plan_t *p;
    float alpha = 1.0f, beta = 0.0f;
    duet_status_t st;
    cublasStatus_t s;

    if (n <= 0)
        return DUET_OK;
    if (w->fp8)
        return duet__gemm_fp8(r, y, x, n, w, bias);
    if (n <= r->gemv_max_n && duet__cuda_gemv_supported(y, x, w->d, n, m, k))
        return duet__cuda_gemv(r->stream, y, x, n, w->d, m, k, bias, r->gemv_pdl);
    if (duet__align_of(x) < align)
        align = duet__align_of(x);
    if (duet__align_of(w->d) < align)
        align = duet__align_of(w->d);
    if (bias != NULL && duet__align_of(bias) < align)
        align = duet__align_of(bias);
    if ((st = duet__plan_get(r, DUET__GEMM_BF16, m, n, k, bias, align, &p)) != DUET_OK)
        return st;
    if (bias != NULL)
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                       sizeof(bias));
    s = cublasLtMatmul(r->lt, p->desc, &alpha, w->d, p->a, x, p->b, &beta, y, p->c, y, p->c,
                       &p->algo, r->lt_ws, DUET__CUDA_LT_WORKSPACE, r->stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return duet__lt_err(s, "matmul", m, n, k);
    return DUET_OK;
}
