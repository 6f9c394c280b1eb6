/* transfer/slice_plan: exhaustive properties over every allowed (P, D, H) with
 * P, D in 1..8 and H in 1..16 (plus larger spot sweeps), the field-bug cases
 * with hand-written runs, refusals, allocation failures and leaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/status.h"
#include "kv/heads.h"
#include "transfer/slice_plan.h"

#define MAX_TP 64
#define MAX_H  128

/* §2 KV-head rule, written out independently of the code under test */
static bool side_valid(int tp, int H)
{
    return H >= tp ? H % tp == 0 : tp % H == 0;
}

static bool holds(int H, int tp, int rank, int h)
{
    int h0, n;
    duet_kv_heads_owned(H, tp, rank, &h0, &n);
    return h >= h0 && h < h0 + n;
}

static bool run_equal(const duet_slice_run_t *a, const duet_slice_run_t *b)
{
    return a->src_rank == b->src_rank && a->dst_rank == b->dst_rank && a->src_head == b->src_head &&
           a->dst_head == b->dst_head && a->n_heads == b->n_heads;
}

/* The checker returns NULL or a description of the first violated property. */
static char why[512];
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            int at_ = snprintf(why, sizeof why, "P %d D %d H %d: ", P, D, H);                      \
            snprintf(why + at_, sizeof why - (size_t)at_, __VA_ARGS__);                            \
            return why;                                                                            \
        }                                                                                          \
    } while (0)

static int cov[MAX_TP][MAX_H];   /* writes of (decode rank, global head) */
static int loadh[MAX_TP][MAX_H]; /* writes sent by (prefill rank, global head) */

static const char *check_plan(const duet_slice_plan_t *plan, int P, int D, int H)
{
    int dh0[MAX_TP], dn[MAX_TP], sh0[MAX_TP], sn[MAX_TP], load[MAX_TP] = {0};
    uint64_t expect_mask[MAX_TP] = {0};
    int total_runs = 0;

    CHECK(duet_slice_plan_prefill_tp(plan) == P, "prefill_tp");
    CHECK(duet_slice_plan_decode_tp(plan) == D, "decode_tp");
    CHECK(duet_slice_plan_kv_heads(plan) == H, "kv_heads");
    for (int d = 0; d < D; d++)
        duet_kv_heads_owned(H, D, d, &dh0[d], &dn[d]);
    for (int s = 0; s < P; s++)
        duet_kv_heads_owned(H, P, s, &sh0[s], &sn[s]);
    memset(cov, 0, sizeof cov);
    memset(loadh, 0, sizeof loadh);

    /* destination side: ordering, bounds, head translation, maximality */
    for (int d = 0; d < D; d++) {
        const duet_slice_run_t *r;
        int n = duet_slice_plan_dst_runs(plan, d, &r);
        CHECK(n >= 1 && r != NULL, "decode rank %d has no runs", d);
        total_runs += n;
        for (int k = 0; k < n; k++) {
            int s = r[k].src_rank;
            CHECK(r[k].dst_rank == d, "d %d run %d: dst_rank %d", d, k, r[k].dst_rank);
            CHECK(s >= 0 && s < P, "d %d run %d: src_rank %d", d, k, s);
            CHECK(r[k].n_heads >= 1, "d %d run %d: n_heads %d", d, k, r[k].n_heads);
            CHECK(r[k].dst_head >= 0 && r[k].dst_head + r[k].n_heads <= dn[d],
                  "d %d run %d: dst heads [%d,+%d) outside %d local", d, k, r[k].dst_head,
                  r[k].n_heads, dn[d]);
            CHECK(r[k].src_head >= 0 && r[k].src_head + r[k].n_heads <= sn[s],
                  "d %d run %d: src heads [%d,+%d) outside rank %d's %d", d, k, r[k].src_head,
                  r[k].n_heads, s, sn[s]);
            if (k > 0) {
                const duet_slice_run_t *a = &r[k - 1], *b = &r[k];
                CHECK(b->dst_head > a->dst_head, "d %d: runs %d,%d not ordered by dst_head", d,
                      k - 1, k);
                CHECK(!(a->src_rank == b->src_rank && a->src_head + a->n_heads == b->src_head &&
                        a->dst_head + a->n_heads == b->dst_head),
                      "d %d: runs %d,%d should have merged", d, k - 1, k);
            }
            for (int t = 0; t < r[k].n_heads; t++) {
                int gd = dh0[d] + r[k].dst_head + t, gs = sh0[s] + r[k].src_head + t;
                CHECK(gd == gs, "d %d run %d: dst global %d != src global %d", d, k, gd, gs);
                CHECK(holds(H, P, s, gs), "src rank %d does not hold head %d", s, gs);
                CHECK(holds(H, D, d, gd), "dst rank %d does not hold head %d", d, gd);
                cov[d][gd]++;
                loadh[s][gs]++;
                load[s]++;
            }
            expect_mask[d] |= UINT64_C(1) << s;
        }
    }
    for (int d = 0; d < D; d++)
        for (int h = 0; h < H; h++)
            CHECK(cov[d][h] == (holds(H, D, d, h) ? 1 : 0), "d %d head %d written %d times", d, h,
                  cov[d][h]);

    /* senders(d) and its mask */
    for (int d = 0; d < D; d++) {
        int ranks[MAX_TP + 1];
        ranks[P] = -77;
        int n = duet_slice_plan_senders(plan, d, ranks);
        CHECK(ranks[P] == -77, "senders(%d) wrote past capacity P", d);
        CHECK(n == __builtin_popcountll(expect_mask[d]), "senders(%d) count %d", d, n);
        for (int i = 0; i < n; i++) {
            CHECK(ranks[i] >= 0 && ranks[i] < P && (expect_mask[d] >> ranks[i] & 1),
                  "senders(%d)[%d] = %d not a src rank of d's runs", d, i, ranks[i]);
            CHECK(i == 0 || ranks[i] > ranks[i - 1], "senders(%d) not ascending", d);
        }
        CHECK(duet_slice_plan_sender_mask(plan, d) == expect_mask[d], "sender_mask(%d)", d);
    }

    /* source side: src_runs(s) is exactly the dst runs with src s, in (dst_rank,
     * dst_head) order; receivers(s) the distinct dst ranks among them */
    int total_src = 0;
    for (int s = 0; s < P; s++) {
        const duet_slice_run_t *sr;
        int ns = duet_slice_plan_src_runs(plan, s, &sr), i = 0;
        total_src += ns;
        int recv[MAX_TP + 1], nexp = 0, expect_recv[MAX_TP];
        for (int d = 0; d < D; d++) {
            const duet_slice_run_t *r;
            int n = duet_slice_plan_dst_runs(plan, d, &r);
            bool any = false;
            for (int k = 0; k < n; k++) {
                if (r[k].src_rank != s)
                    continue;
                CHECK(i < ns, "src_runs(%d) misses d %d run %d", s, d, k);
                CHECK(run_equal(&sr[i], &r[k]), "src_runs(%d)[%d] != d %d run %d", s, i, d, k);
                i++;
                any = true;
            }
            if (any)
                expect_recv[nexp++] = d;
        }
        CHECK(i == ns, "src_runs(%d) has %d runs, dst runs name it %d times", s, ns, i);
        recv[D] = -77;
        int nr = duet_slice_plan_receivers(plan, s, recv);
        CHECK(recv[D] == -77, "receivers(%d) wrote past capacity D", s);
        CHECK(nr == nexp, "receivers(%d) count %d, expected %d", s, nr, nexp);
        for (int k = 0; k < nr; k++)
            CHECK(recv[k] == expect_recv[k], "receivers(%d)[%d] = %d, expected %d", s, k, recv[k],
                  expect_recv[k]);
        /* a receiver's senders must include s: decode waits for what is sent */
        for (int k = 0; k < nr; k++)
            CHECK(duet_slice_plan_sender_mask(plan, recv[k]) >> s & 1,
                  "s %d sends to d %d but is not among its senders", s, recv[k]);
    }
    CHECK(total_src == total_runs, "src runs %d, dst runs %d", total_src, total_runs);

    /* spreading: per head, replica loads differ by at most one; the busiest
     * prefill rank sends no more than the lower bound */
    int ceil_share[MAX_H];
    for (int h = 0; h < H; h++) {
        int writes = 0, replicas = 0, lo = 1 << 30, hi = 0;
        for (int d = 0; d < D; d++)
            writes += holds(H, D, d, h);
        for (int s = 0; s < P; s++) {
            if (!holds(H, P, s, h))
                continue;
            replicas++;
            lo = loadh[s][h] < lo ? loadh[s][h] : lo;
            hi = loadh[s][h] > hi ? loadh[s][h] : hi;
        }
        CHECK(replicas >= 1, "head %d has no prefill holder", h);
        CHECK(hi - lo <= 1, "head %d: replica loads from %d to %d", h, lo, hi);
        ceil_share[h] = (writes + replicas - 1) / replicas;
    }
    /* The bound below is exact because every prefill rank holds either a
     * single head or only unreplicated heads (the §2 layout); check that. */
    int bound = 0, busiest = 0;
    for (int s = 0; s < P; s++) {
        int need = 0;
        for (int h = sh0[s]; h < sh0[s] + sn[s]; h++) {
            int replicas = 0;
            for (int q = 0; q < P; q++)
                replicas += holds(H, P, q, h);
            CHECK(sn[s] == 1 || replicas == 1, "rank %d holds %d heads, head %d replicated", s,
                  sn[s], h);
            need += ceil_share[h];
        }
        bound = need > bound ? need : bound;
        busiest = load[s] > busiest ? load[s] : busiest;
    }
    CHECK(busiest == bound, "busiest prefill rank sends %d heads, minimum is %d", busiest, bound);
    return NULL;
}

static void check_one(int P, int D, int H)
{
    long live = duet_alloc_live();
    duet_slice_plan_t *plan = NULL;
    duet_status_t st = duet_slice_plan_create(P, D, H, &plan);
    if (st != DUET_OK)
        fail_msg("P %d D %d H %d: %s: %s", P, D, H, duet_status_name(st), duet_error_msg());
    const char *bad = check_plan(plan, P, D, H);
    duet_slice_plan_destroy(plan);
    if (bad)
        fail_msg("%s", bad);
    assert_int_equal(duet_alloc_live(), live);
}

static void check_refused(int P, int D, int H)
{
    long live = duet_alloc_live();
    duet_slice_plan_t *plan = (duet_slice_plan_t *)&live; /* must stay untouched */
    char want[64];
    const char *side = side_valid(P, H) ? "decode" : "prefill";
    duet_error_clear();
    duet_status_t st = duet_slice_plan_create(P, D, H, &plan);
    if (st != DUET_ERR_CONFIG)
        fail_msg("P %d D %d H %d: got %s, expected DUET_ERR_CONFIG", P, D, H, duet_status_name(st));
    assert_ptr_equal(plan, (duet_slice_plan_t *)&live);
    const char *msg = duet_error_msg();
    snprintf(want, sizeof want, "%s tp %d", side, side_valid(P, H) ? D : P);
    if (!strstr(msg, want))
        fail_msg("P %d D %d H %d: message \"%s\" lacks \"%s\"", P, D, H, msg, want);
    snprintf(want, sizeof want, "%d kv heads", H);
    if (!strstr(msg, want))
        fail_msg("P %d D %d H %d: message \"%s\" lacks \"%s\"", P, D, H, msg, want);
    assert_int_equal(duet_alloc_live(), live);
}

static void test_exhaustive(void **state)
{
    (void)state;
    int valid = 0, refused = 0;
    for (int P = 1; P <= 8; P++)
        for (int D = 1; D <= 8; D++)
            for (int H = 1; H <= 16; H++) {
                if (side_valid(P, H) && side_valid(D, H)) {
                    check_one(P, D, H);
                    valid++;
                } else {
                    check_refused(P, D, H);
                    refused++;
                }
            }
    /* every allowed combination was planned: per H, (valid tp values)^2 */
    int per_h_total = 0;
    for (int H = 1; H <= 16; H++) {
        int n = 0;
        for (int tp = 1; tp <= 8; tp++)
            n += (H >= tp && H % tp == 0) || (H < tp && tp % H == 0);
        per_h_total += n * n;
    }
    assert_int_equal(valid, per_h_total);
    assert_int_equal(valid + refused, 8 * 8 * 16);
}

/* Larger groups up to DUET_TP_MAX, where replication factors reach 64. */
static void test_large_sweep(void **state)
{
    (void)state;
    static const int tps[] = {1, 2, 3, 6, 12, 16, 24, 32, 48, 64};
    static const int hs[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128};
    for (size_t i = 0; i < sizeof tps / sizeof *tps; i++)
        for (size_t j = 0; j < sizeof tps / sizeof *tps; j++)
            for (size_t k = 0; k < sizeof hs / sizeof *hs; k++)
                if (side_valid(tps[i], hs[k]) && side_valid(tps[j], hs[k]))
                    check_one(tps[i], tps[j], hs[k]);
}

typedef struct {
    int P, D, H;
    int n_runs;
    duet_slice_run_t runs[16]; /* by (dst_rank, dst_head) */
    uint64_t senders[8];       /* mask per decode rank */
    uint64_t receivers[8];     /* mask per prefill rank */
} expect_t;

#define R(s, d, sh, dh, n)                                                                         \
    {                                                                                              \
        .src_rank = (s), .dst_rank = (d), .src_head = (sh), .dst_head = (dh), .n_heads = (n)       \
    }

/* clang-format off */
static const expect_t cases[] = {
    /* prefill 0:{0,1} 1:{2,3} 2:{4,5}; decode 0:{0,1,2} 1:{3,4,5} */
    {3, 2, 6, 4,
     {R(0, 0, 0, 0, 2), R(1, 0, 0, 2, 1), R(1, 1, 1, 0, 1), R(2, 1, 0, 1, 2)},
     {0x3, 0x6}, {0x1, 0x3, 0x2}},
    /* one prefill rank holds both heads; decode replicates each on 4 ranks */
    {1, 8, 2, 8,
     {R(0, 0, 0, 0, 1), R(0, 1, 0, 0, 1), R(0, 2, 0, 0, 1), R(0, 3, 0, 0, 1),
      R(0, 4, 1, 0, 1), R(0, 5, 1, 0, 1), R(0, 6, 1, 0, 1), R(0, 7, 1, 0, 1)},
     {1, 1, 1, 1, 1, 1, 1, 1}, {0xff}},
    /* prefill replicates head 0 on ranks 0-3 and head 1 on 4-7; decode rank 0
     * holds both and hears from one replica of each */
    {8, 1, 2, 2,
     {R(0, 0, 0, 0, 1), R(4, 0, 0, 1, 1)},
     {0x11}, {1, 0, 0, 0, 1, 0, 0, 0}},
    {4, 2, 8, 4,
     {R(0, 0, 0, 0, 2), R(1, 0, 0, 2, 2), R(2, 1, 0, 0, 2), R(3, 1, 0, 2, 2)},
     {0x3, 0xc}, {0x1, 0x1, 0x2, 0x2}},
    {2, 4, 4, 4,
     {R(0, 0, 0, 0, 1), R(0, 1, 1, 0, 1), R(1, 2, 0, 0, 1), R(1, 3, 1, 0, 1)},
     {0x1, 0x1, 0x2, 0x2}, {0x3, 0xc}},
    /* both sides replicate: 4 decode replicas per head over 2 prefill replicas */
    {4, 8, 2, 8,
     {R(0, 0, 0, 0, 1), R(0, 1, 0, 0, 1), R(1, 2, 0, 0, 1), R(1, 3, 0, 0, 1),
      R(2, 4, 0, 0, 1), R(2, 5, 0, 0, 1), R(3, 6, 0, 0, 1), R(3, 7, 0, 0, 1)},
     {0x1, 0x1, 0x2, 0x2, 0x4, 0x4, 0x8, 0x8}, {0x3, 0xc, 0x30, 0xc0}},
    /* 2 decode replicas over 3 prefill replicas: two distinct senders per head */
    {6, 4, 2, 4,
     {R(0, 0, 0, 0, 1), R(1, 1, 0, 0, 1), R(3, 2, 0, 0, 1), R(4, 3, 0, 0, 1)},
     {0x1, 0x2, 0x8, 0x10}, {0x1, 0x2, 0, 0x4, 0x8, 0}},
    {2, 8, 1, 8,
     {R(0, 0, 0, 0, 1), R(0, 1, 0, 0, 1), R(0, 2, 0, 0, 1), R(0, 3, 0, 0, 1),
      R(1, 4, 0, 0, 1), R(1, 5, 0, 0, 1), R(1, 6, 0, 0, 1), R(1, 7, 0, 0, 1)},
     {1, 1, 1, 1, 2, 2, 2, 2}, {0x0f, 0xf0}},
    {1, 1, 4, 1, {R(0, 0, 0, 0, 4)}, {1}, {1}},
};
/* clang-format on */

static void test_hand_written(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const expect_t *e = &cases[c];
        long live = duet_alloc_live();
        duet_slice_plan_t *plan = NULL;
        assert_int_equal(duet_slice_plan_create(e->P, e->D, e->H, &plan), DUET_OK);
        const char *bad = check_plan(plan, e->P, e->D, e->H);
        if (bad)
            fail_msg("%s", bad);

        int at = 0;
        for (int d = 0; d < e->D; d++) {
            const duet_slice_run_t *r;
            int n = duet_slice_plan_dst_runs(plan, d, &r);
            for (int k = 0; k < n; k++, at++)
                if (at >= e->n_runs || !run_equal(&r[k], &e->runs[at]))
                    fail_msg("P %d D %d H %d: d %d run %d = (%d,%d,%d,%d,%d)", e->P, e->D, e->H, d,
                             k, r[k].src_rank, r[k].dst_rank, r[k].src_head, r[k].dst_head,
                             r[k].n_heads);
            assert_int_equal(duet_slice_plan_sender_mask(plan, d), e->senders[d]);
        }
        assert_int_equal(at, e->n_runs);
        for (int s = 0; s < e->P; s++) {
            int recv[8], n = duet_slice_plan_receivers(plan, s, recv);
            uint64_t mask = 0;
            for (int k = 0; k < n; k++)
                mask |= UINT64_C(1) << recv[k];
            if (mask != e->receivers[s])
                fail_msg("P %d D %d H %d: receivers(%d) = %#llx", e->P, e->D, e->H, s,
                         (unsigned long long)mask);
        }
        duet_slice_plan_destroy(plan);
        assert_int_equal(duet_alloc_live(), live);
    }
}

/* The src index is a view of the same runs (stored once), and idle
 * replicas really have nothing to send. */
static void test_src_runs_shared_storage(void **state)
{
    (void)state;
    duet_slice_plan_t *plan;
    const duet_slice_run_t *d0, *s4, *s1;
    int ranks[8];
    assert_int_equal(duet_slice_plan_create(8, 1, 2, &plan), DUET_OK);
    assert_int_equal(duet_slice_plan_dst_runs(plan, 0, &d0), 2);
    assert_int_equal(duet_slice_plan_src_runs(plan, 4, &s4), 1);
    assert_ptr_equal(s4, &d0[1]);
    assert_int_equal(duet_slice_plan_src_runs(plan, 1, &s1), 0);
    assert_int_equal(duet_slice_plan_receivers(plan, 1, ranks), 0);
    assert_int_equal(duet_slice_plan_senders(plan, 0, ranks), 2);
    assert_int_equal(ranks[0], 0);
    assert_int_equal(ranks[1], 4);
    duet_slice_plan_destroy(plan);
}

static void test_refusals(void **state)
{
    (void)state;
    duet_slice_plan_t *plan = NULL;

    assert_int_equal(duet_slice_plan_create(3, 2, 4, &plan), DUET_ERR_CONFIG);
    assert_null(plan);
    assert_non_null(strstr(duet_error_msg(), "prefill tp 3"));
    assert_non_null(strstr(duet_error_msg(), "4 kv heads"));
    assert_null(strstr(duet_error_msg(), "decode"));

    assert_int_equal(duet_slice_plan_create(2, 5, 2, &plan), DUET_ERR_CONFIG);
    assert_null(plan);
    assert_non_null(strstr(duet_error_msg(), "decode tp 5"));
    assert_non_null(strstr(duet_error_msg(), "2 kv heads"));
    assert_null(strstr(duet_error_msg(), "prefill"));

    assert_int_equal(duet_slice_plan_create(0, 1, 1, &plan), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "prefill tp 0"));
    assert_int_equal(duet_slice_plan_create(1, 65, 1, &plan), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "decode tp 65"));
    assert_int_equal(duet_slice_plan_create(1, 1, 0, &plan), DUET_ERR_CONFIG);
    assert_non_null(strstr(duet_error_msg(), "0 kv heads"));
    assert_int_equal(duet_slice_plan_create(1, 1, -3, &plan), DUET_ERR_CONFIG);
    assert_null(plan);
    assert_int_equal(duet_slice_plan_create(1, 1, 1, NULL), DUET_ERR_INVALID);
    duet_slice_plan_destroy(NULL);
}

static void test_out_of_range_ranks(void **state)
{
    (void)state;
    duet_slice_plan_t *plan;
    const duet_slice_run_t *r = (const duet_slice_run_t *)state;
    int ranks[4];
    assert_int_equal(duet_slice_plan_create(2, 4, 4, &plan), DUET_OK);
    assert_int_equal(duet_slice_plan_dst_runs(plan, 4, &r), 0);
    assert_null(r);
    r = (const duet_slice_run_t *)&plan;
    assert_int_equal(duet_slice_plan_dst_runs(plan, -1, &r), 0);
    assert_null(r);
    r = (const duet_slice_run_t *)&plan;
    assert_int_equal(duet_slice_plan_src_runs(plan, 2, &r), 0);
    assert_null(r);
    assert_int_equal(duet_slice_plan_senders(plan, 4, ranks), 0);
    assert_int_equal(duet_slice_plan_sender_mask(plan, -1), 0);
    assert_int_equal(duet_slice_plan_receivers(plan, -1, ranks), 0);
    duet_slice_plan_destroy(plan);
}

static void test_deterministic(void **state)
{
    (void)state;
    duet_slice_plan_t *a, *b;
    assert_int_equal(duet_slice_plan_create(6, 8, 2, &a), DUET_OK);
    assert_int_equal(duet_slice_plan_create(6, 8, 2, &b), DUET_OK);
    for (int d = 0; d < 8; d++) {
        const duet_slice_run_t *ra, *rb;
        int na = duet_slice_plan_dst_runs(a, d, &ra), nb = duet_slice_plan_dst_runs(b, d, &rb);
        assert_int_equal(na, nb);
        for (int k = 0; k < na; k++)
            assert_true(run_equal(&ra[k], &rb[k]));
    }
    duet_slice_plan_destroy(a);
    duet_slice_plan_destroy(b);
}

static void test_alloc_failures(void **state)
{
    (void)state;
    long live = duet_alloc_live();
    int failed = 0;
    for (long n = 0;; n++) {
        duet_slice_plan_t *plan = NULL;
        duet_alloc_fail_after(n);
        duet_status_t st = duet_slice_plan_create(3, 2, 6, &plan);
        duet_alloc_fail_after(-1);
        if (st == DUET_OK) {
            const char *bad = check_plan(plan, 3, 2, 6);
            duet_slice_plan_destroy(plan);
            if (bad)
                fail_msg("%s", bad);
            break;
        }
        assert_int_equal(st, DUET_ERR_NO_MEMORY);
        assert_null(plan);
        assert_int_equal(duet_alloc_live(), live);
        failed++;
        assert_true(n < 100);
    }
    assert_true(failed > 0);
    assert_int_equal(duet_alloc_live(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exhaustive),    cmocka_unit_test(test_large_sweep),
        cmocka_unit_test(test_hand_written),  cmocka_unit_test(test_src_runs_shared_storage),
        cmocka_unit_test(test_refusals),      cmocka_unit_test(test_out_of_range_ranks),
        cmocka_unit_test(test_deterministic), cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
