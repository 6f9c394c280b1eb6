/* Streaming a request's tokens: detokenize incrementally (primed with the
 * prompt so the first piece keeps its leading space), hold back text that
 * may begin a stop string, and end the stream with a Finished message
 * (output.h: the caller makes the terminal call). */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_pb.h"
#include "decode/lp.h"
#include "decode/output.h"
#include "duet/v1/generate.pb-c.h"
#include "node/logprob_pb.h"

static duet_status_t duet__held_append(duet_dc_req_t *req, const char *s, size_t n);

duet_status_t duet_dc_output_init(duet_decode_t *dc, duet_dc_req_t *req)
{
    duet_status_t st;

    req->out = duet_malloc((size_t)(req->max_tokens > 0 ? req->max_tokens : 1) * sizeof(int32_t));
    req->held_cap = 256;
    req->held = duet_malloc(req->held_cap);
    if (req->out == NULL || req->held == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "no memory for the output of %s", req->request_id);
    if ((st = duet_dc_lp_init(dc, req)) != DUET_OK ||
        (st = duet_detok_create(dc->tok, true, &req->detok)) != DUET_OK)
        return st;
    /* the prompt is context only: its text is not sent (priming reads its
     * tail, not all of it: this runs before the first token goes out) */
    size_t n_context = (size_t)(req->n_prompt - req->first_index);
    if ((st = duet_detok_prime(req->detok, req->prompt, n_context)) != DUET_OK)
        return st;
    /* a migrated stream: its earlier outputs' text as the first decode had
     * it, less what the client has (docs/migration.md) */
    for (int i = 0; i < req->first_index; i++) {
        size_t n = 0;
        if ((st = duet_detok_push(req->detok, req->prompt[n_context + (size_t)i], dc->piece,
                                  dc->piece_cap, &n)) != DUET_OK ||
            (st = duet__held_append(req, dc->piece, n)) != DUET_OK)
            return st;
    }
    if (req->resumed_text > req->held_len)
        return duet_error(DUET_ERR_INVALID,
                          "resumed_text_bytes: %zu, but the resumed tokens' text has %zu bytes",
                          req->resumed_text, req->held_len);
    memmove(req->held, req->held + req->resumed_text, req->held_len - req->resumed_text);
    req->held_len -= req->resumed_text;
    req->held[req->held_len] = '\0';
    return DUET_OK;
}

static duet_status_t duet__held_append(duet_dc_req_t *req, const char *s, size_t n)
{
    if (req->held_len + n + 1 > req->held_cap) {
        size_t cap = (req->held_len + n + 1) * 2;
        char *h = duet_realloc(req->held, cap);
        if (h == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "no memory for output text");
        req->held = h;
        req->held_cap = cap;
    }
    memcpy(req->held + req->held_len, s, n);
    req->held_len += n;
    req->held[req->held_len] = '\0';
    return DUET_OK;
}

/* Longest suffix of held that is a proper prefix of a stop string. */
static size_t duet__stop_prefix(const duet_dc_req_t *req)
{
    size_t best = 0;
    for (int i = 0; i < req->n_stops; i++) {
        size_t sl = strlen(req->stops[i]);
        for (size_t k = sl - 1; k > best; k--) {
            if (k <= req->held_len &&
                memcmp(req->held + req->held_len - k, req->stops[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

static bool duet__is_stop_id(const duet_dc_req_t *req, int32_t t)
{
    for (int i = 0; i < req->n_stop_ids; i++) {
        if (req->stop_ids[i] == t)
            return true;
    }
    return false;
}

/* The chunk's logprobs (docs/api-logprobs.md): the token's, and the
 * prompt's on the first chunk.  The arrays are freed by the caller. */
static bool duet__chunk_logprobs(duet_dc_req_t *req, const duet_logprob_t *lp,
                                 Duet__V1__TokenChunk *chunk, Duet__V1__TokenLogprob **msgs_p,
                                 Duet__V1__TokenLogprob ***ptrs_p, Duet__V1__TopLogprob **tops_p,
                                 Duet__V1__TopLogprob ***top_ptrs_p)
{
    size_t n_prompt = req->prompt_logprobs && !req->prompt_lps_sent && req->n_prompt > 1
                          ? (size_t)req->n_prompt - 1
                          : 0;
    size_t n = n_prompt + (lp != NULL);
    Duet__V1__TokenLogprob *msgs;
    Duet__V1__TokenLogprob **ptrs;
    Duet__V1__TopLogprob *tops;
    Duet__V1__TopLogprob **top_ptrs;

    if (n == 0)
        return true;
    msgs = *msgs_p = DUET_NEW_ARRAY(Duet__V1__TokenLogprob, n);
    ptrs = *ptrs_p = DUET_NEW_ARRAY(Duet__V1__TokenLogprob *, n);
    tops = *tops_p = DUET_NEW_ARRAY(Duet__V1__TopLogprob, n * DUET_LOGPROBS_TOP_MAX);
    top_ptrs = *top_ptrs_p = DUET_NEW_ARRAY(Duet__V1__TopLogprob *, n * DUET_LOGPROBS_TOP_MAX);
    if (msgs == NULL || ptrs == NULL || tops == NULL || top_ptrs == NULL)
        return false;
    for (size_t i = 0; i < n; i++) {
        duet_node_logprob_to_pb(i < n_prompt ? &req->prompt_lps[i] : lp, &msgs[i],
                                tops + i * DUET_LOGPROBS_TOP_MAX,
                                top_ptrs + i * DUET_LOGPROBS_TOP_MAX);
        ptrs[i] = &msgs[i];
    }
    chunk->n_prompt_logprobs = n_prompt;
    chunk->prompt_logprobs = n_prompt > 0 ? ptrs : NULL;
    chunk->n_logprobs = lp != NULL;
    chunk->logprobs = lp != NULL ? ptrs + n_prompt : NULL;
    return true;
}

static duet_dc_emit_t duet__emit_fail(duet_status_t st, const char *msg)
{
    duet_dc_emit_t r = {.kind = DUET_DC_EMIT_FAIL, .status = st};
    snprintf(r.msg, sizeof(r.msg), "%s", msg);
    return r;
}

/* Send one chunk of ids and text: MORE, or FAIL (the stream is gone). */
static duet_dc_emit_t duet__chunk_send(duet_dc_req_t *req, int32_t *ids, size_t n_ids,
                                       const char *text, size_t text_len, const duet_logprob_t *lp)
{
    Duet__V1__GenerateResponse resp = DUET__V1__GENERATE_RESPONSE__INIT;
    Duet__V1__TokenChunk chunk = DUET__V1__TOKEN_CHUNK__INIT;
    Duet__V1__TokenLogprob *msgs = NULL, **ptrs = NULL;
    Duet__V1__TopLogprob *tops = NULL, **top_ptrs = NULL;
    char *t = duet_strndup(text, text_len);
    duet_status_t st;
    bool lp_ok = duet__chunk_logprobs(req, lp, &chunk, &msgs, &ptrs, &tops, &top_ptrs);

    if (t == NULL || !lp_ok) {
        duet_free(t);
        duet_free(msgs);
        duet_free(ptrs);
        duet_free(tops);
        duet_free(top_ptrs);
        return duet__emit_fail(DUET_ERR_NO_MEMORY, "no memory for output text");
    }
    req->prompt_lps_sent = true;
    chunk.n_ids = n_ids;
    chunk.ids = ids;
    chunk.text = t;
    resp.kind_case = DUET__V1__GENERATE_RESPONSE__KIND_CHUNK;
    resp.chunk = &chunk;
    st = duet_pb_write(req->call, &resp.base);
    duet_free(t);
    duet_free(msgs);
    duet_free(ptrs);
    duet_free(tops);
    duet_free(top_ptrs);
    if (st == DUET_OK)
        return (duet_dc_emit_t){.kind = DUET_DC_EMIT_MORE};
    if (st == DUET_ERR_CANCELLED)
        return duet__emit_fail(DUET_ERR_CANCELLED, "the client went away");
    if (st == DUET_ERR_EXHAUSTED)
        return duet__emit_fail(DUET_ERR_EXHAUSTED, "the client does not read its stream");
    return duet__emit_fail(st, duet_error_msg());
}

/* The Finished message: FINISH, or FAIL (the stream is gone). */
static duet_dc_emit_t duet__finished_send(duet_dc_req_t *req, Duet__V1__FinishReason reason,
                                          const char *matched)
{
    Duet__V1__GenerateResponse resp = DUET__V1__GENERATE_RESPONSE__INIT;
    Duet__V1__Finished fin = DUET__V1__FINISHED__INIT;

    fin.reason = reason;
    fin.prompt_tokens = (uint32_t)(req->n_prompt - req->first_index);
    fin.completion_tokens = (uint32_t)(req->first_index + req->n_out);
    fin.request_id = req->request_id;
    fin.seed = req->sampling.seed;
    fin.stop_matched = (char *)(matched ? matched : "");
    fin.ttft_us = (uint32_t)((req->t_first - req->t_arrival) / 1000);
    resp.kind_case = DUET__V1__GENERATE_RESPONSE__KIND_FINISHED;
    resp.finished = &fin;
    if (duet_pb_write(req->call, &resp.base) != DUET_OK)
        return duet__emit_fail(DUET_ERR_CANCELLED, "the client went away");
    return (duet_dc_emit_t){.kind = DUET_DC_EMIT_FINISH};
}

duet_dc_emit_t duet_dc_output_emit(duet_decode_t *dc, duet_dc_req_t *req, int32_t token,
                                   const duet_logprob_t *lp)
{
    const duet_model_config_t *cfg = &dc->node.ke.model_cfg;
    char *piece = dc->piece;
    size_t cap = dc->piece_cap;
    size_t n = 0;
    int32_t id = token;
    const char *why = NULL, *matched = NULL;
    duet_dc_emit_t r;

    if (req->call == NULL)
        return (duet_dc_emit_t){.kind = DUET_DC_EMIT_ENDED};
    if (token == DUET_ENGINE_NONFINITE) { /* broken weights: this request fails, not the daemon */
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "non-finite logits (NaN or inf) at output token %d: the model's weights or "
                 "activations are broken",
                 req->n_out);
        DUET_LOG_ERROR("request %s: %s", req->request_id, msg);
        return duet__emit_fail(DUET_ERR_INTERNAL, msg);
    }
    if (req->t_first == 0)
        req->t_first = duet_now_ns();
    req->out[req->n_out++] = token;

    /* an EOS or stop token ends the stream: its id goes out, its text not */
    if (!req->ignore_eos && duet_model_config_is_eos(cfg, token))
        why = "eos";
    else if (duet__is_stop_id(req, token))
        why = "stop_token_id";
    if (why == NULL && (duet_detok_push(req->detok, token, piece, cap, &n) != DUET_OK ||
                        duet__held_append(req, piece, n) != DUET_OK))
        return duet__emit_fail(DUET_ERR_INTERNAL, duet_error_msg());
    bool last =
        why != NULL || req->n_out >= req->max_tokens || req->n_prompt + req->n_out >= dc->max_ctx;
    if (last && duet_detok_flush(req->detok, piece, cap, &n) == DUET_OK && n > 0 &&
        duet__held_append(req, piece, n) != DUET_OK)
        return duet__emit_fail(DUET_ERR_NO_MEMORY, duet_error_msg());
    /* the earliest stop string ends the text before it */
    size_t send = req->held_len;
    for (int i = 0; i < req->n_stops; i++) {
        char *hit = strstr(req->held, req->stops[i]);
        if (hit != NULL && (size_t)(hit - req->held) < send) {
            send = (size_t)(hit - req->held);
            matched = req->stops[i];
        }
    }
    if (matched == NULL && !last)
        send -= duet__stop_prefix(req);
    if ((r = duet__chunk_send(req, &id, 1, req->held, send, lp)).kind != DUET_DC_EMIT_MORE)
        return r;
    if (matched != NULL || why != NULL)
        return duet__finished_send(req, DUET__V1__FINISH_REASON__FINISH_REASON_STOP,
                                   matched != NULL ? matched : why);
    if (last)
        return duet__finished_send(req, DUET__V1__FINISH_REASON__FINISH_REASON_LENGTH, NULL);
    memmove(req->held, req->held + send, req->held_len - send);
    req->held_len -= send;
    req->held[req->held_len] = '\0';
    return r;
}
