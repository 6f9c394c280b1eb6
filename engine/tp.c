#include "engine/tp.h"

duet_status_t duet_tp_check_heads(int n_heads, int n_kv_heads, int tp)
{
    if (tp < 1 || tp > DUET_TP_MAX)
        return duet_error(DUET_ERR_CONFIG, "tp %d: must be between 1 and %d", tp, DUET_TP_MAX);
    if (n_kv_heads < 1 || n_heads < 1)
        return duet_error(DUET_ERR_CONFIG, "tp %d: model has %d heads and %d kv heads", tp,
                          n_heads, n_kv_heads);
    if (n_heads % tp != 0)
        return duet_error(DUET_ERR_CONFIG,
                          "tp %d: num_attention_heads %d is not divisible by tp", tp, n_heads);
    return duet_kv_heads_check(n_kv_heads, tp);
}

duet_status_t duet_tp_check(const duet_model_config_t *cfg, int tp)
{
    duet_status_t st = duet_tp_check_heads(cfg->n_heads, cfg->n_kv_heads, tp);
    if (st != DUET_OK)
        return st;
    if (cfg->intermediate < tp)
        return duet_error(DUET_ERR_CONFIG, "tp %d: intermediate_size %d is smaller than tp", tp,
                          cfg->intermediate);
    return DUET_OK;
}

void duet_shard_init(const duet_model_config_t *cfg, int tp, int rank, duet_shard_t *shard_p)
{
    duet_shard_t s;
    s.tp = tp;
    s.rank = rank;
    s.n_q_heads = cfg->n_heads / tp;
    s.q_head0 = rank * s.n_q_heads;
    duet_kv_heads_owned(cfg->n_kv_heads, tp, rank, &s.kv_head0, &s.n_kv_heads);
    s.ffn0 = (int)((long)rank * cfg->intermediate / tp);
    s.n_ffn = (int)((long)(rank + 1) * cfg->intermediate / tp) - s.ffn0;
    s.vocab_chunk = (cfg->vocab + tp - 1) / tp;
    s.vocab0 = rank * s.vocab_chunk;
    if (s.vocab0 > cfg->vocab)
        s.vocab0 = cfg->vocab;
    s.n_vocab = cfg->vocab - s.vocab0 < s.vocab_chunk ? cfg->vocab - s.vocab0 : s.vocab_chunk;
    *shard_p = s;
}
