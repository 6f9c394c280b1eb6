/* What each rank thread computes: its shard of the weights, and the forward
 * step over a prepared chunk (DESIGN §2).
 *
 * Reductions (DESIGN §3 rule 2): the outputs of o_proj and down_proj are
 * partial sums on every rank (row-parallel: each rank holds a slice of the
 * input features) and each is all-reduced exactly once, right after the
 * matmul.  Everything else is complete on every rank: the residual stream
 * x, the norms, and the column-parallel q/k/v and gate/up outputs, which
 * are local slices by construction (so their biases, sliced like their
 * rows, go into the matmul).  o_proj's bias (Llama with attention_bias) is
 * whole on every rank and added once to the reduced, complete output --
 * never to a rank's partial sum, which would add it TP times.  lm_head is
 * vocab-parallel: each rank computes its vocab rows and an all-gather
 * assembles the row.
 *
 * Sampling (DESIGN §3 rule 1): rank 0 alone looks at the gathered logits
 * and writes the sampled ids into the caller's array.  The caller (the
 * scheduler) builds the next batch from those ids and hands the same batch
 * to every rank, so no other rank needs them: a step broadcasts nothing,
 * and a decode step issues 2 all-reduces per layer plus one all-gather per
 * DUET_LM_BLOCK output rows, nothing else. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "engine/engine_internal.h"

#define DUET__ACT(rk) (duet_dtype_size((rk)->e->ops->act_dtype))

static duet_weight_src_t duet__src(const duet_st_tensor_t *t, const duet_st_tensor_t *scale,
                                   int row0, int rows, int col0, int cols)
{
    duet_weight_src_t s = {t->data, t->dtype, (int)t->shape[1], row0, rows, col0,
                           cols,    NULL,     DUET_DTYPE_F32,   false};
    if (scale != NULL) { /* F8_E4M3 weight: [] / [1] per tensor, [rows][1] per channel */
        s.scale = scale->data;
        s.scale_dtype = scale->dtype;
        s.scale_per_row = scale->ndim == 2;
    }
    return s;
}

static duet_weight_src_t duet__rows(const duet_st_tensor_t *t, const duet_st_tensor_t *scale,
                                    int row0, int rows)
{
    return duet__src(t, scale, row0, rows, 0, (int)t->shape[1]);
}

static duet_weight_src_t duet__cols(const duet_st_tensor_t *t, const duet_st_tensor_t *scale,
                                    int col0, int cols)
{
    return duet__src(t, scale, 0, (int)t->shape[0], col0, cols);
}

/* Stacked q/k/v bias slices as one act-dtype vector. */
static duet_status_t duet__qkv_bias(duet__rank_t *rk, const duet_layer_weights_t *lw, void **bias_p)
{
    const duet_shard_t *s = &rk->shard;
    int hd = rk->e->model->cfg.head_dim;
    int nq = s->n_q_heads * hd, nkv = s->n_kv_heads * hd;
    float *tmp = duet_malloc((size_t)(nq + 2 * nkv) * sizeof(float));
    duet_status_t st;

    if (tmp == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "rank %d: no memory for biases", rk->rank);
    duet_dtype_to_f32(lw->bq->dtype,
                      (const char *)lw->bq->data +
                          (size_t)s->q_head0 * (size_t)hd * duet_dtype_size(lw->bq->dtype),
                      tmp, (size_t)nq);
    duet_dtype_to_f32(lw->bk->dtype,
                      (const char *)lw->bk->data +
                          (size_t)s->kv_head0 * (size_t)hd * duet_dtype_size(lw->bk->dtype),
                      tmp + nq, (size_t)nkv);
    duet_dtype_to_f32(lw->bv->dtype,
                      (const char *)lw->bv->data +
                          (size_t)s->kv_head0 * (size_t)hd * duet_dtype_size(lw->bv->dtype),
                      tmp + nq + nkv, (size_t)nkv);
    st = rk->e->ops->vector_create(rk->br, tmp, DUET_DTYPE_F32, 0, nq + 2 * nkv, bias_p);
    duet_free(tmp);
    return st;
}

static duet_status_t duet__load_layer(duet__rank_t *rk, int l)
{
    const duet_backend_ops_t *ops = rk->e->ops;
    const duet_model_config_t *cfg = &rk->e->model->cfg;
    const duet_layer_weights_t *lw = &rk->e->model->layers[l];
    const duet_shard_t *s = &rk->shard;
    duet__layer_t *L = &rk->layers[l];
    int hd = cfg->head_dim;
    duet_status_t st;

    duet_weight_src_t qkv[3] = {
        duet__rows(lw->wq, lw->wq_scale, s->q_head0 * hd, s->n_q_heads * hd),
        duet__rows(lw->wk, lw->wk_scale, s->kv_head0 * hd, s->n_kv_heads * hd),
        duet__rows(lw->wv, lw->wv_scale, s->kv_head0 * hd, s->n_kv_heads * hd),
    };
    duet_weight_src_t gu[2] = {
        duet__rows(lw->w_gate, lw->w_gate_scale, s->ffn0, s->n_ffn),
        duet__rows(lw->w_up, lw->w_up_scale, s->ffn0, s->n_ffn),
    };
    duet_weight_src_t wo = duet__cols(lw->wo, lw->wo_scale, s->q_head0 * hd, s->n_q_heads * hd);
    duet_weight_src_t down = duet__cols(lw->w_down, lw->w_down_scale, s->ffn0, s->n_ffn);

    if ((st = ops->vector_create(rk->br, lw->attn_norm->data, lw->attn_norm->dtype, 0, cfg->hidden,
                                 &L->attn_norm)) != DUET_OK ||
        (st = ops->vector_create(rk->br, lw->mlp_norm->data, lw->mlp_norm->dtype, 0, cfg->hidden,
                                 &L->mlp_norm)) != DUET_OK ||
        (st = ops->weight_create(rk->br, qkv, 3, &L->wqkv)) != DUET_OK ||
        (st = ops->weight_create(rk->br, &wo, 1, &L->wo)) != DUET_OK ||
        (st = ops->weight_create(rk->br, gu, 2, &L->wgu)) != DUET_OK ||
        (st = ops->weight_create(rk->br, &down, 1, &L->wdown)) != DUET_OK)
        return duet_error_wrap(st, "rank %d layer %d: ", rk->rank, l);
    if (lw->bq != NULL && (st = duet__qkv_bias(rk, lw, &L->qkv_bias)) != DUET_OK)
        return st;
    if (lw->q_norm != NULL && ((st = ops->vector_create(rk->br, lw->q_norm->data, lw->q_norm->dtype,
                                                        0, hd, &L->q_norm)) != DUET_OK ||
                               (st = ops->vector_create(rk->br, lw->k_norm->data, lw->k_norm->dtype,
                                                        0, hd, &L->k_norm)) != DUET_OK))
        return duet_error_wrap(st, "rank %d layer %d: ", rk->rank, l);
    /* the whole o_proj bias on every rank: it is added to the reduced sum */
    if (lw->bo != NULL && (st = ops->vector_create(rk->br, lw->bo->data, lw->bo->dtype, 0,
                                                   cfg->hidden, &L->o_bias)) != DUET_OK)
        return duet_error_wrap(st, "rank %d layer %d: ", rk->rank, l);
    return DUET_OK;
}

static void *duet__act_alloc(duet__rank_t *rk, size_t elems, duet_status_t *st)
{
    void *p;
    if (*st != DUET_OK)
        return NULL;
    p = rk->e->ops->alloc(rk->br, elems * DUET__ACT(rk));
    if (p == NULL)
        *st = duet_error(DUET_ERR_NO_MEMORY, "rank %d: no memory for activations", rk->rank);
    return p;
}

duet_status_t duet__rank_init(duet__rank_t *rk)
{
    duet_engine_t *e = rk->e;
    const duet_backend_ops_t *ops = e->ops;
    const duet_model_t *m = e->model;
    const duet_model_config_t *cfg = &m->cfg;
    const duet_shard_t *s = &rk->shard;
    size_t T = (size_t)e->opts.max_batch_tokens;
    size_t kv_bytes = (size_t)duet_engine_kv_pool_bytes(e);
    int hd = cfg->head_dim;
    duet_status_t st;

    duet_backend_rank_opts_t bo = {
        .rank = rk->rank,
        .tp = e->tp,
        .threads = e->threads,
        .spin = e->spin,
        .device = e->opts.devices ? e->opts.devices[rk->rank] : rk->rank,
        .kv_layout = e->kv_layout,
    };
    st = ops->rank_create(&bo, &rk->br);
    if (st != DUET_OK)
        return st;
#ifdef DUET_HAVE_CUDA
    /* nccl: each rank joins on its own thread, once its device is current */
    if (e->nccl_group != NULL &&
        (st = duet_comm_nccl_create(e->nccl_group, rk->rank, rk->br, &rk->comm)) != DUET_OK)
        return st;
#endif
    if (e->opts.kv_alloc != NULL && ops->kv_import == NULL) {
        st = e->opts.kv_alloc(e->opts.kv_ud, rk->rank, kv_bytes, &rk->kv_base);
    } else {
        rk->kv_base = ops->alloc(rk->br, kv_bytes);
        st = rk->kv_base ? DUET_OK : DUET_ERR_NO_MEMORY;
        if (st == DUET_OK && e->opts.kv_register != NULL && ops->kv_import != NULL) {
            /* device pool registered as it is: no mirror */
            st = e->opts.kv_register(e->opts.kv_ud, rk->rank, rk->kv_base, kv_bytes);
            rk->kv_registered = st == DUET_OK;
        } else if (st == DUET_OK && e->opts.kv_alloc != NULL) {
            /* device pool: the provider's memory becomes its host mirror */
            st = e->opts.kv_alloc(e->opts.kv_ud, rk->rank, kv_bytes, &rk->kv_mirror);
            if (st == DUET_OK) {
                rk->kv_mirror_pinned =
                    ops->host_register(rk->br, rk->kv_mirror, kv_bytes) == DUET_OK;
                if (!rk->kv_mirror_pinned)
                    DUET_LOG_WARN("rank %d: kv mirror not pinned: %s", rk->rank, duet_error_msg());
            }
        }
    }
    if (st != DUET_OK)
        return duet_error_wrap(st, "rank %d: kv pool of %zu bytes: ", rk->rank, kv_bytes);
    ops->kv_attach(rk->br, rk->kv_base);

    st = ops->embedding_create(rk->br, m->embed->data, m->embed->dtype, cfg->vocab, cfg->hidden,
                               &rk->embed);
    if (st == DUET_OK)
        st = ops->vector_create(rk->br, m->norm->data, m->norm->dtype, 0, cfg->hidden,
                                &rk->final_norm);
    if (st == DUET_OK && s->n_vocab > 0) {
        duet_weight_src_t lm = duet__rows(m->lm_head, NULL, s->vocab0, s->n_vocab);
        st = ops->weight_create(rk->br, &lm, 1, &rk->lm_head);
    }
    if (st != DUET_OK)
        return st;
    rk->layers = DUET_NEW_ARRAY(duet__layer_t, (size_t)cfg->n_layers);
    if (rk->layers == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "rank %d: no memory", rk->rank);
    for (int l = 0; l < cfg->n_layers; l++) {
        if ((st = duet__load_layer(rk, l)) != DUET_OK)
            return st;
    }

    size_t qkv_w = (size_t)(s->n_q_heads + 2 * s->n_kv_heads) * (size_t)hd;
    rk->x = duet__act_alloc(rk, T * (size_t)cfg->hidden, &st);
    rk->h = duet__act_alloc(rk, T * (size_t)cfg->hidden, &st);
    rk->o = duet__act_alloc(rk, T * (size_t)cfg->hidden, &st);
    rk->qkv = duet__act_alloc(rk, T * qkv_w, &st);
    rk->attn = duet__act_alloc(rk, T * (size_t)s->n_q_heads * (size_t)hd, &st);
    rk->gu = duet__act_alloc(rk, T * 2u * (size_t)s->n_ffn, &st);
    rk->act = duet__act_alloc(rk, T * (size_t)s->n_ffn, &st);
    rk->last = duet__act_alloc(rk, DUET_LM_BLOCK * (size_t)cfg->hidden, &st);
    rk->logits = duet__act_alloc(rk, DUET_LM_BLOCK * (size_t)s->vocab_chunk, &st);
    rk->gathered = duet__act_alloc(rk, (size_t)e->tp * DUET_LM_BLOCK * (size_t)s->vocab_chunk, &st);
    if (st != DUET_OK)
        return st;
    if (rk->rank == 0) {
        rk->host_logits = duet_malloc((size_t)DUET_LM_BLOCK * (size_t)cfg->vocab * sizeof(float));
        rk->sample_scratch = duet_malloc(2u * (size_t)cfg->vocab * sizeof(float));
        if (rk->host_logits == NULL || rk->sample_scratch == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "rank 0: no memory for logits");
    }
    return DUET_OK;
}

void duet__rank_cleanup(duet__rank_t *rk)
{
    duet_engine_t *e = rk->e;
    const duet_backend_ops_t *ops = e->ops;

    if (rk->br == NULL)
        goto out_host;
    if (e->nccl_group != NULL && rk->comm != NULL) {
        /* an nccl comm uses the backend rank's stream: it goes first */
        rk->comm->ops->destroy(rk->comm);
        rk->comm = NULL;
    }
    if (rk->layers != NULL) {
        for (int l = 0; l < e->model->cfg.n_layers; l++) {
            duet__layer_t *L = &rk->layers[l];
            ops->free(rk->br, L->attn_norm);
            ops->free(rk->br, L->mlp_norm);
            ops->free(rk->br, L->qkv_bias);
            ops->free(rk->br, L->o_bias);
            ops->free(rk->br, L->q_norm);
            ops->free(rk->br, L->k_norm);
            ops->weight_destroy(rk->br, L->wqkv);
            ops->weight_destroy(rk->br, L->wo);
            ops->weight_destroy(rk->br, L->wgu);
            ops->weight_destroy(rk->br, L->wdown);
        }
    }
    ops->weight_destroy(rk->br, rk->embed);
    ops->weight_destroy(rk->br, rk->lm_head);
    ops->free(rk->br, rk->final_norm);
    void *bufs[] = {rk->x,  rk->h,   rk->o,    rk->qkv,    rk->attn,
                    rk->gu, rk->act, rk->last, rk->logits, rk->gathered};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        ops->free(rk->br, bufs[i]);
    if (rk->kv_registered) {
        e->opts.kv_unregister(e->opts.kv_ud, rk->rank, rk->kv_base);
        ops->free(rk->br, rk->kv_base);
    } else if (rk->kv_mirror != NULL) {
        if (rk->kv_mirror_pinned)
            ops->host_unregister(rk->br, rk->kv_mirror);
        if (e->opts.kv_free != NULL)
            e->opts.kv_free(e->opts.kv_ud, rk->rank, rk->kv_mirror);
        ops->free(rk->br, rk->kv_base);
    } else if (rk->kv_base != NULL) {
        if (e->opts.kv_free != NULL)
            e->opts.kv_free(e->opts.kv_ud, rk->rank, rk->kv_base);
        else
            ops->free(rk->br, rk->kv_base);
    }
    ops->rank_destroy(rk->br);
out_host:
    duet_free(rk->layers);
    duet_free(rk->host_logits);
    duet_free(rk->sample_scratch);
    if (rk->comm != NULL)
        rk->comm->ops->destroy(rk->comm);
}

/* Rows [r0, r0 + nr) only sample greedily and want no logits: rank 0 can
 * take the argmax on the device instead of copying every logit. */
static bool duet__greedy_only(const duet__job_t *job, int r0, int nr)
{
    for (int i = 0; i < nr; i++) {
        const duet__out_row_t *o = &job->out[r0 + i];
        const duet_sampling_t *sp = &job->seqs[o->seq].sampling;
        if (o->logits != NULL || !o->sample || (sp->temperature > 0.0f && sp->top_k != 1))
            return false;
    }
    return true;
}

/* duet_sample's greedy rule over the gathered vocab shards: the larger
 * maximum wins, ties go to the lower id (shards are in vocab order). */
static duet_status_t duet__logits_argmax(duet__rank_t *rk, const duet__job_t *job, int r0, int nr,
                                         const void *all)
{
    duet_engine_t *e = rk->e;
    const duet_model_config_t *cfg = &e->model->cfg;
    size_t es = DUET__ACT(rk);
    float best[DUET_LM_BLOCK], mx[DUET_LM_BLOCK];
    int32_t id[DUET_LM_BLOCK], ix[DUET_LM_BLOCK];
    duet_status_t st;

    for (int i = 0; i < nr; i++) {
        id[i] = -1;
        best[i] = 0.0f;
    }
    for (int q = 0; q < e->tp; q++) {
        duet_shard_t sq;
        duet_shard_init(cfg, e->tp, q, &sq);
        if (sq.n_vocab == 0)
            continue;
        const char *src =
            (const char *)all + (size_t)q * (size_t)nr * (size_t)rk->shard.vocab_chunk * es;
        st = e->ops->argmax_rows(rk->br, mx, ix, src, nr, sq.n_vocab, (size_t)sq.n_vocab);
        if (st != DUET_OK)
            return st;
        for (int i = 0; i < nr; i++) {
            if (id[i] >= 0 && !isfinite(best[i]))
                continue; /* a non-finite shard taints the row */
            if (id[i] < 0 || !isfinite(mx[i]) || mx[i] > best[i]) {
                best[i] = mx[i];
                id[i] = sq.vocab0 + ix[i];
            }
        }
    }
    for (int i = 0; i < nr; i++)
        job->sampled[job->out[r0 + i].seq] = isfinite(best[i]) ? id[i] : DUET_ENGINE_NONFINITE;
    return DUET_OK;
}

/* Rows [r0, r0 + nr) all sample and want no logits: rank 0 can draw on
 * the device (ops->sample_rows) instead of copying every logit. */
static bool duet__sample_only(const duet__job_t *job, int r0, int nr)
{
    for (int i = 0; i < nr; i++) {
        const duet__out_row_t *o = &job->out[r0 + i];
        if (o->logits != NULL || !o->sample)
            return false;
    }
    return true;
}

/* duet_sample over the gathered vocab shards, on the device. */
static duet_status_t duet__logits_sample(duet__rank_t *rk, const duet__job_t *job, int r0, int nr,
                                         const void *all)
{
    duet_sample_row_t rows[DUET_LM_BLOCK];
    int32_t ids[DUET_LM_BLOCK];
    duet_status_t st;

    for (int i = 0; i < nr; i++) {
        const duet_engine_seq_t *sq = &job->seqs[job->out[r0 + i].seq];
        rows[i] = (duet_sample_row_t){
            .temperature = sq->sampling.temperature,
            .top_k = sq->sampling.top_k,
            .top_p = sq->sampling.top_p,
            .u53 = duet_sampling_u53(sq->sampling.seed, sq->sample_index),
        };
    }
    st = rk->e->ops->sample_rows(rk->br, ids, all, nr, rk->e->model->cfg.vocab,
                                 rk->shard.vocab_chunk, rows);
    if (st != DUET_OK)
        return st;
    for (int i = 0; i < nr; i++)
        job->sampled[job->out[r0 + i].seq] =
            ids[i] == DUET_SAMPLE_NONFINITE ? DUET_ENGINE_NONFINITE : ids[i];
    return DUET_OK;
}

static bool duet__all_finite(const float *x, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++)
        acc += x[i] * 0.0f; /* NaN once any x is NaN or inf */
    return acc == 0.0f;
}

/* Logits of rows [r0, r0 + nr) of the job's output rows; rank 0 fills the
 * caller's buffers and samples. */
static duet_status_t duet__logits_block(duet__rank_t *rk, const duet__job_t *job, int r0, int nr)
{
    duet_engine_t *e = rk->e;
    const duet_backend_ops_t *ops = e->ops;
    const duet_model_config_t *cfg = &e->model->cfg;
    const duet_shard_t *s = &rk->shard;
    size_t es = DUET__ACT(rk);
    int32_t rows[DUET_LM_BLOCK];
    void *all;
    duet_status_t st;

    for (int i = 0; i < nr; i++)
        rows[i] = job->out[r0 + i].token;
    if ((st = ops->gather_rows(rk->br, rk->last, rk->x, rows, nr, cfg->hidden)) != DUET_OK ||
        (st = ops->rmsnorm(rk->br, rk->last, rk->last, rk->final_norm, nr, cfg->hidden,
                           (float)cfg->rms_eps)) != DUET_OK)
        return st;
    if (s->n_vocab > 0 &&
        (st = ops->matmul(rk->br, rk->logits, rk->last, nr, rk->lm_head, NULL)) != DUET_OK)
        return st;
    /* every rank sends nr x vocab_chunk elements; rank q's valid part is
     * its first nr x n_vocab(q) elements, row-major */
    if (e->tp == 1) {
        all = rk->logits;
    } else {
        st = duet_comm_all_gather(rk->comm, rk->logits, rk->gathered,
                                  (size_t)nr * (size_t)s->vocab_chunk * es);
        if (st != DUET_OK)
            return st;
        all = rk->gathered;
    }
    if (rk->rank != 0)
        return DUET_OK;
    if (ops->argmax_rows != NULL && duet__greedy_only(job, r0, nr))
        return duet__logits_argmax(rk, job, r0, nr, all);
    if (ops->sample_rows != NULL && duet__sample_only(job, r0, nr)) {
        st = duet__logits_sample(rk, job, r0, nr, all);
        if (st != DUET_ERR_UNSUPPORTED) /* DUET_CUDA_SAMPLING=host */
            return st;
    }
    for (int q = 0; q < e->tp; q++) {
        duet_shard_t sq;
        duet_shard_init(cfg, e->tp, q, &sq);
        if (sq.n_vocab == 0)
            continue;
        const char *src = (const char *)all + (size_t)q * (size_t)nr * (size_t)s->vocab_chunk * es;
        for (int i = 0; i < nr; i++) {
            st = ops->rows_to_host_f32(
                rk->br, rk->host_logits + (size_t)i * (size_t)cfg->vocab + sq.vocab0,
                src + (size_t)i * (size_t)sq.n_vocab * es, 1, sq.n_vocab, (size_t)sq.n_vocab);
            if (st != DUET_OK)
                return st;
        }
    }
    for (int i = 0; i < nr; i++) {
        const duet__out_row_t *o = &job->out[r0 + i];
        const float *lg = rk->host_logits + (size_t)i * (size_t)cfg->vocab;
        if (o->logits != NULL)
            memcpy(o->logits, lg, (size_t)cfg->vocab * sizeof(float));
        if (o->sample) {
            const duet_engine_seq_t *sq = &job->seqs[o->seq];
            job->sampled[o->seq] = duet__all_finite(lg, cfg->vocab)
                                       ? duet_sample(lg, cfg->vocab, &sq->sampling,
                                                     sq->sample_index, rk->sample_scratch)
                                       : DUET_ENGINE_NONFINITE;
        }
    }
    return DUET_OK;
}

/* x += y, then h = rmsnorm(x) * w: one fused op where the backend has it */
static duet_status_t duet__add_norm(duet__rank_t *rk, const void *y, const void *w, int n, int H)
{
    const duet_backend_ops_t *ops = rk->e->ops;
    float eps = (float)rk->e->model->cfg.rms_eps;
    duet_status_t st;
    if (ops->add_rmsnorm != NULL)
        return ops->add_rmsnorm(rk->br, rk->h, rk->x, y, w, n, H, eps);
    if ((st = ops->add(rk->br, rk->x, y, (size_t)n * (size_t)H)) != DUET_OK)
        return st;
    return ops->rmsnorm(rk->br, rk->h, rk->x, w, n, H, eps);
}

/* Embedding and every layer of the prepared chunk (what a backend may
 * record and replay as one step). */
static duet_status_t duet__rank_layers(duet__rank_t *rk, const duet__job_t *job)
{
    duet_engine_t *e = rk->e;
    const duet_backend_ops_t *ops = e->ops;
    const duet_model_config_t *cfg = &e->model->cfg;
    const duet_shard_t *s = &rk->shard;
    const duet_batch_desc_t *b = &job->desc;
    int n = b->n_tokens, H = cfg->hidden, hd = cfg->head_dim;
    int nq = s->n_q_heads, nkv = s->n_kv_heads;
    size_t nH = (size_t)n * (size_t)H;
    duet_status_t st;

    if ((st = ops->embed(rk->br, rk->x, rk->embed, n, H)) != DUET_OK)
        return st;
    /* h = attn_norm(x) of layer 0; every later one comes with the residual
     * add that ends the layer before (add_rmsnorm, where the backend fuses) */
    if ((st = ops->rmsnorm(rk->br, rk->h, rk->x, rk->layers[0].attn_norm, n, H,
                           (float)cfg->rms_eps)) != DUET_OK)
        return st;
    for (int l = 0; l < cfg->n_layers; l++) {
        const duet__layer_t *L = &rk->layers[l];
        const void *next_norm = l + 1 < cfg->n_layers ? rk->layers[l + 1].attn_norm : NULL;
        if ((st = ops->matmul(rk->br, rk->qkv, rk->h, n, L->wqkv, L->qkv_bias)) ||
            (L->q_norm != NULL &&
             (st = ops->head_rmsnorm(rk->br, rk->qkv, n, nq, nkv, hd, L->q_norm, L->k_norm,
                                     (float)cfg->rms_eps))) ||
            (st = ops->rope_kv_store(rk->br, rk->qkv, n, nq, nkv, hd, e->model->rope_inv_freq,
                                     (float)cfg->rope_scaling.attention_factor, l)))
            return st;
        /* layer l's KV is in the pool: a transfer may start reading it */
        if (e->opts.on_layer != NULL)
            e->opts.on_layer(e->opts.layer_ud, rk->rank, l, job->last_chunk);
        if ((st = ops->attention(rk->br, rk->attn, rk->qkv, n, nq, nkv, hd, l)) ||
            (st = ops->matmul(rk->br, rk->o, rk->attn, n, L->wo, NULL)) ||
            (st = duet_comm_all_reduce_sum(rk->comm, rk->o, nH, ops->act_dtype)) ||
            (L->o_bias != NULL && (st = ops->add_bias(rk->br, rk->o, L->o_bias, n, H))) ||
            (st = duet__add_norm(rk, rk->o, L->mlp_norm, n, H)) ||
            (st = ops->matmul(rk->br, rk->gu, rk->h, n, L->wgu, NULL)) ||
            (st = ops->silu_mul(rk->br, rk->act, rk->gu, n, s->n_ffn)) ||
            (st = ops->matmul(rk->br, rk->o, rk->act, n, L->wdown, NULL)) ||
            (st = duet_comm_all_reduce_sum(rk->comm, rk->o, nH, ops->act_dtype)))
            return st;
        if (next_norm != NULL)
            st = duet__add_norm(rk, rk->o, next_norm, n, H);
        else
            st = ops->add(rk->br, rk->x, rk->o, nH); /* the final norm runs on the gathered rows */
        if (st != DUET_OK)
            return st;
    }
    return DUET_OK;
}

duet_status_t duet__rank_forward(duet__rank_t *rk, const duet__job_t *job)
{
    duet_engine_t *e = rk->e;
    const duet_backend_ops_t *ops = e->ops;
    bool replayed = false, redo = false;
    /* a recorded step would skip the per-layer hook: record only without it */
    bool steps = ops->step_begin != NULL && e->opts.on_layer == NULL;
    duet_status_t st;

    if ((st = ops->batch_prepare(rk->br, &job->desc)) != DUET_OK ||
        (steps && (st = ops->step_begin(rk->br, &replayed)) != DUET_OK))
        return st;
    if (!replayed) {
        st = duet__rank_layers(rk, job);
        if (steps && (st = ops->step_end(rk->br, st, &redo)) == DUET_OK && redo)
            st = duet__rank_layers(rk, job);
        if (st != DUET_OK)
            return st;
    }
    for (int r0 = 0; r0 < job->n_out; r0 += DUET_LM_BLOCK) {
        int nr = job->n_out - r0 < DUET_LM_BLOCK ? job->n_out - r0 : DUET_LM_BLOCK;
        if ((st = duet__logits_block(rk, job, r0, nr)) != DUET_OK)
            return st;
    }
    return ops->sync(rk->br);
}

duet_status_t duet__rank_kv_job(duet__rank_t *rk, const duet__job_t *job)
{
    const duet_backend_ops_t *ops = rk->e->ops;
    switch (job->kind) {
    case DUET__JOB_KV_EXPORT_SYNC:
        /* also without a mirror: on the direct path the queued dones post
         * the layers' puts, and the caller ends the sends after this */
        return ops->kv_export_sync != NULL ? ops->kv_export_sync(rk->br) : DUET_OK;
    case DUET__JOB_KV_IMPORT:
        if (rk->kv_mirror == NULL)
            return DUET_OK; /* registered device pool: the KV is in place */
        return ops->kv_import(rk->br, job->kv_pages, job->kv_n_pages, rk->kv_mirror);
    case DUET__JOB_KV_COPY: {
        const duet_kv_copy_t *copies = job->kv_copies;
        int n = job->kv_n_copies;
        if (job->kv_rank_copies != NULL) {
            copies = job->kv_rank_copies[rk->rank];
            n = job->kv_rank_n[rk->rank];
        }
        if (job->kv_queue && ops->kv_copy_queue != NULL)
            return ops->kv_copy_queue(rk->br, job->kv_l0, job->kv_l1, copies, n);
        return ops->kv_copy(rk->br, job->kv_l0, job->kv_l1, copies, n, NULL, NULL);
    }
    case DUET__JOB_FORWARD:
        break;
    }
    return duet_error(DUET_ERR_INTERNAL, "rank %d: kv job of kind %d", rk->rank, (int)job->kind);
}
