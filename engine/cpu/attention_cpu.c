/* RoPE + KV store and causal paged attention on the cpu.
 *
 * RoPE (HF rotate-half): for i < d/2, with a = pos * theta^(-2i/d),
 *   x'[i]       = x[i] cos a - x[i + d/2] sin a
 *   x'[i + d/2] = x[i + d/2] cos a + x[i] sin a
 * Attention: out = softmax(q . K^T / sqrt(d)) . V over positions 0..pos of
 * the token's sequence, reading K/V through the sequence's page table. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "engine/cpu/backend_cpu.h"

static duet_status_t duet__ensure_inv_freq(duet_backend_rank_t *r, int head_dim, float theta)
{
    if (r->inv_freq != NULL && r->inv_freq_dim == head_dim && r->inv_freq_theta == theta)
        return DUET_OK;
    float *f = duet_malloc((size_t)(head_dim / 2) * sizeof(float));
    if (f == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory for rope");
    for (int i = 0; i < head_dim / 2; i++)
        f[i] = (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)head_dim));
    duet_free(r->inv_freq);
    r->inv_freq = f;
    r->inv_freq_dim = head_dim;
    r->inv_freq_theta = theta;
    return DUET_OK;
}

typedef struct {
    duet_backend_rank_t *r;
    float *qkv;
    const float *cqkv;
    float *out;
    int n, nq, nkv, hd, layer;
} duet__attn_job_t;

static void duet__rope_kv_job(void *arg, int ti, int nt)
{
    duet__attn_job_t *j = arg;
    duet_backend_rank_t *r = j->r;
    const duet_kv_layout_t *kv = &r->kv;
    int half = j->hd / 2;
    size_t stride = (size_t)(j->nq + 2 * j->nkv) * (size_t)j->hd;
    long b, e;
    float cs[512], sn[512];

    duet_cpu_split(j->n, ti, nt, &b, &e);
    for (long t = b; t < e; t++) {
        float *row = j->qkv + (size_t)t * stride;
        float pos = (float)r->batch->positions[t];
        int32_t slot = r->batch->slots[t];
        int page = slot / kv->page_size, off = slot % kv->page_size;

        for (int i = 0; i < half; i++) {
            float a = pos * r->inv_freq[i];
            cs[i] = cosf(a);
            sn[i] = sinf(a);
        }
        for (int h = 0; h < j->nq + j->nkv; h++) {
            float *x = row + (size_t)h * (size_t)j->hd;
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * cs[i] - x2 * sn[i];
                x[i + half] = x2 * cs[i] + x1 * sn[i];
            }
        }
        for (int h = 0; h < j->nkv; h++) {
            const float *k = row + (size_t)(j->nq + h) * (size_t)j->hd;
            const float *v = row + (size_t)(j->nq + j->nkv + h) * (size_t)j->hd;
            char *base = (char *)r->kv_base;
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
                                      int head_dim, float theta, int layer)
{
    duet_status_t st;
    if (head_dim > 1024 || head_dim % 2 != 0)
        return duet_error(DUET_ERR_UNSUPPORTED, "cpu backend: head_dim %d", head_dim);
    if (nkv != r->kv.n_kv_heads || head_dim != r->kv.head_dim)
        return duet_error(DUET_ERR_INTERNAL, "cpu backend: kv heads %d/%d head_dim %d/%d", nkv,
                          r->kv.n_kv_heads, head_dim, r->kv.head_dim);
    st = duet__ensure_inv_freq(r, head_dim, theta);
    if (st != DUET_OK)
        return st;
    duet__attn_job_t j = {.r = r, .qkv = qkv, .n = n, .nq = nq, .nkv = nkv, .hd = head_dim,
                          .layer = layer};
    if (n == 1)
        duet__rope_kv_job(&j, 0, 1);
    else
        duet_cpu_pool_run(r->pool, duet__rope_kv_job, &j);
    return DUET_OK;
}

static inline float duet__dot(const float *a, const float *b, int d)
{
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        for (int k = 0; k < 16; k++)
            acc[k] += a[i + k] * b[i + k];
    }
    float s = 0;
    for (; i < d; i++)
        s += a[i] * b[i];
    for (int k = 0; k < 16; k++)
        s += acc[k];
    return s;
}

/* One (token, query head) pair per work item. */
static void duet__attention_job(void *arg, int ti, int nt)
{
    duet__attn_job_t *j = arg;
    duet_backend_rank_t *r = j->r;
    const duet_batch_desc_t *bd = r->batch;
    const duet_kv_layout_t *kv = &r->kv;
    const char *base = (const char *)r->kv_base;
    size_t stride = (size_t)(j->nq + 2 * j->nkv) * (size_t)j->hd;
    int group = j->nq / j->nkv;
    float scale = 1.0f / sqrtf((float)j->hd);
    float *scores = r->scores + (size_t)ti * (size_t)r->scores_stride;
    long b, e;

    duet_cpu_split((long)j->n * j->nq, ti, nt, &b, &e);
    for (long item = b; item < e; item++) {
        int t = (int)(item / j->nq), h = (int)(item % j->nq);
        int s = r->seq_of[t];
        int npos = bd->positions[t] + 1;
        int g = h / group;
        const int32_t *pt = bd->page_table + (size_t)s * (size_t)bd->page_stride;
        const float *q = j->cqkv + (size_t)t * stride + (size_t)h * (size_t)j->hd;
        float *o = j->out + ((size_t)t * (size_t)j->nq + (size_t)h) * (size_t)j->hd;
        float mx = -INFINITY, sum = 0;

        for (int p0 = 0, pi = 0; p0 < npos; p0 += kv->page_size, pi++) {
            const float *k = (const float *)(base + duet_kv_offset(kv, j->layer, 0, pt[pi], g));
            int cnt = npos - p0 < kv->page_size ? npos - p0 : kv->page_size;
            for (int i = 0; i < cnt; i++) {
                float sc = duet__dot(q, k + (size_t)i * (size_t)j->hd, j->hd) * scale;
                scores[p0 + i] = sc;
                if (sc > mx)
                    mx = sc;
            }
        }
        for (int p = 0; p < npos; p++) {
            scores[p] = expf(scores[p] - mx);
            sum += scores[p];
        }
        memset(o, 0, (size_t)j->hd * sizeof(float));
        for (int p0 = 0, pi = 0; p0 < npos; p0 += kv->page_size, pi++) {
            const float *v = (const float *)(base + duet_kv_offset(kv, j->layer, 1, pt[pi], g));
            int cnt = npos - p0 < kv->page_size ? npos - p0 : kv->page_size;
            for (int i = 0; i < cnt; i++) {
                float w = scores[p0 + i];
                const float *vr = v + (size_t)i * (size_t)j->hd;
                for (int d = 0; d < j->hd; d++)
                    o[d] += w * vr[d];
            }
        }
        float inv = 1.0f / sum;
        for (int d = 0; d < j->hd; d++)
            o[d] *= inv;
    }
}

duet_status_t duet__cpu_attention(duet_backend_rank_t *r, void *out, const void *qkv, int n,
                                  int nq, int nkv, int head_dim, int layer)
{
    duet__attn_job_t j = {.r = r, .cqkv = qkv, .out = out, .n = n, .nq = nq, .nkv = nkv,
                          .hd = head_dim, .layer = layer};
    duet_cpu_pool_run(r->pool, duet__attention_job, &j);
    return DUET_OK;
}
