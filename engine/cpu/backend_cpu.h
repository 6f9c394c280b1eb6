/* Internal state of the cpu backend, shared by its source files. */
#ifndef DUET_ENGINE_CPU_BACKEND_CPU_H
#define DUET_ENGINE_CPU_BACKEND_CPU_H

#include "engine/backend.h"
#include "engine/cpu/matmul.h"
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

struct duet_backend_rank {
    int rank;
    duet_cpu_pool_t *pool;
    duet_kv_layout_t kv;
    float *kv_base;
    const duet_batch_desc_t *batch;
    int32_t *seq_of;          /* [seq_of_cap]: sequence of each batch token */
    int seq_of_cap;
    float *scores;            /* [threads][scores_stride] attention scratch */
    int scores_stride;
    float *inv_freq;          /* [head_dim / 2] */
    int inv_freq_dim;
    float inv_freq_theta;
};

duet_status_t duet__cpu_rope_kv_store(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                      int head_dim, float theta, int layer);
duet_status_t duet__cpu_attention(duet_backend_rank_t *r, void *out, const void *qkv, int n,
                                  int nq, int nkv, int head_dim, int layer);

#endif
