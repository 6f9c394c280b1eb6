/* duet generate: single-process generation, printing text as it comes.
 * This is the TP=1 oracle the disaggregated runs are compared against
 * (DESIGN §10), so it uses the same engine entry points as the daemons. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/flags.h"
#include "common/log.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"
#include "tools/duet/commands.h"

typedef enum { DUET__OUT_TEXT, DUET__OUT_IDS } duet__out_t;

typedef struct {
    const char *model;
    const char *prompt;
    const char *prompt_ids;
    const char *backend;
    const char *dump_logits;
    int tp, threads, page_size, max_tokens;
    bool ignore_eos;
    duet_sampling_t sampling;
    bool seed_set;
    duet__out_t output;
} duet__gen_args_t;

static void duet__gen_usage(FILE *f)
{
    fprintf(f,
            "usage: duet generate --model DIR (--prompt TEXT | --prompt-ids \"1 2 3\") [options]\n"
            "  --tp N               tensor-parallel ranks (default 1)\n"
            "  --threads N          cpu threads per rank (default: cpus / tp)\n"
            "  --backend cpu|cuda   (default cpu)\n"
            "  --max-tokens N       tokens to generate (default 64)\n"
            "  --temperature X      0 = greedy (default 0)\n"
            "  --top-k N  --top-p X --seed N\n"
            "  --ignore-eos         keep generating after the end-of-sequence token\n"
            "  --output text|ids    ids: print only the generated ids, space-separated\n"
            "  --page-size N        KV page size in tokens (default 16)\n"
            "  --dump-logits FILE   write the float32 logits of every prompt position and\n"
            "                       every generated step ([rows][vocab], raw)\n"
            "--prompt adds BOS as the tokenizer says; --prompt-ids is used exactly as given.\n"
            "--prompt-ids @FILE reads the ids from FILE (a long prompt outgrows the\n"
            "command line: one argument holds at most 128 KiB on Linux).\n");
}


static const char *const duet__gen_outputs[] = {"text", "ids", NULL};

static int duet__gen_parse(int argc, char **argv, duet__gen_args_t *a)
{
    double temperature = 0, top_p = 1;
    int output = DUET__OUT_TEXT;
    bool help = false;
    duet_flag_seed_t seed = {0, false};
    duet_status_t st;

    memset(a, 0, sizeof(*a));
    a->backend = "cpu";
    a->tp = 1;
    a->page_size = 16;
    a->max_tokens = 64;
    a->sampling = duet_sampling_greedy();
    temperature = a->sampling.temperature;
    top_p = a->sampling.top_p;

    const duet_flag_t flags[] = {
        {"model", DUET_FLAG_STRING, &a->model, .arg = "DIR"},
        {"prompt", DUET_FLAG_STRING, &a->prompt, .arg = "TEXT"},
        {"prompt-ids", DUET_FLAG_STRING, &a->prompt_ids, .arg = "IDS"},
        {"tp", DUET_FLAG_INT, &a->tp, 1, 64, .arg = "N"},
        {"threads", DUET_FLAG_INT, &a->threads, 1, 1024, .arg = "N"},
        {"backend", DUET_FLAG_STRING, &a->backend, .arg = "cpu|cuda"},
        {"max-tokens", DUET_FLAG_INT, &a->max_tokens, 1, 1 << 20, .arg = "N"},
        {"temperature", DUET_FLAG_DOUBLE, &temperature, 0, 100, .arg = "X"},
        {"top-k", DUET_FLAG_INT, &a->sampling.top_k, 0, 1 << 30, .arg = "N"},
        {"top-p", DUET_FLAG_DOUBLE, &top_p, 1e-9, 1, .arg = "X"},
        {"seed", DUET_FLAG_FUNC, &seed, .fn = duet_flag_seed, .arg = "N"},
        {"ignore-eos", DUET_FLAG_TRUE, &a->ignore_eos, .help = "see the usage"},
        {"output", DUET_FLAG_CHOICE, &output, .choices = duet__gen_outputs, .arg = "text|ids"},
        {"page-size", DUET_FLAG_INT, &a->page_size, 1, 4096, .arg = "N"},
        {"dump-logits", DUET_FLAG_STRING, &a->dump_logits, .arg = "FILE"},
        {"help", DUET_FLAG_STOP, &help, .help = "see the usage"},
    };

    st = duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, NULL, NULL);
    if (st != DUET_OK) {
        fprintf(stderr, "duet generate: %s\n", duet_error_msg());
        return -1;
    }
    if (help) {
        duet__gen_usage(stdout);
        exit(0);
    }
    a->sampling.temperature = (float)temperature;
    a->sampling.top_p = (float)top_p;
    if (seed.set) {
        a->sampling.seed = seed.value;
        a->seed_set = true;
    }
    a->output = (duet__out_t)output;
    if (a->model == NULL) {
        fprintf(stderr, "duet generate: --model is required\n");
        return -1;
    }
    if ((a->prompt == NULL) == (a->prompt_ids == NULL)) {
        fprintf(stderr, "duet generate: give exactly one of --prompt and --prompt-ids\n");
        return -1;
    }
    if (!a->seed_set && a->sampling.temperature > 0)
        a->sampling.seed = 0x5eed; /* reproducible by default */
    return 0;
}

/* "1 2 3" -> ids; commas also separate. */
static int duet__parse_ids(const char *s, int32_t **ids_p, size_t *n_p)
{
    size_t cap = 16, n = 0;
    int32_t *ids = duet_malloc(cap * sizeof(int32_t));
    const char *p = s;

    if (ids == NULL)
        return -1;
    for (;;) {
        char *end;
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
            p++;
        if (*p == '\0')
            break;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno != 0 || end == p || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "duet generate: --prompt-ids: bad token id near '%.16s'\n", p);
            duet_free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *g = duet_realloc(ids, 2 * cap * sizeof(int32_t));
            if (g == NULL) {
                duet_free(ids);
                return -1;
            }
            ids = g;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) {
        fprintf(stderr, "duet generate: --prompt-ids: no token ids\n");
        duet_free(ids);
        return -1;
    }
    *ids_p = ids;
    *n_p = n;
    return 0;
}

/* The whole of a file, NUL-terminated, duet_malloc'ed; NULL (said) on error. */
static char *duet__read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    size_t cap = 4096, n = 0, got;
    char *buf = duet_malloc(cap);
    if (f == NULL || buf == NULL) {
        fprintf(stderr, "duet generate: --prompt-ids @%s: %s\n", path,
                f == NULL ? strerror(errno) : "out of memory");
        goto err;
    }
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *g = duet_realloc(buf, 2 * cap);
            if (g == NULL) {
                fprintf(stderr, "duet generate: --prompt-ids @%s: out of memory\n", path);
                goto err;
            }
            buf = g;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        fprintf(stderr, "duet generate: --prompt-ids @%s: read error\n", path);
        goto err;
    }
    fclose(f);
    buf[n] = '\0';
    return buf;
err:
    if (f != NULL)
        fclose(f);
    duet_free(buf);
    return NULL;
}

static void duet__print_piece(duet_detok_t *dt, int32_t id, char *buf, size_t cap)
{
    size_t len = 0;
    if (duet_detok_push(dt, id, buf, cap, &len) == DUET_OK && len > 0) {
        fwrite(buf, 1, len, stdout);
        fflush(stdout);
    }
}

int duet_cmd_generate(int argc, char **argv)
{
    duet__gen_args_t a;
    duet_tokenizer_t *tok = NULL;
    duet_detok_t *dt = NULL;
    duet_engine_t *eng = NULL;
    int32_t *prompt = NULL, *pages = NULL, *out = NULL;
    float *logits = NULL;
    char *piece = NULL;
    size_t piece_cap = 0;
    FILE *dump = NULL;
    size_t n_prompt = 0;
    int n_out = 0, rc = 1;
    duet_status_t st;

    if (duet__gen_parse(argc, argv, &a) != 0) {
        fprintf(stderr, "run 'duet generate --help' for usage\n");
        return 2;
    }
    if (a.output == DUET__OUT_TEXT || a.prompt != NULL) {
        st = duet_tokenizer_load(a.model, &tok);
        if (st != DUET_OK) {
            fprintf(stderr, "duet generate: tokenizer: %s\n", duet_error_msg());
            return 1;
        }
    }
    if (a.prompt != NULL) {
        st = duet_tokenizer_encode(tok, a.prompt, strlen(a.prompt), true, &prompt, &n_prompt);
        if (st != DUET_OK) {
            fprintf(stderr, "duet generate: encode: %s\n", duet_error_msg());
            goto out;
        }
        if (n_prompt == 0) {
            fprintf(stderr, "duet generate: the prompt encodes to no tokens\n");
            goto out;
        }
    } else if (a.prompt_ids[0] == '@') {
        char *text = duet__read_file(a.prompt_ids + 1);
        int bad = text == NULL || duet__parse_ids(text, &prompt, &n_prompt) != 0;
        duet_free(text);
        if (bad)
            goto out;
    } else if (duet__parse_ids(a.prompt_ids, &prompt, &n_prompt) != 0) {
        goto out;
    }

    duet_engine_opts_t eo;
    duet_engine_opts_default(&eo);
    eo.model_dir = a.model;
    eo.backend = a.backend;
    eo.tp = a.tp;
    eo.threads = a.threads;
    eo.page_size = a.page_size;
    eo.max_seqs = 1;
    size_t total = n_prompt + (size_t)a.max_tokens;
    eo.n_pages = (int)((total + (size_t)a.page_size - 1) / (size_t)a.page_size);
    st = duet_engine_create(&eo, &eng);
    if (st != DUET_OK) {
        fprintf(stderr, "duet generate: %s\n", duet_error_msg());
        goto out;
    }
    const duet_model_config_t *cfg = &duet_engine_model(eng)->cfg;
    if (n_prompt > (size_t)cfg->max_pos) {
        fprintf(stderr,
                "duet generate: the prompt has %zu tokens, more than the model's context of %d\n",
                n_prompt, cfg->max_pos);
        goto out;
    }
    if (total > (size_t)cfg->max_pos) {
        DUET_LOG_WARN("generate: stopping at the model context of %d tokens", cfg->max_pos);
        a.max_tokens = cfg->max_pos - (int)n_prompt + 1;
    }
    pages = duet_malloc((size_t)eo.n_pages * sizeof(int32_t));
    out = duet_malloc((size_t)a.max_tokens * sizeof(int32_t));
    if (pages == NULL || out == NULL) {
        fprintf(stderr, "duet generate: out of memory\n");
        goto out;
    }
    for (int i = 0; i < eo.n_pages; i++)
        pages[i] = i;
    if (a.dump_logits != NULL) {
        dump = fopen(a.dump_logits, "wb");
        logits = duet_malloc(n_prompt * (size_t)cfg->vocab * sizeof(float));
        if (dump == NULL || logits == NULL) {
            fprintf(stderr, "duet generate: --dump-logits %s: %s\n", a.dump_logits,
                    dump == NULL ? strerror(errno) : "out of memory");
            goto out;
        }
    }
    if (tok != NULL && a.output == DUET__OUT_TEXT) {
        if (duet_detok_create(tok, true, &dt) != DUET_OK) {
            fprintf(stderr, "duet generate: %s\n", duet_error_msg());
            goto out;
        }
        /* the prompt is context for the detokenizer (so the continuation
         * keeps its leading space); a text prompt is echoed as given */
        piece_cap = duet_detok_max_chunk(tok) + 1;
        piece = duet_malloc(piece_cap);
        if (piece == NULL) {
            fprintf(stderr, "duet generate: out of memory\n");
            goto out;
        }
        for (size_t i = 0; i < n_prompt; i++) {
            size_t len = 0;
            duet_detok_push(dt, prompt[i], piece, piece_cap, &len);
        }
        if (a.prompt != NULL) {
            fputs(a.prompt, stdout);
            fflush(stdout);
        }
    }

    duet_engine_seq_t seq = {
        .tokens = prompt,
        .n_tokens = (int)n_prompt,
        .start_pos = 0,
        .pages = pages,
        .n_pages = eo.n_pages,
        .sample = true,
        .sampling = a.sampling,
        .sample_index = 0,
        .logits = logits,
        .all_logits = logits != NULL,
    };
    for (;;) {
        int32_t next;
        st = duet_engine_forward(eng, &seq, 1, &next);
        if (st != DUET_OK) {
            fprintf(stderr, "duet generate: %s\n", duet_error_msg());
            goto out;
        }
        if (dump != NULL && fwrite(logits, sizeof(float), (size_t)seq.n_tokens * (size_t)cfg->vocab,
                                   dump) != (size_t)seq.n_tokens * (size_t)cfg->vocab) {
            fprintf(stderr, "duet generate: --dump-logits: write failed\n");
            goto out;
        }
        if (next == DUET_ENGINE_NONFINITE) {
            fprintf(stderr,
                    "duet generate: non-finite logits (NaN or inf) at output token %d: the "
                    "model's weights or activations are broken\n",
                    n_out);
            goto out;
        }
        out[n_out++] = next;
        bool eos = duet_model_config_is_eos(cfg, next);
        if (dt != NULL && !eos)
            duet__print_piece(dt, next, piece, piece_cap);
        if (n_out >= a.max_tokens || (eos && !a.ignore_eos))
            break;
        seq.start_pos += seq.n_tokens;
        seq.tokens = &out[n_out - 1];
        seq.n_tokens = 1;
        seq.sample_index = (uint64_t)n_out;
    }
    if (a.output == DUET__OUT_IDS) {
        for (int i = 0; i < n_out; i++)
            printf(i ? " %d" : "%d", out[i]);
        printf("\n");
    } else if (dt != NULL) {
        size_t len = 0;
        if (duet_detok_flush(dt, piece, piece_cap, &len) == DUET_OK && len > 0)
            fwrite(piece, 1, len, stdout);
        printf("\n");
    }
    rc = 0;
out:
    if (dump != NULL)
        fclose(dump);
    duet_free(logits);
    duet_free(piece);
    duet_free(pages);
    duet_free(out);
    duet_free(prompt);
    duet_detok_destroy(dt);
    duet_engine_destroy(eng);
    duet_tokenizer_destroy(tok);
    return rc;
}
