/* bench_matmul: the CPU matmul on the bench-124m shapes against the memory
 * roofline and OpenBLAS sgemm/sgemv (when built with it).
 *
 *   decode  n = 1 and 16: weight bytes streamed per second and % of the
 *           STREAM-like copy bandwidth (bench/membw.h).  Each matrix exists
 *           in enough copies (>= 96 MiB) used in turn that weights come from
 *           DRAM as in a real decode step, not from the 32 MiB L3.
 *   prefill n = 512: GFLOP/s (2 n m k / t).
 *   model   the 12 layers' matmuls in model order: decode GB/s and tok/s,
 *           prefill tok/s (lm_head excluded from prefill: a prompt needs
 *           logits for its last token only).
 *
 * Usage: bench_matmul [-t 1,2] [-d F32,F16,BF16] [-s seconds per point] [-q] [-m]
 *   -q: quick (prefill and decode of a few shapes only); -m: model rows only.
 * Figures are the best of several timed runs; ours and OpenBLAS run side by
 * side ("speedup" = OpenBLAS time / ours).  OpenBLAS has no F16/BF16 weights:
 * those rows show ours only.  The matmul ISA follows DUET_CPU_ISA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/membw.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/pool.h"

#ifdef DUET_HAVE_OPENBLAS
#include <cblas.h>
#endif

#define N_LAYERS 12

typedef struct {
    const char *name;
    int m, k;
} shape_t;

/* bench-124m: hidden 768, 12 heads / 4 KV heads of 64, intermediate 2048,
 * vocab 32000. */
static const shape_t shapes[] = {
    {"q", 768, 768},     {"k", 256, 768},   {"v", 256, 768},     {"o", 768, 768},
    {"gate", 2048, 768}, {"up", 2048, 768}, {"down", 768, 2048}, {"lm_head", 32000, 768},
};
#define N_SHAPES ((int)(sizeof(shapes) / sizeof(shapes[0])))
#define LM_HEAD  (N_SHAPES - 1)

/* Decode rows stream at least this many bytes of distinct copies of a
 * matrix per pass (the L3 is 32 MiB), so weights come from DRAM. */
#define COLD_BYTES ((size_t)96 << 20)
#define MAX_COPIES 256

typedef struct {
    int copies;
    duet_cpu_weight_t w[MAX_COPIES];
    float *raw[MAX_COPIES]; /* row-major m x k, for OpenBLAS */
} mat_t;

static double g_seconds = 0.3;

static uint64_t g_rng = 88172645463325252ull;
static float rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void die(const char *what, duet_status_t st)
{
    fprintf(stderr, "bench_matmul: %s: %s (%s)\n", what, duet_status_str(st), duet_error_msg());
    exit(1);
}

/* At least min_copies copies, and enough for COLD_BYTES. */
static void mat_init(mat_t *mt, const shape_t *s, int min_copies, duet_dtype_t dt, int with_raw)
{
    size_t cnt = (size_t)s->m * s->k;
    size_t one = cnt * duet_dtype_size(dt);
    int copies = (int)((COLD_BYTES + one - 1) / one);
    if (copies < min_copies)
        copies = min_copies;
    if (copies > MAX_COPIES)
        copies = MAX_COPIES;
    float *src = duet_malloc(cnt * sizeof(float));
    if (src == NULL)
        die("malloc", DUET_ERR_NO_MEMORY);
    for (size_t i = 0; i < cnt; i++)
        src[i] = rnd() * 0.05f;
    mt->copies = copies;
    for (int c = 0; c < copies; c++) {
        duet_status_t st =
            duet_cpu_weight_pack(src, DUET_DTYPE_F32, s->k, 0, s->m, 0, s->k, dt, &mt->w[c]);
        if (st != DUET_OK)
            die("pack", st);
        mt->raw[c] = NULL;
        if (with_raw) {
            mt->raw[c] = duet_malloc(cnt * sizeof(float));
            if (mt->raw[c] == NULL)
                die("malloc", DUET_ERR_NO_MEMORY);
            memcpy(mt->raw[c], src, cnt * sizeof(float));
        }
    }
    duet_free(src);
}

static void mat_free(mat_t *mt)
{
    for (int c = 0; c < mt->copies; c++) {
        duet_cpu_weight_free(&mt->w[c]);
        duet_free(mt->raw[c]);
    }
}

typedef struct {
    duet_cpu_pool_t *pool;
    int threads;
    int blas; /* 0: ours, 1: OpenBLAS */
    int n;
    const float *x;
    float *y;
} runner_t;

/* One matmul of copy c of mt: ours or OpenBLAS. */
static void run_one(const runner_t *r, const mat_t *mt, int c)
{
    const duet_cpu_weight_t *w = &mt->w[c];
    if (!r->blas) {
        duet_cpu_matmul(r->pool, r->y, (size_t)w->rows, r->x, (size_t)w->cols, r->n, w, NULL);
        return;
    }
#ifdef DUET_HAVE_OPENBLAS
    if (r->n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, w->rows, w->cols, 1.0f, mt->raw[c], w->cols, r->x,
                    1, 0.0f, r->y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r->n, w->rows, w->cols, 1.0f, r->x,
                    w->cols, mt->raw[c], w->cols, 0.0f, r->y, w->rows);
#endif
}

typedef void (*pass_fn)(const runner_t *r, void *arg);

/* Best seconds per pass: 5 timed rounds of at least g_seconds / 5 each. */
static double time_best(pass_fn fn, const runner_t *r, void *arg)
{
    double best = 1e30;
    fn(r, arg); /* warm-up */
    for (int round = 0; round < 5; round++) {
        int64_t t0 = duet_now_ns(), t1;
        long passes = 0;
        do {
            fn(r, arg);
            passes++;
            t1 = duet_now_ns();
        } while ((double)(t1 - t0) * 1e-9 < g_seconds / 5);
        double per = (double)(t1 - t0) * 1e-9 / (double)passes;
        if (per < best)
            best = per;
    }
    return best;
}

static void pass_copies(const runner_t *r, void *arg)
{
    const mat_t *mt = arg;
    for (int c = 0; c < mt->copies; c++)
        run_one(r, mt, c);
}

typedef struct {
    mat_t *mats; /* [N_SHAPES] */
    int with_lm_head;
} model_t;

static void pass_model(const runner_t *r, void *arg)
{
    const model_t *md = arg;
    for (int l = 0; l < N_LAYERS; l++) {
        for (int s = 0; s < LM_HEAD; s++)
            run_one(r, &md->mats[s], l % md->mats[s].copies);
    }
    if (md->with_lm_head)
        run_one(r, &md->mats[LM_HEAD], 0);
}

static void blas_threads(int threads)
{
#ifdef DUET_HAVE_OPENBLAS
    openblas_set_num_threads(threads);
#else
    (void)threads;
#endif
}

/* OpenBLAS's idle threads spin for a while after a call: let them settle
 * before our next measurement. */
static void settle(void)
{
    struct timespec ts = {0, 150 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static int have_blas(void)
{
#ifdef DUET_HAVE_OPENBLAS
    return 1;
#else
    return 0;
#endif
}

static double pool_dispatch_us(duet_cpu_pool_t *pool);

int main(int argc, char **argv)
{
    int threads_list[4] = {1, 2}, n_threads = 2;
    duet_dtype_t dts[3] = {DUET_DTYPE_F32, DUET_DTYPE_F16};
    int n_dts = 2, quick = 0, model_only = 0, opt;
    double bw[3] = {0};
    size_t max_n = 512, max_k = 2048, max_m = 32000;

    while ((opt = getopt(argc, argv, "t:d:s:qm")) != -1) {
        switch (opt) {
        case 't':
            n_threads = 0;
            for (char *p = strtok(optarg, ","); p != NULL && n_threads < 4; p = strtok(NULL, ","))
                threads_list[n_threads++] = atoi(p) == 2 ? 2 : 1;
            break;
        case 'd':
            n_dts = 0;
            for (char *p = strtok(optarg, ","); p != NULL && n_dts < 3; p = strtok(NULL, ",")) {
                int d = duet_dtype_parse(p);
                if (d != DUET_DTYPE_F32 && d != DUET_DTYPE_F16 && d != DUET_DTYPE_BF16) {
                    fprintf(stderr, "bench_matmul: -d takes F32,F16,BF16\n");
                    return 2;
                }
                dts[n_dts++] = (duet_dtype_t)d;
            }
            break;
        case 's':
            g_seconds = atof(optarg);
            break;
        case 'q':
            quick = 1;
            break;
        case 'm':
            model_only = 1;
            break;
        default:
            fprintf(stderr, "usage: bench_matmul [-t 1,2] [-d F32,F16,BF16] [-s sec] [-q] [-m]\n");
            return 2;
        }
    }

    float *x = duet_aligned_alloc(64, max_n * max_k * sizeof(float));
    float *y = duet_aligned_alloc(64, max_n * max_m * sizeof(float));
    if (x == NULL || y == NULL)
        die("malloc", DUET_ERR_NO_MEMORY);
    for (size_t i = 0; i < max_n * max_k; i++)
        x[i] = rnd();
    memset(y, 0, max_n * max_m * sizeof(float));

    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("# bench_matmul: isa %s, OpenBLAS %s (OPENBLAS_CORETYPE=%s)\n", duet_cpu_matmul_isa(),
#ifdef DUET_HAVE_OPENBLAS
           openblas_get_corename(),
#else
           "not built in",
#endif
           ct != NULL ? ct : "unset");
    {
        duet_cpu_pool_t *pool;
        duet_status_t st = duet_cpu_pool_create(2, true, "bp", &pool);
        if (st != DUET_OK)
            die("pool", st);
        printf("# pool dispatch (2 threads, spin, empty job): %.2f us\n", pool_dispatch_us(pool));
        duet_cpu_pool_destroy(pool);
    }

    for (int di = 0; di < n_dts; di++) {
        duet_dtype_t dt = dts[di];
        mat_t *mats = duet_calloc(N_SHAPES, sizeof(mat_t));
        model_t md = {mats, 1};
        if (mats == NULL)
            die("malloc", DUET_ERR_NO_MEMORY);
        for (int s = 0; s < N_SHAPES; s++) {
            /* F32 rows carry the row-major copies OpenBLAS reads. */
            mat_init(&mats[s], &shapes[s], s == LM_HEAD ? 1 : N_LAYERS, dt,
                     have_blas() && dt == DUET_DTYPE_F32);
        }
        size_t model_bytes = 0;
        double model_flop_tok = 0;
        for (int s = 0; s < N_SHAPES; s++) {
            model_bytes += mats[s].w[0].bytes * (s == LM_HEAD ? 1 : N_LAYERS);
            if (s != LM_HEAD)
                model_flop_tok += 2.0 * shapes[s].m * shapes[s].k * N_LAYERS;
        }

        for (int t = 0; t < n_threads; t++) {
            int th = threads_list[t];
            duet_cpu_pool_t *pool;
            duet_status_t st = duet_cpu_pool_create(th, true, "bm", &pool);
            if (st != DUET_OK)
                die("pool", st);
            blas_threads(th);
            int blas = have_blas() && dt == DUET_DTYPE_F32;

            /* The host's bandwidth drifts (shared machine): measure it next
             * to the figures it scales. */
            bw[th] = duet_bench_membw_copy(th, (size_t)256 << 20);
            printf("\n## %s, %d thread%s (copy bandwidth now %.1f GB/s)\n", duet_dtype_name(dt), th,
                   th > 1 ? "s" : "", bw[th]);
            printf("%-8s %5s %5s %4s | %9s %6s | %9s %6s | %6s\n", "decode", "m", "k", "n",
                   "ours GB/s", "%copy", "blas GB/s", "%copy", "speedup");
            static const int dec_n[] = {1, 16};
            for (int ni = 0; ni < 2; ni++) {
                for (int s = 0; s < N_SHAPES; s++) {
                    if (model_only || (quick && s != 0 && s != 6 && s != LM_HEAD))
                        continue;
                    runner_t r = {pool, th, 0, dec_n[ni], x, y};
                    size_t bytes = mats[s].w[0].bytes * (size_t)mats[s].copies;
                    double tu = time_best(pass_copies, &r, &mats[s]);
                    double gu = (double)bytes / tu / 1e9, gb = 0, tb = 0;
                    if (blas) {
                        r.blas = 1;
                        tb = time_best(pass_copies, &r, &mats[s]);
                        gb = (double)bytes / tb / 1e9;
                        settle();
                    }
                    printf("%-8s %5d %5d %4d | %9.1f %5.0f%% | ", shapes[s].name, shapes[s].m,
                           shapes[s].k, dec_n[ni], gu, 100 * gu / bw[th]);
                    if (blas)
                        printf("%9.1f %5.0f%% | %5.2fx\n", gb, 100 * gb / bw[th], tb / tu);
                    else
                        printf("%9s %6s | %6s\n", "-", "", "");
                }
                /* The whole decode step's matmuls. */
                runner_t r = {pool, th, 0, dec_n[ni], x, y};
                double tu = time_best(pass_model, &r, &md), tb = 0;
                if (blas) {
                    r.blas = 1;
                    tb = time_best(pass_model, &r, &md);
                    settle();
                }
                double gu = (double)model_bytes / tu / 1e9;
                printf("%-8s %11s %4d | %9.1f %5.0f%% | ", "model", "", dec_n[ni], gu,
                       100 * gu / bw[th]);
                if (blas)
                    printf("%9.1f %5.0f%% | %5.2fx", (double)model_bytes / tb / 1e9,
                           100 * model_bytes / tb / 1e9 / bw[th], tb / tu);
                else
                    printf("%9s %6s | %6s", "-", "", "");
                printf("   -> matmul-only %.0f tok/s (ours)\n", dec_n[ni] / tu);
            }

            printf("%-8s %5s %5s %4s | %9s %6s | %9s %6s | %6s\n", "prefill", "m", "k", "n",
                   "ours GF/s", "", "blas GF/s", "", "speedup");
            int pn = 512;
            md.with_lm_head = 0;
            for (int s = 0; s < N_SHAPES; s++) {
                if (model_only || (quick && s != 0 && s != 6))
                    continue;
                mat_t one = mats[s];
                one.copies = 1;
                runner_t r = {pool, th, 0, pn, x, y};
                double flop = 2.0 * pn * shapes[s].m * shapes[s].k;
                double tu = time_best(pass_copies, &r, &one), tb = 0;
                if (blas) {
                    r.blas = 1;
                    tb = time_best(pass_copies, &r, &one);
                    settle();
                }
                printf("%-8s %5d %5d %4d | %9.1f %6s | ", shapes[s].name, shapes[s].m, shapes[s].k,
                       pn, flop / tu / 1e9, "");
                if (blas)
                    printf("%9.1f %6s | %5.2fx\n", flop / tb / 1e9, "", tb / tu);
                else
                    printf("%9s %6s | %6s\n", "-", "", "");
            }
            {
                runner_t r = {pool, th, 0, pn, x, y};
                double tu = time_best(pass_model, &r, &md), tb = 0;
                if (blas) {
                    r.blas = 1;
                    tb = time_best(pass_model, &r, &md);
                    settle();
                }
                printf("%-8s %11s %4d | %9.1f %6s | ", "model", "", pn,
                       model_flop_tok * pn / tu / 1e9, "");
                if (blas)
                    printf("%9.1f %6s | %5.2fx", model_flop_tok * pn / tb / 1e9, "", tb / tu);
                else
                    printf("%9s %6s | %6s", "-", "", "");
                printf("   -> matmul-only %.0f tok/s ours", pn / tu);
                if (blas)
                    printf(", %.0f blas", pn / tb);
                printf("\n");
            }
            md.with_lm_head = 1;
            duet_cpu_pool_destroy(pool);
        }
        for (int s = 0; s < N_SHAPES; s++)
            mat_free(&mats[s]);
        duet_free(mats);
    }
    duet_aligned_free(y);
    duet_aligned_free(x);
    return 0;
}

static void nop_job(void *arg, int ti, int nt)
{
    (void)arg;
    (void)ti;
    (void)nt;
}

static double pool_dispatch_us(duet_cpu_pool_t *pool)
{
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        int64_t t0 = duet_now_ns();
        for (int i = 0; i < 20000; i++)
            duet_cpu_pool_run(pool, nop_job, NULL);
        double us = (double)(duet_now_ns() - t0) / 1e3 / 20000;
        if (us < best)
            best = us;
    }
    return best;
}
