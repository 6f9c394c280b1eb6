/* Log-probabilities on the wire (docs/api-logprobs.md): between the
 * engine's duet_logprob_t and duet.v1.TokenLogprob.  Both daemons use it:
 * prefill answers with the first token's and the prompt's, decode reads
 * them and streams its own. */
#ifndef DUET_NODE_LOGPROB_PB_H
#define DUET_NODE_LOGPROB_PB_H

#include "common/status.h"
#include "duet/v1/common.pb-c.h"
#include "engine/logprobs.h"

/* A TokenLogprob message viewing lp (no allocation): m and tops (room for
 * DUET_LOGPROBS_TOP_MAX entries, top_ptrs likewise) are the caller's and
 * must outlive the packing of m. */
void duet_node_logprob_to_pb(const duet_logprob_t *lp, Duet__V1__TokenLogprob *m,
                             Duet__V1__TopLogprob *tops, Duet__V1__TopLogprob **top_ptrs);

/* Check and copy a received TokenLogprob: ids in 0..vocab-1, finite
 * logprobs <= 0 (a small rounding excess allowed), exactly n_top
 * alternatives.  DUET_ERR_INVALID naming what is wrong. */
duet_status_t duet_node_logprob_from_pb(const Duet__V1__TokenLogprob *m, int vocab, int n_top,
                                        duet_logprob_t *lp);

#endif
