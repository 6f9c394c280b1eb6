/* The engine end to end on the cpu backend:
 *  - TP in {1,2,4,8} x kv_heads in {1,2,4,8} give the greedy tokens of
 *    TP=1 and logits within 1e-4 relative, with page sizes 1 and 16;
 *  - a mixed-length batch (and a chunked one) equals the prompts run one by
 *    one;
 *  - seeded sampling is reproducible and the same across TP sizes;
 *  - a Llama with attention_bias (q/k/v and o_proj biases) gives the same
 *    greedy tokens at TP 1, 2, 4 (o_proj's bias is added once, after the
 *    all-reduce);
 *  - a forward step issues exactly the collectives the math needs (no
 *    broadcast of the sampled ids);
 *  - stories260K continues "Once upon a time" as llama2.c does;
 *  - bad input and bad sharding are clear errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "engine/engine.h"
#include "engine/engine_internal.h" /* collective counts of the rank comms */
#include "synth/mkmodel.h"
#include "tokenizer/tokenizer.h"

static char tmpdir[256];

static const char *model_dir(int kv_heads, int intermediate)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/m_kv%d_i%d", tmpdir, kv_heads, intermediate);
    if (access(path, F_OK) == 0)
        return path;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    o.layers = 2;
    o.hidden = 64;
    o.heads = 8;
    o.kv_heads = kv_heads;
    o.head_dim = 8;
    o.intermediate = intermediate;
    o.vocab = 300;
    o.max_pos = 256;
    o.seed = 100 + (uint64_t)kv_heads;
    o.threads = 1;
    assert_int_equal(duet_mkmodel_write(path, &o), DUET_OK);
    return path;
}

/* A Llama with attention_bias: true (q/k/v and o_proj biases). */
static const char *bias_model_dir(void)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/m_attn_bias", tmpdir);
    if (access(path, F_OK) == 0)
        return path;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    o.attention_bias = true;
    o.layers = 2;
    o.hidden = 64;
    o.heads = 8;
    o.kv_heads = 2;
    o.head_dim = 8;
    o.intermediate = 96;
    o.vocab = 300;
    o.max_pos = 256;
    o.seed = 300;
    o.threads = 1;
    assert_int_equal(duet_mkmodel_write(path, &o), DUET_OK);
    return path;
}

static duet_engine_t *engine(const char *dir, int tp, int page_size, int n_pages, int max_tokens)
{
    duet_engine_opts_t eo;
    duet_engine_t *e = NULL;
    duet_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.tp = tp;
    eo.threads = 1;
    eo.page_size = page_size;
    eo.n_pages = n_pages;
    eo.max_batch_tokens = max_tokens;
    eo.max_seqs = max_tokens < 16 ? max_tokens : 16;
    eo.comm_timeout_ms = 20000;
    duet_status_t st = duet_engine_create(&eo, &e);
    if (st != DUET_OK)
        fail_msg("engine create: %s", duet_error_msg());
    return e;
}

/* Greedy (or sampled) generation of n_gen tokens after prompt; logits of
 * every step into logits[n_gen][vocab] when not NULL. */
static void generate(duet_engine_t *e, const int32_t *prompt, int n_prompt, int n_gen,
                     const duet_sampling_t *sp, int32_t *out, float *logits, int vocab)
{
    int32_t pages[512];
    int ps = duet_engine_kv_layout(e)->page_size;
    int np = duet_engine_kv_layout(e)->n_pages;
    for (int i = 0; i < np && i < 512; i++)
        pages[i] = np - 1 - i; /* descending: page ids are not positions */
    duet_engine_seq_t s = {.tokens = prompt, .n_tokens = n_prompt, .pages = pages,
                           .n_pages = (n_prompt + n_gen + ps - 1) / ps, .sample = true,
                           .sampling = *sp};
    for (int i = 0; i < n_gen; i++) {
        s.sample_index = (uint64_t)i;
        s.logits = logits ? logits + (size_t)i * (size_t)vocab : NULL;
        if (duet_engine_forward(e, &s, 1, &out[i]) != DUET_OK)
            fail_msg("forward: %s", duet_error_msg());
        s.start_pos += s.n_tokens;
        s.tokens = &out[i];
        s.n_tokens = 1;
    }
}

static void prompt_of(int32_t *p, int n, int salt)
{
    for (int i = 0; i < n; i++)
        p[i] = (int32_t)((i * 31 + salt * 17 + 5) % 298);
}

#define NP 37
#define NG 12
#define VOCAB 300

static void test_tp_equivalence(void **state)
{
    (void)state;
    static float ref_logits[NG * VOCAB], logits[NG * VOCAB];
    int32_t prompt[NP], ref[NG], got[NG];
    duet_sampling_t g = duet_sampling_greedy();
    prompt_of(prompt, NP, 1);
    for (int kv = 1; kv <= 8; kv *= 2) {
        const char *dir = model_dir(kv, 96);
        for (int ps = 1; ps <= 16; ps *= 16) {
            int n_pages = 512 / ps < 64 ? 64 : 512 / ps;
            if (n_pages > 512)
                n_pages = 512;
            duet_engine_t *e = engine(dir, 1, ps, n_pages, 64);
            generate(e, prompt, NP, NG, &g, ref, ref_logits, VOCAB);
            duet_engine_destroy(e);
            for (int tp = 2; tp <= 8; tp *= 2) {
                e = engine(dir, tp, ps, n_pages, 64);
                generate(e, prompt, NP, NG, &g, got, logits, VOCAB);
                duet_engine_destroy(e);
                double maxd = 0, maxa = 0;
                for (int i = 0; i < NG * VOCAB; i++) {
                    maxd = fmax(maxd, fabs((double)logits[i] - ref_logits[i]));
                    maxa = fmax(maxa, fabs((double)ref_logits[i]));
                }
                if (memcmp(got, ref, sizeof(ref)) != 0 || maxd > 1e-4 * (1 + maxa))
                    fail_msg("kv %d page %d tp %d: tokens %s, max |dlogit| %g (scale %g)", kv, ps,
                             tp, memcmp(got, ref, sizeof(ref)) ? "differ" : "equal", maxd, maxa);
            }
        }
    }
}

/* o_proj's output is a partial sum on every rank; its bias must be added
 * once, to the reduced sum: added to each rank's partial sum it would
 * count TP times and TP 2 / 4 would decode differently from TP 1. */
static void test_attention_bias_tp(void **state)
{
    (void)state;
    static float ref_logits[NG * VOCAB], logits[NG * VOCAB];
    int32_t prompt[NP], ref[NG], got[NG];
    duet_sampling_t g = duet_sampling_greedy();
    const char *dir = bias_model_dir();
    prompt_of(prompt, NP, 5);

    duet_engine_t *e = engine(dir, 1, 16, 64, 64);
    const duet_model_t *m = duet_engine_model(e);
    assert_true(m->cfg.qkv_bias && m->cfg.o_bias);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        assert_non_null(m->layers[l].bo);
        assert_int_equal(m->layers[l].bo->shape[0], 64);
    }
    generate(e, prompt, NP, NG, &g, ref, ref_logits, VOCAB);
    duet_engine_destroy(e);
    for (int tp = 2; tp <= 4; tp *= 2) {
        e = engine(dir, tp, 16, 64, 64);
        generate(e, prompt, NP, NG, &g, got, logits, VOCAB);
        duet_engine_destroy(e);
        double maxd = 0, maxa = 0;
        for (int i = 0; i < NG * VOCAB; i++) {
            maxd = fmax(maxd, fabs((double)logits[i] - ref_logits[i]));
            maxa = fmax(maxa, fabs((double)ref_logits[i]));
        }
        if (memcmp(got, ref, sizeof(ref)) != 0 || maxd > 1e-4 * (1 + maxa))
            fail_msg("attention bias tp %d: tokens %s, max |dlogit| %g (scale %g)", tp,
                     memcmp(got, ref, sizeof(ref)) ? "differ" : "equal", maxd, maxa);
    }
}

/* Collectives rank r has issued so far. */
static uint64_t issued(const duet_engine_t *e, int r)
{
    return e->ranks[r].comm->n_issued;
}

static void forward_counted(duet_engine_t *e, const duet_engine_seq_t *seqs, int n, int32_t *next,
                            uint64_t want, const char *what)
{
    uint64_t before[2] = {issued(e, 0), issued(e, 1)};
    if (duet_engine_forward(e, seqs, n, next) != DUET_OK)
        fail_msg("%s: forward: %s", what, duet_error_msg());
    for (int r = 0; r < 2; r++) {
        uint64_t got = issued(e, r) - before[r];
        if (got != want)
            fail_msg("%s: rank %d issued %llu collectives, want %llu", what, r,
                     (unsigned long long)got, (unsigned long long)want);
    }
}

/* At TP 2 a forward step costs an all-reduce after o_proj and one after
 * down_proj per layer, plus one all-gather of the lm_head shards per
 * DUET_LM_BLOCK output rows.  Sampling costs nothing more: rank 0 samples
 * and the caller hands the next batch to every rank (DESIGN §3 rule 1). */
static void test_step_collectives(void **state)
{
    (void)state;
    static float all_logits[70 * VOCAB];
    static int32_t prompts[4][NP], long_prompt[70], pages[5][25];
    int32_t next[4], last[4];
    duet_engine_seq_t seqs[4];
    duet_sampling_t seeded = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 7};
    duet_engine_t *e = engine(model_dir(2, 96), 2, 4, 128, 256); /* one chunk */
    uint64_t L2 = 2u * (uint64_t)duet_engine_model(e)->cfg.n_layers;

    for (int i = 0; i < 25; i++) {
        for (int s = 0; s < 4; s++)
            pages[s][i] = s + 4 * i; /* 0..99 */
        pages[4][i] = 100 + i;
    }
    for (int s = 0; s < 4; s++) {
        prompt_of(prompts[s], NP, 20 + s);
        seqs[s] = (duet_engine_seq_t){.tokens = prompts[s], .n_tokens = NP, .pages = pages[s],
                                      .n_pages = 25, .sample = true,
                                      .sampling = s % 2 ? seeded : duet_sampling_greedy()};
    }
    /* prefill of 4 x 37 tokens, 4 sampled rows; then a decode step */
    forward_counted(e, seqs, 4, next, L2 + 1, "prefill");
    for (int s = 0; s < 4; s++) {
        last[s] = next[s]; /* forward() clears next[] first */
        seqs[s].start_pos = NP;
        seqs[s].tokens = &last[s];
        seqs[s].n_tokens = 1;
        seqs[s].sample_index = 1;
    }
    forward_counted(e, seqs, 4, next, L2 + 1, "decode");
    /* 70 rows of logits: two lm_head blocks */
    prompt_of(long_prompt, 70, 30);
    duet_engine_seq_t lg = {.tokens = long_prompt, .n_tokens = 70, .pages = pages[4],
                            .n_pages = 25, .logits = all_logits, .all_logits = true};
    assert_true(70 > DUET_LM_BLOCK && 70 <= 2 * DUET_LM_BLOCK);
    forward_counted(e, &lg, 1, NULL, L2 + 2, "all logits");
    /* nothing sampled, no logits: the layers alone */
    lg.logits = NULL;
    lg.all_logits = false;
    forward_counted(e, &lg, 1, NULL, L2, "kv only");
    duet_engine_destroy(e);
}

static void test_uneven_ffn_split(void **state)
{
    (void)state;
    int32_t prompt[NP], ref[NG], got[NG];
    duet_sampling_t g = duet_sampling_greedy();
    const char *dir = model_dir(2, 100); /* 100 columns over 8 ranks: 12 or 13 each */
    prompt_of(prompt, NP, 2);
    duet_engine_t *e = engine(dir, 1, 16, 64, 64);
    generate(e, prompt, NP, NG, &g, ref, NULL, VOCAB);
    duet_engine_destroy(e);
    e = engine(dir, 8, 16, 64, 64);
    generate(e, prompt, NP, NG, &g, got, NULL, VOCAB);
    duet_engine_destroy(e);
    assert_memory_equal(got, ref, sizeof(ref));
}

/* Four prompts of lengths 1, 5, 16, 33 prefilled as one batch and decoded
 * together equal the same prompts run alone; with max_batch_tokens 8 the
 * prefill is split into chunks that cut through sequences. */
static void test_batch_equals_single(void **state)
{
    (void)state;
    const int lens[4] = {1, 5, 16, 33};
    int32_t prompts[4][33], single[4][NG], batched[4][NG];
    duet_sampling_t g = duet_sampling_greedy();
    const char *dir = model_dir(4, 96);

    for (int s = 0; s < 4; s++)
        prompt_of(prompts[s], lens[s], 10 + s);
    duet_engine_t *e = engine(dir, 2, 4, 128, 64);
    for (int s = 0; s < 4; s++)
        generate(e, prompts[s], lens[s], NG, &g, single[s], NULL, VOCAB);
    duet_engine_destroy(e);

    for (int max_tokens = 64; max_tokens >= 8; max_tokens -= 56) {
        e = engine(dir, 2, 4, 128, max_tokens);
        int32_t pages[4][16], next[4];
        duet_engine_seq_t seqs[4];
        for (int s = 0; s < 4; s++) {
            for (int i = 0; i < 16; i++)
                pages[s][i] = s + 4 * i; /* interleaved pages */
            seqs[s] = (duet_engine_seq_t){.tokens = prompts[s], .n_tokens = lens[s],
                                          .pages = pages[s], .n_pages = 16, .sample = true,
                                          .sampling = g};
        }
        for (int step = 0; step < NG; step++) {
            if (duet_engine_forward(e, seqs, 4, next) != DUET_OK)
                fail_msg("forward: %s", duet_error_msg());
            for (int s = 0; s < 4; s++) {
                batched[s][step] = next[s];
                seqs[s].start_pos += seqs[s].n_tokens;
                seqs[s].tokens = &batched[s][step];
                seqs[s].n_tokens = 1;
                seqs[s].sample_index = (uint64_t)step + 1;
            }
        }
        duet_engine_destroy(e);
        for (int s = 0; s < 4; s++)
            assert_memory_equal(batched[s], single[s], sizeof(single[s]));
    }
}

static void test_seeded_sampling_across_tp(void **state)
{
    (void)state;
    int32_t prompt[NP], a[NG], b[NG], c[NG], d[NG];
    duet_sampling_t sp = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 4242};
    duet_sampling_t other = sp;
    other.seed = 1;
    const char *dir = model_dir(4, 96);
    prompt_of(prompt, NP, 3);
    duet_engine_t *e = engine(dir, 1, 16, 64, 64);
    generate(e, prompt, NP, NG, &sp, a, NULL, VOCAB);
    generate(e, prompt, NP, NG, &sp, b, NULL, VOCAB);
    generate(e, prompt, NP, NG, &other, d, NULL, VOCAB);
    duet_engine_destroy(e);
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_not_equal(a, d, sizeof(a));
    for (int tp = 2; tp <= 4; tp *= 2) {
        e = engine(dir, tp, 16, 64, 64);
        generate(e, prompt, NP, NG, &sp, c, NULL, VOCAB);
        duet_engine_destroy(e);
        assert_memory_equal(a, c, sizeof(a));
    }
}

static void test_stories260k(void **state)
{
    (void)state;
    char path[512];
    duet_tokenizer_t *tok;
    int32_t *ids, out[40];
    size_t n;
    char *text;
    duet_sampling_t g = duet_sampling_greedy();
    const char *src = getenv("DUET_SOURCE_DIR");

    snprintf(path, sizeof(path), "%s/models/stories260K", src ? src : ".");
    assert_int_equal(duet_tokenizer_load(path, &tok), DUET_OK);
    const char *prompt = "Once upon a time";
    assert_int_equal(duet_tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &n), DUET_OK);
    for (int tp = 1; tp <= 4; tp *= 2) {
        duet_engine_t *e = engine(path, tp, 16, 8, 64);
        generate(e, ids, (int)n, 40, &g, out, NULL, 512);
        duet_engine_destroy(e);
        assert_int_equal(duet_tokenizer_decode(tok, out, 40, true, &text), DUET_OK);
        /* llama2.c's test_all.py expected output for this model and prompt */
        if (strncmp(text, ", there was a little girl named Lily.", 37) != 0)
            fail_msg("tp %d: unexpected continuation '%s'", tp, text);
        duet_free(text);
    }
    duet_free(ids);
    duet_tokenizer_destroy(tok);
}

static void test_errors(void **state)
{
    (void)state;
    duet_engine_opts_t eo;
    duet_engine_t *e = NULL;
    duet_engine_opts_default(&eo);
    eo.model_dir = model_dir(2, 96);
    eo.n_pages = 16;
    eo.tp = 3;
    assert_int_equal(duet_engine_create(&eo, &e), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "num_attention_heads 8 is not divisible"));
    eo.tp = 8; /* kv 2 < 8: replicated, allowed */
    eo.threads = 1;
    assert_int_equal(duet_engine_create(&eo, &e), DUET_OK);
    duet_engine_destroy(e);
    eo.model_dir = "/nonexistent/model";
    eo.tp = 1;
    assert_int_not_equal(duet_engine_create(&eo, &e), DUET_OK);
    assert_non_null(strstr(duet_error_msg(), "/nonexistent/model"));

    e = engine(model_dir(2, 96), 2, 16, 32, 64);
    static int32_t toks[300];
    int32_t pages[32], next;
    for (int i = 0; i < 32; i++)
        pages[i] = i;
    duet_engine_seq_t s = {.tokens = toks, .n_tokens = 257, .pages = pages, .n_pages = 32,
                           .sample = true, .sampling = duet_sampling_greedy()};
    assert_int_equal(duet_engine_forward(e, &s, 1, &next), DUET_ERR_TOO_LONG);
    assert_non_null(strstr(duet_error_msg(), "exceed the model context of 256"));
    s.n_tokens = 10;
    toks[3] = 300;
    assert_int_equal(duet_engine_forward(e, &s, 1, &next), DUET_ERR_INVALID);
    assert_non_null(strstr(duet_error_msg(), "token id 300"));
    toks[3] = 1;
    pages[0] = 32;
    assert_int_equal(duet_engine_forward(e, &s, 1, &next), DUET_ERR_INVALID);
    pages[0] = 0;
    s.n_pages = 0;
    assert_int_equal(duet_engine_forward(e, &s, 1, &next), DUET_ERR_INVALID);
    s.n_pages = 32;
    s.sampling.top_p = 2.0f;
    assert_int_equal(duet_engine_forward(e, &s, 1, &next), DUET_ERR_INVALID);
    s.sampling.top_p = 1.0f;
    assert_int_equal(duet_engine_forward(e, &s, 1, &next), DUET_OK);
    duet_engine_destroy(e);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/duet_test_engine_XXXXXX");
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_equivalence),
        cmocka_unit_test(test_attention_bias_tp),
        cmocka_unit_test(test_step_collectives),
        cmocka_unit_test(test_uneven_ffn_split),
        cmocka_unit_test(test_batch_equals_single),
        cmocka_unit_test(test_seeded_sampling_across_tp),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
