/* Log-probabilities on decode (docs/api-logprobs.md).  Output 0's come
 * from whoever computed the prompt: a prefill daemon sends them (and the
 * prompt's, with prompt_logprobs) in its Prefill reply, which decode then
 * waits for besides the KV notifications; a local prefill computes them
 * here.  Every later token's come from the decode step's logits row. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "decode/lp.h"
#include "duet/v1/prefill.pb-c.h"
#include "node/logprob_pb.h"

bool duet_dc_lp_wants_reply(const duet_dc_req_t *req)
{
    return req->logprobs || req->prompt_logprobs;
}

void duet_dc_lp_take_reply(duet_decode_t *dc, duet_dc_req_t *req, const uint8_t *data, size_t len)
{
    int vocab = dc->node.ke.model_cfg.vocab;
    Duet__V1__PrefillResponse *r;
    duet_status_t st = DUET_OK;

    if (!duet_dc_lp_wants_reply(req) || req->pf_reply)
        return;
    req->pf_reply = true;
    r = duet__v1__prefill_response__unpack(NULL, len, data);
    if (r == NULL) {
        snprintf(req->pf_lp_error, sizeof(req->pf_lp_error), "malformed Prefill reply");
        return;
    }
    if (req->logprobs)
        st = duet_node_logprob_from_pb(r->first_logprob, vocab, req->top_logprobs,
                                       &req->pf_first_lp);
    if (st == DUET_OK && req->prompt_logprobs) {
        if (r->n_prompt_logprobs != (size_t)req->n_prompt - 1) {
            st = duet_error(DUET_ERR_INVALID, "%zu prompt logprobs for a %d-token prompt",
                            r->n_prompt_logprobs, req->n_prompt);
        } else if (req->n_prompt > 1 && (req->pf_prompt_lps = DUET_NEW_ARRAY(
                                             duet_logprob_t, (size_t)req->n_prompt - 1)) == NULL) {
            st = duet_error(DUET_ERR_NO_MEMORY, "no memory for prompt logprobs");
        }
        for (size_t i = 0; st == DUET_OK && i < r->n_prompt_logprobs; i++) {
            st = duet_node_logprob_from_pb(r->prompt_logprobs[i], vocab, req->top_logprobs,
                                           &req->pf_prompt_lps[i]);
            if (st == DUET_OK && req->pf_prompt_lps[i].id != req->prompt[i + 1])
                st = duet_error(DUET_ERR_INVALID, "prompt logprob %zu is for token %d, not %d", i,
                                req->pf_prompt_lps[i].id, req->prompt[i + 1]);
        }
    }
    if (st != DUET_OK)
        snprintf(req->pf_lp_error, sizeof(req->pf_lp_error), "%s", duet_error_msg());
    duet__v1__prefill_response__free_unpacked(r, NULL);
}

duet_status_t duet_dc_lp_adopt_reply(duet_decode_t *dc, duet_dc_req_t *req)
{
    char msg[320];

    (void)dc;
    if (!duet_dc_lp_wants_reply(req))
        return DUET_OK;
    if (!req->pf_reply)
        snprintf(req->pf_lp_error, sizeof(req->pf_lp_error), "no reply");
    else if (req->pf_lp_error[0] == '\0' && req->logprobs &&
             req->pf_first_lp.id != req->kv_first_token)
        snprintf(req->pf_lp_error, sizeof(req->pf_lp_error),
                 "logprob of token %d, the first token is %d", req->pf_first_lp.id,
                 req->kv_first_token);
    if (req->pf_lp_error[0] != '\0') {
        snprintf(msg, sizeof(msg), "prefill %s sent bad logprobs: %s", req->prefill_target,
                 req->pf_lp_error);
        DUET_LOG_ERROR("request %s: %s", req->request_id, msg);
        return duet_error(DUET_ERR_INTERNAL, "%s", msg);
    }
    req->first_lp = req->pf_first_lp;
    req->have_first_lp = req->logprobs;
    req->prompt_lps = req->pf_prompt_lps;
    req->pf_prompt_lps = NULL;
    return DUET_OK;
}

duet_status_t duet_dc_lp_init(duet_decode_t *dc, duet_dc_req_t *req)
{
    if (!req->logprobs || req->logits != NULL)
        return DUET_OK;
    req->logits = DUET_NEW_ARRAY(float, (size_t)dc->node.ke.model_cfg.vocab);
    if (req->logits == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory for the logits of %s", req->request_id);
    return DUET_OK;
}

void duet_dc_lp_cleanup(duet_dc_req_t *req)
{
    duet_free(req->logits);
    duet_free(req->prompt_lps);
    duet_free(req->pf_prompt_lps);
    req->logits = NULL;
    req->prompt_lps = NULL;
    req->pf_prompt_lps = NULL;
}

duet_status_t duet_dc_lp_local_prepare(duet_decode_t *dc, duet_dc_req_t *req,
                                       duet_engine_seq_t *seq, bool first, bool last)
{
    size_t vocab = (size_t)dc->node.ke.model_cfg.vocab;
    duet_status_t st = DUET_OK;

    if (!duet_dc_lp_wants_reply(req))
        return DUET_OK;
    if (first && req->prompt_logprobs) {
        /* every prompt row: the step's row buffer is too small, so a
         * temporary one, held across the chunks; prompt_lps holds the
         * results */
        float *rows = duet_malloc((size_t)req->n_prompt * vocab * sizeof(float));
        if (rows == NULL)
            st = duet_error(DUET_ERR_NO_MEMORY, "no memory for the prompt logits of %s",
                            req->request_id);
        duet_free(req->logits);
        req->logits = rows;
    } else if (first) {
        st = duet_dc_lp_init(dc, req);
    }
    if (req->logits == NULL)
        return st; /* (compute fails the request) */
    if (req->prompt_logprobs) {
        /* this chunk's rows (prompt logprobs: nothing came from the
         * cache, row i is position i) */
        seq->logits = req->logits + (size_t)seq->start_pos * vocab;
        seq->all_logits = true;
    } else if (last) {
        seq->logits = req->logits;
    }
    return st;
}

duet_status_t duet_dc_lp_local_compute(duet_decode_t *dc, duet_dc_req_t *req, int32_t first)
{
    duet_status_t st;

    if (!duet_dc_lp_wants_reply(req))
        return DUET_OK;
    if (req->logits == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory for the logits of %s", req->request_id);
    if (req->prompt_logprobs && req->n_prompt > 1 &&
        (req->prompt_lps = DUET_NEW_ARRAY(duet_logprob_t, (size_t)req->n_prompt - 1)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory for prompt logprobs");
    st = duet_logprobs_of_prompt(req->logits, dc->node.ke.model_cfg.vocab, req->prompt,
                                 req->n_prompt, first, req->top_logprobs,
                                 req->logprobs ? &req->first_lp : NULL,
                                 req->prompt_logprobs ? req->prompt_lps : NULL);
    req->have_first_lp = req->logprobs && st == DUET_OK;
    if (st == DUET_OK && req->prompt_logprobs) {
        /* back to one row for the decode steps */
        duet_free(req->logits);
        req->logits = NULL;
        st = duet_dc_lp_init(dc, req);
    }
    return st;
}

const duet_logprob_t *duet_dc_lp_step(duet_decode_t *dc, duet_dc_req_t *req, int32_t token,
                                      duet_logprob_t *lp)
{
    if (!req->logprobs || req->logits == NULL || token < 0)
        return NULL;
    if (duet_logprob_compute(req->logits, dc->node.ke.model_cfg.vocab, token, req->top_logprobs,
                             lp) != DUET_OK)
        return NULL;
    return lp;
}
