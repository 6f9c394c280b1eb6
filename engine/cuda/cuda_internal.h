/* Internal state of the cuda backend, shared by its C files (the kernels
 * see only engine/cuda/cuda_kernels.h). */
#ifndef DUET_ENGINE_CUDA_CUDA_INTERNAL_H
#define DUET_ENGINE_CUDA_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/cuda/cuda_kernels.h"

/* duet_engine (dtype.c) links after this library: these small helpers
 * keep duet_engine_cuda free of references back into it. */
static inline size_t duet__cuda_dtype_size(duet_dtype_t dt)
{
    return dt == DUET_DTYPE_F32 || dt == DUET_DTYPE_I32 ? 4
           : dt == DUET_DTYPE_I64                       ? 8
           : dt == DUET_DTYPE_F8_E4M3                   ? 1
                                                        : 2;
}

/* e4m3 (OCP e4m3fn) -> float, exact */
static inline float duet__cuda_e4m3_to_f32(uint8_t b)
{
    uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float f;
    if (exp == 0xfu && man == 0x7u)
        return __builtin_nanf("");
    if (exp == 0)
        f = (float)man * 0x1p-9f;
    else
        f = (float)(8u + man) * (float)(1u << exp) * 0x1p-10f;
    return (b & 0x80u) ? -f : f;
}

/* IEEE half -> float (exact) */
static inline float duet__cuda_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    float f;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* A CUDA runtime call whose failure becomes a status naming the call, file
 * and line (never exit()). */
#define DUET__CUDA_TRY(call)                                                                       \
    do {                                                                                           \
        cudaError_t duet__e = (call);                                                              \
        if (duet__e != cudaSuccess)                                                                \
            return duet__cuda_check(duet__e, #call, __FILE__, __LINE__);                           \
    } while (0)

/* Decode batches (n tokens = n sequences) up to this size get a recorded
 * graph each. */
#define DUET__CUDA_GRAPH_MAX_N 512
/* cached cuBLASLt plans (shape + alignment + bias) */
#define DUET__CUDA_GEMM_PLANS   96
#define DUET__CUDA_LT_WORKSPACE (32u << 20)

struct duet_weight {
    void *d; /* bf16 [rows][cols], device; e4m3 when fp8 */
    int rows, cols;
    bool fp8;     /* FP8 checkpoint weights kept as e4m3 (gemm_fp8.cu, docs/fp8.md) */
    float *scale; /* fp8: device [rows], each output row's weight scale */
};

/* Plans: bf16, or FP8 with cuBLASLt's outer-vector scales (weight scale per
 * row, activation scale per token) or unscaled (then rescaled by
 * duet__cuda_fp8_rescale). */
#define DUET__GEMM_BF16      0
#define DUET__GEMM_FP8_OUTER 1
#define DUET__GEMM_FP8_PLAIN 2

typedef struct {
    bool used;
    int kind; /* DUET__GEMM_* */
    int m, n, k;
    bool bias;
    unsigned align; /* smallest pointer alignment the plan accepts */
    uint64_t last_use;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} duet__gemm_plan_t;

/* A host wait's hook: the comm backend checks deadlines and peer failures
 * while the rank's thread waits for its stream (see comm_nccl.c). */
typedef duet_status_t (*duet__cuda_watch_fn)(void *ud, int64_t waited_ns, const char *what);

/* kv_copy's descriptor lists on their way to the device (kv_copy_host.c):
 * a pinned ring and a device ring of the same entries, used in order; each
 * launch's entries stay reserved until its event completed. */
#define DUET__CUDA_KVC_SLOTS 64
typedef struct {
    duet_kv_copy_t *host; /* pinned [cap] */
    duet_kv_copy_t *dev;  /* device [cap] */
    size_t cap, head;     /* head: next free entry */
    struct {
        size_t begin, end;
        cudaEvent_t ev; /* recorded after the launch that read [begin, end) */
        uint64_t seq;   /* or, for a signalled launch, its signal (seq != 0) */
        bool live;
    } slot[DUET__CUDA_KVC_SLOTS];
    int next;
} duet__cuda_kvc_ring_t;

/* kv_done.c: dones of the copy stream's work, run by the rank's completion
 * thread in queue order once the event recorded after the work completed.
 * Nodes (each with its event) come from a free list that grows to the
 * most dones in flight. */
typedef struct duet__cuda_done_node {
    struct duet__cuda_done_node *next;
    cudaEvent_t ev; /* recorded after the layer's work (seq == 0) */
    uint64_t seq;   /* or the signal of the launch that was its work */
    void (*done)(void *arg);
    void *arg;
    int layer;
} duet__cuda_done_node_t;

typedef struct {
    bool started, stop; /* started: mu, the conds and thread exist */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;    /* queue non-empty, or stop */
    pthread_cond_t drained; /* finished advanced */
    duet__cuda_done_node_t *head, *tail, *free;
    uint64_t queued, finished; /* dones queued / run (or skipped) so far */
    cudaError_t err;           /* first failed event since the last drain */
    int err_layer;
    /* the copy stream's launch signals (duet__cuda_signal_next): the word
     * the launches write (pinned, mapped), its device address, the
     * launches' counter, the last seq issued (rank thread) */
    unsigned long long *sig_word, *sig_word_dev;
    unsigned *sig_ctr;
    uint64_t sig_seq;
    /* OFF: events (DUET_CUDA_LAYER_DONE=event, or no signal memory) */
    enum { DUET__SIG_UNSET, DUET__SIG_ON, DUET__SIG_OFF } sig_mode;
} duet__cuda_done_queue_t;

/* kv_crc_host.c: the checksum's stream and buffers, made on first use. */
typedef struct {
    bool ready;
    cudaStream_t stream;
    duet_crc32c_par_tables_t *tabs; /* device */
    duet_crc32c_piece_t *host;      /* pinned [cap] */
    duet_crc32c_piece_t *dev;       /* device [cap] */
    size_t cap;
    uint32_t *acc_d, *acc_h; /* device, pinned */
    int blocks;              /* grid: resident blocks on the whole GPU */
} duet__cuda_crc_t;

struct duet_backend_rank {
    int rank, device, sm_count;
    cudaStream_t stream;
    cudaEvent_t ev_wait; /* host waits */
    cudaEvent_t ev_meta; /* the batch upload has read the staging buffer */
    bool meta_pending;
    duet_kv_layout_t kv;
    void *kv_base;
    cudaEvent_t *ev_kv; /* [n_layers] K/V of the layer stored (kv_mirror.c waits) */

    /* cuBLASLt */
    cublasLtHandle_t lt;
    void *lt_ws;
    duet__gemm_plan_t plans[DUET__CUDA_GEMM_PLANS];
    uint64_t gemm_clock;
    int gemv_max_n; /* DUET_CUDA_GEMV (default DUET__CUDA_GEMV_MAX_N, 0 = off) */
    bool gemv_pdl;  /* launch it as a programmatic dependent (DUET_CUDA_GEMV_PDL=0: not) */
    /* FP8 GEMMs: the quantized activations and their per-token scales
     * (grown eagerly to cap_tokens x fp8_max_cols, never while recording);
     * fp8_outer: 0 untried, 1 cuBLASLt takes outer-vector scales, -1 not;
     * fp8_off: DUET_CUDA_FP8=0, FP8 checkpoints dequantized to bf16 at load;
     * fp8_gemv_only: DUET_CUDA_FP8_GEMM=0, every n through the FP8 GEMV in
     * chunks of DUET__CUDA_GEMV_MAX_N tokens (exact weights, bf16
     * activations: slow, for accuracy checks) */
    void *fp8_xq;
    float *fp8_sx;
    size_t fp8_xq_bytes;
    int fp8_sx_n, fp8_max_cols, fp8_outer;
    bool fp8_off, fp8_gemv_only;

    /* host staging */
    void *pin; /* pinned, pin_bytes */
    size_t pin_bytes;

    /* the prepared batch: pinned staging and device copy, same layout */
    int32_t *meta_h;
    void *meta_d;
    size_t meta_bytes;
    int cap_tokens, cap_seqs, cap_tiles, cap_table;
    size_t off_tokens, off_positions, off_slots, off_seq_of, off_q_start, off_ctx_len, off_tiles,
        off_table;               /* int32 offsets */
    duet__cuda_batch_t bd;       /* device pointers into meta_d */
    const duet_batch_desc_t *hb; /* the caller's description (valid during the forward) */
    int n_tokens, n_seqs, max_q, n_tiles;

    /* attention split scratch */
    float *part;
    size_t part_bytes;
    unsigned *fd_counts; /* the flash kernel's split counters */
    size_t fd_counts_n;
    int part_covered; /* batch sizes 1..part_covered have their scratch */
    bool part_flash;  /* ... for the flash kernel (else the legacy one) */
    /* argmax results and sampling rows (device) */
    float *am_val;
    int32_t *am_idx;
    duet_sample_row_t *am_rows;
    int am_cap;
    bool host_sampling; /* DUET_CUDA_SAMPLING=host */

    bool split_add_norm; /* DUET_CUDA_FUSE_ADD_NORM=0 */
    int attn_variant; /* DUET__CUDA_ATTN_FA, _MMA or _WMMA (DUET_CUDA_ATTN) */
    /* decode attention (DUET_CUDA_DECODE_ATTN): flash-decoding on tensor cores where
     * the head_dim has that kernel ("flash", the default), on CUDA cores ("cores"),
     * or the per-token kernel ("legacy"); the flash split count fills whole
     * waves of fd_resident blocks per SM (for the shape fd_shape: nq, nkv,
     * head_dim), or aims at fd_blocks_per_sm per SM when DUET_CUDA_FD_BLOCKS
     * sets it (a benchmark's sweep) */
    bool decode_legacy, decode_cores;
    int fd_blocks_per_sm, fd_resident, fd_shape[3];
    double fd_merge_cost; /* the split rule's cost per split (DUET_CUDA_FD_MERGE_COST) */

    /* RoPE */
    float *inv_freq_d;
    float *inv_freq_h; /* host copy of what inv_freq_d holds */
    int inv_freq_dim;

    int vocab, hidden; /* of the embedding table */

    /* graphs of the decode step, by batch size */
    bool graphs_enabled;
    bool capturing;
    int capture_n;
    cudaGraphExec_t graph[DUET__CUDA_GRAPH_MAX_N + 1];
    uint8_t graph_seen[DUET__CUDA_GRAPH_MAX_N + 1];

    duet__cuda_watch_fn watch;
    void *watch_ud;

    /* KV mirror copies (kv_mirror.c) and kv_copy's packs (kv_copy_host.c):
     * their own stream, so a layer's export overlaps the next layer's
     * compute */
    cudaStream_t copy_stream;
    cudaEvent_t ev_copy; /* the copy stream's work so far (the unpack waits) */
    duet__cuda_kvc_ring_t kvc;
    duet__cuda_done_queue_t dq;  /* the dones of exports and packs (kv_done.c) */
    void *host_pinned_elsewhere; /* host_register found it pinned already (UCX's cuda_copy) */
    duet__cuda_crc_t crc;        /* ops->kv_crc (kv_crc_host.c) */
};

/* kv_mirror.c: the ops that move KV between the pool and its host mirror */
duet_status_t duet__cuda_host_register(duet_backend_rank_t *r, void *host, size_t bytes);
void duet__cuda_host_unregister(duet_backend_rank_t *r, void *host);
duet_status_t duet__cuda_kv_export_layer(duet_backend_rank_t *r, int layer, const int32_t *pages,
                                         int n, void *host, void (*done)(void *arg), void *arg);
duet_status_t duet__cuda_kv_export_sync(duet_backend_rank_t *r);
duet_status_t duet__cuda_kv_import(duet_backend_rank_t *r, const int32_t *pages, int n,
                                   const void *host);
/* The copy stream and ev_copy, created on first use. */
duet_status_t duet__cuda_copy_stream(duet_backend_rank_t *r);

/* kv_done.c: queue done(arg) (for layer) after the work queued on s so far;
 * r's completion thread (started on first use) runs it once that work
 * completed, dones in queue order.  On failure done never runs. */
duet_status_t duet__cuda_launch_done(duet_backend_rank_t *r, cudaStream_t s, int layer,
                                     void (*done)(void *arg), void *arg);
/* A signal for the next launch on r's copy stream (cuda_kernels.h), in
 * *sig; false when signals are off (DUET_CUDA_LAYER_DONE=event) or their
 * memory could not be had: the caller then records an event instead.
 * Rank thread. */
bool duet__cuda_signal_next(duet_backend_rank_t *r, duet__cuda_signal_t *sig);
/* Queue done(arg) (for layer) to run once the launch signalled with seq
 * (duet__cuda_signal_next) wrote it; as duet__cuda_launch_done. */
duet_status_t duet__cuda_queue_done(duet_backend_rank_t *r, uint64_t seq, int layer,
                                    void (*done)(void *arg), void *arg);
/* Wait on the host until the signalled launch seq completed, or r's copy
 * stream failed (its error). */
cudaError_t duet__cuda_signal_wait(duet_backend_rank_t *r, uint64_t seq);
/* Wait until every done queued so far has returned; the error of a failed
 * event since the last drain (whose done did not run). */
duet_status_t duet__cuda_done_drain(duet_backend_rank_t *r);
/* Drain, then join the completion thread and free the pool (teardown). */
void duet__cuda_done_stop(duet_backend_rank_t *r);

/* kv_copy_host.c: ops->kv_copy, and the ring's teardown (streams idle) */
duet_status_t duet__cuda_kv_copy_op(duet_backend_rank_t *r, int l0, int l1,
                                    const duet_kv_copy_t *copies, int n, void (*done)(void *arg),
                                    void *arg);
duet_status_t duet__cuda_kv_copy_queue(duet_backend_rank_t *r, int l0, int l1,
                                       const duet_kv_copy_t *copies, int n);
void duet__cuda_kv_copy_cleanup(duet_backend_rank_t *r);

/* kv_crc_host.c: ops->kv_crc, and its teardown */
duet_status_t duet__cuda_kv_crc_op(duet_backend_rank_t *r, const duet_crc32c_range_t *ranges, int n,
                                   uint32_t *crc_p);
void duet__cuda_kv_crc_cleanup(duet_backend_rank_t *r);

/* Wait on the host for everything issued to r's stream so far; polls the
 * registered watch (deadline, peer failure).  what names the wait. */
duet_status_t duet__cuda_wait(duet_backend_rank_t *r, const char *what);
void duet__cuda_set_watch(duet_backend_rank_t *r, duet__cuda_watch_fn fn, void *ud);
/* Forget every recorded graph (buffers they use moved, or an NCCL
 * communicator they captured is about to go: NCCL's destroy and abort wait
 * until no live graph holds its collectives). */
void duet__cuda_graphs_reset(duet_backend_rank_t *r);
/* Pinned host staging of at least bytes (grows; never while capturing). */
duet_status_t duet__cuda_pinned(duet_backend_rank_t *r, size_t bytes, void **p);

/* cuBLASLt (gemm.c) */
duet_status_t duet__cuda_gemm_init(duet_backend_rank_t *r);
void duet__cuda_gemm_cleanup(duet_backend_rank_t *r);
/* y[n][rows] = x[n][cols] . W^T (+ bias) */
duet_status_t duet__cuda_gemm(duet_backend_rank_t *r, void *y, const void *x, int n,
                              const duet_weight_t *w, const void *bias);

/* op entry points split across files */
duet_status_t duet__cuda_op_step_begin(duet_backend_rank_t *r, bool *replayed_p);
duet_status_t duet__cuda_op_step_end(duet_backend_rank_t *r, duet_status_t st, bool *redo_p);
duet_status_t duet__cuda_op_batch_prepare(duet_backend_rank_t *r, const duet_batch_desc_t *b);
duet_status_t duet__cuda_op_attention(duet_backend_rank_t *r, void *out, const void *qkv, int n,
                                      int nq, int nkv, int head_dim, int layer);
duet_status_t duet__cuda_op_rope_kv_store(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                          int head_dim, const float *inv_freq, float attn_factor,
                                          int layer);
duet_status_t duet__cuda_op_head_rmsnorm(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                         int head_dim, const void *qw, const void *kw, float eps);

#endif
