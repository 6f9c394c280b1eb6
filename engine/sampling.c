#include "engine/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

duet_status_t duet_sampling_check(const duet_sampling_t *s)
{
    if (!(s->temperature >= 0.0f && s->temperature <= 100.0f))
        return duet_error(DUET_ERR_INVALID, "temperature %g must be between 0 and 100",
                          (double)s->temperature);
    if (s->top_k < 0)
        return duet_error(DUET_ERR_INVALID, "top_k %d must be >= 0", s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return duet_error(DUET_ERR_INVALID, "top_p %g must be in (0, 1]", (double)s->top_p);
    return DUET_OK;
}

static uint64_t duet__mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t duet_sampling_u53(uint64_t seed, uint64_t index)
{
    uint64_t z = duet__mix64(seed + 0x9e3779b97f4a7c15ULL * (index + 1));
    z = duet__mix64(z ^ 0xd1b54a32d192ed03ULL);
    return z >> 11;
}

double duet_sampling_uniform(uint64_t seed, uint64_t index)
{
    return (double)duet_sampling_u53(seed, index) * 0x1.0p-53;
}

static int32_t duet__argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[best])
            best = i;
    }
    return best;
}

typedef struct {
    float val;
    int32_t id;
} duet__cand_t;

/* Descending value, ties by ascending id: the order (and so the sample) is
 * a function of the logits alone. */
static int duet__cand_cmp(const void *a, const void *b)
{
    const duet__cand_t *x = a, *y = b;
    if (x->val != y->val)
        return x->val > y->val ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t duet_sample(const float *logits, int vocab, const duet_sampling_t *s, uint64_t index,
                    float *scratch)
{
    duet__cand_t *c = (duet__cand_t *)(void *)scratch;
    int n = 0;
    double u, acc = 0, total = 0;
    float mx;

    if (s->temperature <= 0.0f || s->top_k == 1)
        return duet__argmax(logits, vocab);

    /* Candidates within a wide margin of the max: the rest carry less than
     * e^-80 of the mass each. */
    mx = logits[duet__argmax(logits, vocab)] / s->temperature;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i] / s->temperature;
        if (v >= mx - 80.0f)
            c[n++] = (duet__cand_t){v, i};
    }
    qsort(c, (size_t)n, sizeof(*c), duet__cand_cmp);
    if (s->top_k > 0 && s->top_k < n)
        n = s->top_k;
    for (int i = 0; i < n; i++) {
        c[i].val = expf(c[i].val - mx);
        total += c[i].val;
    }
    if (s->top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += c[i].val;
            if (cum >= s->top_p * total) {
                n = i + 1;
                break;
            }
        }
        total = 0;
        for (int i = 0; i < n; i++)
            total += c[i].val;
    }
    u = duet_sampling_uniform(s->seed, index) * total;
    for (int i = 0; i < n; i++) {
        acc += c[i].val;
        if (u < acc)
            return c[i].id;
    }
    return c[n - 1].id;
}
