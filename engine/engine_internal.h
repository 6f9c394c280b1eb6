/* Engine internals shared by engine.c (lifecycle, dispatch, chunking) and
 * forward.c (what each rank thread computes). */
#ifndef DUET_ENGINE_ENGINE_INTERNAL_H
#define DUET_ENGINE_ENGINE_INTERNAL_H

#include <pthread.h>

#include "engine/backend.h"
#include "engine/comm.h"
#include "engine/comm_nccl.h"
#include "engine/engine.h"
#include "engine/tp.h"

/* Rows of the lm_head evaluated at once (bounds the gathered logits). */
#define DUET_LM_BLOCK 64

/* An output row of a chunk: the last token of a sequence (or every token
 * with all_logits) whose logits are needed. */
typedef struct {
    int32_t token; /* flat index in the chunk */
    int seq;       /* index into the caller's seqs */
    float *logits; /* caller's destination [vocab] or NULL */
    bool sample;
} duet__out_row_t;

/* One forward chunk (or KV job), built on the caller's thread, read by
 * every rank. */
typedef struct {
    enum {
        DUET__JOB_FORWARD,
        DUET__JOB_KV_EXPORT_SYNC,
        DUET__JOB_KV_IMPORT,
        DUET__JOB_KV_COPY,
    } kind;
    const int32_t *kv_pages; /* KV_IMPORT */
    int kv_n_pages;
    const duet_kv_copy_t *kv_copies; /* KV_COPY: one list for every rank, */
    int kv_n_copies;
    const duet_kv_copy_t *const *kv_rank_copies; /* or one per rank (non-NULL) */
    const int *kv_rank_n;
    int kv_l0, kv_l1; /* KV_COPY: the layers */
    bool kv_queue;    /* KV_COPY: return once queued (backend kv_copy_queue) */
    duet_batch_desc_t desc;
    const duet_engine_seq_t *seqs; /* caller's array */
    duet__out_row_t *out;
    int n_out;
    int32_t *sampled; /* caller's array, indexed by seq: rank 0 writes it */
    bool last_chunk;  /* the final chunk of the forward call */
} duet__job_t;

typedef struct {
    void *attn_norm;      /* [hidden] */
    void *mlp_norm;       /* [hidden] */
    void *qkv_bias;       /* [(nq + 2 nkv) * head_dim] or NULL */
    duet_weight_t *wqkv;  /* [(nq + 2 nkv) * head_dim][hidden]: q, k, v shards stacked */
    duet_weight_t *wo;    /* [hidden][nq * head_dim]: row-parallel, output partial */
    void *o_bias;         /* [hidden] whole, added after the all-reduce, or NULL */
    void *q_norm;         /* [head_dim] Qwen3's q_norm, or NULL */
    void *k_norm;         /* [head_dim] Qwen3's k_norm, or NULL */
    duet_weight_t *wgu;   /* [2 * n_ffn][hidden]: gate shard then up shard */
    duet_weight_t *wdown; /* [hidden][n_ffn]: row-parallel, output partial */
} duet__layer_t;

typedef struct duet__rank {
    struct duet_engine *e;
    int rank;
    pthread_t thread;
    bool started;
    duet_shard_t shard;
    duet_backend_rank_t *br;
    duet_comm_t *comm;
    void *kv_base;   /* the pool (backend memory) */
    void *kv_mirror; /* its host mirror, when the pool is device memory */
    bool kv_mirror_pinned;
    bool kv_registered; /* device pool handed to opts.kv_register (no mirror) */
    duet_weight_t *embed;
    duet_weight_t *lm_head; /* [n_vocab][hidden] rows of this rank */
    void *final_norm;
    duet__layer_t *layers;
    /* activations, backend memory, sized for max_batch_tokens */
    void *x, *h, *qkv, *attn, *o, *gu, *act;
    void *last;            /* [DUET_LM_BLOCK][hidden] */
    void *logits;          /* [DUET_LM_BLOCK][vocab_chunk] */
    void *gathered;        /* [tp][DUET_LM_BLOCK][vocab_chunk] */
    float *host_logits;    /* rank 0: [DUET_LM_BLOCK][vocab] */
    float *sample_scratch; /* rank 0: [2 * vocab] */
    duet_status_t status;
    char errmsg[512];
} duet__rank_t;

struct duet_engine {
    duet_engine_opts_t opts;
    duet_model_t *model;
    const duet_backend_ops_t *ops;
    duet_kv_layout_t kv_layout;
    duet_comm_host_group_t *comm_group;
    duet_comm_nccl_group_t *nccl_group; /* cuda with tp > 1: comms made by the rank threads */
    duet__rank_t *ranks;
    int tp;
    int threads;
    bool spin; /* ranks x threads fit the cpus */

    pthread_mutex_t lock;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    uint64_t gen; /* bumped per dispatched job */
    int n_done;
    bool stop;
    duet__job_t *job;

    duet_status_t failed; /* sticky failure */
    char failed_msg[512];
};

/* Rank thread bodies (forward.c). */
duet_status_t duet__rank_init(duet__rank_t *rk);
void duet__rank_cleanup(duet__rank_t *rk);
duet_status_t duet__rank_forward(duet__rank_t *rk, const duet__job_t *job);
duet_status_t duet__rank_kv_job(duet__rank_t *rk, const duet__job_t *job);

#endif
