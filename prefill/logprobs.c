/* Log-probabilities on prefill (docs/api-logprobs.md): the first token's,
 * from the last prompt position's logits, and with prompt_logprobs every
 * prompt token's from the second on (row i-1 predicts token i).  The
 * engine copies the requested logits rows to the host (engine.h
 * duet_engine_seq_t.logits); the log-softmax runs here in double. */
#include <string.h>

#include "common/alloc.h"
#include "node/logprob_pb.h"
#include "prefill/prefill.h"

duet_status_t duet_pf_logprobs_prepare(duet_prefill_t *pf, duet_pf_req_t *req,
                                       duet_engine_seq_t *seq)
{
    size_t vocab = (size_t)pf->node.ke.model_cfg.vocab;
    size_t rows = req->prompt_logprobs ? (size_t)req->n_prompt : 1;

    if (!req->logprobs && !req->prompt_logprobs)
        return DUET_OK;
    req->logits = duet_malloc(rows * vocab * sizeof(float));
    if (req->logits == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for %zu logits rows", req->request_id,
                          rows);
    if (req->prompt_logprobs) {
        req->prompt_lps = DUET_NEW_ARRAY(duet_logprob_t, (size_t)req->n_prompt);
        if (req->prompt_lps == NULL) {
            duet_free(req->logits);
            req->logits = NULL;
            return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for prompt logprobs",
                              req->request_id);
        }
    }
    seq->logits = req->logits;
    seq->all_logits = req->prompt_logprobs;
    return DUET_OK;
}

duet_status_t duet_pf_logprobs_compute(duet_prefill_t *pf, duet_pf_req_t *req, int32_t first)
{
    duet_status_t st;

    if (req->logits == NULL)
        return DUET_OK;
    st = duet_logprobs_of_prompt(req->logits, pf->node.ke.model_cfg.vocab, req->prompt,
                                 req->n_prompt, first, req->top_logprobs,
                                 req->logprobs ? &req->first_lp : NULL,
                                 req->prompt_logprobs ? req->prompt_lps : NULL);
    duet_free(req->logits);
    req->logits = NULL;
    return st;
}

bool duet_pf_logprobs_reply(const duet_pf_req_t *req, Duet__V1__PrefillResponse *resp,
                            duet_pf_lp_reply_t *r)
{
    size_t n = (size_t)req->n_prompt; /* n - 1 prompt entries + the first token */
    size_t k = 0;

    memset(r, 0, sizeof(*r));
    if (!req->logprobs && !req->prompt_logprobs)
        return true;
    r->msgs = DUET_NEW_ARRAY(Duet__V1__TokenLogprob, n);
    r->ptrs = DUET_NEW_ARRAY(Duet__V1__TokenLogprob *, n);
    r->tops = DUET_NEW_ARRAY(Duet__V1__TopLogprob, n * DUET_LOGPROBS_TOP_MAX);
    r->top_ptrs = DUET_NEW_ARRAY(Duet__V1__TopLogprob *, n * DUET_LOGPROBS_TOP_MAX);
    if (r->msgs == NULL || r->ptrs == NULL || r->tops == NULL || r->top_ptrs == NULL) {
        duet_pf_logprobs_reply_free(r);
        return false;
    }
    if (req->logprobs) {
        duet_node_logprob_to_pb(&req->first_lp, &r->msgs[k], r->tops, r->top_ptrs);
        resp->first_logprob = &r->msgs[k++];
    }
    if (req->prompt_logprobs) {
        size_t k0 = k;
        for (int i = 0; i + 1 < req->n_prompt; i++, k++) {
            duet_node_logprob_to_pb(&req->prompt_lps[i], &r->msgs[k],
                                    r->tops + k * DUET_LOGPROBS_TOP_MAX,
                                    r->top_ptrs + k * DUET_LOGPROBS_TOP_MAX);
            r->ptrs[k - k0] = &r->msgs[k];
        }
        resp->n_prompt_logprobs = k - k0;
        resp->prompt_logprobs = r->ptrs;
    }
    return true;
}

void duet_pf_logprobs_reply_free(duet_pf_lp_reply_t *r)
{
    duet_free(r->msgs);
    duet_free(r->ptrs);
    duet_free(r->tops);
    duet_free(r->top_ptrs);
    memset(r, 0, sizeof(*r));
}
