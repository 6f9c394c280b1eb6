/* The cuda backend: rank lifecycle, memory, weights, host waits and the
 * ops table (engine/cuda/backend_cuda.h has the design notes).  The batch
 * upload and graphs are in batch.c, attention and RoPE dispatch in
 * attention_host.c, GEMMs in gemm.c, the kernels in *.cu. */
#include "engine/cuda/cuda_internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

int duet_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

void *duet_cuda_rank_stream(duet_backend_rank_t *r)
{
    return r->stream;
}

int duet_cuda_rank_device(const duet_backend_rank_t *r)
{
    return r->device;
}

void duet__cuda_set_watch(duet_backend_rank_t *r, duet__cuda_watch_fn fn, void *ud)
{
    r->watch = fn;
    r->watch_ud = ud;
}

duet_status_t duet__cuda_wait(duet_backend_rank_t *r, const char *what)
{
    int64_t t0 = duet_now_ns();
    unsigned polls = 0;
    cudaError_t e;

    if (r->capturing)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: host wait (%s) while recording a graph",
                          r->rank, what);
    DUET__CUDA_TRY(cudaEventRecord(r->ev_wait, r->stream));
    for (;;) {
        e = cudaEventQuery(r->ev_wait);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady)
            return duet__cuda_check(e, what, __FILE__, __LINE__);
        if (r->watch != NULL) {
            duet_status_t st = r->watch(r->watch_ud, duet_now_ns() - t0, what);
            if (st != DUET_OK)
                return st;
        }
        /* spin briefly (decode steps are short), then sleep in small steps */
        if (++polls < 2000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady)
        cudaGetLastError();
    return DUET_OK;
}

duet_status_t duet__cuda_pinned(duet_backend_rank_t *r, size_t bytes, void **p)
{
    if (bytes > r->pin_bytes) {
        size_t want = bytes < (4u << 20) ? (4u << 20) : bytes;
        void *np = NULL;
        if (r->capturing)
            return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: staging grows while recording",
                              r->rank);
        /* the previous buffer may still feed an earlier async copy */
        DUET__CUDA_TRY(cudaStreamSynchronize(r->stream));
        DUET__CUDA_TRY(cudaMallocHost(&np, want));
        cudaFreeHost(r->pin);
        r->pin = np;
        r->pin_bytes = want;
    }
    *p = r->pin;
    return DUET_OK;
}

static void duet__cuda_op_rank_destroy(duet_backend_rank_t *r)
{
    if (r == NULL)
        return;
    cudaSetDevice(r->device);
    if (r->capturing) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(r->stream, &g);
        if (g != NULL)
            cudaGraphDestroy(g);
        r->capturing = false;
    }
    if (r->stream != NULL && cudaStreamSynchronize(r->stream) != cudaSuccess)
        DUET_LOG_WARN("cuda rank %d: stream failed before shutdown: %s", r->rank,
                      cudaGetErrorString(cudaGetLastError()));
    duet__cuda_graphs_reset(r);
    duet__cuda_gemm_cleanup(r);
    cudaFree(r->meta_d);
    cudaFreeHost(r->meta_h);
    cudaFreeHost(r->pin);
    cudaFree(r->part);
    cudaFree(r->fd_counts);
    cudaFree(r->am_val);
    cudaFree(r->am_idx);
    cudaFree(r->am_rows);
    cudaFree(r->inv_freq_d);
    duet_free(r->inv_freq_h);
    if (r->ev_kv != NULL) {
        for (int l = 0; l < r->kv.n_layers; l++) {
            if (r->ev_kv[l] != NULL)
                cudaEventDestroy(r->ev_kv[l]);
        }
    }
    duet_free(r->ev_kv);
    if (r->ev_meta != NULL)
        cudaEventDestroy(r->ev_meta);
    if (r->ev_wait != NULL)
        cudaEventDestroy(r->ev_wait);
    if (r->copy_stream != NULL)
        cudaStreamSynchronize(r->copy_stream);
    duet__cuda_done_stop(r); /* runs the dones still queued, then joins */
    if (r->copy_stream != NULL)
        cudaStreamDestroy(r->copy_stream);
    duet__cuda_kv_copy_cleanup(r);
    duet__cuda_kv_crc_cleanup(r);
    if (r->ev_copy != NULL)
        cudaEventDestroy(r->ev_copy);
    if (r->stream != NULL)
        cudaStreamDestroy(r->stream);
    cudaGetLastError();
    duet_free(r);
}

static duet_status_t duet__rank_setup(duet_backend_rank_t *r)
{
    struct cudaDeviceProp prop;
    const char *g = getenv("DUET_CUDA_GRAPHS");
    cudaError_t e;

    if ((e = cudaSetDevice(r->device)) != cudaSuccess) {
        cudaGetLastError();
        return duet_error(DUET_ERR_CONFIG, "cuda rank %d: device %d: %s (%d device(s) visible)",
                          r->rank, r->device, cudaGetErrorString(e), duet_cuda_device_count());
    }
    DUET__CUDA_TRY(cudaGetDeviceProperties(&prop, r->device));
    if (prop.major < 8)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "cuda rank %d: device %d (%s) has compute capability %d.%d; bf16 "
                          "tensor cores need 8.0 or later",
                          r->rank, r->device, prop.name, prop.major, prop.minor);
    r->sm_count = prop.multiProcessorCount;
    DUET__CUDA_TRY(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
    DUET__CUDA_TRY(cudaEventCreateWithFlags(&r->ev_wait, cudaEventDisableTiming));
    DUET__CUDA_TRY(cudaEventCreateWithFlags(&r->ev_meta, cudaEventDisableTiming));
    r->ev_kv = DUET_NEW_ARRAY(cudaEvent_t, (size_t)r->kv.n_layers);
    if (r->ev_kv == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cuda rank %d: no memory", r->rank);
    for (int l = 0; l < r->kv.n_layers; l++)
        DUET__CUDA_TRY(cudaEventCreateWithFlags(&r->ev_kv[l], cudaEventDisableTiming));
    duet_status_t st = duet__cuda_kernels_init();
    if (st != DUET_OK)
        return duet_error_wrap(st, "cuda rank %d (%s): ", r->rank, prop.name);
    if ((st = duet__cuda_gemm_init(r)) != DUET_OK)
        return st;
    r->graphs_enabled = !(g != NULL && strcmp(g, "0") == 0);
    g = getenv("DUET_CUDA_ATTN");
    r->attn_variant = g != NULL && strcmp(g, "wmma") == 0  ? DUET__CUDA_ATTN_WMMA
                      : g != NULL && strcmp(g, "mma") == 0 ? DUET__CUDA_ATTN_MMA
                                                           : DUET__CUDA_ATTN_FA;
    g = getenv("DUET_CUDA_SAMPLING"); /* =host: logits to the host, for comparison */
    r->host_sampling = g != NULL && strcmp(g, "host") == 0;
    g = getenv("DUET_CUDA_FUSE_ADD_NORM"); /* =0: two kernels, for comparison */
    r->split_add_norm = g != NULL && strcmp(g, "0") == 0;
    g = getenv("DUET_CUDA_DECODE_ATTN");
    r->decode_legacy = g != NULL && strcmp(g, "legacy") == 0;
    r->decode_cores = g != NULL && strcmp(g, "cores") == 0;
    g = getenv("DUET_CUDA_FD_BLOCKS");
    r->fd_blocks_per_sm = g != NULL && atoi(g) > 0 && atoi(g) <= 64 ? atoi(g) : 0;
    g = getenv("DUET_CUDA_FD_MERGE_COST");
    r->fd_merge_cost = g != NULL && atof(g) >= 0 && atof(g) < 1 ? atof(g) : DUET__FD_MERGE_COST;
    DUET_LOG_INFO("cuda rank %d: device %d %s, %d SMs, %.1f GiB, graphs %s, prefill attention %s, "
                  "decode attention %s",
                  r->rank, r->device, prop.name, prop.multiProcessorCount,
                  (double)prop.totalGlobalMem / (double)(1u << 30),
                  r->graphs_enabled ? "on" : "off",
                  r->attn_variant == DUET__CUDA_ATTN_WMMA  ? "wmma"
                  : r->attn_variant == DUET__CUDA_ATTN_MMA ? "mma"
                                                           : "fa",
                  r->decode_legacy  ? "legacy"
                  : r->decode_cores ? "flash on cuda cores"
                                    : "flash");
    return DUET_OK;
}

static duet_status_t duet__cuda_op_thread_bind(duet_backend_rank_t *r)
{
    DUET__CUDA_TRY(cudaSetDevice(r->device));
    DUET__CUDA_TRY(cudaFree(NULL)); /* the primary context exists and is current */
    return DUET_OK;
}

static duet_status_t duet__cuda_op_device_id(duet_backend_rank_t *r, char *buf, size_t cap)
{
    struct cudaDeviceProp p;
    size_t n;
    DUET__CUDA_TRY(cudaGetDeviceProperties(&p, r->device));
    n = (size_t)snprintf(buf, cap, "GPU-");
    for (size_t i = 0; i < sizeof(p.uuid.bytes) && n + 2 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%02x", (unsigned char)p.uuid.bytes[i]);
    return DUET_OK;
}

static duet_status_t duet__cuda_op_rank_create(const duet_backend_rank_opts_t *opts,
                                               duet_backend_rank_t **r_p)
{
    duet_backend_rank_t *r;
    duet_status_t st;

    if (opts->kv_layout.elem_size != 2)
        return duet_error(DUET_ERR_INVALID, "cuda backend: kv elem_size %d, expected 2 (bf16)",
                          opts->kv_layout.elem_size);
    if (opts->device < 0)
        return duet_error(DUET_ERR_CONFIG, "cuda backend: device %d", opts->device);
    r = DUET_NEW(duet_backend_rank_t);
    if (r == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cuda backend: no memory");
    r->rank = opts->rank;
    r->device = opts->device;
    r->kv = opts->kv_layout;
    if ((st = duet__rank_setup(r)) != DUET_OK) {
        duet__cuda_op_rank_destroy(r);
        return st;
    }
    *r_p = r;
    return DUET_OK;
}

static void *duet__cuda_op_alloc(duet_backend_rank_t *r, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        duet_error(DUET_ERR_NO_MEMORY, "cuda rank %d: no device memory for %zu bytes: %s", r->rank,
                   bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void duet__cuda_op_free(duet_backend_rank_t *r, void *p)
{
    if (p != NULL && cudaFree(p) != cudaSuccess)
        DUET_LOG_WARN("cuda rank %d: cudaFree: %s", r->rank,
                      cudaGetErrorString(cudaGetLastError()));
}

static duet_status_t duet__cuda_op_upload(duet_backend_rank_t *r, void *dst, const void *src,
                                          size_t bytes)
{
    DUET__CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, r->stream));
    return duet__cuda_wait(r, "upload");
}

static duet_status_t duet__cuda_op_download(duet_backend_rank_t *r, void *dst, const void *src,
                                            size_t bytes)
{
    DUET__CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, r->stream));
    return duet__cuda_wait(r, "download");
}

static duet_status_t duet__cuda_op_sync(duet_backend_rank_t *r)
{
    return duet__cuda_wait(r, "sync");
}

static void duet__cuda_op_kv_attach(duet_backend_rank_t *r, void *kv_base)
{
    r->kv_base = kv_base;
}

/* n elements of src (dtype) -> bf16 */
static void duet__to_bf16(duet_dtype_t dt, const void *src, uint16_t *dst, size_t n)
{
    if (dt == DUET_DTYPE_BF16) {
        memcpy(dst, src, n * 2);
    } else if (dt == DUET_DTYPE_F32) {
        const float *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = duet_f32_to_bf16(s[i]);
    } else {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = duet_f32_to_bf16(duet__cuda_f16_to_f32(s[i]));
    }
}

static bool duet__float_dtype(duet_dtype_t dt)
{
    return dt == DUET_DTYPE_F32 || dt == DUET_DTYPE_F16 || dt == DUET_DTYPE_BF16;
}

/* The scale of source row `row` (absolute) of an F8_E4M3 source. */
static float duet__src_scale(const duet_weight_src_t *s, int row)
{
    size_t i = s->scale_per_row ? (size_t)row : 0;
    if (s->scale_dtype == DUET_DTYPE_F32)
        return ((const float *)s->scale)[i];
    uint16_t h = ((const uint16_t *)s->scale)[i];
    return s->scale_dtype == DUET_DTYPE_BF16 ? duet_bf16_to_f32(h) : duet__cuda_f16_to_f32(h);
}

/* One row of an F8_E4M3 source as bf16: e4m3 * scale rounded once (the
 * bf16 path, for stacks that mix FP8 and float sources or DUET_CUDA_FP8=0). */
static void duet__fp8_row_to_bf16(const duet_weight_src_t *s, int row, uint16_t *dst)
{
    const uint8_t *q = (const uint8_t *)s->data + (size_t)row * (size_t)s->src_cols + s->col0;
    float sc = duet__src_scale(s, row);
    for (int c = 0; c < s->cols; c++)
        dst[c] = duet_f32_to_bf16(duet__cuda_e4m3_to_f32(q[c]) * sc);
}

/* FP8 sources kept as e4m3 (rows uploaded in pinned chunks) with a float
 * scale per output row. */
static duet_status_t duet__cuda_weight_fp8(duet_backend_rank_t *r, const duet_weight_src_t *src,
                                           int n_src, int rows, int cols, duet_weight_t *w)
{
    size_t chunk_rows = (16u << 20) / (size_t)cols, in_stage = 0, done = 0;
    float *scales = DUET_NEW_ARRAY(float, (size_t)rows);
    duet_status_t st = DUET_OK;
    void *stage;
    int at = 0;

    if (scales == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cuda backend: no memory for %d scales", rows);
    w->fp8 = true;
    if ((w->d = duet__cuda_op_alloc(r, (size_t)rows * (size_t)cols)) == NULL ||
        (w->scale = duet__cuda_op_alloc(r, (size_t)rows * sizeof(float))) == NULL) {
        st = DUET_ERR_NO_MEMORY;
        goto out;
    }
    if (chunk_rows < 1)
        chunk_rows = 1;
    if ((st = duet__cuda_pinned(r, chunk_rows * (size_t)cols, &stage)) != DUET_OK)
        goto out;
    for (int i = 0; i < n_src; i++) {
        for (int row = 0; row < src[i].rows; row++) {
            int sr = src[i].row0 + row;
            memcpy((char *)stage + in_stage * (size_t)cols,
                   (const char *)src[i].data + (size_t)sr * (size_t)src[i].src_cols +
                       (size_t)src[i].col0,
                   (size_t)cols);
            scales[at++] = duet__src_scale(&src[i], sr);
            if (++in_stage == chunk_rows) {
                if ((st = duet__cuda_op_upload(r, (char *)w->d + done * (size_t)cols, stage,
                                               in_stage * (size_t)cols)) != DUET_OK)
                    goto out;
                done += in_stage;
                in_stage = 0;
            }
        }
    }
    if (in_stage > 0 && (st = duet__cuda_op_upload(r, (char *)w->d + done * (size_t)cols, stage,
                                                   in_stage * (size_t)cols)) != DUET_OK)
        goto out;
    if ((st = duet__cuda_op_upload(r, w->scale, scales, (size_t)rows * sizeof(float))) != DUET_OK)
        goto out;
    if (cols > r->fp8_max_cols)
        r->fp8_max_cols = cols;
out:
    duet_free(scales);
    return st;
}

/* Rows of the stacked sources, converted in pinned chunks and copied. */
static duet_status_t duet__cuda_op_weight_create(duet_backend_rank_t *r,
                                                 const duet_weight_src_t *src, int n_src,
                                                 duet_weight_t **w_p)
{
    int rows = 0, cols = n_src > 0 ? src[0].cols : 0, n_fp8 = 0;
    size_t row_bytes = (size_t)cols * 2, done = 0;
    duet_weight_t *w;
    duet_status_t st;
    void *stage;

    for (int i = 0; i < n_src; i++) {
        bool fp8 = src[i].dtype == DUET_DTYPE_F8_E4M3 && src[i].scale != NULL &&
                   duet__float_dtype(src[i].scale_dtype);
        if (src[i].cols != cols || !(fp8 || duet__float_dtype(src[i].dtype)) || src[i].rows < 0)
            return duet_error(DUET_ERR_INVALID, "cuda backend: stacked weight sources differ");
        rows += src[i].rows;
        n_fp8 += fp8;
    }
    if (rows < 1 || cols < 1)
        return duet_error(DUET_ERR_INVALID, "cuda backend: empty weight (%d x %d)", rows, cols);
    /* FP8 kept where cuBLASLt's FP8 GEMM takes the shape (leading
     * dimensions in 16-byte multiples); any real model's projections */
    if (n_fp8 == n_src && !r->fp8_off && cols % 16 == 0 && rows % 16 == 0) {
        if ((w = DUET_NEW(duet_weight_t)) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "cuda backend: no memory for a weight");
        w->rows = rows;
        w->cols = cols;
        if ((st = duet__cuda_weight_fp8(r, src, n_src, rows, cols, w)) != DUET_OK) {
            duet__cuda_op_free(r, w->d);
            duet__cuda_op_free(r, w->scale);
            duet_free(w);
            return st;
        }
        *w_p = w;
        return DUET_OK;
    }
    w = DUET_NEW(duet_weight_t);
    if (w == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cuda backend: no memory for a weight");
    w->rows = rows;
    w->cols = cols;
    w->d = duet__cuda_op_alloc(r, (size_t)rows * row_bytes);
    if (w->d == NULL) {
        st = DUET_ERR_NO_MEMORY;
        goto err_free;
    }
    size_t chunk_rows = (16u << 20) / row_bytes;
    if (chunk_rows < 1)
        chunk_rows = 1;
    if ((st = duet__cuda_pinned(r, chunk_rows * row_bytes, &stage)) != DUET_OK)
        goto err_free;
    size_t in_stage = 0;
    for (int i = 0; i < n_src; i++) {
        size_t es = duet__cuda_dtype_size(src[i].dtype);
        for (int row = 0; row < src[i].rows; row++) {
            const char *s =
                (const char *)src[i].data +
                ((size_t)(src[i].row0 + row) * (size_t)src[i].src_cols + (size_t)src[i].col0) * es;
            uint16_t *dst = (uint16_t *)((char *)stage + in_stage * row_bytes);
            if (src[i].dtype == DUET_DTYPE_F8_E4M3)
                duet__fp8_row_to_bf16(&src[i], src[i].row0 + row, dst);
            else
                duet__to_bf16(src[i].dtype, s, dst, (size_t)cols);
            if (++in_stage == chunk_rows) {
                if ((st = duet__cuda_op_upload(r, (char *)w->d + done * row_bytes, stage,
                                               in_stage * row_bytes)) != DUET_OK)
                    goto err_free;
                done += in_stage;
                in_stage = 0;
            }
        }
    }
    if (in_stage > 0 && (st = duet__cuda_op_upload(r, (char *)w->d + done * row_bytes, stage,
                                                   in_stage * row_bytes)) != DUET_OK)
        goto err_free;
    *w_p = w;
    return DUET_OK;

err_free:
    duet__cuda_op_free(r, w->d);
    duet_free(w);
    return st;
}

static void duet__cuda_op_weight_destroy(duet_backend_rank_t *r, duet_weight_t *w)
{
    if (w == NULL)
        return;
    duet__cuda_op_free(r, w->d);
    duet__cuda_op_free(r, w->scale);
    duet_free(w);
}

static duet_status_t duet__cuda_op_vector_create(duet_backend_rank_t *r, const void *src,
                                                 duet_dtype_t dtype, int offset, int n,
                                                 void **vec_p)
{
    void *stage, *d;
    duet_status_t st;

    if (!duet__float_dtype(dtype) || n < 1)
        return duet_error(DUET_ERR_INVALID, "cuda backend: vector of %d elements of dtype %d", n,
                          (int)dtype);
    if ((st = duet__cuda_pinned(r, (size_t)n * 2, &stage)) != DUET_OK)
        return st;
    duet__to_bf16(dtype, (const char *)src + (size_t)offset * duet__cuda_dtype_size(dtype), stage,
                  (size_t)n);
    if ((d = duet__cuda_op_alloc(r, (size_t)n * 2)) == NULL)
        return DUET_ERR_NO_MEMORY;
    if ((st = duet__cuda_op_upload(r, d, stage, (size_t)n * 2)) != DUET_OK) {
        duet__cuda_op_free(r, d);
        return st;
    }
    *vec_p = d;
    return DUET_OK;
}

static duet_status_t duet__cuda_op_embedding_create(duet_backend_rank_t *r, const void *src,
                                                    duet_dtype_t dtype, int vocab, int hidden,
                                                    duet_weight_t **w_p)
{
    duet_weight_src_t ws = {src, dtype, hidden, 0, vocab, 0, hidden, NULL, DUET_DTYPE_F32, false};
    duet_status_t st = duet__cuda_op_weight_create(r, &ws, 1, w_p);
    if (st == DUET_OK) {
        r->vocab = vocab;
        r->hidden = hidden;
    }
    return st;
}

static duet_status_t duet__cuda_op_embed(duet_backend_rank_t *r, void *out,
                                         const duet_weight_t *table, int n, int hidden)
{
    if (n != r->n_tokens || hidden != table->cols)
        return duet_error(DUET_ERR_INTERNAL, "cuda embed: %d tokens x %d, batch %d x %d", n, hidden,
                          r->n_tokens, table->cols);
    return duet__cuda_embed(r->stream, out, table->d, table->rows, r->bd, n, hidden);
}

static duet_status_t duet__cuda_op_rmsnorm(duet_backend_rank_t *r, void *out, const void *in,
                                           const void *w, int n, int d, float eps)
{
    return duet__cuda_rmsnorm(r->stream, out, in, w, n, d, eps);
}

static duet_status_t duet__cuda_op_matmul(duet_backend_rank_t *r, void *y, const void *x, int n,
                                          const duet_weight_t *w, const void *bias)
{
    return duet__cuda_gemm(r, y, x, n, w, bias);
}

static duet_status_t duet__cuda_op_silu_mul(duet_backend_rank_t *r, void *out, const void *gu,
                                            int n, int m)
{
    return duet__cuda_silu_mul(r->stream, out, gu, n, m);
}

static duet_status_t duet__cuda_op_add(duet_backend_rank_t *r, void *x, const void *y, size_t count)
{
    return duet__cuda_add(r->stream, x, y, count);
}

static duet_status_t duet__cuda_op_add_rmsnorm(duet_backend_rank_t *r, void *out, void *x,
                                               const void *y, const void *w, int n, int d,
                                               float eps)
{
    duet_status_t st;
    if (!r->split_add_norm)
        return duet__cuda_add_rmsnorm(r->stream, out, x, y, w, n, d, eps);
    if ((st = duet__cuda_add(r->stream, x, y, (size_t)n * (size_t)d)) != DUET_OK)
        return st;
    return duet__cuda_rmsnorm(r->stream, out, x, w, n, d, eps);
}

static duet_status_t duet__cuda_op_add_bias(duet_backend_rank_t *r, void *x, const void *bias,
                                            int n, int d)
{
    return duet__cuda_add_bias(r->stream, x, bias, n, d);
}

static duet_status_t duet__cuda_op_gather_rows(duet_backend_rank_t *r, void *out, const void *in,
                                               const int32_t *rows, int n_rows, int d)
{
    return duet__cuda_gather_rows(r->stream, out, in, rows, n_rows, d);
}

static duet_status_t duet__cuda_op_rows_to_host_f32(duet_backend_rank_t *r, float *dst,
                                                    const void *src, int n, int d, size_t src_ld)
{
    size_t row = (size_t)d * 2;
    void *stage;
    duet_status_t st;

    if (n <= 0 || d <= 0)
        return DUET_OK;
    if ((st = duet__cuda_pinned(r, (size_t)n * row, &stage)) != DUET_OK)
        return st;
    DUET__CUDA_TRY(cudaMemcpy2DAsync(stage, row, src, src_ld * 2, row, (size_t)n,
                                     cudaMemcpyDeviceToHost, r->stream));
    if ((st = duet__cuda_wait(r, "logits to host")) != DUET_OK)
        return st;
    const uint16_t *h = stage;
    for (size_t i = 0; i < (size_t)n * (size_t)d; i++)
        dst[i] = duet_bf16_to_f32(h[i]);
    return DUET_OK;
}

/* Room for n rows of argmax or sampling results on the device. */
static duet_status_t duet__cuda_rows_reserve(duet_backend_rank_t *r, int n)
{
    if (n <= r->am_cap)
        return DUET_OK;
    int cap = n < 64 ? 64 : n;
    cudaFree(r->am_val);
    cudaFree(r->am_idx);
    cudaFree(r->am_rows);
    r->am_val = NULL;
    r->am_idx = NULL;
    r->am_rows = NULL;
    r->am_cap = 0;
    DUET__CUDA_TRY(cudaMalloc((void **)&r->am_val, (size_t)cap * sizeof(float)));
    DUET__CUDA_TRY(cudaMalloc((void **)&r->am_idx, (size_t)cap * sizeof(int32_t)));
    DUET__CUDA_TRY(cudaMalloc((void **)&r->am_rows, (size_t)cap * sizeof(duet_sample_row_t)));
    r->am_cap = cap;
    return DUET_OK;
}

static duet_status_t duet__cuda_op_argmax_rows(duet_backend_rank_t *r, float *max_p, int32_t *idx_p,
                                               const void *src, int n, int d, size_t src_ld)
{
    void *stage;
    duet_status_t st;

    if (n <= 0)
        return DUET_OK;
    if ((st = duet__cuda_rows_reserve(r, n)) != DUET_OK ||
        (st = duet__cuda_pinned(r, (size_t)n * 8, &stage)) != DUET_OK ||
        (st = duet__cuda_argmax_rows(r->stream, r->am_val, r->am_idx, src, n, d, src_ld)) !=
            DUET_OK)
        return st;
    DUET__CUDA_TRY(cudaMemcpyAsync(stage, r->am_val, (size_t)n * sizeof(float),
                                   cudaMemcpyDeviceToHost, r->stream));
    DUET__CUDA_TRY(cudaMemcpyAsync((char *)stage + (size_t)n * sizeof(float), r->am_idx,
                                   (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, r->stream));
    if ((st = duet__cuda_wait(r, "argmax")) != DUET_OK)
        return st;
    memcpy(max_p, stage, (size_t)n * sizeof(float));
    memcpy(idx_p, (char *)stage + (size_t)n * sizeof(float), (size_t)n * sizeof(int32_t));
    return DUET_OK;
}

static duet_status_t duet__cuda_op_sample_rows(duet_backend_rank_t *r, int32_t *ids_p,
                                               const void *src, int n, int vocab, int chunk,
                                               const duet_sample_row_t *rows)
{
    size_t rb = (size_t)n * sizeof(duet_sample_row_t);
    void *stage;
    duet_status_t st;

    if (r->host_sampling)
        return DUET_ERR_UNSUPPORTED;
    if (n <= 0)
        return DUET_OK;
    if ((st = duet__cuda_rows_reserve(r, n)) != DUET_OK ||
        (st = duet__cuda_pinned(r, rb + (size_t)n * sizeof(int32_t), &stage)) != DUET_OK)
        return st;
    memcpy(stage, rows, rb);
    DUET__CUDA_TRY(cudaMemcpyAsync(r->am_rows, stage, rb, cudaMemcpyHostToDevice, r->stream));
    if ((st = duet__cuda_sample_rows(r->stream, r->am_idx, src, n, vocab, chunk, r->am_rows)) !=
        DUET_OK)
        return st;
    DUET__CUDA_TRY(cudaMemcpyAsync((char *)stage + rb, r->am_idx, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, r->stream));
    if ((st = duet__cuda_wait(r, "sample")) != DUET_OK)
        return st;
    memcpy(ids_p, (char *)stage + rb, (size_t)n * sizeof(int32_t));
    return DUET_OK;
}

const duet_backend_ops_t duet_backend_cuda = {
    .name = "cuda",
    .act_dtype = DUET_DTYPE_BF16,
    .kv_dtype = DUET_DTYPE_BF16,
    .rank_create = duet__cuda_op_rank_create,
    .thread_bind = duet__cuda_op_thread_bind,
    .device_id = duet__cuda_op_device_id,
    .rank_destroy = duet__cuda_op_rank_destroy,
    .alloc = duet__cuda_op_alloc,
    .free = duet__cuda_op_free,
    .upload = duet__cuda_op_upload,
    .download = duet__cuda_op_download,
    .sync = duet__cuda_op_sync,
    .kv_attach = duet__cuda_op_kv_attach,
    .weight_create = duet__cuda_op_weight_create,
    .weight_destroy = duet__cuda_op_weight_destroy,
    .vector_create = duet__cuda_op_vector_create,
    .embedding_create = duet__cuda_op_embedding_create,
    .batch_prepare = duet__cuda_op_batch_prepare,
    .embed = duet__cuda_op_embed,
    .rmsnorm = duet__cuda_op_rmsnorm,
    .matmul = duet__cuda_op_matmul,
    .rope_kv_store = duet__cuda_op_rope_kv_store,
    .head_rmsnorm = duet__cuda_op_head_rmsnorm,
    .attention = duet__cuda_op_attention,
    .silu_mul = duet__cuda_op_silu_mul,
    .add = duet__cuda_op_add,
    .add_rmsnorm = duet__cuda_op_add_rmsnorm,
    .add_bias = duet__cuda_op_add_bias,
    .gather_rows = duet__cuda_op_gather_rows,
    .rows_to_host_f32 = duet__cuda_op_rows_to_host_f32,
    .step_begin = duet__cuda_op_step_begin,
    .step_end = duet__cuda_op_step_end,
    .argmax_rows = duet__cuda_op_argmax_rows,
    .sample_rows = duet__cuda_op_sample_rows,
    .host_register = duet__cuda_host_register,
    .host_unregister = duet__cuda_host_unregister,
    .kv_export_layer = duet__cuda_kv_export_layer,
    .kv_export_sync = duet__cuda_kv_export_sync,
    .kv_import = duet__cuda_kv_import,
    .kv_copy = duet__cuda_kv_copy_op,
    .kv_copy_queue = duet__cuda_kv_copy_queue,
    .kv_crc = duet__cuda_kv_crc_op,
};
