/* cuda rope_kv_store against the cpu backend: the rotated q/k heads left
 * in qkv (v untouched) and the k/v rows stored in the paged cache at each
 * token's slot, through a shuffled page table, for several head sizes,
 * theta and large positions.  Both rotate the same bf16 inputs in float32
 * with the same angles (pos * inv_freq in float32); the GPU rounds to bf16
 * once.  Bound: |err| <= 2^-7 |ref| + 2^-9 max|ref|, rel_l2 <= 4e-3. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/backend.h"
#include "model/rope.h"

#ifdef DUET_HAVE_CUDA
#include "tests/gpu/cuda_test_util.h"

/* rope_scaling: 0 none, 1 llama3 (factor 8, 1, 4, 8192), 2 yarn
 * (factor 4, original 32768: attention factor 1.1386) -- the tables of
 * model/rope.c, the same on both backends */
static void run_scaled(int nq, int nkv, int hd, float theta, int pos0, int scaling)
{
    duet_model_config_t cfg = {.head_dim = hd, .rope_theta = theta};
    float tab[512];
    cfg.rope_scaling.factor = 1.0;
    cfg.rope_scaling.attention_factor = 1.0;
    if (scaling == 1)
        cfg.rope_scaling = (duet_rope_scaling_t){.type = DUET_ROPE_LLAMA3,
                                                 .factor = 8,
                                                 .low_freq_factor = 1,
                                                 .high_freq_factor = 4,
                                                 .orig_max_pos = 8192,
                                                 .attention_factor = 1};
    else if (scaling == 2)
        cfg.rope_scaling = (duet_rope_scaling_t){.type = DUET_ROPE_YARN,
                                                 .factor = 4,
                                                 .orig_max_pos = 32768,
                                                 .beta_fast = 32,
                                                 .beta_slow = 1,
                                                 .truncate = true,
                                                 .attention_factor = 0.1 * log(4.0) + 1.0};
    duet_rope_inv_freq(&cfg, tab);
    float attn = (float)cfg.rope_scaling.attention_factor;

    duet_test_rng_t g = {31u * (unsigned)hd + (unsigned)pos0};
    int ps = 16, stride = (pos0 + 40) / ps + 1, n_pages = 3 * stride + 2;
    duet_kv_layout_t kv = {2, n_pages, ps, nkv, hd, 2};
    duet_test_pair_t p;
    duet_test_batch_t b;
    int n_new[3] = {9, 1, 30}, start[3] = {pos0, pos0 + 3, 0};
    duet_test_pair_open(&p, kv);
    duet_test_batch_make(&b, 3, n_new, start, ps, n_pages, stride, 100);
    int n = b.d.n_tokens, w = (nq + 2 * nkv) * hd;
    size_t nw = (size_t)n * w;
    float *qkv = duet_malloc(nw * sizeof(float)), *got = duet_malloc(nw * sizeof(float));
    duet_test_fill(&g, qkv, nw, 2.0f);
    void *dqkv = duet_test_dev_bf16(&duet_backend_cuda, p.gpu, qkv, nw);
    assert_int_equal(duet_backend_cpu.batch_prepare(p.cpu, &b.d), 0);
    assert_int_equal(duet_backend_cuda.batch_prepare(p.gpu, &b.d), 0);
    assert_int_equal(duet_backend_cpu.rope_kv_store(p.cpu, qkv, n, nq, nkv, hd, tab, attn, 1), 0);
    assert_int_equal(duet_backend_cuda.rope_kv_store(p.gpu, dqkv, n, nq, nkv, hd, tab, attn, 1), 0);
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p.gpu, dqkv, got, nw), 0);
    char what[112];
    snprintf(what, sizeof(what), "rope qkv %d/%d hd %d theta %g pos %d scaling %d", nq, nkv, hd,
             theta, pos0, scaling);
    DUET_TEST_ASSERT_CLOSE(what, got, qkv, nw, 1.0 / 128, 1.0 / 512, 4e-3);

    /* the written cache rows: gather them from both pools */
    duet_kv_layout_t k4 = kv, k2 = kv;
    k4.elem_size = 4;
    size_t tot2 = duet_kv_total_bytes(&k2) / 2;
    float *cache = duet_malloc(tot2 * sizeof(float));
    assert_int_equal(duet_test_host_f32(&duet_backend_cuda, p.gpu, p.kv_gpu, cache, tot2), 0);
    size_t m = (size_t)n * 2 * nkv * hd;
    float *cr = duet_malloc(m * sizeof(float)), *cg = duet_malloc(m * sizeof(float));
    size_t j = 0;
    for (int t = 0; t < n; t++) {
        int page = b.slots[t] / ps, off = b.slots[t] % ps;
        for (int which = 0; which < 2; which++) {
            for (int h = 0; h < nkv; h++) {
                size_t o4 = duet_kv_offset(&k4, 1, which, page, h) / 4 + (size_t)off * hd;
                size_t o2 = duet_kv_offset(&k2, 1, which, page, h) / 2 + (size_t)off * hd;
                for (int d = 0; d < hd; d++, j++) {
                    cr[j] = ((const float *)p.kv_cpu)[o4 + d];
                    cg[j] = cache[o2 + d];
                }
            }
        }
    }
    snprintf(what, sizeof(what), "rope cache hd %d pos %d", hd, pos0);
    DUET_TEST_ASSERT_CLOSE(what, cg, cr, m, 1.0 / 128, 1.0 / 512, 4e-3);
    duet_backend_cuda.free(p.gpu, dqkv);
    duet_free(cache);
    duet_free(cr);
    duet_free(cg);
    duet_free(qkv);
    duet_free(got);
    duet_test_batch_free(&b);
    duet_test_pair_close(&p);
}

static void run(int nq, int nkv, int hd, float theta, int pos0)
{
    run_scaled(nq, nkv, hd, theta, pos0, 0);
}

static void test_rope_kv_store(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    run(4, 2, 64, 10000.0f, 0);
    run(8, 2, 128, 500000.0f, 3000);
    run(4, 4, 16, 10000.0f, 7);
    run(8, 4, 8, 10000.0f, 100);
    run(32, 8, 128, 1000000.0f, 8000);
    run_scaled(8, 2, 128, 500000.0f, 9000, 1);
    run_scaled(4, 2, 64, 1000000.0f, 40000, 2);
}
#else
static void test_rope_kv_store(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rope_kv_store)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
