/* Conversions between duet_logprob_t and duet.v1.TokenLogprob. */
#include <math.h>

#include "node/logprob_pb.h"

void duet_node_logprob_to_pb(const duet_logprob_t *lp, Duet__V1__TokenLogprob *m,
                             Duet__V1__TopLogprob *tops, Duet__V1__TopLogprob **top_ptrs)
{
    duet__v1__token_logprob__init(m);
    m->id = lp->id;
    m->logprob = lp->logprob;
    for (int k = 0; k < lp->n_top; k++) {
        duet__v1__top_logprob__init(&tops[k]);
        tops[k].id = lp->top_ids[k];
        tops[k].logprob = lp->top_logprobs[k];
        top_ptrs[k] = &tops[k];
    }
    m->n_top = (size_t)lp->n_top;
    m->top = lp->n_top > 0 ? top_ptrs : NULL;
}

static bool duet__lp_ok(float v)
{
    return isfinite(v) && v <= 1e-3f;
}

duet_status_t duet_node_logprob_from_pb(const Duet__V1__TokenLogprob *m, int vocab, int n_top,
                                        duet_logprob_t *lp)
{
    if (m == NULL)
        return duet_error(DUET_ERR_INVALID, "logprobs: missing");
    if (m->id < 0 || m->id >= vocab)
        return duet_error(DUET_ERR_INVALID, "logprobs: token %d outside the vocab (%d)", m->id,
                          vocab);
    if (!duet__lp_ok(m->logprob))
        return duet_error(DUET_ERR_INVALID, "logprobs: logprob %g of token %d is not <= 0",
                          (double)m->logprob, m->id);
    if (n_top < 0 || n_top > DUET_LOGPROBS_TOP_MAX || m->n_top != (size_t)n_top)
        return duet_error(DUET_ERR_INVALID, "logprobs: %zu alternatives where %d were asked",
                          m->n_top, n_top);
    lp->id = m->id;
    lp->logprob = m->logprob;
    lp->n_top = n_top;
    for (int k = 0; k < n_top; k++) {
        const Duet__V1__TopLogprob *t = m->top[k];
        if (t->id < 0 || t->id >= vocab || !duet__lp_ok(t->logprob))
            return duet_error(DUET_ERR_INVALID, "logprobs: alternative %d (token %d, %g) is bad", k,
                              t->id, (double)t->logprob);
        lp->top_ids[k] = t->id;
        lp->top_logprobs[k] = t->logprob;
    }
    return DUET_OK;
}
