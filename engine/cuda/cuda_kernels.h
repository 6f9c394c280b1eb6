/* Launchers of the cuda backend's kernels (one .cu file per operation).
 *
 * Every launcher enqueues on the given stream and returns the launch's
 * status (DUET_ERR_INTERNAL with file and line for a CUDA error); none
 * waits for the device.  Tensors are bf16 ("act" below) unless a comment
 * says otherwise; arithmetic is float32. */
#ifndef DUET_ENGINE_CUDA_CUDA_KERNELS_H
#define DUET_ENGINE_CUDA_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* inside the linkage block: the engine's headers are C */
#include "common/crc32c.h"
#include "common/status.h"
#include "engine/backend.h"
#include "kv/copy.h"

/* The prepared batch in device memory (engine/backend.h duet_batch_desc_t),
 * at addresses that stay fixed while the buffers keep their capacity, so a
 * recorded graph can be replayed over a newly uploaded batch. */
typedef struct {
    const int32_t *hdr;        /* [0] n_tokens, [1] n_seqs, [2] page_stride */
    const int32_t *tokens;     /* [n_tokens] */
    const int32_t *positions;  /* [n_tokens] */
    const int32_t *slots;      /* [n_tokens] page * page_size + offset */
    const int32_t *seq_of;     /* [n_tokens] sequence of each token */
    const int32_t *q_start;    /* [n_seqs + 1] */
    const int32_t *ctx_len;    /* [n_seqs] */
    const int32_t *tiles;      /* [n_tiles][2] (sequence, first new token) */
    const int32_t *page_table; /* [n_seqs][hdr[2]] */
} duet__cuda_batch_t;

/* The rank's bf16 KV pool (kv/layout.h). */
typedef struct {
    void *base;
    int n_pages, page_size, n_kv_heads, head_dim;
} duet__cuda_kv_t;

/* Query rows per prefill attention tile. */
#define DUET__CUDA_ATTN_TILE 64
/* Largest number of context splits of the decode attention. */
#define DUET__CUDA_ATTN_MAX_SPLITS 16
/* Rows per gather_rows launch (passed by value). */
#define DUET__CUDA_GATHER_MAX 64

/* Most tokens the skinny GEMV (gemv.cu) takes; more go to cuBLASLt. */
#define DUET__CUDA_GEMV_MAX_N 4

/* cudaGetLastError() after a launch as a status naming what and where. */
duet_status_t duet__cuda_check(cudaError_t err, const char *what, const char *file, int line);
#define DUET__CUDA_LAUNCHED(what) duet__cuda_check(cudaGetLastError(), what, __FILE__, __LINE__)

/* Per-kernel attributes (shared memory limits); once per device. */
duet_status_t duet__cuda_kernels_init(void);
duet_status_t duet__cuda_attention_decode_init(void);
duet_status_t duet__cuda_attention_prefill_init(void);

duet_status_t duet__cuda_embed(cudaStream_t s, void *out, const void *table, int vocab,
                               duet__cuda_batch_t b, int n, int hidden);
duet_status_t duet__cuda_rmsnorm(cudaStream_t s, void *out, const void *in, const void *w, int n,
                                 int d, float eps);
/* x[t][i] += res[t][i] (bf16-rounded), then out = rmsnorm(x) * w: the same
 * bits as duet__cuda_add then duet__cuda_rmsnorm */
duet_status_t duet__cuda_add_rmsnorm(cudaStream_t s, void *out, void *x, const void *res,
                                     const void *w, int n, int d, float eps);
/* inv_freq: float32 device [head_dim / 2]; cos and sin times attn_factor */
duet_status_t duet__cuda_rope_kv_store(cudaStream_t s, void *qkv, duet__cuda_batch_t b,
                                       const float *inv_freq, float attn_factor, duet__cuda_kv_t kv,
                                       int layer, int n, int nq, int nkv, int head_dim);
/* In place on qkv[n][(nq + 2 nkv) head_dim]: each q head times qw, each k
 * head times kw, after RMSNorm over head_dim (float32 sum of squares) */
duet_status_t duet__cuda_head_rmsnorm(cudaStream_t s, void *qkv, const void *qw, const void *kw,
                                      int n, int nq, int nkv, int head_dim, float eps);
/* Attention of tokens with any number of queries per sequence, one block
 * per (token, KV head, split).  part: float32 scratch of
 * duet__cuda_attention_decode_scratch() bytes when splits > 1. */
duet_status_t duet__cuda_attention_decode(cudaStream_t s, void *out, const void *qkv,
                                          duet__cuda_batch_t b, duet__cuda_kv_t kv, int layer,
                                          int n, int nq, int nkv, int head_dim, int splits,
                                          float *part);
size_t duet__cuda_attention_decode_scratch(int n, int nq, int head_dim, int splits);
/* Can the decode kernel take this group size and head_dim? */
int duet__cuda_attention_decode_supported(int nq, int nkv, int head_dim);

/* The flash split rule's cost of one more split in the merge, as a fraction
 * of one block that reads a whole context (DUET_CUDA_FD_MERGE_COST; H200,
 * batch 1 x 8K tokens: 33 -> 27 us with 0.005, nothing else moved:
 * tests/gpu/results/2026-11-27-decode-merge-sweep-h200.log). */
#define DUET__FD_MERGE_COST 0.005
/* Largest number of context splits of the flash-decoding kernel. */
#define DUET__CUDA_FD_MAX_SPLITS 64
/* Flash-decoding over paged KV (attention_flash_decode.cu): tokens with one
 * query row per head each, head_dim 8..256 (a power of two times 8), any
 * group size; head_dim 64 and 128 on tensor cores when tensor_cores.  A
 * token uses up to `splits` blocks over its context (fewer for short
 * contexts; chosen on the device).  With splits > 1: part, float32 device
 * scratch of duet__cuda_flash_decode_scratch() bytes, and counts, one
 * unsigned per block of the launch without splits
 * (duet__cuda_flash_decode_blocks), zero before the first launch -- each
 * launch leaves them zero again, so they must not share memory with
 * anything else (a launch of another batch size included). */
int duet__cuda_flash_decode_supported(int nq, int nkv, int head_dim);
int duet__cuda_flash_decode_blocks(int n, int nq, int nkv, int head_dim, bool tensor_cores);
/* Blocks of that kernel resident per SM (occupancy calculator). */
int duet__cuda_flash_decode_resident(int nq, int nkv, int head_dim, bool tensor_cores);
size_t duet__cuda_flash_decode_scratch(int n, int nq, int head_dim, int splits);
duet_status_t duet__cuda_flash_decode(cudaStream_t s, void *out, const void *qkv,
                                      duet__cuda_batch_t b, duet__cuda_kv_t kv, int layer, int n,
                                      int nq, int nkv, int head_dim, bool tensor_cores, int splits,
                                      float *part, unsigned *counts);
/* Tiled tensor-core attention for many queries per sequence: one block per
 * (tile of b.tiles, query head).  head_dim 64 or 128.  variant
 * (DUET_CUDA_ATTN=fa|mma|wmma): the pipelined FlashAttention-2 style
 * kernel (attention_prefill_fa.cu, the default), the earlier
 * register-accumulator mma.sync kernel, or the wmma one (O in shared
 * memory). */
#define DUET__CUDA_ATTN_MMA  0
#define DUET__CUDA_ATTN_WMMA 1
#define DUET__CUDA_ATTN_FA   2
duet_status_t duet__cuda_attention_prefill_fa_init(void);
duet_status_t duet__cuda_attention_prefill_fa(cudaStream_t s, void *out, const void *qkv,
                                              duet__cuda_batch_t b, duet__cuda_kv_t kv, int layer,
                                              int n_tiles, int nq, int nkv, int head_dim);
duet_status_t duet__cuda_attention_prefill(cudaStream_t s, void *out, const void *qkv,
                                           duet__cuda_batch_t b, duet__cuda_kv_t kv, int layer,
                                           int n_tiles, int nq, int nkv, int head_dim, int variant);
int duet__cuda_attention_prefill_supported(int head_dim);
/* y[n][rows] = x[n][cols] . W^T (+ bias) for n <= DUET__CUDA_GEMV_MAX_N;
 * supported(): cols % 8 == 0 and 16-byte aligned x and W. */
int duet__cuda_gemv_supported(const void *y, const void *x, const void *w, int n, int rows,
                              int cols);
/* pdl: launched as a programmatic dependent of the kernel before it */
duet_status_t duet__cuda_gemv(cudaStream_t s, void *y, const void *x, int n, const void *w,
                              int rows, int cols, const void *bias, bool pdl);
/* FP8 weights (gemm_fp8.cu): y[n][rows] = (x[n][cols] . e4m3(W)^T) * scale[row]
 * (+ bias) for n <= DUET__CUDA_GEMV_MAX_N; supported(): cols % 16 == 0 and
 * 16-byte aligned x and W. */
int duet__cuda_gemv_fp8_supported(const void *x, const void *w, int n, int rows, int cols);
duet_status_t duet__cuda_gemv_fp8(cudaStream_t s, void *y, const void *x, int n, const void *w,
                                  const float *scale, int rows, int cols, const void *bias,
                                  bool pdl);
/* Per token row t of x[n][cols] (bf16, cols % 8 == 0): sx[t] = amax / 448
 * and xq[t][c] = e4m3(x[t][c] / sx[t]) (nearest even, saturating). */
duet_status_t duet__cuda_fp8_quant_rows(cudaStream_t s, void *xq, float *sx, const void *x, int n,
                                        int cols);
/* In place on y[n][rows] (bf16): y[t][r] * sw[r] * sx[t] (+ bias[r]). */
duet_status_t duet__cuda_fp8_rescale(cudaStream_t s, void *y, const float *sw, const float *sx,
                                     const void *bias, int n, int rows);
duet_status_t duet__cuda_silu_mul(cudaStream_t s, void *out, const void *gu, int n, int m);
duet_status_t duet__cuda_add(cudaStream_t s, void *x, const void *y, size_t count);
/* x[t][j] += bias[j] for t < n, j < d */
duet_status_t duet__cuda_add_bias(cudaStream_t s, void *x, const void *bias, int n, int d);
/* rows: host array of n_rows row indices (passed in the launch) */
duet_status_t duet__cuda_gather_rows(cudaStream_t s, void *out, const void *in, const int32_t *rows,
                                     int n_rows, int d);
/* Per row of src ([n] rows of d elements, row stride ld): the maximum as
 * float and the lowest index holding it, into device max_out/idx_out. */
duet_status_t duet__cuda_argmax_rows(cudaStream_t s, float *max_out, int32_t *idx_out,
                                     const void *src, int n, int d, size_t ld);
/* ops->sample_rows on the device: out[i] (device) for row i; rows
 * (device) as backend.h describes. */
duet_status_t duet__cuda_sample_rows(cudaStream_t s, int32_t *out, const void *src, int n,
                                     int vocab, int chunk, const duet_sample_row_t *rows);

/* A launch's completion signal (kv_done.c): the launch's last block to
 * finish writes seq into *word (host memory mapped for the device) after
 * a system-scope fence, so a host thread that reads *word >= seq sees
 * every byte the launch wrote, with no CUDA call.  ctr: a device counter,
 * zero before the launch and zero again after it; launches that share it
 * must be ordered (one stream).  Words only grow: seqs of one word are
 * issued in stream order. */
typedef struct duet__cuda_signal {
    unsigned *ctr;
    unsigned long long *word;
    unsigned long long seq;
} duet__cuda_signal_t;

/* Longest piece one block of duet__cuda_kv_copy is given (kv_copy_host.c
 * splits longer copies). */
#define DUET__CUDA_KVC_PIECE (64u << 10)
/* The pieces copies[0..n) split into (kv_copy_host.c), and the split into
 * out[0..pieces): empty copies dropped, longer ones cut at
 * DUET__CUDA_KVC_PIECE, steps kept.  A list must be split before
 * duet__cuda_kv_copy, or one block copies a whole long entry. */
size_t duet__cuda_kv_copy_pieces(const duet_kv_copy_t *copies, int n);
void duet__cuda_kv_copy_split(const duet_kv_copy_t *copies, int n, duet_kv_copy_t *out);
/* Copies inside the KV pool (kv/copy.h): the device list copies[0..n) is
 * applied to each of the n_planes planes (plane_bytes each) starting at
 * plane plane0 of base (plane 2l = layer l's K, 2l + 1 its V).  Offsets
 * are trusted (the engine validated them); ranges of one list must not
 * overlap.  n_planes <= 65535.  For timing: one launch moves
 * n_planes * sum(len) bytes (twice that in memory traffic). */
duet_status_t duet__cuda_kv_copy(cudaStream_t s, void *base, size_t plane_bytes, int plane0,
                                 int n_planes, const duet_kv_copy_t *copies, int n,
                                 const duet__cuda_signal_t *sig);

/* The parallel CRC32C (common/crc32c_math.h) of pieces[0..n) (device
 * memory, duet_crc32c_plan) of the buffer at base (16-byte aligned; a
 * piece's first and last 16-byte vectors are read whole): the xor of the
 * pieces' T values is xor-ed into *acc (device; the caller zeroes it and
 * finishes with duet_crc32c_par_finish).  tabs: the tables, device memory.
 * blocks: the grid (capped at n). */
duet_status_t duet__cuda_kv_crc(cudaStream_t s, const void *base, const duet_crc32c_piece_t *pieces,
                                int n, const duet_crc32c_par_tables_t *tabs, uint32_t *acc,
                                int blocks);
/* Blocks of duet__cuda_kv_crc resident per SM (occupancy). */
int duet__cuda_kv_crc_blocks_per_sm(void);

#ifdef __cplusplus
}
#endif

#endif
