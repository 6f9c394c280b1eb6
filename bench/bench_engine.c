/* Engine benchmark (not a test): prefill and decode tokens/s of a
 * bench-124m-shaped synthetic model (../shared/BENCHMARKS.md) on the cpu
 * backend, next to the memory-bandwidth roofline measured in the same run.
 *
 *   bench_engine [--dtype f32|f16|bf16] [--threads N] [--tp N]
 *                [--prompt 512] [--decode 128] [--batch 16] [--reps 3]
 *                [--model DIR]
 *
 * prefill: one prompt of --prompt tokens (llama-bench pp512), logits of the
 * last token only.  decode: batch 1 generating --decode tokens from an
 * empty context (tg128), and --batch sequences decoding together.
 * Roofline: weight bytes read per decode step (every matrix once; the
 * embedding table contributes one row) / copy bandwidth. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/membw.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "engine/cpu/matmul.h"
#include "engine/engine.h"
#include "synth/mkmodel.h"

typedef struct {
    const char *dtype;
    const char *model;
    int threads, tp, prompt, decode, batch, reps;
} bench_args_t;

static int parse(int argc, char **argv, bench_args_t *a)
{
    *a = (bench_args_t){"f32", NULL, 1, 1, 512, 128, 16, 3};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            return -1;
        if (strcmp(k, "--dtype") == 0)
            a->dtype = v;
        else if (strcmp(k, "--model") == 0)
            a->model = v;
        else if (strcmp(k, "--threads") == 0)
            a->threads = atoi(v);
        else if (strcmp(k, "--tp") == 0)
            a->tp = atoi(v);
        else if (strcmp(k, "--prompt") == 0)
            a->prompt = atoi(v);
        else if (strcmp(k, "--decode") == 0)
            a->decode = atoi(v);
        else if (strcmp(k, "--batch") == 0)
            a->batch = atoi(v);
        else if (strcmp(k, "--reps") == 0)
            a->reps = atoi(v);
        else
            return -1;
        i++;
    }
    return a->threads > 0 && a->tp > 0 && a->prompt > 0 && a->decode > 0 && a->batch > 0 &&
                   a->reps > 0
               ? 0
               : -1;
}

static double secs(int64_t t0)
{
    return (double)(duet_now_ns() - t0) / 1e9;
}

int main(int argc, char **argv)
{
    bench_args_t a;
    char dir[256];
    duet_engine_t *e;
    duet_status_t st;

    if (parse(argc, argv, &a) != 0) {
        fprintf(stderr, "usage: bench_engine [--dtype f32|f16|bf16] [--threads N] [--tp N] "
                        "[--prompt N] [--decode N] [--batch N] [--reps N] [--model DIR]\n");
        return 2;
    }
    duet_mkmodel_opts_t mo = duet_mkmodel_opts_default();
    duet_mkmodel_preset("bench-124m", &mo);
    mo.dtype = strcmp(a.dtype, "f16") == 0    ? DUET_DTYPE_F16
               : strcmp(a.dtype, "bf16") == 0 ? DUET_DTYPE_BF16
                                              : DUET_DTYPE_F32;
    if (a.model == NULL) {
        struct stat sb;
        snprintf(dir, sizeof(dir), "/tmp/duet-bench-124m-%s", a.dtype);
        if (stat(dir, &sb) != 0) {
            fprintf(stderr, "writing %s ...\n", dir);
            if (duet_mkmodel_write(dir, &mo) != DUET_OK) {
                fprintf(stderr, "mkmodel: %s\n", duet_error_msg());
                return 1;
            }
        }
        a.model = dir;
    }

    double bw = duet_bench_membw_copy(a.threads * a.tp, 256u << 20);

    duet_engine_opts_t eo;
    duet_engine_opts_default(&eo);
    eo.model_dir = a.model;
    eo.tp = a.tp;
    eo.threads = a.threads;
    eo.page_size = 16;
    int ctx = a.prompt > a.decode ? a.prompt : a.decode;
    int pages_per_seq = (ctx + 16) / 16 + 1;
    eo.n_pages = pages_per_seq * a.batch;
    eo.max_batch_tokens = a.prompt > 2048 ? a.prompt : 2048;
    eo.max_seqs = a.batch;
    st = duet_engine_create(&eo, &e);
    if (st != DUET_OK) {
        fprintf(stderr, "engine: %s\n", duet_error_msg());
        return 1;
    }
    const duet_model_config_t *cfg = &duet_engine_model(e)->cfg;
    double esz = (double)duet_dtype_size(mo.dtype);
    /* matrices read per decoded token (lm_head included, embedding excluded) */
    double mat_params = (double)cfg->n_layers *
                            ((double)cfg->hidden * cfg->head_dim *
                                 (cfg->n_heads * 2.0 + cfg->n_kv_heads * 2.0) +
                             3.0 * cfg->hidden * cfg->intermediate) +
                        (double)cfg->vocab * cfg->hidden;
    double bytes_per_step = mat_params * esz;
    double roof = bw * 1e9 / bytes_per_step;

    int32_t *tokens = duet_malloc((size_t)a.prompt * sizeof(int32_t));
    int32_t *pages = duet_malloc((size_t)eo.n_pages * sizeof(int32_t));
    int32_t *next = duet_malloc((size_t)a.batch * sizeof(int32_t));
    duet_engine_seq_t *seqs = duet_calloc((size_t)a.batch, sizeof(duet_engine_seq_t));
    for (int i = 0; i < a.prompt; i++)
        tokens[i] = (i * 7919 + 13) % (cfg->vocab - 2);
    for (int i = 0; i < eo.n_pages; i++)
        pages[i] = i;

    /* prefill */
    double best_pp = 0;
    for (int r = 0; r < a.reps; r++) {
        duet_engine_seq_t s = {.tokens = tokens, .n_tokens = a.prompt, .pages = pages,
                               .n_pages = pages_per_seq, .sample = true,
                               .sampling = duet_sampling_greedy()};
        int64_t t0 = duet_now_ns();
        if (duet_engine_forward(e, &s, 1, next) != DUET_OK)
            goto fail;
        double tps = a.prompt / secs(t0);
        if (tps > best_pp)
            best_pp = tps;
    }

    /* decode, batch 1 and batch B, from an empty context */
    double best_tg[2] = {0, 0};
    int batches[2] = {1, a.batch};
    for (int bi = 0; bi < 2; bi++) {
        int B = batches[bi];
        for (int r = 0; r < a.reps; r++) {
            for (int s = 0; s < B; s++) {
                seqs[s] = (duet_engine_seq_t){.tokens = &tokens[s], .n_tokens = 1,
                                              .pages = pages + s * pages_per_seq,
                                              .n_pages = pages_per_seq, .sample = true,
                                              .sampling = duet_sampling_greedy()};
            }
            int64_t t0 = duet_now_ns();
            for (int step = 0; step < a.decode; step++) {
                if (duet_engine_forward(e, seqs, B, next) != DUET_OK)
                    goto fail;
                for (int s = 0; s < B; s++) {
                    seqs[s].start_pos++;
                    seqs[s].tokens = &tokens[(s + step + 1) % a.prompt];
                }
            }
            double tps = (double)B * a.decode / secs(t0);
            if (tps > best_tg[bi])
                best_tg[bi] = tps;
        }
    }

    printf("bench_engine: bench-124m %s, cpu backend, tp %d x %d thread(s), kernels %s\n",
           a.dtype, a.tp, a.threads, duet_cpu_matmul_isa());
    printf("  copy bandwidth          %8.1f GB/s  (%d thread(s), 256 MiB arrays)\n", bw,
           a.threads * a.tp);
    printf("  weights read per step   %8.1f MB     -> decode roofline %.1f tok/s\n",
           bytes_per_step / 1e6, roof);
    printf("  prefill pp%-4d          %8.1f tok/s\n", a.prompt, best_pp);
    printf("  decode  tg%-4d batch 1  %8.1f tok/s  (%.0f%% of roofline)\n", a.decode,
           best_tg[0], 100.0 * best_tg[0] / roof);
    printf("  decode  tg%-4d batch %-2d %8.1f tok/s  (%.1f steps/s, %.0f%% of roofline per step)\n",
           a.decode, a.batch, best_tg[1], best_tg[1] / a.batch,
           100.0 * best_tg[1] / a.batch / roof);
    duet_engine_destroy(e);
    duet_free(tokens);
    duet_free(pages);
    duet_free(next);
    duet_free(seqs);
    return 0;
fail:
    fprintf(stderr, "forward: %s\n", duet_error_msg());
    duet_engine_destroy(e);
    return 1;
}
