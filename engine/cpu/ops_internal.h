/* The cpu backend's non-matmul kernels, one table per ISA (AVX-512, AVX2,
 * portable C), chosen at run time like the matmul kernels (same detection,
 * same DUET_CPU_ISA override).
 *
 * Every kernel is written once, in ops_simd.inc, against a small set of
 * vector helpers: ops_avx512.c (16 lanes) and ops_avx2.c (8 lanes) take
 * them from simd_avx512.inc / simd_avx2.inc (shared with the matmul
 * kernels), ops_generic.c (1 lane, plain C) defines its own, and each then
 * includes the template.
 *
 * Determinism: a kernel's result for one row (one token, or one query row
 * of attention) depends only on that row's inputs and the ISA, never on the
 * other rows of the call, the pool size or how the work was split.  For
 * attention this holds even between a prefill and a decode of the same
 * token (see the comment on duet__attn_task_t). */
#ifndef DUET_ENGINE_CPU_OPS_INTERNAL_H
#define DUET_ENGINE_CPU_OPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/cpu/matmul_internal.h"
#include "kv/dtype.h"

/* Keys per attention block: the online softmax advances by blocks of this
 * many consecutive key positions (pages smaller than a block are gathered
 * into one), so block boundaries depend on positions alone. */
#define DUET__ATTN_KB 16

/* One attention work item: the query rows of n_tok consecutive tokens of one
 * sequence times the `group` query heads that share one KV head, against
 * that KV head's keys 0..pos[t] (causal) through the sequence's page table.
 *
 * Query row (t, hg) is q[t * q_ld + hg * hd + 0..hd); its output goes to
 * out[t * out_ld + hg * hd + 0..hd).  Key position p lives in page
 * pages[p / page_size], row p % page_size: k + pages[..] * page_floats +
 * (p % page_size) * hd (v likewise).  Positions must be non-decreasing.
 *
 * A row's result is bit-identical whatever else is in the item: blocks of
 * keys past the row's position contribute exact zeros (and an exact rescale
 * by 1), so a token gives the same output prefilled or decoded. */
typedef struct {
    const float *q;
    size_t q_ld;
    float *out;
    size_t out_ld;
    const int32_t *pos; /* [n_tok] */
    int n_tok;
    int group;
    int hd;
    const float *k, *v;   /* this (layer, KV head)'s slice of page 0 */
    size_t page_floats;   /* floats from one page of a head to the next */
    const int32_t *pages; /* page ids in position order */
    int page_size;
} duet__attn_task_t;

/* Scratch bytes duet__cpu_ops_t.attention needs for rows = n_tok * group
 * query rows (any ISA). */
size_t duet__attn_scratch_bytes(int rows, int hd);

typedef struct {
    const char *name;
    /* y[0..d) = x / sqrt(mean(x^2) + eps) * w; y may be x. */
    void (*rmsnorm)(float *y, const float *x, const float *w, int d, float eps);
    /* o[0..m) = silu(g) * u; o may be g or u. */
    void (*silu_mul)(float *o, const float *g, const float *u, int m);
    /* x[0..n) += y. */
    void (*add)(float *x, const float *y, size_t n);
    /* HF rotate-half RoPE in place on nh heads of hd floats at x, with
     * cs/sn[hd / 2] the cosines and sines of this token's angles. */
    void (*rope)(float *x, int nh, int hd, const float *cs, const float *sn);
    /* dst[0..n) = src converted from F32, F16 or BF16 (exact). */
    void (*to_f32)(duet_dtype_t dt, const void *src, float *dst, size_t n);
    /* The largest of x[0..n) and the lowest index holding it, n >= 1: what
     * a scan from x[0] taking strictly larger values finds (so a NaN wins
     * only at index 0). */
    void (*argmax)(const float *x, int n, float *max_p, int32_t *idx_p);
    /* Causal attention of one work item; scratch holds at least
     * duet__attn_scratch_bytes(n_tok * group, hd), 64-byte aligned. */
    void (*attention)(const duet__attn_task_t *t, void *scratch);
} duet__cpu_ops_t;

extern const duet__cpu_ops_t duet__cpu_ops_generic;
#if DUET__MM_X86
extern const duet__cpu_ops_t duet__cpu_ops_avx2;
extern const duet__cpu_ops_t duet__cpu_ops_avx512;
#endif

/* The ISA the cpu backend uses: the detected one, lowered by DUET_CPU_ISA
 * (read once; an unusable value is ignored, and matmul.c warns about it). */
duet__mm_isa_t duet__cpu_ops_isa(void);
/* The kernel table of isa; an ISA above the detected one gives the
 * detected one's. */
const duet__cpu_ops_t *duet__cpu_ops(duet__mm_isa_t isa);

#endif
