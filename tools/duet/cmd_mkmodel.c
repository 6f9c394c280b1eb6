/* duet mkmodel: write a synthetic Hugging Face Llama-family model. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "synth/mkmodel.h"
#include "tools/duet/commands.h"

static void duet__mkmodel_usage(FILE *f)
{
    fprintf(f, "usage: duet mkmodel --out DIR [options]\n"
               "  --preset NAME       bench-124m | llama-3.2-1b-shape | llama-3-8b-shape\n"
               "                      (applied first; other flags override it)\n"
               "  --arch A            llama | mistral | qwen2 (qwen2 has q/k/v biases)\n"
               "  --attention-bias    llama with q/k/v and o_proj biases (attention_bias: true)\n"
               "  --layers N          --hidden N   --heads N   --kv-heads N   --head-dim N\n"
               "  --intermediate N    --vocab N (>= 260)       --max-pos N\n"
               "  --rope-theta X      --rms-eps X  --tied | --untied   --dtype f32|f16|bf16\n"
               "  --seed N            --shards N (> 1: sharded with an index)\n"
               "  --threads N         generation threads (0: all CPUs)\n"
               "defaults: llama, 2 layers, hidden 64, 4/2 heads, head_dim 16, intermediate 128,\n"
               "          vocab 512, max_pos 2048, theta 10000, eps 1e-5, untied, f32, seed 1\n");
}

static int duet__mkmodel_bad(const char *flag, const char *value, const char *why)
{
    fprintf(stderr, "duet mkmodel: %s%s%s: %s\n", flag, value ? " " : "", value ? value : "", why);
    return 2;
}

static int duet__mkmodel_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    char *end = NULL;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        char why[96];
        snprintf(why, sizeof(why), "expected an integer in [%ld, %ld]", lo, hi);
        return duet__mkmodel_bad(flag, s, why);
    }
    *out = (int)v;
    return 0;
}

static int duet__mkmodel_double(const char *flag, const char *s, double *out)
{
    char *end = NULL;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v > 0))
        return duet__mkmodel_bad(flag, s, "expected a positive number");
    *out = v;
    return 0;
}

static int duet__mkmodel_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-')
        return duet__mkmodel_bad(flag, s, "expected a non-negative integer");
    *out = (uint64_t)v;
    return 0;
}

static int duet__mkmodel_flag(const char *flag, const char *v, duet_mkmodel_opts_t *o)
{
    static const struct {
        const char *flag;
        size_t offset;
        long lo, hi;
    } ints[] = {
        {"--layers", offsetof(duet_mkmodel_opts_t, layers), 1, 1024},
        {"--hidden", offsetof(duet_mkmodel_opts_t, hidden), 1, 1 << 20},
        {"--heads", offsetof(duet_mkmodel_opts_t, heads), 1, 1 << 12},
        {"--kv-heads", offsetof(duet_mkmodel_opts_t, kv_heads), 1, 1 << 12},
        {"--head-dim", offsetof(duet_mkmodel_opts_t, head_dim), 2, 1 << 12},
        {"--intermediate", offsetof(duet_mkmodel_opts_t, intermediate), 1, 1 << 22},
        {"--vocab", offsetof(duet_mkmodel_opts_t, vocab), 260, 1 << 24},
        {"--max-pos", offsetof(duet_mkmodel_opts_t, max_pos), 1, 1 << 24},
        {"--shards", offsetof(duet_mkmodel_opts_t, shards), 1, 99999},
        {"--threads", offsetof(duet_mkmodel_opts_t, threads), 0, 1024},
    };

    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if (strcmp(flag, ints[i].flag) == 0)
            return duet__mkmodel_int(flag, v, ints[i].lo, ints[i].hi,
                                     (int *)((char *)o + ints[i].offset));
    }
    if (strcmp(flag, "--rope-theta") == 0)
        return duet__mkmodel_double(flag, v, &o->rope_theta);
    if (strcmp(flag, "--rms-eps") == 0)
        return duet__mkmodel_double(flag, v, &o->rms_eps);
    if (strcmp(flag, "--seed") == 0)
        return duet__mkmodel_u64(flag, v, &o->seed);
    if (strcmp(flag, "--arch") == 0) {
        int a = duet_arch_parse(v);
        if (a < 0)
            return duet__mkmodel_bad(flag, v, "expected llama, mistral or qwen2");
        o->arch = (duet_arch_t)a;
        return 0;
    }
    if (strcmp(flag, "--dtype") == 0) {
        if (strcmp(v, "f32") == 0 || strcmp(v, "F32") == 0)
            o->dtype = DUET_DTYPE_F32;
        else if (strcmp(v, "f16") == 0 || strcmp(v, "F16") == 0)
            o->dtype = DUET_DTYPE_F16;
        else if (strcmp(v, "bf16") == 0 || strcmp(v, "BF16") == 0)
            o->dtype = DUET_DTYPE_BF16;
        else
            return duet__mkmodel_bad(flag, v, "expected f32, f16 or bf16");
        return 0;
    }
    return duet__mkmodel_bad(flag, NULL, "unknown option (see duet mkmodel --help)");
}

static int duet__mkmodel_takes_value(const char *flag)
{
    return strcmp(flag, "--tied") != 0 && strcmp(flag, "--untied") != 0 &&
           strcmp(flag, "--attention-bias") != 0 && strcmp(flag, "--help") != 0 &&
           strcmp(flag, "-h") != 0;
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
    const char *out = NULL;
    uint64_t params, bytes;
    duet_status_t st;
    int rc;

    /* First pass: --help, --out, --preset and the shape of the command
     * line, so that the preset is the base the other flags override. */
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            duet__mkmodel_usage(stdout);
            return 0;
        }
        if (strncmp(flag, "--", 2) != 0)
            return duet__mkmodel_bad(flag, NULL, "unexpected argument");
        if (!duet__mkmodel_takes_value(flag))
            continue;
        if (i + 1 >= argc)
            return duet__mkmodel_bad(flag, NULL, "missing value");
        if (strcmp(flag, "--out") == 0) {
            out = argv[i + 1];
        } else if (strcmp(flag, "--preset") == 0) {
            if (duet_mkmodel_preset(argv[i + 1], &o) != DUET_OK)
                return duet__mkmodel_bad(flag, argv[i + 1],
                                         "expected bench-124m, llama-3.2-1b-shape or "
                                         "llama-3-8b-shape");
        }
        i++;
    }
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--tied") == 0 || strcmp(flag, "--untied") == 0) {
            o.tied = strcmp(flag, "--tied") == 0;
            continue;
        }
        if (strcmp(flag, "--attention-bias") == 0) {
            o.attention_bias = true;
            continue;
        }
        if (strcmp(flag, "--out") != 0 && strcmp(flag, "--preset") != 0 &&
            (rc = duet__mkmodel_flag(flag, argv[i + 1], &o)) != 0)
            return rc;
        i++;
    }
    if (out == NULL)
        return duet__mkmodel_bad("--out", NULL, "required");
    if ((st = duet_mkmodel_size(&o, &params, &bytes)) != DUET_OK) {
        duet__mkmodel_report();
        return 2;
    }
    if ((st = duet_mkmodel_write(out, &o)) != DUET_OK) {
        duet__mkmodel_report();
        return 1;
    }
    printf("mkmodel out %s arch %s layers %d hidden %d heads %d/%d params %llu (%.2fM) bytes "
           "%llu dtype %s shards %d seed %llu%s%s\n",
           out, duet_arch_name(o.arch), o.layers, o.hidden, o.heads,
           o.kv_heads > 0 ? o.kv_heads : o.heads, (unsigned long long)params, params / 1e6,
           (unsigned long long)bytes, duet_dtype_name(o.dtype), o.shards,
           (unsigned long long)o.seed, o.tied ? " tied" : "",
           o.attention_bias ? " attention_bias" : "");
    return 0;
}
