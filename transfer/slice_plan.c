/* Heterogeneous-TP slice plan (DESIGN §4).
 *
 * Spreading rule: for global head h, let the decode ranks holding h be
 * d_0 < ... < d_{Rd-1} and the prefill ranks holding it p_0 < ... < p_{Rp-1}
 * (both from kv/heads.h).  Decode replica j is written by prefill
 * replica floor(j * Rp / Rd).  Each replica then serves floor(Rd/Rp) or
 * ceil(Rd/Rp) writes of h (the minimum possible maximum), and because both
 * sides lay heads out in rank order the chosen src_rank never decreases along
 * the runs ordered by (dst_rank, dst_head).  That is what lets the runs be
 * stored once, grouped by destination, with every source's runs a contiguous
 * slice of the same array. */
#include "transfer/slice_plan.h"

#include <stddef.h>

#include "common/alloc.h"
#include "kv/heads.h"

struct duet_slice_plan {
    int P, D, H;
    int n_runs;
    duet_slice_run_t *runs; /* [n_runs] by (dst_rank, dst_head); src_rank non-decreasing */
    int *dst_off;           /* [D+1]: runs of decode rank d are [dst_off[d], dst_off[d+1]) */
    int *src_off;           /* [P+1]: runs of prefill rank s are [src_off[s], src_off[s+1]) */
};

/* A side's tp must be able to hold the H heads (the rule of kv/heads.h); the
 * message names the side first: "slice plan: prefill tp 3: ... (4 kv heads
 * ...)". */
static duet_status_t duet__slice_plan_check_side(const char *side, int tp, int H)
{
    if (duet_kv_heads_check(H, tp) != DUET_OK)
        return duet_error_wrap(DUET_ERR_CONFIG, "slice plan: %s ", side);
    return DUET_OK;
}

/* Fill plan->runs and plan->dst_off for every decode rank. */
static void duet__slice_plan_fill(duet_slice_plan_t *plan)
{
    int n_runs = 0;
    for (int d = 0; d < plan->D; d++) {
        int dh0, dn;
        duet_kv_heads_owned(plan->H, plan->D, d, &dh0, &dn);
        plan->dst_off[d] = n_runs;
        for (int i = 0; i < dn; i++) {
            int h = dh0 + i, d0, s0, sh0, sn;
            int rd = duet_kv_heads_holders(plan->H, plan->D, h, &d0);
            int rp = duet_kv_heads_holders(plan->H, plan->P, h, &s0);
            int s = s0 + (d - d0) * rp / rd; /* decode replica j = d - d0 */
            duet_kv_heads_owned(plan->H, plan->P, s, &sh0, &sn);

            duet_slice_run_t *last = n_runs > plan->dst_off[d] ? &plan->runs[n_runs - 1] : NULL;
            if (last && last->src_rank == s && last->src_head + last->n_heads == h - sh0 &&
                last->dst_head + last->n_heads == i) {
                last->n_heads++;
                continue;
            }
            plan->runs[n_runs++] = (duet_slice_run_t){
                .src_rank = s, .dst_rank = d, .src_head = h - sh0, .dst_head = i, .n_heads = 1};
        }
    }
    plan->dst_off[plan->D] = n_runs;
    plan->n_runs = n_runs;
}

/* Build src_off; fails if src_rank ever decreases (the spreading rule above
 * guarantees it does not for the kv/heads.h layout). */
static duet_status_t duet__slice_plan_index_sources(duet_slice_plan_t *plan)
{
    int s = 0; /* src_off[0..s-1] are set */
    for (int k = 0; k < plan->n_runs; k++) {
        if (k > 0 && plan->runs[k].src_rank < plan->runs[k - 1].src_rank)
            return duet_error(
                DUET_ERR_INTERNAL, "slice plan P %d D %d H %d: src rank %d follows %d in dst order",
                plan->P, plan->D, plan->H, plan->runs[k].src_rank, plan->runs[k - 1].src_rank);
        while (s <= plan->runs[k].src_rank)
            plan->src_off[s++] = k;
    }
    while (s <= plan->P)
        plan->src_off[s++] = plan->n_runs;
    return DUET_OK;
}

duet_status_t duet_slice_plan_create(int P, int D, int H, duet_slice_plan_t **plan_p)
{
    duet_status_t st;
    if (!plan_p)
        return duet_error(DUET_ERR_INVALID, "slice plan: plan_p is NULL");
    if (H < 1)
        return duet_error(DUET_ERR_CONFIG, "slice plan: %d kv heads: must be at least 1", H);
    if ((st = duet__slice_plan_check_side("prefill", P, H)) != DUET_OK)
        return st;
    if ((st = duet__slice_plan_check_side("decode", D, H)) != DUET_OK)
        return st;

    duet_slice_plan_t *plan = DUET_NEW(duet_slice_plan_t);
    if (!plan)
        return duet_error(DUET_ERR_NO_MEMORY, "slice plan: plan");
    plan->P = P;
    plan->D = D;
    plan->H = H;
    /* at most one run per (decode rank, local head) */
    int max_runs = D * (H >= D ? H / D : 1);
    plan->runs = DUET_NEW_ARRAY(duet_slice_run_t, max_runs);
    if (!plan->runs) {
        st = duet_error(DUET_ERR_NO_MEMORY, "slice plan: %d runs", max_runs);
        goto err_free_plan;
    }
    plan->dst_off = DUET_NEW_ARRAY(int, D + 1);
    if (!plan->dst_off) {
        st = duet_error(DUET_ERR_NO_MEMORY, "slice plan: dst index");
        goto err_free_runs;
    }
    plan->src_off = DUET_NEW_ARRAY(int, P + 1);
    if (!plan->src_off) {
        st = duet_error(DUET_ERR_NO_MEMORY, "slice plan: src index");
        goto err_free_dst_off;
    }

    duet__slice_plan_fill(plan);
    if ((st = duet__slice_plan_index_sources(plan)) != DUET_OK)
        goto err_free_src_off;
    *plan_p = plan;
    return DUET_OK;

err_free_src_off:
    duet_free(plan->src_off);
err_free_dst_off:
    duet_free(plan->dst_off);
err_free_runs:
    duet_free(plan->runs);
err_free_plan:
    duet_free(plan);
    return st;
}

void duet_slice_plan_destroy(duet_slice_plan_t *plan)
{
    if (!plan)
        return;
    duet_free(plan->src_off);
    duet_free(plan->dst_off);
    duet_free(plan->runs);
    duet_free(plan);
}

int duet_slice_plan_prefill_tp(const duet_slice_plan_t *plan)
{
    return plan->P;
}

int duet_slice_plan_decode_tp(const duet_slice_plan_t *plan)
{
    return plan->D;
}

int duet_slice_plan_kv_heads(const duet_slice_plan_t *plan)
{
    return plan->H;
}

/* A rank outside the group has no runs: 0 and *runs_p = NULL. */
int duet_slice_plan_dst_runs(const duet_slice_plan_t *plan, int d, const duet_slice_run_t **runs_p)
{
    if (d < 0 || d >= plan->D) {
        *runs_p = NULL;
        return 0;
    }
    *runs_p = plan->runs + plan->dst_off[d];
    return plan->dst_off[d + 1] - plan->dst_off[d];
}

int duet_slice_plan_src_runs(const duet_slice_plan_t *plan, int s, const duet_slice_run_t **runs_p)
{
    if (s < 0 || s >= plan->P) {
        *runs_p = NULL;
        return 0;
    }
    *runs_p = plan->runs + plan->src_off[s];
    return plan->src_off[s + 1] - plan->src_off[s];
}

/* d's runs have non-decreasing src_rank, so dropping repeats leaves a sorted
 * set. */
int duet_slice_plan_senders(const duet_slice_plan_t *plan, int d, int *ranks)
{
    const duet_slice_run_t *runs;
    int n = duet_slice_plan_dst_runs(plan, d, &runs), count = 0;
    for (int k = 0; k < n; k++)
        if (count == 0 || ranks[count - 1] != runs[k].src_rank)
            ranks[count++] = runs[k].src_rank;
    return count;
}

uint64_t duet_slice_plan_sender_mask(const duet_slice_plan_t *plan, int d)
{
    const duet_slice_run_t *runs;
    int n = duet_slice_plan_dst_runs(plan, d, &runs);
    uint64_t mask = 0;
    for (int k = 0; k < n; k++)
        mask |= UINT64_C(1) << runs[k].src_rank;
    return mask;
}

int duet_slice_plan_receivers(const duet_slice_plan_t *plan, int s, int *ranks)
{
    const duet_slice_run_t *runs;
    int n = duet_slice_plan_src_runs(plan, s, &runs), count = 0;
    for (int k = 0; k < n; k++)
        if (count == 0 || ranks[count - 1] != runs[k].dst_rank)
            ranks[count++] = runs[k].dst_rank;
    return count;
}
