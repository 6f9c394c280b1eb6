/* duet mkmodel: write a synthetic Hugging Face Llama-family model. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/flags.h"
#include "common/status.h"
#include "synth/mkmodel.h"
#include "tools/duet/commands.h"

static void duet__mkmodel_usage(FILE *f)
{
    fprintf(f, "usage: duet mkmodel --out DIR [options]\n"
               "  --preset NAME       bench-124m | llama-3.2-1b-shape | llama-3-8b-shape\n"
               "                      (applied first; other flags override it)\n"
               "  --arch A            llama | mistral | qwen2 (qwen2 has q/k/v biases) |\n"
               "                      qwen3 (q_norm / k_norm)\n"
               "  --attention-bias    llama with q/k/v and o_proj biases (attention_bias: true)\n"
               "  --layers N          --hidden N   --heads N   --kv-heads N   --head-dim N\n"
               "  --intermediate N    --vocab N (>= 260)       --max-pos N\n"
               "  --rope-theta X      --rms-eps X  --tied | --untied   --dtype f32|f16|bf16\n"
               "  --rope-scaling JSON config.json's rope_scaling (default null), e.g.\n"
               "                      '{\"rope_type\": \"llama3\", \"factor\": 8,\n"
               "                      \"low_freq_factor\": 1, \"high_freq_factor\": 4,\n"
               "                      \"original_max_position_embeddings\": 8192}'\n"
               "  --fp8 tensor|channel  FP8 (e4m3) q/k/v/o and gate/up/down weights with\n"
               "                      per-tensor or per-channel scales (amax / 448)\n"
               "  --fp8-format F      compressed-tensors (default) | fbgemm (channel) |\n"
               "                      fp8 (vLLM Fp8Config, tensor)\n"
               "  --seed N            --shards N (> 1: sharded with an index)\n"
               "  --threads N         generation threads (0: all CPUs)\n"
               "defaults: llama, 2 layers, hidden 64, 4/2 heads, head_dim 16, intermediate 128,\n"
               "          vocab 512, max_pos 2048, theta 10000, eps 1e-5, untied, f32, seed 1\n");
}

static duet_status_t duet__mkmodel_positive(void *dest, const char *flag, const char *value)
{
    char *end = NULL;
    double v;

    errno = 0;
    v = strtod(value, &end);
    if (errno != 0 || end == value || *end != '\0' || !(v > 0))
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected a positive number", flag, value);
    *(double *)dest = v;
    return DUET_OK;
}

static duet_status_t duet__mkmodel_seed(void *dest, const char *flag, const char *value)
{
    duet_flag_seed_t seed;
    duet_status_t st = duet_flag_seed(&seed, flag, value);

    if (st == DUET_OK)
        *(uint64_t *)dest = seed.value;
    return st;
}

static duet_status_t duet__mkmodel_arch(void *dest, const char *flag, const char *value)
{
    int a = duet_arch_parse(value);

    if (a < 0)
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected llama, mistral or qwen2", flag, value);
    *(duet_arch_t *)dest = (duet_arch_t)a;
    return DUET_OK;
}

static duet_status_t duet__mkmodel_dtype(void *dest, const char *flag, const char *value)
{
    duet_dtype_t *d = dest;

    if (strcmp(value, "f32") == 0 || strcmp(value, "F32") == 0)
        *d = DUET_DTYPE_F32;
    else if (strcmp(value, "f16") == 0 || strcmp(value, "F16") == 0)
        *d = DUET_DTYPE_F16;
    else if (strcmp(value, "bf16") == 0 || strcmp(value, "BF16") == 0)
        *d = DUET_DTYPE_BF16;
    else
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected f32, f16 or bf16", flag, value);
    return DUET_OK;
}

static duet_status_t duet__mkmodel_fp8(void *dest, const char *flag, const char *value)
{
    if (strcmp(value, "tensor") == 0)
        *(int *)dest = DUET_MKMODEL_FP8_TENSOR;
    else if (strcmp(value, "channel") == 0)
        *(int *)dest = DUET_MKMODEL_FP8_CHANNEL;
    else
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected tensor or channel", flag, value);
    return DUET_OK;
}

static duet_status_t duet__mkmodel_fp8_format(void *dest, const char *flag, const char *value)
{
    if (strcmp(value, "compressed-tensors") == 0)
        *(int *)dest = DUET_MKMODEL_FP8_COMPRESSED_TENSORS;
    else if (strcmp(value, "fbgemm") == 0 || strcmp(value, "fbgemm_fp8") == 0)
        *(int *)dest = DUET_MKMODEL_FP8_FBGEMM;
    else if (strcmp(value, "fp8") == 0)
        *(int *)dest = DUET_MKMODEL_FP8_VLLM;
    else
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected compressed-tensors, fbgemm or fp8",
                          flag, value);
    return DUET_OK;
}

/* dest: the opts the preset is applied to. */
static duet_status_t duet__mkmodel_preset(void *dest, const char *flag, const char *value)
{
    if (duet_mkmodel_preset(value, dest) != DUET_OK)
        return duet_error(DUET_ERR_CONFIG,
                          "%s %s: expected bench-124m, llama-3.2-1b-shape or llama-3-8b-shape",
                          flag, value);
    return DUET_OK;
}

/* The parse, twice: first with the preset applied to o and the other
 * flags to a scratch copy (so the preset is the base whatever its place),
 * then with the flags applied to o and the preset to the scratch. */
static duet_status_t duet__mkmodel_parse(int argc, char **argv, duet_mkmodel_opts_t *dst,
                                         duet_mkmodel_opts_t *preset_dst, const char **out,
                                         bool *help)
{
    const duet_flag_t flags[] = {
        {"help", DUET_FLAG_STOP, help, .help = "see the usage"},
        {"out", DUET_FLAG_STRING, out, .arg = "DIR"},
        {"preset", DUET_FLAG_FUNC, preset_dst, .fn = duet__mkmodel_preset, .arg = "X"},
        {"arch", DUET_FLAG_FUNC, &dst->arch, .fn = duet__mkmodel_arch, .arg = "X"},
        {"attention-bias", DUET_FLAG_TRUE, &dst->attention_bias, .help = "see the usage"},
        {"layers", DUET_FLAG_INT, &dst->layers, 1, 1024, .arg = "N"},
        {"hidden", DUET_FLAG_INT, &dst->hidden, 1, 1 << 20, .arg = "N"},
        {"heads", DUET_FLAG_INT, &dst->heads, 1, 1 << 12, .arg = "N"},
        {"kv-heads", DUET_FLAG_INT, &dst->kv_heads, 1, 1 << 12, .arg = "N"},
        {"head-dim", DUET_FLAG_INT, &dst->head_dim, 2, 1 << 12, .arg = "N"},
        {"intermediate", DUET_FLAG_INT, &dst->intermediate, 1, 1 << 22, .arg = "N"},
        {"vocab", DUET_FLAG_INT, &dst->vocab, 260, 1 << 24, .arg = "N"},
        {"max-pos", DUET_FLAG_INT, &dst->max_pos, 1, 1 << 24, .arg = "N"},
        {"rope-theta", DUET_FLAG_FUNC, &dst->rope_theta, .fn = duet__mkmodel_positive, .arg = "X"},
        {"rope-scaling", DUET_FLAG_STRING, &dst->rope_scaling, .arg = "JSON"},
        {"rms-eps", DUET_FLAG_FUNC, &dst->rms_eps, .fn = duet__mkmodel_positive, .arg = "X"},
        {"tied", DUET_FLAG_TRUE, &dst->tied, .help = "see the usage"},
        {"untied", DUET_FLAG_FALSE, &dst->tied, .help = "see the usage"},
        {"dtype", DUET_FLAG_FUNC, &dst->dtype, .fn = duet__mkmodel_dtype, .arg = "X"},
        {"fp8", DUET_FLAG_FUNC, &dst->fp8, .fn = duet__mkmodel_fp8, .arg = "X"},
        {"fp8-format", DUET_FLAG_FUNC, &dst->fp8_format, .fn = duet__mkmodel_fp8_format,
         .arg = "X"},
        {"seed", DUET_FLAG_FUNC, &dst->seed, .fn = duet__mkmodel_seed, .arg = "X"},
        {"shards", DUET_FLAG_INT, &dst->shards, 1, 99999, .arg = "N"},
        {"threads", DUET_FLAG_INT, &dst->threads, 0, 1024, .arg = "N"},
    };

    return duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, NULL, NULL);
}

/* Library messages start with "mkmodel: " already. */
static void duet__mkmodel_report(void)
{
    const char *msg = duet_error_msg();
    fprintf(stderr, "duet %s%s\n", strncmp(msg, "mkmodel: ", 9) == 0 ? "" : "mkmodel: ", msg);
}

int duet_cmd_mkmodel(int argc, char **argv)
{
    duet_mkmodel_opts_t o = duet_mkmodel_opts_default();
    duet_mkmodel_opts_t scratch = o;
    const char *out = NULL;
    bool help = false;
    uint64_t params, bytes;
    duet_status_t st;

    if (duet__mkmodel_parse(argc, argv, &scratch, &o, &out, &help) != DUET_OK ||
        (!help && duet__mkmodel_parse(argc, argv, &o, &scratch, &out, &help) != DUET_OK)) {
        fprintf(stderr, "duet mkmodel: %s\n", duet_error_msg());
        return 2;
    }
    if (help) {
        duet__mkmodel_usage(stdout);
        return 0;
    }
    if (out == NULL) {
        fprintf(stderr, "duet mkmodel: --out: required\n");
        return 2;
    }
    if ((st = duet_mkmodel_size(&o, &params, &bytes)) != DUET_OK) {
        duet__mkmodel_report();
        return 2;
    }
    if ((st = duet_mkmodel_write(out, &o)) != DUET_OK) {
        duet__mkmodel_report();
        return 1;
    }
    printf("mkmodel out %s arch %s layers %d hidden %d heads %d/%d params %llu (%.2fM) bytes "
           "%llu dtype %s shards %d seed %llu%s%s%s\n",
           out, duet_arch_name(o.arch), o.layers, o.hidden, o.heads,
           o.kv_heads > 0 ? o.kv_heads : o.heads, (unsigned long long)params, params / 1e6,
           (unsigned long long)bytes, duet_dtype_name(o.dtype), o.shards,
           (unsigned long long)o.seed, o.tied ? " tied" : "",
           o.attention_bias ? " attention_bias" : "",
           o.fp8 == DUET_MKMODEL_FP8_TENSOR    ? " fp8 tensor"
           : o.fp8 == DUET_MKMODEL_FP8_CHANNEL ? " fp8 channel"
                                               : "");
    return 0;
}
