/* synth/mkmodel: written values equal regenerated ones for every dtype,
 * sharding, Qwen2 biases, Llama attention biases (q/k/v and o_proj),
 * tied/untied heads, fingerprints, option checks,
 * and a reference forward pass showing the synthetic models decode
 * decisively (greedy argmax far from ties, output not degenerate). */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/status.h"
#include "synth/mkmodel.h"
#include "engine/model.h"
#include "tokenizer/tokenizer.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/duet-test-mkmodel-XXXXXX");
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void sub_dir(char *buf, size_t n, const char *sub)
{
    snprintf(buf, n, "%s/%s", tmpdir, sub);
}

static bool file_exists(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static duet_model_t *make(const char *sub, const duet_mkmodel_opts_t *o)
{
    char dir[512];
    duet_model_t *m = NULL;

    sub_dir(dir, sizeof(dir), sub);
    if (duet_mkmodel_write(dir, o) != DUET_OK)
        fail_msg("mkmodel %s: %s", sub, duet_error_msg());
    if (duet_model_open(dir, &m) != DUET_OK)
        fail_msg("open %s: %s", sub, duet_error_msg());
    return m;
}

static float round_to(duet_dtype_t dt, float v)
{
    if (dt == DUET_DTYPE_F16)
        return duet_f16_to_f32(duet_f32_to_f16(v));
    if (dt == DUET_DTYPE_BF16)
        return duet_bf16_to_f32(duet_f32_to_bf16(v));
    return v;
}

/* Every tensor of m holds what duet_mkmodel_values generates, rounded. */
static void check_values(const duet_model_t *m, const duet_mkmodel_opts_t *o)
{
    for (size_t i = 0; i < duet_st_count(m->st); i++) {
        const duet_st_tensor_t *t = duet_st_at(m->st, i);
        size_t n = t->nbytes / duet_dtype_size(t->dtype);
        float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        assert_non_null(want);
        assert_non_null(got);
        assert_int_equal(t->dtype, o->dtype);
        assert_int_equal(duet_mkmodel_values(o, t->name, 0, n, want), DUET_OK);
        duet_dtype_to_f32(t->dtype, t->data, got, n);
        for (size_t j = 0; j < n; j++) {
            if (got[j] != round_to(o->dtype, want[j]))
                fail_msg("%s[%zu]: %g, want %g", t->name, j, got[j], want[j]);
        }
        free(want);
        free(got);
    }
}

static void test_round_trip_dtypes(void **state)
{
    (void)state;
    const duet_dtype_t dts[] = {DUET_DTYPE_F32, DUET_DTYPE_F16, DUET_DTYPE_BF16};
    long live = duet_alloc_live();

    for (size_t i = 0; i < 3; i++) {
        duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
        char sub[32];
        o.dtype = dts[i];
        o.seed = 42;
        snprintf(sub, sizeof(sub), "dt%zu", i);
        duet_model_t *m = make(sub, &o);
        assert_int_equal(m->cfg.hidden, 64);
        assert_int_equal(m->cfg.n_layers, 2);
        assert_int_equal(m->cfg.n_heads, 4);
        assert_int_equal(m->cfg.n_kv_heads, 2);
        assert_int_equal(m->cfg.head_dim, 16);
        assert_int_equal(m->cfg.intermediate, 128);
        assert_int_equal(m->cfg.vocab, 512);
        assert_int_equal(m->cfg.bos_id, 510);
        assert_int_equal(m->cfg.n_eos, 1);
        assert_int_equal(m->cfg.eos_ids[0], 511);
        assert_int_equal(m->cfg.torch_dtype, dts[i]);
        assert_true(m->cfg.rms_eps == 1e-5);
        assert_false(m->cfg.tie_embeddings);
        assert_string_equal(m->lm_head->name, "lm_head.weight");
        assert_int_equal(duet_st_count(m->st), 2 + 2 * 9 + 1);
        assert_true(file_exists(m->dir, "tokenizer.json"));
        assert_false(file_exists(m->dir, "model.safetensors.index.json"));
        check_values(m, &o);
        duet_model_close(m);
    }
    assert_int_equal(duet_alloc_live(), live);
}

/* MLP matrices of 4.5 M elements: more than one generation chunk each. */
static void test_round_trip_big_tensors(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();

    o.layers = 1;
    o.intermediate = 70000;
    o.vocab = 300;
    o.dtype = DUET_DTYPE_BF16;
    o.threads = 3;
    duet_model_t *m = make("big", &o);
    assert_int_equal(m->layers[0].w_down->shape[1], 70000);
    check_values(m, &o);
    duet_model_close(m);
}

/* Values depend on (seed, name, index) only: a slice equals the same part
 * of the whole, and the distributions have the documented moments. */
static void test_values(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    const size_t n = 128 * 64;
    float *all = malloc(n * sizeof(float)), part[100];
    double sum = 0, sq = 0;

    assert_int_equal(duet_mkmodel_values(&o, "model.layers.1.mlp.up_proj.weight", 0, n, all),
                     DUET_OK);
    assert_int_equal(duet_mkmodel_values(&o, "model.layers.1.mlp.up_proj.weight", 777, 100, part),
                     DUET_OK);
    assert_memory_equal(part, all + 777, sizeof(part));
    for (size_t i = 0; i < n; i++) {
        sum += all[i];
        sq += (double)all[i] * all[i];
    }
    /* linear weights: mean 0, std about 1.5 / sqrt(fan_in = 64) */
    assert_true(fabs(sum / n) < 0.01);
    assert_true(fabs(sqrt(sq / n) - 1.5 / 8) < 0.01);

    assert_int_equal(duet_mkmodel_values(&o, "model.layers.0.mlp.up_proj.weight", 777, 100, part),
                     DUET_OK);
    assert_memory_not_equal(part, all + 777, sizeof(part));
    assert_int_equal(duet_mkmodel_values(&o, "model.norm.weight", 0, 64, part), DUET_OK);
    for (int i = 0; i < 64; i++)
        assert_true(part[i] > 0.8f && part[i] < 1.2f);
    assert_int_equal(duet_mkmodel_values(&o, "model.layers.2.mlp.up_proj.weight", 0, 1, part),
                     DUET_ERR_NOT_FOUND);
    assert_int_equal(duet_mkmodel_values(&o, "model.norm.weight", 60, 5, part), DUET_ERR_INVALID);
    free(all);
}

static void test_sharded(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    long live = duet_alloc_live();

    o.dtype = DUET_DTYPE_BF16;
    o.layers = 3;
    duet_model_t *single = make("single", &o);
    o.shards = 3;
    duet_model_t *sh = make("sharded", &o);
    assert_true(file_exists(sh->dir, "model.safetensors.index.json"));
    assert_true(file_exists(sh->dir, "model-00001-of-00003.safetensors"));
    assert_true(file_exists(sh->dir, "model-00003-of-00003.safetensors"));
    assert_false(file_exists(sh->dir, "model.safetensors"));
    assert_int_equal(duet_st_count(sh->st), duet_st_count(single->st));
    assert_string_not_equal(sh->embed->file, sh->lm_head->file);
    for (size_t i = 0; i < duet_st_count(sh->st); i++) {
        const duet_st_tensor_t *a = duet_st_at(single->st, i), *b = duet_st_at(sh->st, i);
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
    }
    /* same weights, same fingerprint, however they are split into files */
    assert_true(single->fingerprint == sh->fingerprint);
    check_values(sh, &o);
    duet_model_close(single);
    duet_model_close(sh);

    /* rewriting as one file removes the index (and vice versa) */
    o.shards = 1;
    duet_model_t *back = make("sharded", &o);
    assert_false(file_exists(back->dir, "model.safetensors.index.json"));
    duet_model_close(back);
    o.shards = 2;
    back = make("sharded", &o);
    assert_false(file_exists(back->dir, "model.safetensors"));
    duet_model_close(back);

    /* one tensor per shard */
    o.layers = 1;
    o.shards = 12;
    back = make("many", &o);
    assert_true(file_exists(back->dir, "model-00012-of-00012.safetensors"));
    duet_model_close(back);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_qwen2_and_tied(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();

    o.arch = DUET_ARCH_QWEN2;
    o.tied = true;
    o.dtype = DUET_DTYPE_F16;
    o.kv_heads = 1;
    duet_model_t *m = make("qwen2", &o);
    assert_int_equal(m->cfg.arch, DUET_ARCH_QWEN2);
    assert_true(m->cfg.qkv_bias);
    assert_true(m->cfg.tie_embeddings);
    assert_ptr_equal(m->lm_head, m->embed);
    assert_null(duet_st_find(m->st, "lm_head.weight"));
    for (int l = 0; l < 2; l++) {
        assert_non_null(m->layers[l].bq);
        assert_int_equal(m->layers[l].bq->shape[0], 64);
        assert_int_equal(m->layers[l].bk->shape[0], 16);
        assert_int_equal(m->layers[l].bv->shape[0], 16);
    }
    float b[16];
    duet_dtype_to_f32(DUET_DTYPE_F16, m->layers[1].bv->data, b, 16);
    double sq = 0;
    for (int i = 0; i < 16; i++)
        sq += b[i] * b[i];
    assert_true(sqrt(sq / 16) > 0.2); /* biases matter */
    check_values(m, &o);
    duet_model_close(m);

    o.arch = DUET_ARCH_MISTRAL;
    o.tied = false;
    m = make("mistral", &o);
    assert_int_equal(m->cfg.arch, DUET_ARCH_MISTRAL);
    assert_false(m->cfg.qkv_bias);
    assert_null(m->layers[0].bq);
    assert_null(m->layers[0].bo);
    assert_non_null(duet_st_find(m->st, "lm_head.weight"));
    duet_model_close(m);

    /* llama with attention_bias: q/k/v and o_proj biases */
    o.arch = DUET_ARCH_LLAMA;
    o.attention_bias = true;
    m = make("llama-attn-bias", &o);
    assert_true(m->cfg.qkv_bias);
    assert_true(m->cfg.o_bias);
    assert_int_equal(duet_st_count(m->st), 3 + 2 * 13);
    for (int l = 0; l < 2; l++) {
        assert_non_null(m->layers[l].bq);
        assert_non_null(m->layers[l].bo);
        assert_int_equal(m->layers[l].bo->shape[0], 64);
    }
    float ob[64];
    duet_dtype_to_f32(DUET_DTYPE_F16, m->layers[1].bo->data, ob, 64);
    sq = 0;
    for (int i = 0; i < 64; i++)
        sq += ob[i] * ob[i];
    assert_true(sqrt(sq / 64) > 0.2);
    check_values(m, &o);
    duet_model_close(m);
}

static void test_fingerprints(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    uint64_t fp[6];
    const char *subs[] = {"fa", "fb", "fseed", "flayers", "fdtype", "ftheta"};

    for (int i = 0; i < 6; i++) {
        duet_mkmodel_opts_t v = o;
        if (i == 2)
            v.seed = 2;
        if (i == 3)
            v.layers = 3;
        if (i == 4)
            v.dtype = DUET_DTYPE_F16;
        if (i == 5)
            v.rope_theta = 500000.0;
        duet_model_t *m = make(subs[i], &v);
        fp[i] = m->fingerprint;
        duet_model_close(m);
    }
    assert_true(fp[0] == fp[1]);
    for (int i = 2; i < 6; i++) {
        assert_true(fp[i] != fp[0]);
        for (int j = 2; j < i; j++)
            assert_true(fp[i] != fp[j]);
    }

    /* identical generation gives identical bytes */
    char a[1024], b[1024];
    snprintf(a, sizeof(a), "cmp -s '%s/fa/model.safetensors' '%s/fb/model.safetensors'", tmpdir,
             tmpdir);
    snprintf(b, sizeof(b), "cmp -s '%s/fa/config.json' '%s/fb/config.json'", tmpdir, tmpdir);
    assert_int_equal(system(a), 0);
    assert_int_equal(system(b), 0);
}

static void test_tokenizer_written(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    duet_tokenizer_t *tok = NULL;
    char dir[512];

    o.vocab = 300;
    duet_model_t *m = make("tok", &o);
    sub_dir(dir, sizeof(dir), "tok");
    if (duet_tokenizer_load(dir, &tok) != DUET_OK)
        fail_msg("%s", duet_error_msg());
    assert_int_equal(duet_tokenizer_vocab_size(tok), 300);
    assert_int_equal(m->cfg.bos_id, 298);
    assert_true(duet_model_config_is_eos(&m->cfg, 299));
    duet_tokenizer_destroy(tok);
    duet_model_close(m);
}

static void expect_opts_error(const duet_mkmodel_opts_t *o, const char *sub)
{
    char dir[512];
    sub_dir(dir, sizeof(dir), "bad");
    assert_int_equal(duet_mkmodel_write(dir, o), DUET_ERR_INVALID);
    if (strstr(duet_error_msg(), sub) == NULL)
        fail_msg("message '%s' lacks '%s'", duet_error_msg(), sub);
    assert_false(file_exists(dir, "config.json"));
}

static void test_opts(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default(), v;
    uint64_t params, bytes;

    v = o, v.vocab = 100;
    expect_opts_error(&v, "vocab 100");
    v = o, v.kv_heads = 3;
    expect_opts_error(&v, "kv_heads 3");
    v = o, v.head_dim = 7;
    expect_opts_error(&v, "head_dim 7");
    v = o, v.head_dim = 0, v.hidden = 66;
    expect_opts_error(&v, "hidden 66");
    v = o, v.layers = 0;
    expect_opts_error(&v, "layers 0");
    v = o, v.shards = 100;
    expect_opts_error(&v, "shards 100");
    v = o, v.dtype = DUET_DTYPE_I32;
    expect_opts_error(&v, "dtype I32");
    v = o, v.rope_theta = 0;
    expect_opts_error(&v, "rope_theta");
    v = o, v.arch = DUET_ARCH_QWEN2, v.attention_bias = true;
    expect_opts_error(&v, "attention_bias");

    /* BENCHMARKS.md: bench-124m has 124.7 M parameters */
    assert_int_equal(duet_mkmodel_preset("bench-124m", &o), DUET_OK);
    assert_int_equal(duet_mkmodel_size(&o, &params, &bytes), DUET_OK);
    assert_int_equal(params, 124668672);
    assert_int_equal(bytes, 4 * params);
    assert_int_equal(duet_mkmodel_preset("llama-3.2-1b-shape", &o), DUET_OK);
    assert_true(o.tied);
    assert_int_equal(duet_mkmodel_size(&o, &params, &bytes), DUET_OK);
    assert_true(params > 1235000000ull && params < 1236000000ull);
    assert_int_equal(duet_mkmodel_preset("llama-3-8b-shape", &o), DUET_OK);
    assert_int_equal(duet_mkmodel_size(&o, &params, &bytes), DUET_OK);
    assert_true(params > 8030000000ull && params < 8031000000ull);
    assert_int_equal(duet_mkmodel_preset("gpt-5", &o), DUET_ERR_NOT_FOUND);
}

/* Out-of-memory anywhere in opening a sharded checkpoint unwinds cleanly. */
static void test_open_alloc_failures_sharded(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    long live = duet_alloc_live();
    char dir[512];
    long n;

    o.shards = 4;
    o.arch = DUET_ARCH_QWEN2;
    duet_model_close(make("oom", &o));
    sub_dir(dir, sizeof(dir), "oom");
    for (n = 0; n < 1000; n++) {
        duet_model_t *m = NULL;
        duet_alloc_fail_after(n);
        duet_status_t st = duet_model_open(dir, &m);
        duet_alloc_fail_after(-1);
        if (st == DUET_OK) {
            duet_model_close(m);
            break;
        }
        if (st != DUET_ERR_NO_MEMORY)
            fail_msg("fail after %ld: %s (%s)", n, duet_status_name(st), duet_error_msg());
        assert_int_equal(duet_alloc_live(), live);
    }
    assert_true(n > 10 && n < 1000);
    assert_int_equal(duet_alloc_live(), live);
}

/* Out-of-memory while writing fails cleanly: no leak, no temp file left. */
static void test_write_alloc_failures(void **state)
{
    (void)state;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    long live = duet_alloc_live();
    char dir[512];
    long n;

    o.shards = 3;
    o.vocab = 300;
    sub_dir(dir, sizeof(dir), "oomw");
    for (n = 0; n < 10000; n++) {
        duet_alloc_fail_after(n);
        duet_status_t st = duet_mkmodel_write(dir, &o);
        duet_alloc_fail_after(-1);
        assert_int_equal(duet_alloc_live(), live);
        if (st == DUET_OK)
            break;
        if (st != DUET_ERR_NO_MEMORY)
            fail_msg("fail after %ld: %s (%s)", n, duet_status_name(st), duet_error_msg());
    }
    assert_true(n > 5 && n < 10000);
    DIR *d = opendir(dir);
    struct dirent *de;
    assert_non_null(d);
    while ((de = readdir(d)) != NULL)
        assert_null(strstr(de->d_name, ".tmp."));
    closedir(d);
}

/* ---- reference forward pass (fp32 weights, double accumulation) ---- */

typedef struct {
    float *an, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *mn, *wg, *wu, *wd, *bo;
} ref_layer_t;

typedef struct {
    duet_model_config_t c;
    float *embed, *norm, *lm_head;
    ref_layer_t *l;
} ref_t;

static float *ref_load(const duet_st_tensor_t *t)
{
    if (t == NULL)
        return NULL;
    size_t n = t->nbytes / duet_dtype_size(t->dtype);
    float *f = malloc(n * sizeof(float));
    assert_non_null(f);
    duet_dtype_to_f32(t->dtype, t->data, f, n);
    return f;
}

static void ref_init(ref_t *r, const duet_model_t *m)
{
    r->c = m->cfg;
    r->embed = ref_load(m->embed);
    r->norm = ref_load(m->norm);
    r->lm_head = ref_load(m->lm_head);
    r->l = calloc((size_t)r->c.n_layers, sizeof(ref_layer_t));
    for (int i = 0; i < r->c.n_layers; i++) {
        const duet_layer_weights_t *w = &m->layers[i];
        r->l[i] = (ref_layer_t){ref_load(w->attn_norm), ref_load(w->wq),   ref_load(w->wk),
                                ref_load(w->wv),        ref_load(w->bq),   ref_load(w->bk),
                                ref_load(w->bv),        ref_load(w->wo),   ref_load(w->mlp_norm),
                                ref_load(w->w_gate),    ref_load(w->w_up), ref_load(w->w_down),
                                ref_load(w->bo)};
    }
}

static void ref_free(ref_t *r)
{
    for (int i = 0; i < r->c.n_layers; i++) {
        float **p = (float **)&r->l[i];
        for (size_t k = 0; k < sizeof(ref_layer_t) / sizeof(float *); k++)
            free(p[k]);
    }
    free(r->l);
    free(r->embed);
    free(r->norm);
    free(r->lm_head);
}

/* y[rows] = W[rows][cols] x (+ b) */
static void ref_matvec(const float *w, const float *b, const float *x, int rows, int cols, float *y)
{
    for (int i = 0; i < rows; i++) {
        double s = b ? b[i] : 0;
        for (int j = 0; j < cols; j++)
            s += (double)w[(size_t)i * cols + j] * x[j];
        y[i] = (float)s;
    }
}

static void ref_rmsnorm(const float *x, const float *w, int n, double eps, float *y)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = (float)(x[i] * inv * w[i]);
}

static void ref_rope(float *v, int n_heads, int hd, int pos, double theta)
{
    for (int h = 0; h < n_heads; h++) {
        float *p = v + h * hd;
        for (int i = 0; i < hd / 2; i++) {
            double a = pos * pow(theta, -2.0 * i / hd);
            double x1 = p[i], x2 = p[i + hd / 2];
            p[i] = (float)(x1 * cos(a) - x2 * sin(a));
            p[i + hd / 2] = (float)(x2 * cos(a) + x1 * sin(a));
        }
    }
}

/* Logits of the last of n tokens; use_bias = false drops the attention
 * biases (q/k/v, o). */
static void ref_logits(const ref_t *r, const int *tok, int n, bool use_bias, float *logits)
{
    const duet_model_config_t *c = &r->c;
    const int H = c->hidden, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    const int F = c->intermediate, hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    float *x = malloc(sizeof(float) * (size_t)n * H), *xn = malloc(sizeof(float) * H);
    float *q = malloc(sizeof(float) * (size_t)n * Q), *k = malloc(sizeof(float) * (size_t)n * KV);
    float *v = malloc(sizeof(float) * (size_t)n * KV), *att = malloc(sizeof(float) * Q);
    float *o = malloc(sizeof(float) * H), *g = malloc(sizeof(float) * F);
    float *u = malloc(sizeof(float) * F);
    double *p = malloc(sizeof(double) * n);

    for (int t = 0; t < n; t++)
        memcpy(x + (size_t)t * H, r->embed + (size_t)tok[t] * H, sizeof(float) * H);
    for (int l = 0; l < c->n_layers; l++) {
        const ref_layer_t *w = &r->l[l];
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(x + (size_t)t * H, w->an, H, c->rms_eps, xn);
            ref_matvec(w->wq, use_bias ? w->bq : NULL, xn, Q, H, q + (size_t)t * Q);
            ref_matvec(w->wk, use_bias ? w->bk : NULL, xn, KV, H, k + (size_t)t * KV);
            ref_matvec(w->wv, use_bias ? w->bv : NULL, xn, KV, H, v + (size_t)t * KV);
            ref_rope(q + (size_t)t * Q, c->n_heads, hd, t, c->rope_theta);
            ref_rope(k + (size_t)t * KV, c->n_kv_heads, hd, t, c->rope_theta);
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < c->n_heads; h++) {
                const float *qh = q + (size_t)t * Q + h * hd;
                const int kh = h / group;
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += (double)qh[d] * k[(size_t)j * KV + kh * hd + d];
                    p[j] = s / sqrt((double)hd);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= t; j++)
                    sum += (p[j] = exp(p[j] - mx));
                for (int d = 0; d < hd; d++) {
                    double s = 0;
                    for (int j = 0; j <= t; j++)
                        s += p[j] * v[(size_t)j * KV + kh * hd + d];
                    att[h * hd + d] = (float)(s / sum);
                }
            }
            ref_matvec(w->wo, use_bias ? w->bo : NULL, att, H, Q, o);
            for (int i = 0; i < H; i++)
                x[(size_t)t * H + i] += o[i];
            ref_rmsnorm(x + (size_t)t * H, w->mn, H, c->rms_eps, xn);
            ref_matvec(w->wg, NULL, xn, F, H, g);
            ref_matvec(w->wu, NULL, xn, F, H, u);
            for (int i = 0; i < F; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            ref_matvec(w->wd, NULL, g, H, F, o);
            for (int i = 0; i < H; i++)
                x[(size_t)t * H + i] += o[i];
        }
    }
    ref_rmsnorm(x + (size_t)(n - 1) * H, r->norm, H, c->rms_eps, xn);
    ref_matvec(r->lm_head, NULL, xn, c->vocab, H, logits);
    free(x), free(xn), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(p);
}

typedef struct {
    int distinct;      /* distinct generated tokens */
    double median_gap; /* median over steps of (top1 - top2) / (top1 - mean) */
    double min_gap;
} greedy_stats_t;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Greedy decode `steps` tokens after a 4-token prompt. */
static greedy_stats_t ref_greedy(const ref_t *r, int steps, bool use_bias, int *out)
{
    int tok[64] = {3, 17, 42, 7};
    const int n0 = 4;
    float *logits = malloc(sizeof(float) * (size_t)r->c.vocab);
    double gaps[64];
    bool seen[1 << 16] = {false};
    greedy_stats_t s = {0, 0, 1e9};

    assert_true(n0 + steps <= 64 && r->c.vocab <= (1 << 16));
    for (int i = 0; i < steps; i++) {
        int n = n0 + i, best = 0, second = -1;
        double mean = 0;
        ref_logits(r, tok, n, use_bias, logits);
        for (int j = 0; j < r->c.vocab; j++) {
            mean += logits[j];
            if (logits[j] > logits[best]) {
                second = best;
                best = j;
            } else if (j != best && (second < 0 || logits[j] > logits[second])) {
                second = j;
            }
        }
        mean /= r->c.vocab;
        gaps[i] = (logits[best] - logits[second]) / (logits[best] - mean);
        s.min_gap = gaps[i] < s.min_gap ? gaps[i] : s.min_gap;
        tok[n] = best;
        if (out)
            out[i] = best;
        if (!seen[best])
            s.distinct++;
        seen[best] = true;
    }
    qsort(gaps, (size_t)steps, sizeof(double), cmp_double);
    s.median_gap = gaps[steps / 2];
    free(logits);
    return s;
}

/* The generated models decode decisively and not degenerately, for the
 * default shape, a GQA shape with more layers, tied, Qwen2 and
 * attention-bias variants. */
static void test_decisive(void **state)
{
    (void)state;
    struct {
        const char *sub;
        int layers, hidden, heads, kv, inter, vocab;
        bool tied;
        duet_arch_t arch;
        bool attention_bias;
    } cases[] = {
        {"dec-default", 2, 64, 4, 2, 128, 512, false, DUET_ARCH_LLAMA, false},
        {"dec-tied", 2, 64, 4, 2, 128, 512, true, DUET_ARCH_LLAMA, false},
        {"dec-deep", 6, 96, 6, 2, 256, 1024, false, DUET_ARCH_LLAMA, false},
        {"dec-qwen2", 3, 64, 8, 2, 160, 600, true, DUET_ARCH_QWEN2, false},
        {"dec-attn-bias", 2, 64, 8, 2, 96, 512, false, DUET_ARCH_LLAMA, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
        int with_bias[24], without_bias[24];
        ref_t r;
        o.layers = cases[i].layers;
        o.hidden = cases[i].hidden;
        o.heads = cases[i].heads;
        o.kv_heads = cases[i].kv;
        o.head_dim = 0;
        o.intermediate = cases[i].inter;
        o.vocab = cases[i].vocab;
        o.tied = cases[i].tied;
        o.arch = cases[i].arch;
        o.attention_bias = cases[i].attention_bias;
        duet_model_t *m = make(cases[i].sub, &o);
        ref_init(&r, m);
        greedy_stats_t s = ref_greedy(&r, 24, true, with_bias);
        if (getenv("DUET_TEST_VERBOSE"))
            fprintf(stderr, "%s: distinct %d median gap %.4f min gap %.5f\n", cases[i].sub,
                    s.distinct, s.median_gap, s.min_gap);
        if (s.distinct < 6 || s.median_gap < 0.02 || s.min_gap < 1e-4)
            fail_msg("%s: distinct %d median gap %g min gap %g", cases[i].sub, s.distinct,
                     s.median_gap, s.min_gap);
        if (cases[i].arch == DUET_ARCH_QWEN2 || cases[i].attention_bias) {
            /* a backend that forgot the biases would decode differently */
            ref_greedy(&r, 24, false, without_bias);
            assert_memory_not_equal(with_bias, without_bias, sizeof(with_bias));
        }
        ref_free(&r);
        duet_model_close(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_dtypes),
        cmocka_unit_test(test_round_trip_big_tensors),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_qwen2_and_tied),
        cmocka_unit_test(test_fingerprints),
        cmocka_unit_test(test_tokenizer_written),
        cmocka_unit_test(test_opts),
        cmocka_unit_test(test_open_alloc_failures_sharded),
        cmocka_unit_test(test_write_alloc_failures),
        cmocka_unit_test(test_decisive),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
