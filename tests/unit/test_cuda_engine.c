/* The engine end to end on the cuda backend:
 *  - logits of a prompt (every position) and of 10 decode steps of a batch
 *    of 3 sequences against the cpu engine on bf16 synthetic models (so
 *    both use the same weights): GQA head_dim 64 (tensor-core prefill),
 *    qwen2 with q/k/v biases head_dim 32, MQA head_dim 128 tied.  Decode
 *    steps are teacher-forced with the cpu's greedy tokens, so every step
 *    compares the same inputs.  Bound over all logits: rel_l2 <= 3e-2 and
 *    |err| <= 6e-2 max|ref| (bf16 activations through the whole model;
 *    observed values printed), plus the argmax agreement reported;
 *  - the decode graphs: an engine with graphs and one without
 *    (DUET_CUDA_GRAPHS=0) give bitwise-identical logits and tokens over
 *    steps whose batch size changes (graphs recorded and replayed for
 *    several sizes), greedy on the device and with logits requested;
 *  - with two GPUs: TP=2 over NCCL gives the greedy tokens of TP=1 and
 *    logits within rel_l2 3e-2;
 *  - FP8 checkpoints (per channel, per tensor) against the cpu's exact
 *    dequantization: with every matmul through the FP8 GEMV
 *    (DUET_CUDA_FP8_GEMM=0) within the bf16 bound; by default (prompt
 *    activations quantized to e4m3 for cuBLASLt) within rel_l2 0.3,
 *    |err| <= 0.45 max|ref|, argmax agreeing on 60% of rows. */
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
#include "engine/backend.h"
#include "engine/engine.h"
#include "synth/mkmodel.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

static char tmpdir[256];

static const char *make_model_q(const char *name, duet_arch_t arch, int hidden, int heads,
                                int kv_heads, int head_dim, bool tied, const char *rope_scaling,
                                int fp8)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    if (access(path, F_OK) == 0)
        return path;
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    o.arch = arch;
    o.layers = 3;
    o.hidden = hidden;
    o.heads = heads;
    o.kv_heads = kv_heads;
    o.head_dim = head_dim;
    o.intermediate = 2 * hidden + 64;
    o.vocab = 600;
    o.tied = tied;
    o.dtype = DUET_DTYPE_BF16;
    o.seed = 77;
    o.rope_scaling = rope_scaling;
    o.fp8 = fp8;
    o.fp8_format = fp8 == DUET_MKMODEL_FP8_TENSOR ? DUET_MKMODEL_FP8_VLLM
                                                  : DUET_MKMODEL_FP8_COMPRESSED_TENSORS;
    assert_int_equal(duet_mkmodel_write(path, &o), DUET_OK);
    return path;
}

static const char *make_model_rs(const char *name, duet_arch_t arch, int hidden, int heads,
                                 int kv_heads, int head_dim, bool tied, const char *rope_scaling)
{
    return make_model_q(name, arch, hidden, heads, kv_heads, head_dim, tied, rope_scaling, 0);
}

static const char *make_model(const char *name, duet_arch_t arch, int hidden, int heads,
                              int kv_heads, int head_dim, bool tied)
{
    return make_model_rs(name, arch, hidden, heads, kv_heads, head_dim, tied, NULL);
}

static duet_engine_t *open_engine(const char *dir, const char *backend, int tp)
{
    duet_engine_opts_t eo;
    duet_engine_t *e = NULL;
    duet_engine_opts_default(&eo);
    eo.model_dir = dir;
    eo.backend = backend;
    eo.tp = tp;
    eo.threads = 2;
    eo.page_size = 16;
    eo.n_pages = 64;
    eo.max_batch_tokens = 256;
    eo.max_seqs = 8;
    duet_status_t st = duet_engine_create(&eo, &e);
    if (st != DUET_OK)
        fprintf(stderr, "engine %s tp %d: %s\n", backend, tp, duet_error_msg());
    assert_int_equal(st, DUET_OK);
    return e;
}

#define NSEQ  3
#define PLEN  40
#define STEPS 10

typedef struct {
    int32_t prompt[NSEQ][PLEN];
    int plen[NSEQ];
    int32_t pages[NSEQ][16];
} seqs_t;

static void seqs_init(seqs_t *s, int vocab)
{
    for (int q = 0; q < NSEQ; q++) {
        s->plen[q] = PLEN - 13 * q;
        for (int i = 0; i < PLEN; i++)
            s->prompt[q][i] = (int32_t)((i * 31 + q * 17 + 3) % (vocab - 2));
        for (int i = 0; i < 16; i++)
            s->pages[q][i] = q * 16 + i;
    }
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Prompt logits of every position of sequence 0, then NSEQ sequences
 * decoding STEPS steps: free-running (forced == NULL) or fed forced[] (the
 * inputs of another run).  inputs_out gets the tokens fed. */
static float *run_logits(duet_engine_t *e, const seqs_t *s, const int32_t *forced, int vocab,
                         size_t *n_p, int32_t *inputs_out)
{
    size_t rows = PLEN + (size_t)NSEQ * STEPS, k = 0;
    float *all = duet_malloc(rows * (size_t)vocab * sizeof(float));
    duet_engine_seq_t q[NSEQ];
    int32_t sampled[NSEQ], tok[NSEQ];

    memset(q, 0, sizeof(q));
    for (int i = 0; i < NSEQ; i++) {
        q[i] = (duet_engine_seq_t){.tokens = s->prompt[i],
                                   .n_tokens = s->plen[i],
                                   .pages = s->pages[i],
                                   .n_pages = 16,
                                   .sample = true,
                                   .sampling = duet_sampling_greedy()};
    }
    q[0].logits = all;
    q[0].all_logits = true;
    assert_int_equal(duet_engine_forward(e, q, NSEQ, sampled), DUET_OK);
    k = PLEN;
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < NSEQ; i++) {
            tok[i] = forced != NULL ? forced[step * NSEQ + i] : sampled[i];
            inputs_out[step * NSEQ + i] = tok[i];
            q[i].start_pos += q[i].n_tokens;
            q[i].tokens = &tok[i];
            q[i].n_tokens = 1;
            q[i].all_logits = false;
            q[i].logits = all + (k + (size_t)i) * (size_t)vocab;
        }
        assert_int_equal(duet_engine_forward(e, q, NSEQ, sampled), DUET_OK);
        k += NSEQ;
    }
    *n_p = k * (size_t)vocab;
    return all;
}

static void compare_backends_tol(const char *dir, const char *name, double atol_frac, double l2tol,
                                 int agree_pct)
{
    duet_engine_t *ec = open_engine(dir, "cpu", 1), *eg = open_engine(dir, "cuda", 1);
    int vocab = duet_engine_model(ec)->cfg.vocab;
    seqs_t s;
    int32_t in_c[STEPS * NSEQ], in_g[STEPS * NSEQ];
    size_t n;

    seqs_init(&s, vocab);
    /* the cpu runs free; the cuda engine is fed the cpu's tokens */
    float *ref = run_logits(ec, &s, NULL, vocab, &n, in_c);
    float *got = run_logits(eg, &s, in_c, vocab, &n, in_g);
    char what[96];
    snprintf(what, sizeof(what), "engine logits %s", name);
    DUET_TEST_ASSERT_CLOSE(what, got, ref, n, 0.0, atol_frac, l2tol);
    int agree = 0, rows = (int)(n / (size_t)vocab);
    for (int r = 0; r < rows; r++)
        agree += argmax(got + (size_t)r * vocab, vocab) == argmax(ref + (size_t)r * vocab, vocab);
    fprintf(stderr, "engine %s: argmax agrees on %d of %d rows\n", name, agree, rows);
    assert_true(agree >= rows * agree_pct / 100);
    duet_free(ref);
    duet_free(got);
    duet_engine_destroy(ec);
    duet_engine_destroy(eg);
}

static void compare_backends(const char *dir, const char *name)
{
    compare_backends_tol(dir, name, 6e-2, 3e-2, 90);
}

static void test_against_cpu(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    compare_backends(make_model("gqa64", DUET_ARCH_LLAMA, 256, 4, 2, 64, false), "gqa hd64");
    compare_backends(make_model("qwen32", DUET_ARCH_QWEN2, 128, 4, 2, 32, false),
                     "qwen2 bias hd32");
    compare_backends(make_model("mqa128", DUET_ARCH_LLAMA, 256, 2, 1, 128, true), "mqa hd128 tied");
    /* rope_scaling (the model's table on both backends) and Qwen3's q/k
     * norms (head_rmsnorm) with yarn's attention factor */
    compare_backends(make_model_rs("llama3rs", DUET_ARCH_LLAMA, 256, 4, 2, 64, false,
                                   "{\"rope_type\": \"llama3\", \"factor\": 8, "
                                   "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                                   "\"original_max_position_embeddings\": 16}"),
                     "llama3 rope hd64");
    compare_backends(make_model_rs("qwen3yarn", DUET_ARCH_QWEN3, 128, 4, 2, 64, true,
                                   "{\"rope_type\": \"yarn\", \"factor\": 4, "
                                   "\"original_max_position_embeddings\": 16}"),
                     "qwen3 yarn hd64 tied");
    /* FP8 checkpoints: the cpu dequantizes exactly, cuda keeps e4m3.  With
     * DUET_CUDA_FP8_GEMM=0 every matmul is the FP8 GEMV (exact weights,
     * bf16 activations): the bf16 bound.  By default the prompt (81
     * tokens) goes through cuBLASLt FP8 with activations quantized per
     * token to e4m3: a numpy simulation of exactly that on these synthetic
     * models gives logits rel_l2 0.12-0.18 and argmax agreement near 80%
     * (random weights amplify the error; docs/fp8.md), hence the loose
     * bound there -- a wrong scale or layout gives rel_l2 near 1. */
    static char ch_dir[512], t_dir[512]; /* make_model_q returns a static buffer */
    snprintf(ch_dir, sizeof(ch_dir), "%s",
             make_model_q("fp8ch", DUET_ARCH_LLAMA, 256, 4, 2, 64, false, NULL,
                          DUET_MKMODEL_FP8_CHANNEL));
    snprintf(
        t_dir, sizeof(t_dir), "%s",
        make_model_q("fp8t", DUET_ARCH_QWEN2, 128, 4, 2, 32, false, NULL, DUET_MKMODEL_FP8_TENSOR));
    setenv("DUET_CUDA_FP8_GEMM", "0", 1);
    compare_backends(ch_dir, "fp8 channel gqa hd64, gemv only");
    compare_backends(t_dir, "fp8 tensor qwen2 bias hd32, gemv only");
    unsetenv("DUET_CUDA_FP8_GEMM");
    compare_backends_tol(ch_dir, "fp8 channel gqa hd64", 0.45, 0.3, 60);
    compare_backends_tol(t_dir, "fp8 tensor qwen2 bias hd32", 0.45, 0.3, 60);
}

/* steps with changing batch sizes; logits or device greedy */
static void run_steps(duet_engine_t *e, const seqs_t *s, bool with_logits, int vocab, float *logits,
                      int32_t *tokens)
{
    static const int sizes[] = {3, 3, 3, 2, 2, 2, 3, 1, 1, 1, 3};
    const int n_steps = (int)(sizeof(sizes) / sizeof(sizes[0]));
    duet_engine_seq_t q[NSEQ];
    int32_t sampled[NSEQ], tok[NSEQ];
    for (int i = 0; i < NSEQ; i++)
        q[i] = (duet_engine_seq_t){.tokens = s->prompt[i],
                                   .n_tokens = s->plen[i],
                                   .pages = s->pages[i],
                                   .n_pages = 16,
                                   .sample = true,
                                   .sampling = duet_sampling_greedy()};
    assert_int_equal(duet_engine_forward(e, q, NSEQ, sampled), DUET_OK);
    for (int i = 0; i < NSEQ; i++) {
        tok[i] = sampled[i];
        q[i].start_pos = q[i].n_tokens;
        q[i].tokens = &tok[i];
        q[i].n_tokens = 1;
    }
    for (int step = 0; step < n_steps; step++) {
        int b = sizes[step];
        for (int i = 0; i < b; i++)
            q[i].logits = with_logits ? logits + ((size_t)step * NSEQ + i) * (size_t)vocab : NULL;
        assert_int_equal(duet_engine_forward(e, q, b, sampled), DUET_OK);
        for (int i = 0; i < b; i++) {
            tokens[step * NSEQ + i] = sampled[i];
            tok[i] = sampled[i];
            q[i].start_pos++;
        }
    }
}

static void test_graphs_bitwise(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    const char *dir = make_model("gqa64", DUET_ARCH_LLAMA, 256, 4, 2, 64, false);
    for (int with_logits = 0; with_logits < 2; with_logits++) {
        seqs_t s;
        size_t nl = (size_t)11 * NSEQ * 600;
        float *l1 = duet_calloc(nl, sizeof(float)), *l2 = duet_calloc(nl, sizeof(float));
        int32_t t1[11 * NSEQ], t2[11 * NSEQ];
        memset(t1, 0, sizeof(t1));
        memset(t2, 0, sizeof(t2));
        setenv("DUET_CUDA_GRAPHS", "1", 1);
        duet_engine_t *e1 = open_engine(dir, "cuda", 1);
        setenv("DUET_CUDA_GRAPHS", "0", 1);
        duet_engine_t *e2 = open_engine(dir, "cuda", 1);
        unsetenv("DUET_CUDA_GRAPHS");
        seqs_init(&s, 600);
        run_steps(e1, &s, with_logits, 600, l1, t1);
        run_steps(e2, &s, with_logits, 600, l2, t2);
        assert_memory_equal(t1, t2, sizeof(t1));
        assert_memory_equal(l1, l2, nl * sizeof(float));
        fprintf(stderr, "graphs vs eager (%s): tokens and logits bitwise equal ok\n",
                with_logits ? "logits" : "device greedy");
        duet_engine_destroy(e1);
        duet_engine_destroy(e2);
        duet_free(l1);
        duet_free(l2);
    }
}

/* TP=tp over NCCL against TP=1 on two models (kv 2: at TP=4 each KV head
 * is replicated on two ranks). */
static void check_tp_nccl(int tp)
{
    const char *names[2] = {"gqa64", "qwen32"};
    for (int m = 0; m < 2; m++) {
        const char *dir = m == 0 ? make_model("gqa64", DUET_ARCH_LLAMA, 256, 4, 2, 64, false)
                                 : make_model("qwen32", DUET_ARCH_QWEN2, 128, 4, 2, 32, false);
        duet_engine_t *e1 = open_engine(dir, "cuda", 1), *e2 = open_engine(dir, "cuda", tp);
        seqs_t s;
        int32_t g1[STEPS * NSEQ], g2[STEPS * NSEQ]; /* tokens fed = tokens sampled */
        size_t n;
        seqs_init(&s, 600);
        float *l1 = run_logits(e1, &s, NULL, 600, &n, g1);
        float *l2 = run_logits(e2, &s, NULL, 600, &n, g2);
        int same = 0;
        while (same < STEPS * NSEQ && g1[same] == g2[same])
            same++;
        fprintf(stderr, "tp%d vs tp1 %s: greedy tokens equal for %d of %d\n", tp, names[m], same,
                STEPS * NSEQ);
        char what[64];
        snprintf(what, sizeof(what), "tp%d vs tp1 logits %s", tp, names[m]);
        /* logits compared while the token streams agree */
        size_t cmp = same == STEPS * NSEQ ? n : (size_t)PLEN * 600;
        DUET_TEST_ASSERT_CLOSE(what, l2, l1, cmp, 0.0, 6e-2, 3e-2);
        if (same < STEPS * NSEQ) {
            /* bf16 sums differ between TP sizes: a divergence is allowed
             * only where TP=1 itself barely preferred its token (DESIGN
             * §10), within the logits error measured above (~0.2) */
            int step = same / NSEQ, i = same % NSEQ;
            /* the first sampled token comes from the prompt's last row;
             * every prompt row is kept for sequence 0 only */
            if (step == 0 && i > 0)
                fail_msg("%s: tokens differ at the first step (seq %d)", names[m], i);
            size_t row = step == 0 ? (size_t)s.plen[0] - 1
                                   : PLEN + (size_t)(step - 1) * NSEQ + (size_t)i;
            float gap = l1[row * 600 + (size_t)g1[same]] - l1[row * 600 + (size_t)g2[same]];
            fprintf(stderr,
                    "tp%d vs tp1 %s: first divergence at step %d seq %d: tp1 %d, tp%d %d, "
                    "tp1 margin %.4f (near-tie bound 0.25)\n",
                    tp, names[m], step, i, g1[same], tp, g2[same], (double)gap);
            assert_true(gap >= 0.0f && gap <= 0.25f);
        }
        duet_free(l1);
        duet_free(l2);
        duet_engine_destroy(e1);
        duet_engine_destroy(e2);
    }
}

static void test_tp_nccl(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    int n = duet_cuda_device_count();
    if (n < 2) {
        fprintf(stderr, "fewer than 2 CUDA devices: TP=2 and TP=4 skipped\n");
        skip();
    }
    check_tp_nccl(2);
    if (n >= 4)
        check_tp_nccl(4);
    else
        fprintf(stderr, "fewer than 4 CUDA devices: TP=4 skipped\n");
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/duet-test-cuda-engine-%d", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : 0;
}
#else
static void test_against_cpu(void **state)
{
    (void)state;
    skip();
}

static void test_graphs_bitwise(void **state)
{
    (void)state;
    skip();
}

static void test_tp_nccl(void **state)
{
    (void)state;
    skip();
}

static int setup(void **state)
{
    (void)state;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return 0;
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_cpu),
        cmocka_unit_test(test_graphs_bitwise),
        cmocka_unit_test(test_tp_nccl),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
