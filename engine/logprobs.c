/* log p(i) = l_i - (m + log sum_j exp(l_j - m)), m = max_j l_j, summed in
 * double so the result does not depend on the order of a float sum. */
#include <math.h>

#include "engine/logprobs.h"

duet_status_t duet_logprob_compute(const float *logits, int vocab, int32_t id, int n_top,
                                   duet_logprob_t *out)
{
    double m = -INFINITY, sum = 0.0, lse;
    int n = 0;

    if (vocab <= 0)
        return duet_error(DUET_ERR_INVALID, "logprobs: vocab %d must be positive", vocab);
    if (id < 0 || id >= vocab)
        return duet_error(DUET_ERR_INVALID, "logprobs: token %d outside the vocab (%d)", id, vocab);
    if (n_top < 0 || n_top > DUET_LOGPROBS_TOP_MAX || n_top > vocab)
        return duet_error(DUET_ERR_INVALID, "logprobs: top_logprobs %d outside 0..%d", n_top,
                          vocab < DUET_LOGPROBS_TOP_MAX ? vocab : DUET_LOGPROBS_TOP_MAX);
    for (int i = 0; i < vocab; i++) {
        if (logits[i] > m)
            m = logits[i];
    }
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - m);
    lse = m + log(sum);
    out->id = id;
    out->logprob = (float)((double)logits[id] - lse);
    /* insertion into the sorted top list: strictly greater moves up, so
     * equal logits keep the lower id first */
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float v = logits[i];
        if (n == n_top && !(v > logits[out->top_ids[n - 1]]))
            continue;
        int k = n < n_top ? n++ : n - 1;
        while (k > 0 && v > logits[out->top_ids[k - 1]]) {
            out->top_ids[k] = out->top_ids[k - 1];
            k--;
        }
        out->top_ids[k] = i;
    }
    out->n_top = n;
    for (int k = 0; k < n; k++)
        out->top_logprobs[k] = (float)((double)logits[out->top_ids[k]] - lse);
    return DUET_OK;
}

duet_status_t duet_logprob_params_check(int top, bool prompt, int n_prompt, int vocab)
{
    int cap = vocab < DUET_LOGPROBS_TOP_MAX ? vocab : DUET_LOGPROBS_TOP_MAX;

    if (top < 0 || top > cap)
        return duet_error(DUET_ERR_INVALID, "top_logprobs %d outside 0..%d", top, cap);
    if (prompt && (size_t)n_prompt * (size_t)vocab > DUET_LOGPROBS_PROMPT_MAX_FLOATS)
        return duet_error(DUET_ERR_INVALID,
                          "prompt_logprobs: a %d-token prompt needs %zu MiB of logits (at most "
                          "%zu MiB)",
                          n_prompt, (size_t)n_prompt * (size_t)vocab * 4 >> 20,
                          DUET_LOGPROBS_PROMPT_MAX_FLOATS * 4 >> 20);
    return DUET_OK;
}

duet_status_t duet_logprobs_of_prompt(const float *rows, int vocab, const int32_t *prompt,
                                      int n_prompt, int32_t first, int n_top,
                                      duet_logprob_t *first_lp, duet_logprob_t *prompt_lps)
{
    size_t last = prompt_lps != NULL && n_prompt > 0 ? (size_t)n_prompt - 1 : 0;
    duet_status_t st = DUET_OK;

    if (first_lp != NULL)
        st = duet_logprob_compute(rows + last * (size_t)vocab, vocab, first, n_top, first_lp);
    for (int i = 1; st == DUET_OK && prompt_lps != NULL && i < n_prompt; i++)
        st = duet_logprob_compute(rows + (size_t)(i - 1) * (size_t)vocab, vocab, prompt[i], n_top,
                                  &prompt_lps[i - 1]);
    return st;
}
