/* RoPE + KV store and causal paged attention on the cpu: the drivers (work
 * split, tables); the kernels are in ops_simd.inc.
 *
 * RoPE (HF rotate-half): for i < d/2, with a = pos * inv_freq[i] (the
 * model's table: theta^(-2i/d) with rope_scaling applied) and m the
 * attention factor (yarn; else 1),
 *   x'[i]       = m (x[i] cos a - x[i + d/2] sin a)
 *   x'[i + d/2] = m (x[i + d/2] cos a + x[i] sin a)
 * The angles' cosines and sines are computed once per batch (by the first
 * layer) and reused by every layer.
 * Attention: out = softmax(q . K^T / sqrt(d)) . V over positions 0..pos of
 * the token's sequence, reading K/V through the sequence's page table.  The
 * work items are (a block of a sequence's tokens, one KV head): every query
 * head of the group reads that head's KV once per block of tokens. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "engine/cpu/backend_cpu.h"

/* Query rows (tokens x group) per attention item: 3 vectors of 16 rows
 * (the AVX-512 tile) with head_dim up to 128, so that the item's
 * transposed queries and outputs stay in L1/L2. */
static int duet__attn_rows(int head_dim)
{
    return head_dim <= 128 ? 48 : 16;
}

/* Below this many multiply-adds an attention call runs on the rank thread
 * alone (about a microsecond: less than a dispatch).  Counted with the
 * query rows of each item rounded up to 16, as the kernel computes them. */
#define DUET__ATTN_INLINE_MACS (1L << 16)

/* The model's table, copied once (and again only if it changes). */
static duet_status_t duet__ensure_inv_freq(duet_backend_rank_t *r, int head_dim,
                                           const float *inv_freq, float attn_factor)
{
    size_t bytes = (size_t)(head_dim / 2) * sizeof(float);
    if (r->inv_freq != NULL && r->inv_freq_dim == head_dim && r->rope_attn == attn_factor &&
        memcmp(r->inv_freq, inv_freq, bytes) == 0)
        return DUET_OK;
    float *f = duet_malloc(bytes);
    if (f == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory for rope");
    memcpy(f, inv_freq, bytes);
    duet_free(r->inv_freq);
    r->inv_freq = f;
    r->inv_freq_dim = head_dim;
    r->rope_attn = attn_factor;
    r->rope_ready = false;
    return DUET_OK;
}

typedef struct {
    duet_backend_rank_t *r;
    float *qkv;
    const float *cqkv;
    float *out;
    int n, nq, nkv, hd, layer;
    bool fill; /* rope: compute the batch's angles first */
    atomic_int next; /* attention: the next item to take */
    bool dynamic;
} duet__attn_job_t;

static void duet__rope_kv_job(void *arg, int ti, int nt)
{
    duet__attn_job_t *j = arg;
    duet_backend_rank_t *r = j->r;
    const duet_kv_layout_t *kv = &r->kv;
    int half = j->hd / 2;
    size_t stride = (size_t)(j->nq + 2 * j->nkv) * (size_t)j->hd;
    char *base = (char *)r->kv_base;
    long b, e;

    duet_cpu_split(j->n, ti, nt, &b, &e);
    for (long t = b; t < e; t++) {
        float *row = j->qkv + (size_t)t * stride;
        float *cs = r->rope_cs + (size_t)t * (size_t)half;
        float *sn = r->rope_sn + (size_t)t * (size_t)half;
        int32_t slot = r->batch->slots[t];
        int page = slot / kv->page_size, off = slot % kv->page_size;

        if (j->fill) {
            float pos = (float)r->batch->positions[t], m = r->rope_attn;
            for (int i = 0; i < half; i++) {
                float a = pos * r->inv_freq[i];
                cs[i] = cosf(a) * m; /* m is 1 but for yarn: exact */
                sn[i] = sinf(a) * m;
            }
        }
        r->ops->rope(row, j->nq + j->nkv, j->hd, cs, sn);
        for (int h = 0; h < j->nkv; h++) {
            const float *k = row + (size_t)(j->nq + h) * (size_t)j->hd;
            const float *v = row + (size_t)(j->nq + j->nkv + h) * (size_t)j->hd;
            float *kd = (float *)(base + duet_kv_offset(kv, j->layer, 0, page, h)) +
                        (size_t)off * (size_t)j->hd;
            float *vd = (float *)(base + duet_kv_offset(kv, j->layer, 1, page, h)) +
                        (size_t)off * (size_t)j->hd;
            memcpy(kd, k, (size_t)j->hd * sizeof(float));
            memcpy(vd, v, (size_t)j->hd * sizeof(float));
        }
    }
}

duet_status_t duet__cpu_rope_kv_store(duet_backend_rank_t *r, void *qkv, int n, int nq, int nkv,
                                      int head_dim, const float *inv_freq, float attn_factor,
                                      int layer)
{
    duet_status_t st;
    if (head_dim > 1024 || head_dim % 2 != 0)
        return duet_error(DUET_ERR_UNSUPPORTED, "cpu backend: head_dim %d", head_dim);
    if (nkv != r->kv.n_kv_heads || head_dim != r->kv.head_dim)
        return duet_error(DUET_ERR_INTERNAL, "cpu backend: kv heads %d/%d head_dim %d/%d", nkv,
                          r->kv.n_kv_heads, head_dim, r->kv.head_dim);
    if (n > r->rope_cap)
        return duet_error(DUET_ERR_INTERNAL, "cpu backend: rope of %d tokens, batch of %d", n,
                          r->rope_cap);
    st = duet__ensure_inv_freq(r, head_dim, inv_freq, attn_factor);
    if (st != DUET_OK)
        return st;
    duet__attn_job_t j = {.r = r, .qkv = qkv, .n = n, .nq = nq, .nkv = nkv, .hd = head_dim,
                          .layer = layer, .fill = !r->rope_ready};
    if ((size_t)n * (size_t)(nq + 2 * nkv) * (size_t)head_dim < DUET__CPU_INLINE_ELEMS)
        duet__rope_kv_job(&j, 0, 1);
    else
        duet_cpu_pool_run(r->pool, duet__rope_kv_job, &j);
    r->rope_ready = true;
    return DUET_OK;
}

static int duet__item_cmp(const void *a, const void *b)
{
    const duet__cpu_attn_item_t *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return x->t0 != y->t0 ? (x->t0 > y->t0 ? -1 : 1) : x->kv_head - y->kv_head;
}

/* The batch's work items, most expensive first (so that a worker that
 * takes the next free item ends close to the others). */
static duet_status_t duet__attn_items(duet_backend_rank_t *r, int nq, int nkv, int hd)
{
    const duet_batch_desc_t *b = r->batch;
    int group = nq / nkv, bq = duet__attn_rows(hd) / group, n = 0;

    if (r->items_ready && r->items_nq == nq && r->items_nkv == nkv)
        return DUET_OK;
    if (bq < 1)
        bq = 1;
    for (int s = 0; s < b->n_seqs; s++)
        n += (b->q_start[s + 1] - b->q_start[s] + bq - 1) / bq * nkv;
    if (n > r->items_cap) {
        duet__cpu_attn_item_t *it = duet_realloc(r->items, (size_t)n * sizeof(*it));
        if (it == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory for attention");
        r->items = it;
        r->items_cap = n;
    }
    n = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        /* blocks end at the sequence's last token: a short block, if any,
         * is the cheap first one */
        int q0 = b->q_start[s], q1 = b->q_start[s + 1];
        for (int t1 = q1; t1 > q0; t1 -= bq) {
            int t0 = t1 - bq > q0 ? t1 - bq : q0;
            long keys = (long)b->positions[t1 - 1] + 1;
            for (int h = 0; h < nkv; h++)
                r->items[n++] = (duet__cpu_attn_item_t){
                    s, t0, t1 - t0, h, ((long)(t1 - t0) * group + 15) / 16 * 16 * keys};
        }
    }
    qsort(r->items, (size_t)n, sizeof(r->items[0]), duet__item_cmp);
    r->n_items = n;
    r->items_nq = nq;
    r->items_nkv = nkv;
    r->items_ready = true;
    return DUET_OK;
}

static void duet__attn_run_item(const duet__attn_job_t *j, const duet__cpu_attn_item_t *it,
                                void *scratch)
{
    const duet_backend_rank_t *r = j->r;
    const duet_batch_desc_t *b = r->batch;
    const duet_kv_layout_t *kv = &r->kv;
    const char *base = (const char *)r->kv_base;
    size_t stride = (size_t)(j->nq + 2 * j->nkv) * (size_t)j->hd;
    int group = j->nq / j->nkv;
    size_t head0 = (size_t)it->kv_head * (size_t)group * (size_t)j->hd;
    duet__attn_task_t t = {
        .q = j->cqkv + (size_t)it->t0 * stride + head0,
        .q_ld = stride,
        .out = j->out + (size_t)it->t0 * (size_t)j->nq * (size_t)j->hd + head0,
        .out_ld = (size_t)j->nq * (size_t)j->hd,
        .pos = b->positions + it->t0,
        .n_tok = it->n_tok,
        .group = group,
        .hd = j->hd,
        .k = (const float *)(base + duet_kv_offset(kv, j->layer, 0, 0, it->kv_head)),
        .v = (const float *)(base + duet_kv_offset(kv, j->layer, 1, 0, it->kv_head)),
        .page_floats = duet_kv_page_bytes(kv) / sizeof(float),
        .pages = b->page_table + (size_t)it->seq * (size_t)b->page_stride,
        .page_size = kv->page_size,
    };
    r->ops->attention(&t, scratch);
}

static void duet__attention_job(void *arg, int ti, int nt)
{
    duet__attn_job_t *j = arg;
    void *scratch = duet_cpu_pool_scratch(j->r->pool, ti);
    if (!j->dynamic) {
        for (int i = 0; i < j->r->n_items; i++)
            duet__attn_run_item(j, &j->r->items[i], scratch);
        return;
    }
    for (;;) {
        int i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->r->n_items)
            break;
        duet__attn_run_item(j, &j->r->items[i], scratch);
    }
}

duet_status_t duet__cpu_attention(duet_backend_rank_t *r, void *out, const void *qkv, int n,
                                  int nq, int nkv, int head_dim, int layer)
{
    duet_status_t st;
    long macs = 0;
    int rows;

    if (nkv <= 0 || nq % nkv != 0 || head_dim != r->kv.head_dim)
        return duet_error(DUET_ERR_INTERNAL, "cpu backend: attention heads %d/%d head_dim %d", nq,
                          nkv, head_dim);
    rows = duet__attn_rows(head_dim) > nq / nkv ? duet__attn_rows(head_dim) : nq / nkv;
    if (duet__attn_scratch_bytes(rows, head_dim) > DUET_CPU_POOL_SCRATCH_BYTES)
        return duet_error(DUET_ERR_UNSUPPORTED, "cpu backend: attention group %d head_dim %d",
                          nq / nkv, head_dim);
    if ((st = duet__attn_items(r, nq, nkv, head_dim)) != DUET_OK)
        return st;
    duet__attn_job_t j = {.r = r, .cqkv = qkv, .out = out, .n = n, .nq = nq, .nkv = nkv,
                          .hd = head_dim, .layer = layer, .dynamic = true};
    atomic_init(&j.next, 0);
    for (int i = 0; i < r->n_items; i++)
        macs += r->items[i].cost;
    if (duet_cpu_pool_size(r->pool) == 1 || macs * head_dim < DUET__ATTN_INLINE_MACS) {
        j.dynamic = false;
        duet__attention_job(&j, 0, 1);
    } else {
        duet_cpu_pool_run(r->pool, duet__attention_job, &j);
    }
    return DUET_OK;
}
