/* Internal state of the cpu backend, shared by its source files. */
#ifndef DUET_ENGINE_CPU_BACKEND_CPU_H
#define DUET_ENGINE_CPU_BACKEND_CPU_H

#include <stdbool.h>

#include "engine/backend.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/ops_internal.h"
#include "engine/cpu/pool.h"

typedef enum {
    DUET_CPU_WEIGHT_MATRIX,
    DUET_CPU_WEIGHT_EMBEDDING,
} duet_cpu_weight_kind_t;

struct duet_weight {
    duet_cpu_weight_kind_t kind;
    duet_cpu_weight_t mat;   /* MATRIX */
    const void *table;       /* EMBEDDING: [vocab][hidden] in the checkpoint mapping */
    duet_dtype_t table_dtype;
    int vocab, hidden;
};

/* One attention work item of the prepared batch: tokens [t0, t0 + n_tok)
 * of one sequence against one local KV head. */
typedef struct {
    int seq, t0, n_tok, kv_head;
    long cost; /* query rows (rounded up to 16) x keys: the item's work */
} duet__cpu_attn_item_t;

struct duet_backend_rank {
    int rank;
    duet_cpu_pool_t *pool;
    duet__mm_isa_t isa;          /* kernel family of matmul and ops */
    const duet__cpu_ops_t *ops;
    duet_kv_layout_t kv;
    float *kv_base;
    const duet_batch_desc_t *batch;
    float *inv_freq;          /* [head_dim / 2] */
    int inv_freq_dim;
    float rope_attn; /* cos and sin times this (yarn) */
    /* RoPE angles of the prepared batch's tokens, filled by the first
     * rope_kv_store of the batch and reused by every later layer */
    float *rope_cs, *rope_sn; /* [rope_cap][head_dim / 2] */
    int rope_cap;
    bool rope_ready;
    /* attention work items of the prepared batch, largest first, built by
     * its first attention call (for items_nq / items_nkv) */
    duet__cpu_attn_item_t *items;
    int items_cap, n_items;
    int items_nq, items_nkv;
    bool items_ready;
};

duet_status_t duet__cpu_rope_kv_store(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                      int head_dim, const float *inv_freq, float attn_factor,
                                      int layer);
duet_status_t duet__cpu_attention(duet_backend_rank_t *r, void *out, const void *qkv, int n,
                                  int nq, int nkv, int head_dim, int layer);

/* Make rank r use the kernels of isa (clamped to what the CPU has) instead
 * of the process-wide choice: for tests that compare kernel families. */
void duet__cpu_rank_set_isa(duet_backend_rank_t *r, duet__mm_isa_t isa);

/* Below this many elements an element-wise op runs on the rank thread
 * alone: a pool dispatch would cost more than the work. */
#define DUET__CPU_INLINE_ELEMS 32768

#endif
