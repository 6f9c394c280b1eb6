/* Decode attention benchmark (not a test): the cuda backend's attention
 * kernel alone over a paged KV pool, one query token per sequence at the
 * end of a ctx-token context, for each (batch, ctx).  Reports the KV bytes
 * the step must read (K and V of every context token of every sequence)
 * divided by the kernel time, against the device-to-device copy bandwidth
 * measured in the same run -- for flash-decoding on tensor cores (flash) and
 * on CUDA cores (cores) and the legacy per-token kernel side by side
 * (DUET_CUDA_DECODE_ATTN picks one per rank).
 *
 *   bench_attention [--heads 32/8] [--head-dim 128] [--batches 1,16,64]
 *                   [--ctx 1024,4096,8192] [--page 16] [--reps 50]
 *                   [--variants flash,cores,legacy]
 *
 * Pages of a sequence are a shuffled set of the pool (as a long-running
 * server's are); KV contents are random bf16.  Time: --reps launches queued
 * back to back, host clock around them after a synchronize (launch costs
 * hide behind the kernels except for the smallest shapes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include <cuda_runtime.h>

#include "bench/gpu_bench.h"

#include "engine/cuda/backend_cuda.h"

typedef struct {
    int nq, nkv, hd, page, reps;
    int batches[8], n_batches;
    int ctx[8], n_ctx;
    char variants[64];
} args_t;

static int parse(int argc, char **argv, args_t *a)
{
    memset(a, 0, sizeof(*a));
    a->nq = 32;
    a->nkv = 8;
    a->hd = 128;
    a->page = 16;
    a->reps = 50;
    a->n_batches = duet_bench_list("1,16,64", a->batches, 8);
    a->n_ctx = duet_bench_list("1024,4096,8192", a->ctx, 8);
    snprintf(a->variants, sizeof(a->variants), "flash,cores,legacy");
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--heads") == 0) {
            if (sscanf(v, "%d/%d", &a->nq, &a->nkv) != 2)
                return -1;
        } else if (strcmp(k, "--head-dim") == 0) {
            a->hd = atoi(v);
        } else if (strcmp(k, "--page") == 0) {
            a->page = atoi(v);
        } else if (strcmp(k, "--reps") == 0) {
            a->reps = atoi(v);
        } else if (strcmp(k, "--batches") == 0) {
            a->n_batches = duet_bench_list(v, a->batches, 8);
        } else if (strcmp(k, "--ctx") == 0) {
            a->n_ctx = duet_bench_list(v, a->ctx, 8);
        } else if (strcmp(k, "--variants") == 0) {
            snprintf(a->variants, sizeof(a->variants), "%s", v);
        } else {
            return -1;
        }
    }
    return a->nq > 0 && a->nkv > 0 && a->nq % a->nkv == 0 && a->hd > 0 && a->page > 0 &&
                   a->reps > 0 && a->n_batches > 0 && a->n_ctx > 0
               ? 0
               : -1;
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* One variant over every (batch, ctx): GB/s of KV read, or -1. */
static int run_variant(const args_t *a, const char *variant, double bw, int max_b, int max_ctx)
{
    int stride = (max_ctx + a->page - 1) / a->page;
    int n_pages = max_b * stride;
    duet_kv_layout_t kv = {1, n_pages, a->page, a->nkv, a->hd, 2};
    duet_backend_rank_opts_t o = {.rank = 0, .tp = 1, .threads = 1, .device = 0, .kv_layout = kv};
    duet_backend_rank_t *r = NULL;
    const duet_backend_ops_t *ops = &duet_backend_cuda;
    size_t kv_bytes = duet_kv_total_bytes(&kv);
    int w = (a->nq + 2 * a->nkv) * a->hd;
    int rc = -1;

    setenv("DUET_CUDA_DECODE_ATTN", variant, 1);
    if (ops->rank_create(&o, &r) != DUET_OK) {
        fprintf(stderr, "rank: %s\n", duet_error_msg());
        return -1;
    }
    void *pool = ops->alloc(r, kv_bytes);
    void *qkv = ops->alloc(r, (size_t)max_b * (size_t)w * 2);
    void *out = ops->alloc(r, (size_t)max_b * (size_t)a->nq * (size_t)a->hd * 2);
    size_t chunk = (size_t)64 << 20;
    uint16_t *h = duet_malloc(chunk);
    int32_t *perm = duet_malloc((size_t)n_pages * sizeof(int32_t));
    int32_t *pos = duet_malloc((size_t)max_b * sizeof(int32_t));
    int32_t *slots = duet_malloc((size_t)max_b * sizeof(int32_t));
    int32_t *tok = duet_calloc((size_t)max_b, sizeof(int32_t));
    int32_t *qs = duet_malloc((size_t)(max_b + 1) * sizeof(int32_t));
    int32_t *cl = duet_malloc((size_t)max_b * sizeof(int32_t));
    if (pool == NULL || qkv == NULL || out == NULL || h == NULL || perm == NULL || pos == NULL ||
        slots == NULL || tok == NULL || qs == NULL || cl == NULL) {
        fprintf(stderr, "bench_attention: no memory for %d pages\n", n_pages);
        goto done;
    }
    uint64_t seed = 42;
    for (size_t i = 0; i < chunk / 2; i++) /* bf16 in about [-2, 2] */
        h[i] = (uint16_t)(0x3c00u + (rng_next(&seed) & 0x3ffu)) | (rng_next(&seed) & 1u ? 0x8000u : 0u);
    for (size_t off = 0; off < kv_bytes; off += chunk)
        if (ops->upload(r, (char *)pool + off, h,
                        kv_bytes - off < chunk ? kv_bytes - off : chunk) != DUET_OK)
            goto done;
    if (ops->upload(r, qkv, h, (size_t)max_b * (size_t)w * 2) != DUET_OK)
        goto done;
    ops->kv_attach(r, pool);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(rng_next(&seed) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int bi = 0; bi < a->n_batches; bi++) {
        for (int ci = 0; ci < a->n_ctx; ci++) {
            int B = a->batches[bi], ctx = a->ctx[ci];
            duet_batch_desc_t d = {.n_tokens = B,
                                   .n_seqs = B,
                                   .tokens = tok,
                                   .positions = pos,
                                   .slots = slots,
                                   .q_start = qs,
                                   .ctx_len = cl,
                                   .page_table = perm,
                                   .page_stride = stride,
                                   .max_ctx = ctx};
            for (int s = 0; s < B; s++) {
                pos[s] = ctx - 1;
                cl[s] = ctx;
                qs[s] = s;
                slots[s] = perm[s * stride + (ctx - 1) / a->page] * a->page + (ctx - 1) % a->page;
            }
            qs[B] = B;
            if (ops->batch_prepare(r, &d) != DUET_OK)
                goto done;
            for (int i = 0; i < 3; i++)
                if (ops->attention(r, out, qkv, B, a->nq, a->nkv, a->hd, 0) != DUET_OK)
                    goto done;
            if (ops->sync(r) != DUET_OK)
                goto done;
            uint64_t t0 = duet_now_ns();
            for (int i = 0; i < a->reps; i++)
                if (ops->attention(r, out, qkv, B, a->nq, a->nkv, a->hd, 0) != DUET_OK)
                    goto done;
            if (ops->sync(r) != DUET_OK)
                goto done;
            double us = (double)(duet_now_ns() - t0) / 1e3 / a->reps;
            double bytes = (double)B * ctx * a->nkv * a->hd * 2.0 * 2.0;
            double gbs = bytes / (us * 1e-6) / 1e9;
            printf("  %-6s batch %-3d ctx %-6d %9.1f us  KV %8.1f MB  %7.0f GB/s  %.2f of copy\n",
                   variant, B, ctx, us, bytes / 1e6, gbs, gbs / bw);
        }
    }
    rc = 0;
done:
    if (rc != 0)
        fprintf(stderr, "bench_attention: %s\n", duet_error_msg());
    ops->free(r, pool);
    ops->free(r, qkv);
    ops->free(r, out);
    ops->rank_destroy(r);
    duet_free(h);
    duet_free(perm);
    duet_free(pos);
    duet_free(slots);
    duet_free(tok);
    duet_free(qs);
    duet_free(cl);
    unsetenv("DUET_CUDA_DECODE_ATTN");
    return rc;
}

int main(int argc, char **argv)
{
    args_t a;
    struct cudaDeviceProp prop;
    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: bench_attention [--heads NQ/NKV] [--head-dim D] [--batches ...] "
                        "[--ctx ...] [--page N] [--reps N] [--variants flash,cores,legacy]\n");
        return 2;
    }
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        fprintf(stderr, "bench_attention: no CUDA device\n");
        return 1;
    }
    int max_b = 1, max_ctx = 1;
    for (int i = 0; i < a.n_batches; i++)
        max_b = a.batches[i] > max_b ? a.batches[i] : max_b;
    for (int i = 0; i < a.n_ctx; i++)
        max_ctx = a.ctx[i] > max_ctx ? a.ctx[i] : max_ctx;
    double bw = duet_bench_copy_bandwidth();
    printf("bench_attention: %s (%d SMs), heads %d/%d head_dim %d, page %d\n", prop.name,
           prop.multiProcessorCount, a.nq, a.nkv, a.hd, a.page);
    printf("  HBM copy bandwidth %.0f GB/s (1 GiB D2D, read + write)\n", bw);
    char list[64];
    snprintf(list, sizeof(list), "%s", a.variants);
    for (char *save = NULL, *v = strtok_r(list, ",", &save); v != NULL;
         v = strtok_r(NULL, ",", &save))
        if (run_variant(&a, v, bw, max_b, max_ctx) != 0)
            return 1;
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "bench_attention: this build has no CUDA backend\n");
    return 1;
}
#endif
