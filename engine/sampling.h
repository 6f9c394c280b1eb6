/* Token sampling: greedy, temperature, top-k, top-p, per-request seed.
 *
 * Randomness is counter-based: the draw for the token at output index i of
 * a request is a pure function of (seed, i).  So the prefill daemon (which
 * samples output 0) and the decode daemon (outputs 1..) continue one stream
 * with no state to hand over, and a run is reproducible from its seed.
 * Sampling is decided on rank 0 only and broadcast (DESIGN §3 rule 1). */
#ifndef DUET_ENGINE_SAMPLING_H
#define DUET_ENGINE_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off; (0, 1] */
    uint64_t seed;
} duet_sampling_t;

static inline duet_sampling_t duet_sampling_greedy(void)
{
    duet_sampling_t s = {0.0f, 0, 1.0f, 0};
    return s;
}

/* DUET_ERR_INVALID naming the field when out of range
 * (temperature < 0 or > 100, top_k < 0, top_p outside (0, 1]). */
duet_status_t duet_sampling_check(const duet_sampling_t *s);

/* Uniform double in [0, 1) for (seed, index): duet_sampling_u53 * 2^-53. */
double duet_sampling_uniform(uint64_t seed, uint64_t index);
/* The same draw as 53 random bits (device sampling takes these). */
uint64_t duet_sampling_u53(uint64_t seed, uint64_t index);

/* Sample one id from logits[vocab] for output index `index`.  scratch must
 * hold 2 * vocab floats (it is clobbered).  With temperature > 0 the
 * candidates are sorted by logit (ties by id) before top-k/top-p, so the
 * result depends on the logits alone.  Greedy picks the lowest index
 * among equal maxima. */
int32_t duet_sample(const float *logits, int vocab, const duet_sampling_t *s, uint64_t index,
                    float *scratch);

#endif
