/* RoPE + KV store and attention: checks, tables and kernel choice.
 *
 * Attention kernel: the tensor-core tiled kernel (attention_prefill.cu)
 * when some sequence of the batch brings at least DUET__PREFILL_MIN_Q new
 * tokens and head_dim is 64 or 128; otherwise flash-decoding
 * (attention_flash_decode.cu) for head_dim 8..256 in powers of two, and
 * the older per-token kernel (attention_decode.cu) for other head sizes or
 * when DUET_CUDA_DECODE_ATTN=legacy.  Both split a token's context over
 * several blocks when the batch alone would not fill the GPU; the split
 * count depends only on the batch size, never on context lengths, so
 * recorded decode graphs stay valid (flash-decoding uses fewer splits for
 * short contexts, decided on the device).  Split scratch is reserved for
 * every batch size of the shape at once, so it never moves under a
 * recorded graph. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "engine/cuda/cuda_internal.h"

#define DUET__PREFILL_MIN_Q 8

static duet__cuda_kv_t duet__kv(duet_backend_rank_t *r)
{
    return (duet__cuda_kv_t){r->kv_base, r->kv.n_pages, r->kv.page_size, r->kv.n_kv_heads,
                             r->kv.head_dim};
}

static duet_status_t duet__check(duet_backend_rank_t *r, const char *op, int n, int nkv,
                                 int head_dim, int layer)
{
    if (r->kv_base == NULL)
        return duet_error(DUET_ERR_INTERNAL, "cuda %s: no kv pool attached", op);
    if (nkv != r->kv.n_kv_heads || head_dim != r->kv.head_dim)
        return duet_error(DUET_ERR_INTERNAL, "cuda %s: kv heads %d/%d head_dim %d/%d", op, nkv,
                          r->kv.n_kv_heads, head_dim, r->kv.head_dim);
    if (layer < 0 || layer >= r->kv.n_layers)
        return duet_error(DUET_ERR_INTERNAL, "cuda %s: layer %d of %d", op, layer, r->kv.n_layers);
    if (n != r->n_tokens)
        return duet_error(DUET_ERR_INTERNAL, "cuda %s: %d tokens, prepared batch has %d", op, n,
                          r->n_tokens);
    return DUET_OK;
}

/* The model's table on the device: uploaded once (and again only if it
 * changes, never while recording). */
static duet_status_t duet__inv_freq(duet_backend_rank_t *r, int head_dim, const float *inv_freq)
{
    int half = head_dim / 2;
    size_t bytes = (size_t)half * sizeof(float);
    float *h;

    if (r->inv_freq_d != NULL && r->inv_freq_dim == head_dim &&
        memcmp(r->inv_freq_h, inv_freq, bytes) == 0)
        return DUET_OK;
    if (r->capturing)
        return duet_error(DUET_ERR_INTERNAL, "cuda rope: table built while recording");
    h = duet_malloc(bytes);
    if (h == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cuda rope: no memory");
    memcpy(h, inv_freq, bytes);
    cudaFree(r->inv_freq_d); /* synchronous: no queued kernel still reads it */
    r->inv_freq_d = NULL;
    duet_free(r->inv_freq_h);
    r->inv_freq_h = h;
    r->inv_freq_dim = 0;
    cudaError_t e = cudaMalloc((void **)&r->inv_freq_d, bytes);
    if (e == cudaSuccess)
        e = cudaMemcpy(r->inv_freq_d, h, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        return duet__cuda_check(e, "rope table", __FILE__, __LINE__);
    r->inv_freq_dim = head_dim;
    return DUET_OK;
}

duet_status_t duet__cuda_op_rope_kv_store(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                          int head_dim, const float *inv_freq, float attn_factor,
                                          int layer)
{
    duet_status_t st;

    if ((st = duet__check(r, "rope_kv_store", n, nkv, head_dim, layer)) != DUET_OK)
        return st;
    if (head_dim % 2 != 0 || head_dim > 1024)
        return duet_error(DUET_ERR_UNSUPPORTED, "cuda rope: head_dim %d", head_dim);
    if ((st = duet__inv_freq(r, head_dim, inv_freq)) != DUET_OK ||
        (st = duet__cuda_rope_kv_store(r->stream, qkv, r->bd, r->inv_freq_d, attn_factor,
                                       duet__kv(r), layer, n, nq, nkv, head_dim)) != DUET_OK)
        return st;
    if (r->capturing) {
        /* an event node of the graph: recorded again at every replay */
        DUET__CUDA_TRY(
            cudaEventRecordWithFlags(r->ev_kv[layer], r->stream, cudaEventRecordExternal));
    } else {
        DUET__CUDA_TRY(cudaEventRecord(r->ev_kv[layer], r->stream));
    }
    return DUET_OK;
}

/* Fixed cost of a flash-decoding block (start, merge, its split's state),
 * as a fraction of one block that reads a whole context: a split count is
 * worth it when it fills the GPU's resident slots in whole waves
 * (measured on H200 with bench_attention's sweep: docs/performance.md). */
#define DUET__FD_BLOCK_COST 0.1

/* Splits of the flash-decoding kernel for n tokens: the count s whose
 * waves of blocks, ceil(blocks * s / slots) * (1/s + cost) + merge * s
 * (the last block reads every split's state), take least time; or enough
 * blocks for fd_blocks_per_sm per SM when that is set. */
static int duet__fd_splits(duet_backend_rank_t *r, int n, int nq, int nkv)
{
    int hd = r->kv.head_dim, blocks, best = 1;
    double best_t = 1e300;

    blocks = duet__cuda_flash_decode_blocks(n, nq, nkv, hd, !r->decode_cores);
    if (r->fd_blocks_per_sm > 0) {
        int s = (r->fd_blocks_per_sm * r->sm_count + blocks - 1) / blocks;
        return s < 1 ? 1 : s > DUET__CUDA_FD_MAX_SPLITS ? DUET__CUDA_FD_MAX_SPLITS : s;
    }
    if (r->fd_resident == 0 || r->fd_shape[0] != nq || r->fd_shape[1] != nkv ||
        r->fd_shape[2] != hd) {
        r->fd_resident = duet__cuda_flash_decode_resident(nq, nkv, hd, !r->decode_cores);
        r->fd_shape[0] = nq;
        r->fd_shape[1] = nkv;
        r->fd_shape[2] = hd;
    }
    long slots = (long)r->fd_resident * r->sm_count;
    for (int s = 1; s <= DUET__CUDA_FD_MAX_SPLITS; s++) {
        long waves = ((long)blocks * s + slots - 1) / slots;
        double t = (double)waves * (1.0 / s + DUET__FD_BLOCK_COST) + r->fd_merge_cost * s;
        if (t < best_t * (1.0 - 1e-9)) {
            best_t = t;
            best = s;
        }
    }
    return best;
}

static int duet__splits(const duet_backend_rank_t *r, int n, int nkv)
{
    int blocks = n * nkv, s = 1;
    if (blocks < r->sm_count)
        s = (2 * r->sm_count + blocks - 1) / blocks;
    return s > DUET__CUDA_ATTN_MAX_SPLITS ? DUET__CUDA_ATTN_MAX_SPLITS : s;
}

/* Split scratch of the chosen kernel for batch size n: partial states
 * (bytes) and the flash kernel's counters (how many). */
static size_t duet__part_need(duet_backend_rank_t *r, bool flash, int n, int nq, int nkv,
                              int head_dim, size_t *counts_p)
{
    *counts_p = 0;
    if (!flash)
        return duet__cuda_attention_decode_scratch(n, nq, head_dim, duet__splits(r, n, nkv));
    int splits = duet__fd_splits(r, n, nq, nkv);
    if (splits > 1)
        *counts_p = (size_t)duet__cuda_flash_decode_blocks(n, nq, nkv, head_dim, !r->decode_cores);
    return duet__cuda_flash_decode_scratch(n, nq, head_dim, splits);
}

/* Scratch for every split batch size up to n (and every size a graph is
 * recorded for), reserved when a batch first needs more, so that it never
 * moves under a recorded graph (a size is recorded only after it ran
 * without one).  The counters have their own allocation, zeroed in the
 * rank's stream (ahead of any kernel that uses them): partial states of
 * one batch size must never land on the counters of another. */
static duet_status_t duet__part_reserve(duet_backend_rank_t *r, bool flash, int n, int nq, int nkv,
                                        int head_dim)
{
    size_t need = 0, counts = 0;
    if (n <= r->part_covered && flash == r->part_flash)
        return DUET_OK;
    int top = n > DUET__CUDA_GRAPH_MAX_N ? n : DUET__CUDA_GRAPH_MAX_N;
    for (int i = 1; i <= top; i++) {
        size_t c, b = duet__part_need(r, flash, i, nq, nkv, head_dim, &c);
        need = b > need ? b : need;
        counts = c > counts ? c : counts;
    }
    if (need > r->part_bytes || counts > r->fd_counts_n) {
        if (r->capturing)
            return duet_error(DUET_ERR_INTERNAL, "cuda attention: scratch grows while recording");
        DUET__CUDA_TRY(cudaStreamSynchronize(r->stream));
        duet__cuda_graphs_reset(r);
    }
    if (need > r->part_bytes) {
        cudaFree(r->part);
        r->part = NULL;
        r->part_bytes = 0;
        DUET__CUDA_TRY(cudaMalloc((void **)&r->part, need));
        r->part_bytes = need;
    }
    if (counts > r->fd_counts_n) {
        cudaFree(r->fd_counts);
        r->fd_counts = NULL;
        r->fd_counts_n = 0;
        DUET__CUDA_TRY(cudaMalloc((void **)&r->fd_counts, counts * sizeof(unsigned)));
        DUET__CUDA_TRY(cudaMemsetAsync(r->fd_counts, 0, counts * sizeof(unsigned), r->stream));
        r->fd_counts_n = counts;
    }
    r->part_covered = top;
    r->part_flash = flash;
    return DUET_OK;
}

duet_status_t duet__cuda_op_attention(duet_backend_rank_t *r, void *out, const void *qkv, int n,
                                      int nq, int nkv, int head_dim, int layer)
{
    duet_status_t st;

    if ((st = duet__check(r, "attention", n, nkv, head_dim, layer)) != DUET_OK)
        return st;
    if (nq % nkv != 0)
        return duet_error(DUET_ERR_INTERNAL, "cuda attention: %d query heads over %d kv heads", nq,
                          nkv);
    if (r->max_q >= DUET__PREFILL_MIN_Q && duet__cuda_attention_prefill_supported(head_dim))
        return duet__cuda_attention_prefill(r->stream, out, qkv, r->bd, duet__kv(r), layer,
                                            r->n_tiles, nq, nkv, head_dim, r->attn_variant);
    bool flash = !r->decode_legacy && duet__cuda_flash_decode_supported(nq, nkv, head_dim);
    int splits = flash ? duet__fd_splits(r, n, nq, nkv) : duet__splits(r, n, nkv);
    if (splits > 1 && (st = duet__part_reserve(r, flash, n, nq, nkv, head_dim)) != DUET_OK)
        return st;
    if (flash)
        return duet__cuda_flash_decode(r->stream, out, qkv, r->bd, duet__kv(r), layer, n, nq, nkv,
                                       head_dim, !r->decode_cores, splits, r->part, r->fd_counts);
    return duet__cuda_attention_decode(r->stream, out, qkv, r->bd, duet__kv(r), layer, n, nq, nkv,
                                       head_dim, splits, r->part);
}

/* Qwen3's q_norm / k_norm (no kv pool involved) */
duet_status_t duet__cuda_op_head_rmsnorm(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                         int head_dim, const void *qw, const void *kw, float eps)
{
    if (n < 0 || nq < 0 || nkv < 0 || head_dim <= 0 || head_dim > 1024)
        return duet_error(DUET_ERR_INTERNAL, "cuda head_rmsnorm: %d tokens, %d+%d heads of %d", n,
                          nq, nkv, head_dim);
    return duet__cuda_head_rmsnorm(r->stream, qkv, qw, kw, n, nq, nkv, head_dim, eps);
}
