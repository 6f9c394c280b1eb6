/* The compute backend of one engine rank, behind an ops table (CPU today,
 * CUDA on GPU machines).  engine/forward.c is written once against it.
 *
 * Buffers passed to ops are backend memory (host memory for cpu, device
 * memory for cuda) allocated with ops->alloc.  Activations are of
 * ops->act_dtype, the KV pool of ops->kv_dtype.  Every op is issued by the
 * rank's own thread; a backend may run ops asynchronously (a CUDA stream)
 * as long as they complete in issue order and ops->sync() waits for all. */
#ifndef DUET_ENGINE_BACKEND_H
#define DUET_ENGINE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/crc32c.h"
#include "common/status.h"
#include "kv/copy.h"
#include "kv/dtype.h"
#include "kv/layout.h"

typedef struct duet_backend_rank duet_backend_rank_t;
typedef struct duet_weight duet_weight_t;

typedef struct {
    int rank;
    int tp;
    int threads;    /* cpu: workers for this rank (>= 1) */
    bool spin;      /* cpu: workers may spin-wait (not oversubscribed) */
    int device;     /* cuda: device ordinal */
    duet_kv_layout_t kv_layout;
} duet_backend_rank_opts_t;

/* A sub-matrix of a row-major source matrix in host memory (usually the
 * memory-mapped checkpoint): rows [row0, row0+rows) x cols [col0, col0+cols)
 * of a matrix with src_cols columns. */
typedef struct {
    const void *data;
    duet_dtype_t dtype;
    int src_cols;
    int row0, rows;
    int col0, cols;
    /* dtype F8_E4M3 (an FP8 checkpoint, model/quant.h): element (i, j) is
     * e4m3(i, j) * scale[i] (scale_per_row, i the source row) or
     * * scale[0], with scale of scale_dtype (F32, F16 or BF16).  NULL for
     * float dtypes.  cpu dequantizes at load (exactly: e4m3 -> f32, times
     * the scale in f32) into F32; cuda keeps e4m3 and the scales. */
    const void *scale;
    duet_dtype_t scale_dtype;
    bool scale_per_row;
} duet_weight_src_t;

/* Per-forward batch description, host memory, built by the engine.  Token t
 * of the flat batch belongs to sequence seq_of[t]; sequence s owns tokens
 * [q_start[s], q_start[s+1]) at positions [ctx_len[s] - n_new, ctx_len[s]),
 * and its KV lives in pages page_table[s * page_stride + i]. */
typedef struct {
    int n_tokens;
    int n_seqs;
    const int32_t *tokens;     /* [n_tokens] */
    const int32_t *positions;  /* [n_tokens] */
    const int32_t *slots;      /* [n_tokens] page * page_size + offset */
    const int32_t *q_start;    /* [n_seqs + 1] */
    const int32_t *ctx_len;    /* [n_seqs] */
    const int32_t *page_table; /* [n_seqs][page_stride] */
    int page_stride;
    int max_ctx;               /* max over ctx_len */
} duet_batch_desc_t;

/* One row's draw for ops->sample_rows. */
typedef struct {
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* 0: off; 1: greedy */
    float top_p;       /* (0, 1]; 1: off */
    uint32_t reserved;
    uint64_t u53; /* duet_sampling_u53(seed, output index) */
} duet_sample_row_t;

#define DUET_SAMPLE_NONFINITE (-2)

typedef struct duet_backend_ops {
    const char *name;
    duet_dtype_t act_dtype;
    duet_dtype_t kv_dtype;

    duet_status_t (*rank_create)(const duet_backend_rank_opts_t *opts, duet_backend_rank_t **r_p);
    void (*rank_destroy)(duet_backend_rank_t *r);
    /* Optional: make the calling thread use r's device (cuda: its primary
     * context current), for threads other than the rank's own that work on
     * its memory -- UCX's progress thread with CUDA transports. */
    duet_status_t (*thread_bind)(duet_backend_rank_t *r);
    /* Optional: a name of r's device unique on the host and stable across
     * processes (cuda: "GPU-" and its UUID), into buf[cap]; NULL: none. */
    duet_status_t (*device_id)(duet_backend_rank_t *r, char *buf, size_t cap);

    /* Backend memory. alloc returns NULL on failure (with duet_error set). */
    void *(*alloc)(duet_backend_rank_t *r, size_t bytes);
    void (*free)(duet_backend_rank_t *r, void *p);
    duet_status_t (*upload)(duet_backend_rank_t *r, void *dst, const void *src, size_t bytes);
    duet_status_t (*download)(duet_backend_rank_t *r, void *dst, const void *src, size_t bytes);
    duet_status_t (*sync)(duet_backend_rank_t *r);
    /* The rank's KV pool (duet_kv_total_bytes(kv_layout)), backend memory,
     * allocated by the engine (ops->alloc or the transfer layer). */
    void (*kv_attach)(duet_backend_rank_t *r, void *kv_base);

    /* A dense weight W[rows][cols] stacked from n_src sources (all with the
     * same cols; rows add up), for y = x . W^T.  Stacking fuses q/k/v and
     * gate/up into one pass over x. */
    duet_status_t (*weight_create)(duet_backend_rank_t *r, const duet_weight_src_t *src, int n_src,
                                   duet_weight_t **w_p);
    void (*weight_destroy)(duet_backend_rank_t *r, duet_weight_t *w);
    /* A vector (norm weight, bias) converted to act_dtype: backend memory
     * of n elements starting at element offset of src. */
    duet_status_t (*vector_create)(duet_backend_rank_t *r, const void *src, duet_dtype_t dtype,
                                   int offset, int n, void **vec_p);
    /* The embedding table, rows looked up by id. */
    duet_status_t (*embedding_create)(duet_backend_rank_t *r, const void *src, duet_dtype_t dtype,
                                      int vocab, int hidden, duet_weight_t **w_p);

    /* Make the batch description usable by the ops below (cuda: upload). */
    duet_status_t (*batch_prepare)(duet_backend_rank_t *r, const duet_batch_desc_t *b);

    /* out[n][hidden] = table[ids[t]] for the prepared batch's tokens */
    duet_status_t (*embed)(duet_backend_rank_t *r, void *out, const duet_weight_t *table, int n,
                           int hidden);
    /* out[n][d] = in[n][d] / rms(in) * w */
    duet_status_t (*rmsnorm)(duet_backend_rank_t *r, void *out, const void *in, const void *w,
                             int n, int d, float eps);
    /* y[n][rows] = x[n][cols] . W^T (+ bias[rows] when bias != NULL) */
    duet_status_t (*matmul)(duet_backend_rank_t *r, void *y, const void *x, int n,
                            const duet_weight_t *w, const void *bias);
    /* In place on qkv[n][(nq + nk + nv) * head_dim] (q heads, then k heads,
     * then v heads): rotate the nq + nk q/k heads (HF rotate-half) at the
     * prepared batch's positions, with the angles pos * inv_freq[i] (host
     * memory, [head_dim / 2], the model's table: the same pointer and
     * contents for the engine's life) and their cos and sin multiplied by
     * attn_factor (yarn; 1 otherwise), then store the k and v heads into
     * layer's KV pages at the batch's slots. */
    duet_status_t (*rope_kv_store)(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                   int head_dim, const float *inv_freq, float attn_factor,
                                   int layer);
    /* In place on the same qkv rows: every q head (of nq) and k head (of
     * nkv) becomes rmsnorm(head) * qw (q) or * kw (k), over head_dim
     * (Qwen3's q_norm / k_norm, before RoPE); v is untouched. */
    duet_status_t (*head_rmsnorm)(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                  int head_dim, const void *qw, const void *kw, float eps);
    /* out[n][nq * head_dim] = causal attention of the q heads in
     * qkv[n][(nq + 2 nkv) * head_dim] over layer's paged KV of the prepared
     * batch; query head h reads local KV head h / (nq / nkv). */
    duet_status_t (*attention)(duet_backend_rank_t *r, void *out, const void *qkv, int n, int nq,
                               int nkv, int head_dim, int layer);
    /* out[n][m] = silu(gu[n][0:m]) * gu[n][m:2m] */
    duet_status_t (*silu_mul)(duet_backend_rank_t *r, void *out, const void *gu, int n, int m);
    /* x[i] += y[i] for i < count */
    duet_status_t (*add)(duet_backend_rank_t *r, void *x, const void *y, size_t count);
    /* Optional (NULL: add then rmsnorm): x[n][d] += y[n][d], then
     * out[n][d] = rmsnorm(x) * w, with the same results as the two ops. */
    duet_status_t (*add_rmsnorm)(duet_backend_rank_t *r, void *out, void *x, const void *y,
                                 const void *w, int n, int d, float eps);
    /* x[t][d] += bias[d] for t < n (a bias vector of vector_create) */
    duet_status_t (*add_bias)(duet_backend_rank_t *r, void *x, const void *bias, int n, int d);
    /* out[i][d] = in[rows[i]][d] for i < n_rows (rows in host memory) */
    duet_status_t (*gather_rows)(duet_backend_rank_t *r, void *out, const void *in,
                                 const int32_t *rows, int n_rows, int d);
    /* Copy act_dtype rows into host float: dst[n][d] from src with row
     * stride src_ld (elements). */
    duet_status_t (*rows_to_host_f32)(duet_backend_rank_t *r, float *dst, const void *src, int n,
                                      int d, size_t src_ld);

    /* Copies inside the pool (kv/copy.h; offsets validated by the engine):
     * copies[0..n) applied to the K and V planes of layers [l0, l1).  The
     * list is read during the call only.
     *  - done == NULL: ordered after every op issued on the rank so far;
     *    returns once the copies landed (decode's unpack).
     *  - done != NULL: from the on_layer hook of layer l0 (l1 == l0 + 1):
     *    ordered after that layer's KV store (prefill's pack); done(arg)
     *    runs once the copies landed -- cpu: before the call returns; cuda:
     *    on a driver thread, where it must not call the backend or block --
     *    and kv_export_sync waits for it.  Several calls per layer are
     *    fine.  On failure done never runs. */
    duet_status_t (*kv_copy)(duet_backend_rank_t *r, int l0, int l1, const duet_kv_copy_t *copies,
                             int n, void (*done)(void *arg), void *arg);
    /* Optional: kv_copy with done == NULL that returns once queued (the
     * rank's later ops, kv_copy's wait included, are ordered after it).
     * NULL: the engine calls kv_copy, which waits. */
    duet_status_t (*kv_copy_queue)(duet_backend_rank_t *r, int l0, int l1,
                                   const duet_kv_copy_t *copies, int n);
    /* CRC32C (common/crc32c.h) of the pool's bytes ranges[0..n)
     * concatenated in order (offsets from the pool's start, validated by
     * the engine) into *crc_p: a KV transfer's checksum where the pool
     * lives.  From a thread other than the rank's (the transfer layer's
     * progress thread), one call at a time per rank, while nothing writes
     * those bytes: it is not ordered after the rank's queued work (the
     * caller knows the bytes are complete).  cpu: the host CRC; cuda: a
     * parallel kernel on a stream of its own, then a 4-byte copy back. */
    duet_status_t (*kv_crc)(duet_backend_rank_t *r, const duet_crc32c_range_t *ranges, int n,
                            uint32_t *crc_p);

    /* ---- optional hooks (NULL when a backend has none; cuda has all) ---- */
    /* Called after batch_prepare.  *replayed_p = true: the backend replayed
     * a recording of embed and every layer for this batch shape, and the
     * caller goes straight to the logits.  Otherwise the caller runs embed
     * and the layers, then calls step_end with their status; step_end may
     * have recorded them (and then runs them), and sets *redo_p when the
     * recording failed and nothing ran, so the caller runs them again. */
    duet_status_t (*step_begin)(duet_backend_rank_t *r, bool *replayed_p);
    duet_status_t (*step_end)(duet_backend_rank_t *r, duet_status_t st, bool *redo_p);
    /* Greedy sampling on the device: for each of n rows of src (d act_dtype
     * elements, row stride src_ld), the maximum as float and the lowest
     * index holding it, into host max_p[n] / idx_p[n]. */
    duet_status_t (*argmax_rows)(duet_backend_rank_t *r, float *max_p, int32_t *idx_p,
                                 const void *src, int n, int d, size_t src_ld);
    /* Sampling on the device (duet_sample's rule, engine/cuda/sample.cu):
     * ids_p[i] (host) for row i of the gathered logits src -- shard q's
     * n rows at element q * n * chunk, row i of it at + i * n_vocab(q) --
     * drawn as rows[i] says; DUET_SAMPLE_NONFINITE for a row with a
     * non-finite logit.  DUET_ERR_UNSUPPORTED: use the host path. */
    duet_status_t (*sample_rows)(duet_backend_rank_t *r, int32_t *ids_p, const void *src, int n,
                                 int vocab, int chunk, const duet_sample_row_t *rows);

    /* ---- KV in device memory (NULL on a backend whose pool is host
     * memory; cuda has all) ----
     * The transfer layer moves host memory only (UCX here has no CUDA
     * transports), so such a backend keeps a host mirror of its pool with
     * the same layout: prefill copies a layer's pages out as soon as the
     * layer is stored, decode copies a request's pages in once its KV
     * arrived.  Page ids and offsets are the same on both sides. */
    /* Pin host memory for fast asynchronous copies (best effort: copies
     * still work unpinned). */
    duet_status_t (*host_register)(duet_backend_rank_t *r, void *host, size_t bytes);
    void (*host_unregister)(duet_backend_rank_t *r, void *host);
    /* Rank thread, right after layer's KV was stored (the on_layer hook):
     * queue the copy of layer's K and V slices of pages[0..n) to the same
     * offsets of `host`, ordered after the store; done(arg) runs once they
     * landed, on a driver thread: it must not call the backend or block.
     * host NULL (a pool registered for direct device puts): no copies,
     * done(arg) runs once the store completed. */
    duet_status_t (*kv_export_layer)(duet_backend_rank_t *r, int layer, const int32_t *pages,
                                     int n, void *host, void (*done)(void *arg), void *arg);
    /* Wait until every queued export and kv_copy landed and its done()
     * returned (also for a pool without a mirror). */
    duet_status_t (*kv_export_sync)(duet_backend_rank_t *r);
    /* Copy every layer's K and V of pages[0..n) from `host` into the pool;
     * returns when they landed. */
    duet_status_t (*kv_import)(duet_backend_rank_t *r, const int32_t *pages, int n,
                               const void *host);
} duet_backend_ops_t;

extern const duet_backend_ops_t duet_backend_cpu;
#ifdef DUET_HAVE_CUDA
extern const duet_backend_ops_t duet_backend_cuda;
#endif

/* The ops table named "cpu" or "cuda"; NULL (with duet_error set) when the
 * name is unknown or the backend was not built. */
const duet_backend_ops_t *duet_backend_find(const char *name);

#endif
