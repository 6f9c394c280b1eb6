/* The cpu backend: fp32 activations and KV, weights packed by matmul.c,
 * the other kernels in ops_*.c; every op split across the rank's worker
 * pool, small element-wise ones run on the rank thread alone. */
#include "engine/cpu/backend_cpu.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "engine/weight_src.h"

static duet_status_t duet__cpu_op_rank_create(const duet_backend_rank_opts_t *opts,
                                              duet_backend_rank_t **r_p)
{
    duet_backend_rank_t *r = DUET_NEW(duet_backend_rank_t);
    char name[16];
    duet_status_t st;

    if (r == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory");
    if (opts->kv_layout.elem_size != (int)sizeof(float)) {
        duet_free(r);
        return duet_error(DUET_ERR_INVALID, "cpu backend: kv elem_size %d, expected 4",
                          opts->kv_layout.elem_size);
    }
    snprintf(name, sizeof(name), "r%d", opts->rank);
    st = duet_cpu_pool_create(opts->threads > 0 ? opts->threads : 1, opts->spin, name, &r->pool);
    if (st != DUET_OK) {
        duet_free(r);
        return st;
    }
    r->rank = opts->rank;
    r->kv = opts->kv_layout;
    duet__cpu_rank_set_isa(r, duet__cpu_ops_isa());
    *r_p = r;
    return DUET_OK;
}

static void duet__cpu_op_rank_destroy(duet_backend_rank_t *r)
{
    if (r == NULL)
        return;
    duet_cpu_pool_destroy(r->pool);
    duet_free(r->inv_freq);
    duet_aligned_free(r->rope_cs);
    duet_aligned_free(r->rope_sn);
    duet_free(r->items);
    duet_free(r);
}

void duet__cpu_rank_set_isa(duet_backend_rank_t *r, duet__mm_isa_t isa)
{
    r->ops = duet__cpu_ops(isa);
    r->isa = isa > duet__mm_isa_detect() ? duet__mm_isa_detect() : isa;
}

static void *duet__cpu_op_alloc(duet_backend_rank_t *r, size_t bytes)
{
    void *p = duet_aligned_alloc(64, bytes);
    if (p == NULL)
        duet_error(DUET_ERR_NO_MEMORY, "cpu backend rank %d: no memory for %zu bytes", r->rank,
                   bytes);
    return p;
}

static void duet__cpu_op_free(duet_backend_rank_t *r, void *p)
{
    duet_aligned_free(p);
}

static duet_status_t duet__cpu_op_copy(duet_backend_rank_t *r, void *dst, const void *src,
                                       size_t bytes)
{
    memcpy(dst, src, bytes);
    return DUET_OK;
}

static duet_status_t duet__cpu_op_sync(duet_backend_rank_t *r)
{
    return DUET_OK;
}

static void duet__cpu_op_kv_attach(duet_backend_rank_t *r, void *kv_base)
{
    r->kv_base = kv_base;
}

/* FP8 sources (any of the stack): dequantized at load into F32 -- e4m3 ->
 * f32 is exact and the scale is one f32 multiply, so the packed weight
 * equals that of a checkpoint holding the dequantized values in F32, and
 * the logits match it bit for bit. */
static duet_status_t duet__cpu_weight_dequant(const duet_weight_src_t *src, int n_src,
                                              duet_cpu_weight_t *mat)
{
    int rows = 0, cols = src[0].cols;
    float *tmp;
    size_t off = 0;
    duet_status_t st;

    for (int i = 0; i < n_src; i++) {
        if (src[i].cols != cols)
            return duet_error(DUET_ERR_INVALID, "cpu backend: stacked weights differ");
        if (src[i].dtype == DUET_DTYPE_F8_E4M3 && src[i].scale == NULL)
            return duet_error(DUET_ERR_INVALID, "cpu backend: FP8 weight without a scale");
        rows += src[i].rows;
    }
    if ((tmp = duet_malloc((size_t)rows * (size_t)cols * sizeof(float))) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory to dequantize weights");
    for (int i = 0; i < n_src; i++) {
        duet_weight_src_to_f32(&src[i], tmp + off);
        off += (size_t)src[i].rows * (size_t)cols;
    }
    st = duet_cpu_weight_pack(tmp, DUET_DTYPE_F32, cols, 0, rows, 0, cols, DUET_DTYPE_F32, mat);
    duet_free(tmp);
    return st;
}

/* Stacking several sources: pack each, then concatenate the packed rows.
 * Packed layouts are row-blocked, so stack by packing a temporary source
 * that holds the stacked rows in the source dtype. */
static duet_status_t duet__cpu_op_weight_create(duet_backend_rank_t *r,
                                                const duet_weight_src_t *src, int n_src,
                                                duet_weight_t **w_p)
{
    duet_weight_t *w = DUET_NEW(duet_weight_t);
    duet_status_t st;
    duet_dtype_t store;

    if (w == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory for a weight");
    w->kind = DUET_CPU_WEIGHT_MATRIX;
    store = src[0].dtype;
    for (int i = 0; i < n_src; i++) {
        if (src[i].dtype == DUET_DTYPE_F8_E4M3) {
            st = duet__cpu_weight_dequant(src, n_src, &w->mat);
            goto done;
        }
    }
    if (n_src == 1) {
        st = duet_cpu_weight_pack(src[0].data, src[0].dtype, src[0].src_cols, src[0].row0,
                                  src[0].rows, src[0].col0, src[0].cols, store, &w->mat);
    } else {
        size_t es = duet_dtype_size(src[0].dtype);
        int rows = 0, cols = src[0].cols;
        char *tmp, *p;
        for (int i = 0; i < n_src; i++) {
            if (src[i].cols != cols || src[i].dtype != src[0].dtype) {
                duet_free(w);
                return duet_error(DUET_ERR_INVALID, "cpu backend: stacked weights differ");
            }
            rows += src[i].rows;
        }
        tmp = duet_malloc((size_t)rows * (size_t)cols * es);
        if (tmp == NULL) {
            duet_free(w);
            return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory to stack weights");
        }
        p = tmp;
        for (int i = 0; i < n_src; i++) {
            for (int row = 0; row < src[i].rows; row++) {
                const char *s =
                    (const char *)src[i].data +
                    ((size_t)(src[i].row0 + row) * (size_t)src[i].src_cols + (size_t)src[i].col0) *
                        es;
                memcpy(p, s, (size_t)cols * es);
                p += (size_t)cols * es;
            }
        }
        st = duet_cpu_weight_pack(tmp, src[0].dtype, cols, 0, rows, 0, cols, store, &w->mat);
        duet_free(tmp);
    }
done:
    if (st != DUET_OK) {
        duet_free(w);
        return st;
    }
    *w_p = w;
    return DUET_OK;
}

static void duet__cpu_op_weight_destroy(duet_backend_rank_t *r, duet_weight_t *w)
{
    if (w == NULL)
        return;
    if (w->kind == DUET_CPU_WEIGHT_MATRIX)
        duet_cpu_weight_free(&w->mat);
    duet_free(w);
}

static duet_status_t duet__cpu_op_vector_create(duet_backend_rank_t *r, const void *src,
                                                duet_dtype_t dtype, int offset, int n, void **vec_p)
{
    float *v = duet_aligned_alloc(64, (size_t)n * sizeof(float));
    if (v == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory for a vector");
    duet_dtype_to_f32(dtype, (const char *)src + (size_t)offset * duet_dtype_size(dtype), v,
                      (size_t)n);
    *vec_p = v;
    return DUET_OK;
}

static duet_status_t duet__cpu_op_embedding_create(duet_backend_rank_t *r, const void *src,
                                                   duet_dtype_t dtype, int vocab, int hidden,
                                                   duet_weight_t **w_p)
{
    duet_weight_t *w = DUET_NEW(duet_weight_t);
    if (w == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory");
    w->kind = DUET_CPU_WEIGHT_EMBEDDING;
    w->table = src;
    w->table_dtype = dtype;
    w->vocab = vocab;
    w->hidden = hidden;
    *w_p = w;
    return DUET_OK;
}

static duet_status_t duet__cpu_op_batch_prepare(duet_backend_rank_t *r, const duet_batch_desc_t *b)
{
    if (b->n_tokens > r->rope_cap) {
        size_t bytes = (size_t)b->n_tokens * (size_t)(r->kv.head_dim / 2) * sizeof(float) + 64;
        float *cs = duet_aligned_alloc(64, bytes), *sn = duet_aligned_alloc(64, bytes);
        if (cs == NULL || sn == NULL) {
            duet_aligned_free(cs);
            duet_aligned_free(sn);
            return duet_error(DUET_ERR_NO_MEMORY, "cpu backend: no memory for %d tokens",
                              b->n_tokens);
        }
        duet_aligned_free(r->rope_cs);
        duet_aligned_free(r->rope_sn);
        r->rope_cs = cs;
        r->rope_sn = sn;
        r->rope_cap = b->n_tokens;
    }
    r->rope_ready = false;
    r->items_ready = false;
    r->batch = b;
    return DUET_OK;
}

/* ---- element-wise ops: split across the pool by rows, or run on the rank
 * thread alone when small (decode) ---- */

typedef struct {
    duet_backend_rank_t *r;
    float *out;
    const float *in;
    const float *w;
    const void *table;
    duet_dtype_t dtype;
    int n, d;
    float eps;
} duet__rows_job_t;

/* Run fn over the pool, or inline on the rank thread for small work. */
static void duet__cpu_run(duet_backend_rank_t *r, size_t elems, duet_cpu_pool_fn fn, void *arg)
{
    if (elems < DUET__CPU_INLINE_ELEMS)
        fn(arg, 0, 1);
    else
        duet_cpu_pool_run(r->pool, fn, arg);
}

static void duet__embed_job(void *arg, int ti, int nt)
{
    duet__rows_job_t *j = arg;
    size_t es = duet_dtype_size(j->dtype);
    long b, e;
    duet_cpu_split(j->n, ti, nt, &b, &e);
    for (long t = b; t < e; t++) {
        int32_t id = j->r->batch->tokens[t];
        j->r->ops->to_f32(j->dtype, (const char *)j->table + (size_t)id * (size_t)j->d * es,
                          j->out + (size_t)t * (size_t)j->d, (size_t)j->d);
    }
}

static duet_status_t duet__cpu_op_embed(duet_backend_rank_t *r, void *out,
                                        const duet_weight_t *table, int n, int hidden)
{
    for (int t = 0; t < n; t++) {
        if (r->batch->tokens[t] < 0 || r->batch->tokens[t] >= table->vocab)
            return duet_error(DUET_ERR_INVALID, "token id %d out of range 0..%d",
                              r->batch->tokens[t], table->vocab - 1);
    }
    duet__rows_job_t j = {.r = r,
                          .out = out,
                          .table = table->table,
                          .dtype = table->table_dtype,
                          .n = n,
                          .d = hidden};
    duet__cpu_run(r, (size_t)n * (size_t)hidden, duet__embed_job, &j);
    return DUET_OK;
}

static void duet__rmsnorm_job(void *arg, int ti, int nt)
{
    duet__rows_job_t *j = arg;
    long b, e;
    duet_cpu_split(j->n, ti, nt, &b, &e);
    for (long t = b; t < e; t++)
        j->r->ops->rmsnorm(j->out + (size_t)t * (size_t)j->d, j->in + (size_t)t * (size_t)j->d,
                           j->w, j->d, j->eps);
}

static duet_status_t duet__cpu_op_rmsnorm(duet_backend_rank_t *r, void *out, const void *in,
                                          const void *w, int n, int d, float eps)
{
    duet__rows_job_t j = {.r = r, .out = out, .in = in, .w = w, .n = n, .d = d, .eps = eps};
    duet__cpu_run(r, (size_t)n * (size_t)d, duet__rmsnorm_job, &j);
    return DUET_OK;
}

/* Qwen3's q_norm / k_norm: rows of (nq + 2 nkv) heads, the first nq + nkv
 * normalised in place */
typedef struct {
    duet_backend_rank_t *r;
    float *qkv;
    const float *qw, *kw;
    int n, nq, nkv, hd;
    float eps;
} duet__head_norm_job_t;

static void duet__head_rmsnorm_job(void *arg, int ti, int nt)
{
    duet__head_norm_job_t *j = arg;
    size_t stride = (size_t)(j->nq + 2 * j->nkv) * (size_t)j->hd;
    long b, e;
    duet_cpu_split(j->n, ti, nt, &b, &e);
    for (long t = b; t < e; t++) {
        float *row = j->qkv + (size_t)t * stride;
        for (int h = 0; h < j->nq + j->nkv; h++) {
            float *x = row + (size_t)h * (size_t)j->hd;
            j->r->ops->rmsnorm(x, x, h < j->nq ? j->qw : j->kw, j->hd, j->eps);
        }
    }
}

static duet_status_t duet__cpu_op_head_rmsnorm(duet_backend_rank_t *r, void *qkv, int n, int nq,
                                               int nkv, int head_dim, const void *qw,
                                               const void *kw, float eps)
{
    duet__head_norm_job_t j = {.r = r,
                               .qkv = qkv,
                               .qw = qw,
                               .kw = kw,
                               .n = n,
                               .nq = nq,
                               .nkv = nkv,
                               .hd = head_dim,
                               .eps = eps};
    duet__cpu_run(r, (size_t)n * (size_t)(nq + nkv) * (size_t)head_dim, duet__head_rmsnorm_job, &j);
    return DUET_OK;
}

static duet_status_t duet__cpu_op_matmul(duet_backend_rank_t *r, void *y, const void *x, int n,
                                         const duet_weight_t *w, const void *bias)
{
    duet__cpu_matmul_isa(r->isa, r->pool, y, (size_t)w->mat.rows, x, (size_t)w->mat.cols, n,
                         &w->mat, bias);
    return DUET_OK;
}

static void duet__silu_mul_job(void *arg, int ti, int nt)
{
    duet__rows_job_t *j = arg;
    long b, e;
    duet_cpu_split(j->n, ti, nt, &b, &e);
    for (long t = b; t < e; t++) {
        const float *g = j->in + (size_t)t * 2u * (size_t)j->d;
        j->r->ops->silu_mul(j->out + (size_t)t * (size_t)j->d, g, g + j->d, j->d);
    }
}

static duet_status_t duet__cpu_op_silu_mul(duet_backend_rank_t *r, void *out, const void *gu, int n,
                                           int m)
{
    duet__rows_job_t j = {.r = r, .out = out, .in = gu, .n = n, .d = m};
    duet__cpu_run(r, (size_t)n * (size_t)m, duet__silu_mul_job, &j);
    return DUET_OK;
}

static void duet__add_job(void *arg, int ti, int nt)
{
    duet__rows_job_t *j = arg;
    long b, e;
    /* whole 64-byte lines per worker */
    duet_cpu_split(((long)j->n + 15) / 16, ti, nt, &b, &e);
    b *= 16;
    e = e * 16 < j->n ? e * 16 : j->n;
    if (b < e)
        j->r->ops->add(j->out + b, j->in + b, (size_t)(e - b));
}

static duet_status_t duet__cpu_op_add(duet_backend_rank_t *r, void *x, const void *y, size_t count)
{
    if (count < DUET__CPU_INLINE_ELEMS || count > (size_t)INT32_MAX) {
        r->ops->add(x, y, count);
        return DUET_OK;
    }
    duet__rows_job_t j = {.r = r, .out = x, .in = y, .n = (int)count};
    duet_cpu_pool_run(r->pool, duet__add_job, &j);
    return DUET_OK;
}

static void duet__add_bias_job(void *arg, int ti, int nt)
{
    duet__rows_job_t *j = arg;
    long b, e;
    duet_cpu_split(j->n, ti, nt, &b, &e);
    for (long t = b; t < e; t++)
        j->r->ops->add(j->out + (size_t)t * (size_t)j->d, j->w, (size_t)j->d);
}

static duet_status_t duet__cpu_op_add_bias(duet_backend_rank_t *r, void *x, const void *bias, int n,
                                           int d)
{
    duet__rows_job_t j = {.r = r, .out = x, .w = bias, .n = n, .d = d};
    duet__cpu_run(r, (size_t)n * (size_t)d, duet__add_bias_job, &j);
    return DUET_OK;
}

static duet_status_t duet__cpu_op_argmax_rows(duet_backend_rank_t *r, float *max_p, int32_t *idx_p,
                                              const void *src, int n, int d, size_t src_ld)
{
    for (int i = 0; i < n; i++) {
        const float *x = (const float *)src + (size_t)i * src_ld;
        float acc = 0.0f;
        r->ops->argmax(x, d, &max_p[i], &idx_p[i]);
        for (int j = 0; j < d; j++)
            acc += x[j] * 0.0f; /* NaN once any logit is NaN or inf */
        if (acc != 0.0f)
            max_p[i] = NAN; /* the engine fails the request (DUET_ENGINE_NONFINITE) */
    }
    return DUET_OK;
}

static duet_status_t duet__cpu_op_gather_rows(duet_backend_rank_t *r, void *out, const void *in,
                                              const int32_t *rows, int n_rows, int d)
{
    for (int i = 0; i < n_rows; i++)
        memcpy((float *)out + (size_t)i * (size_t)d,
               (const float *)in + (size_t)rows[i] * (size_t)d, (size_t)d * sizeof(float));
    return DUET_OK;
}

static duet_status_t duet__cpu_op_rows_to_host_f32(duet_backend_rank_t *r, float *dst,
                                                   const void *src, int n, int d, size_t src_ld)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)i * (size_t)d, (const float *)src + (size_t)i * src_ld,
               (size_t)d * sizeof(float));
    return DUET_OK;
}

typedef struct {
    duet_backend_rank_t *r;
    const duet_kv_copy_t *copies;
    int n, plane0;
    long items; /* planes x copies */
} duet__kv_copy_job_t;

static void duet__kv_copy_job(void *arg, int ti, int nt)
{
    duet__kv_copy_job_t *j = arg;
    size_t plane_bytes = duet_kv_plane_bytes(&j->r->kv);
    long b, e;
    duet_cpu_split(j->items, ti, nt, &b, &e);
    for (long k = b; k < e; k++) {
        unsigned char *base = (unsigned char *)j->r->kv_base;
        int p = j->plane0 + (int)(k / j->n);
        const duet_kv_copy_t *c = &j->copies[k % j->n];
        memcpy(base + duet_kv_copy_at(c->dst, c->dst_step, plane_bytes, p),
               base + duet_kv_copy_at(c->src, c->src_step, plane_bytes, p), (size_t)c->len);
    }
}

/* The pool is host memory and every op is synchronous: the copies run now
 * (what duet_kv_copy_apply_host does, split over the workers when large),
 * after the layer's KV store, and done runs before returning. */
static duet_status_t duet__cpu_op_kv_copy(duet_backend_rank_t *r, int l0, int l1,
                                          const duet_kv_copy_t *copies, int n,
                                          void (*done)(void *arg), void *arg)
{
    size_t bytes = 0;
    if (r->kv_base == NULL)
        return duet_error(DUET_ERR_INTERNAL, "cpu kv_copy: no kv pool attached");
    if (l0 < 0 || l1 > r->kv.n_layers || l0 > l1)
        return duet_error(DUET_ERR_INVALID, "cpu kv_copy: layers [%d, %d) of %d", l0, l1,
                          r->kv.n_layers);
    for (int i = 0; i < n; i++)
        bytes += (size_t)copies[i].len;
    duet__kv_copy_job_t j = {r, copies, n, 2 * l0, (long)n * 2 * (l1 - l0)};
    if (j.items > 0)
        duet__cpu_run(r, bytes * 2u * (size_t)(l1 - l0) / sizeof(float), duet__kv_copy_job, &j);
    if (done != NULL)
        done(arg);
    return DUET_OK;
}

/* The pool is host memory: the byte-serial CRC (SSE4.2), on the calling
 * thread (the rank's workers belong to its thread). */
static duet_status_t duet__cpu_op_kv_crc(duet_backend_rank_t *r, const duet_crc32c_range_t *ranges,
                                         int n, uint32_t *crc_p)
{
    if (r->kv_base == NULL)
        return duet_error(DUET_ERR_INTERNAL, "cpu kv_crc: no kv pool attached");
    *crc_p = duet_crc32c_ranges(r->kv_base, ranges, n);
    return DUET_OK;
}

const duet_backend_ops_t duet_backend_cpu = {
    .name = "cpu",
    .act_dtype = DUET_DTYPE_F32,
    .kv_dtype = DUET_DTYPE_F32,
    .rank_create = duet__cpu_op_rank_create,
    .rank_destroy = duet__cpu_op_rank_destroy,
    .alloc = duet__cpu_op_alloc,
    .free = duet__cpu_op_free,
    .upload = duet__cpu_op_copy,
    .download = duet__cpu_op_copy,
    .sync = duet__cpu_op_sync,
    .kv_attach = duet__cpu_op_kv_attach,
    .weight_create = duet__cpu_op_weight_create,
    .weight_destroy = duet__cpu_op_weight_destroy,
    .vector_create = duet__cpu_op_vector_create,
    .embedding_create = duet__cpu_op_embedding_create,
    .batch_prepare = duet__cpu_op_batch_prepare,
    .embed = duet__cpu_op_embed,
    .rmsnorm = duet__cpu_op_rmsnorm,
    .matmul = duet__cpu_op_matmul,
    .rope_kv_store = duet__cpu_rope_kv_store,
    .head_rmsnorm = duet__cpu_op_head_rmsnorm,
    .attention = duet__cpu_attention,
    .silu_mul = duet__cpu_op_silu_mul,
    .add = duet__cpu_op_add,
    .add_bias = duet__cpu_op_add_bias,
    .gather_rows = duet__cpu_op_gather_rows,
    .rows_to_host_f32 = duet__cpu_op_rows_to_host_f32,
    .argmax_rows = duet__cpu_op_argmax_rows,
    .kv_copy = duet__cpu_op_kv_copy,
    .kv_crc = duet__cpu_op_kv_crc,
};
