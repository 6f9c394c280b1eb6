/* duet mkmodel --fp8: the FP8 weights and scales of a synthetic
 * checkpoint (quantized from the values a dtype checkpoint holds), and its
 * quantization_config. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "synth/mkmodel_internal.h"

/* Generated values rounded to dtype, back as float (what a bf16
 * checkpoint holds). */
static void duet__mk_rounded(const duet__mk_spec_t *s, uint64_t first, size_t n, float *dst)
{
    uint16_t h[1024];

    duet__mk_gen(s, first, n, dst);
    if (s->base == DUET_DTYPE_F32)
        return;
    duet__mk_store(s->base, dst, n, h);
    duet_dtype_to_f32(s->base, h, dst, n);
}

/* n elements from `first` of an FP8 weight (fp8 1) or scale (2) spec. */
void duet__mk_fp8_block(const duet__mk_spec_t *s, uint64_t first, size_t n, float *tmp,
                        unsigned char *out)
{
    const uint64_t cols = (uint64_t)s->shape[1];

    if (s->fp8 == 2) {
        memcpy(out, s->scales + first, n * sizeof(float));
        return;
    }
    duet__mk_rounded(s, first, n, tmp);
    for (size_t j = 0; j < n; j++) {
        float sc = s->scales[s->per_row ? (first + j) / cols : 0];
        out[j] = duet_f32_to_e4m3(sc > 0 ? tmp[j] / sc : 0.0f);
    }
}

/* Row amax of an FP8 weight, rows [r0, r1), into amax[]. */
typedef struct {
    const duet__mk_spec_t *spec;
    int64_t r0, r1;
    float *amax;
} duet__mk_amax_job_t;

static void *duet__mk_amax_run(void *arg)
{
    const duet__mk_amax_job_t *job = arg;
    const uint64_t cols = (uint64_t)job->spec->shape[1];
    float block[1024];

    for (int64_t r = job->r0; r < job->r1; r++) {
        float m = 0.0f;
        for (uint64_t c = 0; c < cols; c += 1024) {
            size_t k = cols - c < 1024 ? (size_t)(cols - c) : 1024;
            duet__mk_rounded(job->spec, (uint64_t)r * cols + c, k, block);
            for (size_t j = 0; j < k; j++)
                m = fabsf(block[j]) > m ? fabsf(block[j]) : m;
        }
        job->amax[r] = m;
    }
    return NULL;
}

/* scale = amax / 448 per row or per tensor, for every FP8 weight (and its
 * scale spec, which follows it). */
duet_status_t duet__mk_fp8_scales(const duet_mkmodel_opts_t *o, duet__mk_spec_t *specs, size_t n)
{
    const int nt = duet__mk_threads(o);

    for (size_t i = 0; i < n; i++) {
        duet__mk_spec_t *w = &specs[i];
        const int64_t rows = w->shape[0];
        duet__mk_amax_job_t jobs[DUET_MKMODEL_MAX_THREADS];
        pthread_t tids[DUET_MKMODEL_MAX_THREADS];
        bool started[DUET_MKMODEL_MAX_THREADS];
        float *amax;

        if (w->fp8 != 1)
            continue;
        if ((amax = DUET_NEW_ARRAY(float, (size_t)rows)) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "mkmodel: no memory for %s's scales", w->name);
        for (int t = 0; t < nt; t++) {
            jobs[t] = (duet__mk_amax_job_t){w, rows * t / nt, rows * (t + 1) / nt, amax};
            started[t] = pthread_create(&tids[t], NULL, duet__mk_amax_run, &jobs[t]) == 0;
        }
        for (int t = 0; t < nt; t++) {
            if (started[t])
                pthread_join(tids[t], NULL);
            else
                duet__mk_amax_run(&jobs[t]);
        }
        if (!w->per_row) {
            for (int64_t r = 1; r < rows; r++)
                amax[0] = amax[r] > amax[0] ? amax[r] : amax[0];
        }
        for (int64_t r = 0; r < (w->per_row ? rows : 1); r++)
            amax[r] = amax[r] / 448.0f;
        w->scales = amax;
        specs[i + 1].scales = amax;
    }
    return DUET_OK;
}

/* config.json's quantization_config line, as the tools writing each
 * format do (model/quant.h). */
const char *duet__mk_quant_config(const duet_mkmodel_opts_t *o)
{
    if (o->fp8 == 0)
        return "";
    if (o->fp8_format == DUET_MKMODEL_FP8_FBGEMM)
        return "  \"quantization_config\": {\"quant_method\": \"fbgemm_fp8\", "
               "\"activation_scale_ub\": 1200.0, \"modules_to_not_convert\": [\"lm_head\"]},\n";
    if (o->fp8_format == DUET_MKMODEL_FP8_VLLM)
        return "  \"quantization_config\": {\"quant_method\": \"fp8\", "
               "\"activation_scheme\": \"dynamic\", \"ignored_layers\": [\"lm_head\"]},\n";
    if (o->fp8 == DUET_MKMODEL_FP8_CHANNEL)
        return "  \"quantization_config\": {\"quant_method\": \"compressed-tensors\", "
               "\"format\": \"float-quantized\", \"quantization_status\": \"compressed\", "
               "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
               "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\", "
               "\"symmetric\": true, \"dynamic\": false}, \"input_activations\": "
               "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"token\", "
               "\"symmetric\": true, \"dynamic\": true}}}, \"kv_cache_scheme\": null, "
               "\"ignore\": [\"lm_head\"]},\n";
    return "  \"quantization_config\": {\"quant_method\": \"compressed-tensors\", "
           "\"format\": \"float-quantized\", \"quantization_status\": \"compressed\", "
           "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
           "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", "
           "\"symmetric\": true, \"dynamic\": false}, \"input_activations\": "
           "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", "
           "\"symmetric\": true, \"dynamic\": true}}}, \"kv_cache_scheme\": null, "
           "\"ignore\": [\"lm_head\"]},\n";
}
