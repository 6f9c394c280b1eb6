/* Weight packing, ISA choice and the blocking driver of the CPU matmul.
 * The layouts and the kernel contract are described in matmul_internal.h;
 * the kernels live in matmul_{avx512,avx2,generic}.c. */
#include "engine/cpu/matmul.h"

#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/alloc.h"
#include "common/log.h"
#include "engine/cpu/matmul_internal.h"

/* Packed weights of at least one huge page start on a 2 MiB boundary, and
 * their whole huge pages are marked MADV_HUGEPAGE (the tail keeps 4 KiB
 * pages, so no memory is wasted): fewer TLB misses while decode streams
 * them (THP is "madvise" on Debian by default). */
#define DUET__MM_HUGE_PAGE ((size_t)2 << 20)

/* Batches up to this many rows take the bandwidth path: output panels are
 * split across workers (each weight byte is read once per call) and each
 * worker streams its panels start to end with all of x packed. */
#define DUET__MM_SMALL_N 64
/* Row block of the GEMM path, in tiles (rows = tiles x mr). */
#ifndef DUET__MM_MC_TILES
#define DUET__MM_MC_TILES 12
#endif

/* ---- ISA ---- */

const char *duet__mm_isa_name(duet__mm_isa_t isa)
{
    switch (isa) {
    case DUET__MM_ISA_AVX512:
        return "avx512";
    case DUET__MM_ISA_AVX2:
        return "avx2";
    case DUET__MM_ISA_GENERIC:
        break;
    }
    return "generic";
}

duet__mm_isa_t duet__mm_isa_detect(void)
{
#if DUET__MM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return DUET__MM_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return DUET__MM_ISA_AVX2;
#endif
    return DUET__MM_ISA_GENERIC;
}

duet__mm_isa_t duet__mm_isa_choose(duet__mm_isa_t detected, const char *env, int *ignored_p)
{
    static const duet__mm_isa_t all[] = {DUET__MM_ISA_GENERIC, DUET__MM_ISA_AVX2,
                                         DUET__MM_ISA_AVX512};
    *ignored_p = 0;
    if (env == NULL || env[0] == '\0')
        return detected;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (strcmp(env, duet__mm_isa_name(all[i])) == 0 && all[i] <= detected)
            return all[i];
    }
    *ignored_p = 1;
    return detected;
}

static pthread_once_t duet__mm_isa_once = PTHREAD_ONCE_INIT;
static duet__mm_isa_t duet__mm_isa_value; /* written once under duet__mm_isa_once */

static void duet__mm_isa_init(void)
{
    duet__mm_isa_t detected = duet__mm_isa_detect();
    const char *env = getenv("DUET_CPU_ISA");
    int ignored;
    duet__mm_isa_value = duet__mm_isa_choose(detected, env, &ignored);
    if (ignored)
        DUET_LOG_WARN("cpu matmul: DUET_CPU_ISA %s not available (generic|avx2|avx512, at most "
                      "%s here), using %s",
                      env, duet__mm_isa_name(detected), duet__mm_isa_name(detected));
}

static duet__mm_isa_t duet__mm_isa(void)
{
    pthread_once(&duet__mm_isa_once, duet__mm_isa_init);
    return duet__mm_isa_value;
}

const char *duet_cpu_matmul_isa(void)
{
    return duet__mm_isa_name(duet__mm_isa());
}

static const duet__mm_ops_t *duet__mm_ops(duet__mm_isa_t isa)
{
    switch (isa) {
#if DUET__MM_X86
    case DUET__MM_ISA_AVX512:
        return &duet__mm_ops_avx512;
    case DUET__MM_ISA_AVX2:
        return &duet__mm_ops_avx2;
#else
    case DUET__MM_ISA_AVX512:
    case DUET__MM_ISA_AVX2:
#endif
    case DUET__MM_ISA_GENERIC:
        break;
    }
    return &duet__mm_ops_generic;
}

/* ---- packing ---- */

static int duet__mm_storable(duet_dtype_t dt)
{
    return dt == DUET_DTYPE_F32 || dt == DUET_DTYPE_F16 || dt == DUET_DTYPE_BF16;
}

/* Convert n elements of src (sdt) into dst (ddt). */
static void duet__mm_convert(const void *src, duet_dtype_t sdt, void *dst, duet_dtype_t ddt, int n)
{
    if (sdt == ddt) {
        memcpy(dst, src, (size_t)n * duet_dtype_size(sdt));
    } else if (ddt == DUET_DTYPE_F32) {
        duet_dtype_to_f32(sdt, src, dst, (size_t)n);
    } else {
        float tmp[64];
        uint16_t *d = dst;
        for (int i0 = 0; i0 < n; i0 += 64) {
            int len = n - i0 < 64 ? n - i0 : 64;
            const char *s = (const char *)src + (size_t)i0 * duet_dtype_size(sdt);
            duet_dtype_to_f32(sdt, s, tmp, (size_t)len);
            for (int i = 0; i < len; i++)
                d[i0 + i] =
                    ddt == DUET_DTYPE_F16 ? duet_f32_to_f16(tmp[i]) : duet_f32_to_bf16(tmp[i]);
        }
    }
}

duet_status_t duet_cpu_weight_pack(const void *src, duet_dtype_t src_dtype, int src_cols, int row0,
                                   int rows, int col0, int cols, duet_dtype_t store_dtype,
                                   duet_cpu_weight_t *w_p)
{
    enum { CHUNK = 64 };
    const int nr = DUET__MM_NR;
    size_t ses, es, panels, bytes, align;
    char *data;

    if (src == NULL || w_p == NULL)
        return duet_error(DUET_ERR_INVALID, "weight pack: null argument");
    if (!duet__mm_storable(src_dtype) || !duet__mm_storable(store_dtype))
        return duet_error(DUET_ERR_UNSUPPORTED, "weight pack: dtype %s -> %s not supported",
                          duet_dtype_name(src_dtype), duet_dtype_name(store_dtype));
    if (rows < 1 || cols < 1 || row0 < 0 || col0 < 0 || src_cols < 1 ||
        (long)col0 + cols > (long)src_cols)
        return duet_error(DUET_ERR_INVALID,
                          "weight pack: block rows %d+%d cols %d+%d outside a matrix of %d "
                          "columns",
                          row0, rows, col0, cols, src_cols);

    ses = duet_dtype_size(src_dtype);
    es = duet_dtype_size(store_dtype);
    panels = ((size_t)rows + nr - 1) / nr;
    bytes = panels * (size_t)cols * nr * es;
    align = bytes >= DUET__MM_HUGE_PAGE ? DUET__MM_HUGE_PAGE : 64;
    data = duet_aligned_alloc(align, bytes);
    if (data == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "weight pack: %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
    if (align == DUET__MM_HUGE_PAGE) /* advice only: failure changes nothing */
        (void)madvise(data, bytes & ~(DUET__MM_HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    if (rows % nr != 0) {
        size_t last = (panels - 1) * (size_t)cols * nr * es;
        memset(data + last, 0, bytes - last);
    }

    /* Transpose each panel in chunks of CHUNK columns so that the lines being
     * filled stay in cache while the 32 rows are scattered into them. */
    for (size_t p = 0; p < panels; p++) {
        int prow = (int)p * nr;
        int prows = rows - prow < nr ? rows - prow : nr;
        char *panel = data + p * (size_t)cols * nr * es;
        for (int k0 = 0; k0 < cols; k0 += CHUNK) {
            int klen = cols - k0 < CHUNK ? cols - k0 : CHUNK;
            for (int j = 0; j < prows; j++) {
                _Alignas(64) char tmp[CHUNK * 4];
                const char *s =
                    (const char *)src + (((size_t)row0 + prow + j) * src_cols + col0 + k0) * ses;
                duet__mm_convert(s, src_dtype, tmp, store_dtype, klen);
                if (es == 4) {
                    float *d = (float *)panel + (size_t)k0 * nr + j;
                    const float *t = (const float *)tmp;
                    for (int kk = 0; kk < klen; kk++)
                        d[(size_t)kk * nr] = t[kk];
                } else {
                    uint16_t *d = (uint16_t *)panel + (size_t)k0 * nr + j;
                    const uint16_t *t = (const uint16_t *)tmp;
                    for (int kk = 0; kk < klen; kk++)
                        d[(size_t)kk * nr] = t[kk];
                }
            }
        }
    }

    w_p->dtype = store_dtype;
    w_p->rows = rows;
    w_p->cols = cols;
    w_p->data = data;
    w_p->bytes = bytes;
    return DUET_OK;
}

void duet_cpu_weight_free(duet_cpu_weight_t *w)
{
    if (w == NULL)
        return;
    duet_aligned_free(w->data);
    w->data = NULL;
    w->bytes = 0;
}

/* ---- driver ---- */

typedef struct {
    const duet__mm_ops_t *ops;
    duet_cpu_pool_t *pool;
    float *y;
    size_t ldy;
    const float *x;
    size_t ldx;
    int n;
    const duet_cpu_weight_t *w;
    const float *bias;
    int tr, tp; /* workers form a tr (row groups) x tp (panel groups) grid */
} duet__mm_job_t;

/* Copy rows [r0, r0+nrows) x cols [k0, k0+kc) of x into a (stride LDA). */
static void duet__mm_pack_x(const duet__mm_job_t *j, int r0, int nrows, int k0, int kc, float *a)
{
    for (int r = 0; r < nrows; r++)
        memcpy(a + (size_t)r * DUET__MM_LDA, j->x + (size_t)(r0 + r) * j->ldx + k0,
               (size_t)kc * sizeof(float));
}

/* [0, total) cut into `parts` near-equal parts: part i starts here.  Used for
 * row tiles (16 rows with mr 14 run as 8 + 8, not 14 + 2), row blocks and
 * k blocks (768 with KC 512 runs as 384 + 384). */
static inline int duet__mm_part(int total, int parts, int i)
{
    return (int)((long)total * i / parts);
}

static inline int duet__mm_parts(int total, int max_size)
{
    return (total + max_size - 1) / max_size;
}

/* Run the row tiles of packed rows a against one kc x NR weight block b.
 * next (NULL: none) is the weight block the caller runs after this one: the
 * tiles prefetch it, kc lines each, so its memory latency overlaps their
 * arithmetic. */
static void duet__mm_block(const duet__mm_job_t *j, const float *a, int nrows, const void *b,
                           int kc, float *c, int nc, const float *bias, unsigned flags,
                           const char *next, float *widen_buf)
{
    const duet__mm_ops_t *ops = j->ops;
    int dt = (int)j->w->dtype;
    int tiles = duet__mm_parts(nrows, ops->mr);
    size_t block_bytes = (size_t)kc * DUET__MM_NR * duet_dtype_size(j->w->dtype);

    if (dt != DUET_DTYPE_F32 && tiles >= ops->widen_min_tiles) {
        ops->widen[dt](b, widen_buf, (size_t)kc * DUET__MM_NR);
        b = widen_buf;
        dt = DUET_DTYPE_F32;
    }
    for (int t = 0; t < tiles; t++) {
        int t0 = duet__mm_part(nrows, tiles, t), t1 = duet__mm_part(nrows, tiles, t + 1);
        size_t off = (size_t)t * kc * 64;
        const char *pf = next != NULL && off < block_bytes ? next + off : (const char *)b;
        ops->kernel[dt](t1 - t0, kc, a + (size_t)t0 * DUET__MM_LDA, b, c + (size_t)t0 * j->ldy,
                        j->ldy, nc, bias, flags, pf);
    }
}

static void duet__mm_run(void *arg, int ti, int nt)
{
    const duet__mm_job_t *j = arg;
    const duet_cpu_weight_t *w = j->w;
    const int nr = DUET__MM_NR, k = w->cols, m = w->rows;
    const int nkb = duet__mm_parts(k, DUET__MM_KC);
    const size_t es = duet_dtype_size(w->dtype);
    const char *wdata = w->data;
    long r0, r1, p0, p1;
    float *scratch, *widen_buf, *a;
    size_t a_floats;
    int nrows;

    (void)nt;
    if (ti >= j->tr * j->tp)
        return;
    duet_cpu_split(j->n, ti / j->tp, j->tr, &r0, &r1);
    duet_cpu_split(duet__mm_parts(m, nr), ti % j->tp, j->tp, &p0, &p1);
    if (r0 == r1 || p0 == p1)
        return;
    nrows = (int)(r1 - r0);

    scratch = duet_cpu_pool_scratch(j->pool, ti);
    widen_buf = scratch;
    a = scratch + (size_t)DUET__MM_KC * nr;
    a_floats = DUET_CPU_POOL_SCRATCH_BYTES / sizeof(float) - (size_t)DUET__MM_KC * nr;

#define DUET__KB(kb)       duet__mm_part(k, nkb, (kb))
#define DUET__BLOCK(p, kb) (wdata + ((size_t)(p)*k + (size_t)DUET__KB(kb)) * nr * es)
#define DUET__BIAS(p, kb)  ((kb) == nkb - 1 && j->bias != NULL ? j->bias + (p)*nr : NULL)
#define DUET__FLAGS(kb)    ((kb) > 0 ? DUET__MM_ACCUM : 0u)

    if (j->n <= DUET__MM_SMALL_N && (size_t)nrows * nkb * DUET__MM_LDA <= a_floats) {
        /* Bandwidth path: all of x packed once, then each panel streamed
         * from start to end. */
        const int pair = nrows <= j->ops->mr2;
        for (int kb = 0; kb < nkb; kb++)
            duet__mm_pack_x(j, (int)r0, nrows, DUET__KB(kb), DUET__KB(kb + 1) - DUET__KB(kb),
                            a + (size_t)kb * nrows * DUET__MM_LDA);
        for (long p = p0; p < p1; p++) {
            float *c = j->y + (size_t)r0 * j->ldy + (size_t)p * nr;
            if (pair && p + 1 < p1) {
                /* Few rows: two panels at once for more independent FMA
                 * chains (the same arithmetic per output). */
                int nc = m - (int)p * nr < 2 * nr ? m - (int)p * nr : 2 * nr;
                for (int kb = 0; kb < nkb; kb++) {
                    /* Prefetch what follows each of the two streams: the
                     * next k block, else the next pair's first blocks. */
                    const char *b = DUET__BLOCK(p, kb), *b2 = DUET__BLOCK(p + 1, kb);
                    const char *pf = b, *pf2 = b2;
                    if (kb + 1 < nkb) {
                        pf = DUET__BLOCK(p, kb + 1);
                        pf2 = DUET__BLOCK(p + 1, kb + 1);
                    } else if (p + 3 < p1) {
                        pf = DUET__BLOCK(p + 2, 0);
                        pf2 = DUET__BLOCK(p + 3, 0);
                    }
                    j->ops->kernel2[w->dtype](nrows, DUET__KB(kb + 1) - DUET__KB(kb),
                                              a + (size_t)kb * nrows * DUET__MM_LDA, b, b2, c,
                                              j->ldy, nc, DUET__BIAS(p, kb), DUET__FLAGS(kb), pf,
                                              pf2);
                }
                p++;
                continue;
            }
            int nc = m - (int)p * nr < nr ? m - (int)p * nr : nr;
            for (int kb = 0; kb < nkb; kb++) {
                /* The next block in memory: this panel's next k block or the
                 * next panel's first. */
                const char *next = kb + 1 < nkb ? DUET__BLOCK(p, kb + 1)
                                   : p + 1 < p1 ? DUET__BLOCK(p + 1, 0)
                                                : NULL;
                duet__mm_block(j, a + (size_t)kb * nrows * DUET__MM_LDA, nrows, DUET__BLOCK(p, kb),
                               DUET__KB(kb + 1) - DUET__KB(kb), c, nc, DUET__BIAS(p, kb),
                               DUET__FLAGS(kb), next, widen_buf);
            }
        }
        return;
    }

    /* GEMM path: a block of at most MC rows x one k block of x stays in L2
     * while each panel's kc x NR block passes through once per row block. */
    const int mc = DUET__MM_MC_TILES * j->ops->mr;
    const int nblk = duet__mm_parts(nrows, mc);
    assert((size_t)mc * DUET__MM_LDA <= a_floats);
    for (int bi = 0; bi < nblk; bi++) {
        int i0 = (int)r0 + duet__mm_part(nrows, nblk, bi);
        int mrows = (int)r0 + duet__mm_part(nrows, nblk, bi + 1) - i0;
        for (int kb = 0; kb < nkb; kb++) {
            int kc = DUET__KB(kb + 1) - DUET__KB(kb);
            duet__mm_pack_x(j, i0, mrows, DUET__KB(kb), kc, a);
            for (long p = p0; p < p1; p++) {
                int nc = m - (int)p * nr < nr ? m - (int)p * nr : nr;
                duet__mm_block(j, a, mrows, DUET__BLOCK(p, kb), kc,
                               j->y + (size_t)i0 * j->ldy + (size_t)p * nr, nc, DUET__BIAS(p, kb),
                               DUET__FLAGS(kb), p + 1 < p1 ? DUET__BLOCK(p + 1, kb) : NULL,
                               widen_buf);
            }
        }
    }
#undef DUET__KB
#undef DUET__BLOCK
#undef DUET__BIAS
#undef DUET__FLAGS
}

void duet__cpu_matmul_isa(duet__mm_isa_t isa, duet_cpu_pool_t *pool, float *y, size_t ldy,
                          const float *x, size_t ldx, int n, const duet_cpu_weight_t *w,
                          const float *bias)
{
    duet__mm_job_t j;
    int nt, n_panels;

    if (n <= 0)
        return;
    assert(pool != NULL && x != NULL && y != NULL && w != NULL && w->data != NULL);
    assert(ldx >= (size_t)w->cols && ldy >= (size_t)w->rows);
    nt = duet_cpu_pool_size(pool);
    n_panels = duet__mm_parts(w->rows, DUET__MM_NR);
    if (isa > duet__mm_isa_detect()) /* never run instructions the CPU lacks */
        isa = duet__mm_isa_detect();
    j.ops = duet__mm_ops(isa);
    j.pool = pool;
    j.y = y;
    j.ldy = ldy;
    j.x = x;
    j.ldx = ldx;
    j.n = n;
    j.w = w;
    j.bias = bias;
    /* Small n: one row group, the panels split across workers so that each
     * weight byte is read once.  Large n: row groups of at least 2 tiles
     * (each worker packs only its rows of x and reads all weights, which is
     * cheap at this arithmetic intensity); leftover workers split panels. */
    if (n <= DUET__MM_SMALL_N) {
        j.tr = 1;
    } else {
        int tiles = duet__mm_parts(n, j.ops->mr);
        j.tr = tiles / 2 < nt ? tiles / 2 : nt;
        if (j.tr < 1)
            j.tr = 1;
    }
    j.tp = nt / j.tr;
    if (j.tp > n_panels)
        j.tp = n_panels;
    if (j.tr * j.tp == 1)
        duet__mm_run(&j, 0, 1);
    else
        duet_cpu_pool_run(pool, duet__mm_run, &j);
}

void duet_cpu_matmul(duet_cpu_pool_t *pool, float *y, size_t ldy, const float *x, size_t ldx, int n,
                     const duet_cpu_weight_t *w, const float *bias)
{
    duet__cpu_matmul_isa(duet__mm_isa(), pool, y, ldy, x, ldx, n, w, bias);
}
