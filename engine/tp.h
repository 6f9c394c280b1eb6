/* Tensor-parallel sharding (DESIGN §2), as pure functions.
 *
 * q/k/v and gate/up are column-parallel (split by head / by column), o_proj
 * and down_proj are row-parallel and each followed by exactly one
 * all-reduce, lm_head is vocab-parallel followed by an all-gather.
 * Query heads must divide by TP.  KV heads: kv >= TP -> kv % TP == 0 and
 * each rank owns kv/TP consecutive heads; kv < TP -> TP % kv == 0 and head
 * r*kv/TP is replicated on TP/kv consecutive ranks (kv/heads.h, the one
 * ownership rule the slice plan uses too).  The intermediate size
 * and the vocabulary may split unevenly: rank r owns [r*N/TP, (r+1)*N/TP). */
#ifndef DUET_ENGINE_TP_H
#define DUET_ENGINE_TP_H

#include "common/status.h"
#include "kv/heads.h"
#include "model/model_config.h"

typedef struct {
    int tp;
    int rank;
    int q_head0, n_q_heads;   /* global index of the first local query head, count */
    int kv_head0, n_kv_heads; /* global index of the first local KV head, count */
    int ffn0, n_ffn;          /* intermediate columns */
    int vocab0, n_vocab;      /* lm_head rows owned */
    int vocab_chunk;          /* ceil(vocab / tp): all-gather slot size */
} duet_shard_t;

/* Is this (heads, kv_heads, tp) sharding allowed?  DUET_ERR_CONFIG with a
 * message naming the numbers and the rule when not. */
duet_status_t duet_tp_check_heads(int n_heads, int n_kv_heads, int tp);
duet_status_t duet_tp_check(const duet_model_config_t *cfg, int tp);

void duet_shard_init(const duet_model_config_t *cfg, int tp, int rank, duet_shard_t *shard_p);

#endif
