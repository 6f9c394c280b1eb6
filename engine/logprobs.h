/* Log-probabilities of a next-token distribution (docs/api-logprobs.md):
 * the log-softmax of one row of raw logits (before temperature, top-k or
 * top-p), computed in double precision on the host, and its most likely
 * tokens.  Pure functions: any thread. */
#ifndef DUET_ENGINE_LOGPROBS_H
#define DUET_ENGINE_LOGPROBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The most alternatives a request may ask for (OpenAI chat's cap). */
#define DUET_LOGPROBS_TOP_MAX 20

typedef struct {
    int32_t id;    /* the token */
    float logprob; /* log p(id) */
    int n_top;     /* alternatives below, most likely first (ties: lower id) */
    int32_t top_ids[DUET_LOGPROBS_TOP_MAX];
    float top_logprobs[DUET_LOGPROBS_TOP_MAX];
} duet_logprob_t;

/* Prompt logprobs need the logits of every prompt position at once:
 * n_prompt * vocab floats, at most this many (1 GiB). */
#define DUET_LOGPROBS_PROMPT_MAX_FLOATS ((size_t)1 << 28)

/* Check a request's log-probability options against the model: top in
 * 0..min(20, vocab), and prompt logprobs within the limit above.
 * DUET_ERR_INVALID naming the field (top_logprobs, prompt_logprobs). */
duet_status_t duet_logprob_params_check(int top, bool prompt, int n_prompt, int vocab);

/* Fill *out for token id from logits[vocab] with the n_top (0..20, at most
 * vocab) most likely tokens.  DUET_ERR_INVALID naming the argument for a
 * bad id, vocab or n_top; a non-finite logit gives non-finite results (the
 * engine reports such rows as DUET_ENGINE_NONFINITE first). */
duet_status_t duet_logprob_compute(const float *logits, int vocab, int32_t id, int n_top,
                                   duet_logprob_t *out);

/* What a prompt's logits rows give: with prompt_lps, rows holds every
 * prompt position ([n_prompt][vocab]) and prompt_lps[i - 1] gets prompt[i]'s
 * logprob for i in 1..n_prompt-1 (row i-1 predicts token i); without, rows
 * is the last position's row alone.  With first_lp, *first_lp gets the
 * first generated token's (first), from the last row.  Errors as
 * duet_logprob_compute. */
duet_status_t duet_logprobs_of_prompt(const float *rows, int vocab, const int32_t *prompt,
                                      int n_prompt, int32_t first, int n_top,
                                      duet_logprob_t *first_lp, duet_logprob_t *prompt_lps);

#endif
