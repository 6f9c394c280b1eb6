/* quantization_config: the FP8 layouts of model/quant.h, everything else
 * refused with the key that made it so. */
#include "model/quant.h"

#include <string.h>

#define DUET__QC "quantization_config"

const char *duet_quant_method_name(duet_quant_method_t m)
{
    switch (m) {
    case DUET_QUANT_NONE:
        return "none";
    case DUET_QUANT_COMPRESSED_TENSORS:
        return "compressed-tensors";
    case DUET_QUANT_FBGEMM_FP8:
        return "fbgemm_fp8";
    case DUET_QUANT_FP8:
        return "fp8";
    }
    return "?";
}

static bool duet__q_absent(const cJSON *it)
{
    return it == NULL || cJSON_IsNull(it);
}

/* Absent, null, or a list of strings. */
static duet_status_t duet__q_names(const cJSON *obj, const char *what, const char *key)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, key), *it;

    if (duet__q_absent(list))
        return DUET_OK;
    if (!cJSON_IsArray(list))
        return duet_error(DUET_ERR_FORMAT, "%s: " DUET__QC ".%s: expected a list of strings", what,
                          key);
    cJSON_ArrayForEach(it, list)
    {
        if (!cJSON_IsString(it))
            return duet_error(DUET_ERR_FORMAT, "%s: " DUET__QC ".%s: expected a list of strings",
                              what, key);
    }
    return DUET_OK;
}

/* weights / input_activations of one config group: 8-bit float.  For
 * weights, strategy tensor or channel (into *per_channel); for activations
 * any strategy (they are quantized dynamically on the device anyway). */
static duet_status_t duet__q_args(const cJSON *args, const char *what, const char *group,
                                  const char *key, bool weights, int *per_channel, bool *static_p)
{
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(args, "num_bits");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(args, "type");
    const cJSON *strategy = cJSON_GetObjectItemCaseSensitive(args, "strategy");
    const cJSON *sym = cJSON_GetObjectItemCaseSensitive(args, "symmetric");
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(args, "dynamic");

    if (!cJSON_IsObject(args))
        return duet_error(DUET_ERR_FORMAT,
                          "%s: " DUET__QC ".config_groups.%s.%s: expected an object", what, group,
                          key);
    if (!cJSON_IsNumber(bits) || bits->valuedouble != 8)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".config_groups.%s.%s.num_bits: only 8 (FP8) is "
                          "supported",
                          what, group, key);
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "float") != 0)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".config_groups.%s.%s.type: only \"float\" (e4m3) is "
                          "supported",
                          what, group, key);
    if (!duet__q_absent(sym) && !cJSON_IsTrue(sym))
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".config_groups.%s.%s.symmetric: asymmetric (zero "
                          "points) is not supported",
                          what, group, key);
    if (!weights) {
        *static_p = !duet__q_absent(dyn) && cJSON_IsFalse(dyn);
        return DUET_OK;
    }
    if (!cJSON_IsString(strategy))
        return duet_error(DUET_ERR_FORMAT,
                          "%s: " DUET__QC ".config_groups.%s.weights.strategy: missing", what,
                          group);
    int pc = strcmp(strategy->valuestring, "channel") == 0  ? 1
             : strcmp(strategy->valuestring, "tensor") == 0 ? 0
                                                            : -1;
    if (pc < 0)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".config_groups.%s.weights.strategy: %s is not "
                          "supported (tensor, channel)",
                          what, group, strategy->valuestring);
    if (!duet__q_absent(dyn) && !cJSON_IsFalse(dyn))
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".config_groups.%s.weights.dynamic: dynamic weight "
                          "scales are not supported",
                          what, group);
    if (*per_channel >= 0 && *per_channel != pc)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".config_groups.%s.weights.strategy: groups with "
                          "different strategies are not supported",
                          what, group);
    *per_channel = pc;
    return DUET_OK;
}

static duet_status_t duet__q_compressed(const cJSON *qc, const char *what, duet_quant_config_t *q)
{
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(qc, "format");
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(qc, "kv_cache_scheme");
    const cJSON *sparsity = cJSON_GetObjectItemCaseSensitive(qc, "sparsity_config");
    const cJSON *g;
    int per_channel = -1;
    duet_status_t st;

    if (!cJSON_IsString(format))
        return duet_error(DUET_ERR_FORMAT, "%s: " DUET__QC ".format: missing", what);
    if (strcmp(format->valuestring, "float-quantized") != 0)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".format: %s is not supported (float-quantized)", what,
                          format->valuestring);
    if (!duet__q_absent(kv))
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".kv_cache_scheme: a quantized KV cache is not "
                          "supported (KV stays bf16)",
                          what);
    if (!duet__q_absent(sparsity) && cJSON_GetArraySize(sparsity) > 0)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "%s: " DUET__QC ".sparsity_config: sparse checkpoints are not supported",
                          what);
    if (!cJSON_IsObject(groups) || cJSON_GetArraySize(groups) == 0)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: " DUET__QC ".config_groups: expected an object "
                          "with at least one group",
                          what);
    cJSON_ArrayForEach(g, groups)
    {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(g, "input_activations");
        const cJSON *out = cJSON_GetObjectItemCaseSensitive(g, "output_activations");
        const cJSON *gf = cJSON_GetObjectItemCaseSensitive(g, "format");
        bool stat = false;

        if (!cJSON_IsObject(g))
            return duet_error(DUET_ERR_FORMAT,
                              "%s: " DUET__QC ".config_groups.%s: expected an object", what,
                              g->string);
        if (!duet__q_absent(gf) &&
            (!cJSON_IsString(gf) || strcmp(gf->valuestring, "float-quantized") != 0))
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: " DUET__QC ".config_groups.%s.format: only float-quantized "
                              "is supported",
                              what, g->string);
        if (duet__q_absent(w))
            return duet_error(DUET_ERR_FORMAT, "%s: " DUET__QC ".config_groups.%s.weights: missing",
                              what, g->string);
        if ((st = duet__q_args(w, what, g->string, "weights", true, &per_channel, &stat)) !=
            DUET_OK)
            return st;
        if (!duet__q_absent(in) && (st = duet__q_args(in, what, g->string, "input_activations",
                                                      false, &per_channel, &stat)) != DUET_OK)
            return st;
        if (!duet__q_absent(out))
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: " DUET__QC ".config_groups.%s.output_activations: not "
                              "supported",
                              what, g->string);
        q->static_input = q->static_input || stat;
    }
    q->method = DUET_QUANT_COMPRESSED_TENSORS;
    q->per_channel = per_channel == 1;
    return duet__q_names(qc, what, "ignore");
}

duet_status_t duet_quant_config_parse(const cJSON *json, const char *what, duet_quant_config_t *q)
{
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(json, DUET__QC);
    const cJSON *method;
    const char *m;

    memset(q, 0, sizeof(*q));
    if (duet__q_absent(qc))
        return DUET_OK;
    if (!cJSON_IsObject(qc))
        return duet_error(DUET_ERR_FORMAT, "%s: " DUET__QC ": expected an object or null", what);
    method = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    if (!cJSON_IsString(method))
        return duet_error(DUET_ERR_FORMAT, "%s: " DUET__QC ".quant_method: missing", what);
    m = method->valuestring;
    if (strcmp(m, "compressed-tensors") == 0)
        return duet__q_compressed(qc, what, q);
    if (strcmp(m, "fbgemm_fp8") == 0) {
        const cJSON *ub = cJSON_GetObjectItemCaseSensitive(qc, "activation_scale_ub");
        if (!duet__q_absent(ub) && (!cJSON_IsNumber(ub) || !(ub->valuedouble > 0)))
            return duet_error(DUET_ERR_FORMAT,
                              "%s: " DUET__QC ".activation_scale_ub: expected a positive number",
                              what);
        q->method = DUET_QUANT_FBGEMM_FP8;
        q->per_channel = true;
        return duet__q_names(qc, what, "modules_to_not_convert");
    }
    if (strcmp(m, "fp8") == 0) {
        const cJSON *block = cJSON_GetObjectItemCaseSensitive(qc, "weight_block_size");
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(qc, "fmt");
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(qc, "activation_scheme");
        if (!duet__q_absent(block))
            return duet_error(DUET_ERR_UNSUPPORTED,
                              "%s: " DUET__QC ".weight_block_size: block-wise FP8 scales are "
                              "not supported (per tensor or per channel)",
                              what);
        if (!duet__q_absent(fmt) && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "e4m3")))
            return duet_error(DUET_ERR_UNSUPPORTED, "%s: " DUET__QC ".fmt: only e4m3 is supported",
                              what);
        if (!duet__q_absent(act) && !cJSON_IsString(act))
            return duet_error(DUET_ERR_FORMAT,
                              "%s: " DUET__QC ".activation_scheme: expected a "
                              "string",
                              what);
        q->method = DUET_QUANT_FP8;
        q->per_channel = false;
        q->static_input = cJSON_IsString(act) && strcmp(act->valuestring, "static") == 0;
        return duet__q_names(qc, what, "ignored_layers");
    }
    return duet_error(DUET_ERR_UNSUPPORTED,
                      "%s: " DUET__QC ".quant_method: %s is not supported (compressed-tensors "
                      "float-quantized, fbgemm_fp8, fp8)",
                      what, m);
}
