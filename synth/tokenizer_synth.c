/* duet_tokenizer_write_synthetic: a deterministic byte-level BPE
 * tokenizer.json for synthetic models.
 *
 * Ids 0..255 are the bytes (id = byte value, written in the GPT-2
 * alphabet).  Merges are learned greedily from the built-in text below: the
 * most frequent adjacent pair (ties: smallest left id, then right id) over
 * the GPT-2 pre-tokenized words, until the model vocab has vocab_size - 2
 * entries.  When the text has no pairs left, filler merges (existing token +
 * byte, in id order) complete the vocab.  <|bos|> and <|eos|> are the last
 * two ids; the post-processor prepends <|bos|>. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "tokenizer/tokenizer_internal.h"

#define DUET__SYN_MAX_VOCAB (1 << 22)

static const char duet__syn_text[] =
    "The morning train left the station at seven, and the city slowly woke up around it. "
    "Shops opened their doors, children walked to school, and the baker put fresh bread in "
    "the window. A small dog waited by the corner for its owner, who was buying a newspaper "
    "and a cup of coffee.\n"
    "In the afternoon the weather changed. Clouds came in from the sea, the wind grew "
    "stronger, and people hurried home before the rain started. It rained for three hours; "
    "the streets turned into little rivers and the lights of the cars shone on the wet "
    "stones.\n"
    "\"We should have taken the umbrella,\" said the girl to her brother. He laughed and "
    "answered that a bit of water never hurt anyone. They ran the last 200 meters and "
    "arrived at the house completely soaked, but happy.\n"
    "Their grandmother was waiting with hot tea and a plate of cookies. She told them "
    "stories about the old days, when the town had only one road, 12 houses and a single "
    "shop that sold everything from nails to needles. The children listened carefully, "
    "asking questions about the farm, the horses and the long winters.\n"
    "Later that evening, their father came back from work. He was an engineer who built "
    "bridges, and he liked to explain how every part of a structure carries its share of "
    "the load. \"If one beam fails, the others must be strong enough to hold the weight,\" "
    "he said, drawing a simple picture on a piece of paper.\n"
    "When the rain finally stopped, the sky cleared and the stars appeared one by one. The "
    "family sat outside for a while, counting them and naming the brightest ones. Then "
    "everyone went to bed, tired but content, ready for another day.\n"
    "Numbers, dates and lists appear in ordinary writing too: 1, 2, 3, 10, 25, 100 and "
    "2024; the first of May; items such as apples, pears, plums and grapes (about 4.5 kg "
    "in total). Questions end with a question mark? Exclamations end with a bang! Some "
    "people write e-mails, others prefer letters - and a few still send postcards.";

typedef struct {
    duet__tok_buf_t text; /* token strings, GPT-2 alphabet, concatenated */
    uint32_t *off, *len;  /* [n_tok] */
    int32_t n_tok;
    int32_t *hash; /* open addressing over token strings, -1 empty */
    uint32_t mask;
    int32_t (*merges)[2]; /* [n_merges] */
    int32_t n_merges;
    /* training words: symbols of word w are sym[wofs[w] .. wofs[w] + wlen[w]) */
    int32_t *sym, *wofs, *wlen, *wfreq;
    int32_t n_words;
} duet__syn_t;

static int32_t duet__syn_find(const duet__syn_t *s, const char *str, size_t n)
{
    uint32_t h = (uint32_t)duet__tok_hash(str, n) & s->mask;
    for (; s->hash[h] >= 0; h = (h + 1) & s->mask) {
        int32_t id = s->hash[h];
        if (s->len[id] == n && memcmp(s->text.data + s->off[id], str, n) == 0)
            return id;
    }
    return -1;
}

/* Add token a+b (or just a when b < 0) and return its id, or -1 on OOM. */
static int32_t duet__syn_add(duet__syn_t *s, const char *str, size_t n)
{
    uint32_t off = (uint32_t)s->text.len;
    if (duet__tok_buf_put(&s->text, str, n) != DUET_OK)
        return -1;
    int32_t id = s->n_tok++;
    s->off[id] = off;
    s->len[id] = (uint32_t)n;
    uint32_t h = (uint32_t)duet__tok_hash(str, n) & s->mask;
    while (s->hash[h] >= 0)
        h = (h + 1) & s->mask;
    s->hash[h] = id;
    return id;
}

/* Record merge (a, b) and, when a+b is new, its token.  1: new token,
 * 0: existing token, -1: no memory. */
static int duet__syn_merge(duet__syn_t *s, int32_t a, int32_t b, duet__tok_buf_t *tmp,
                           int32_t *id_p)
{
    tmp->len = 0;
    if (duet__tok_buf_put(tmp, s->text.data + s->off[a], s->len[a]) != DUET_OK ||
        duet__tok_buf_put(tmp, s->text.data + s->off[b], s->len[b]) != DUET_OK)
        return -1;
    s->merges[s->n_merges][0] = a;
    s->merges[s->n_merges][1] = b;
    s->n_merges++;
    *id_p = duet__syn_find(s, tmp->data, tmp->len);
    if (*id_p >= 0)
        return 0;
    *id_p = duet__syn_add(s, tmp->data, tmp->len);
    return *id_p < 0 ? -1 : 1;
}

/* Unique GPT-2 pre-tokenized words of the text with their counts. */
static duet_status_t duet__syn_words(duet__syn_t *s)
{
    const char *t = duet__syn_text;
    size_t n = sizeof(duet__syn_text) - 1, nsym = 0;

    s->sym = duet_malloc(n * sizeof(int32_t));
    s->wofs = duet_malloc(n * sizeof(int32_t));
    s->wlen = duet_malloc(n * sizeof(int32_t));
    s->wfreq = duet_malloc(n * sizeof(int32_t));
    if (s->sym == NULL || s->wofs == NULL || s->wlen == NULL || s->wfreq == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "synthetic tokenizer: no memory");
    for (size_t pos = 0; pos < n;) {
        size_t end = duet__tok_split_next(DUET__TOK_SPLIT_GPT2, t, n, pos);
        int32_t w;
        for (w = 0; w < s->n_words; w++) {
            if ((size_t)s->wlen[w] == end - pos) {
                int32_t k = 0;
                while (k < s->wlen[w] && s->sym[s->wofs[w] + k] == (unsigned char)t[pos + k])
                    k++;
                if (k == s->wlen[w])
                    break;
            }
        }
        if (w == s->n_words) {
            s->wofs[w] = (int32_t)nsym;
            s->wlen[w] = (int32_t)(end - pos);
            s->wfreq[w] = 0;
            for (size_t i = pos; i < end; i++)
                s->sym[nsym++] = (unsigned char)t[i];
            s->n_words++;
        }
        s->wfreq[w]++;
        pos = end;
    }
    return DUET_OK;
}

typedef struct {
    uint64_t pair;
    int64_t count;
} duet__syn_pair_t;

static int duet__syn_pair_cmp(const void *pa, const void *pb)
{
    const duet__syn_pair_t *a = pa, *b = pb;
    return a->pair < b->pair ? -1 : a->pair > b->pair;
}

/* The most frequent pair (ties: smallest pair), or 0 when none is left. */
static int duet__syn_best_pair(const duet__syn_t *s, duet__syn_pair_t *scratch, int32_t *a,
                               int32_t *b)
{
    size_t n = 0;
    for (int32_t w = 0; w < s->n_words; w++) {
        const int32_t *x = s->sym + s->wofs[w];
        for (int32_t i = 0; i + 1 < s->wlen[w]; i++) {
            scratch[n].pair = ((uint64_t)(uint32_t)x[i] << 32) | (uint32_t)x[i + 1];
            scratch[n++].count = s->wfreq[w];
        }
    }
    if (n == 0)
        return 0;
    qsort(scratch, n, sizeof(*scratch), duet__syn_pair_cmp);
    uint64_t best = 0;
    int64_t best_count = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        int64_t c = 0;
        while (j < n && scratch[j].pair == scratch[i].pair)
            c += scratch[j++].count;
        if (c > best_count) {
            best_count = c;
            best = scratch[i].pair;
        }
        i = j;
    }
    *a = (int32_t)(best >> 32);
    *b = (int32_t)(best & 0xFFFFFFFFu);
    return 1;
}

static void duet__syn_apply(duet__syn_t *s, int32_t a, int32_t b, int32_t id)
{
    for (int32_t w = 0; w < s->n_words; w++) {
        int32_t *x = s->sym + s->wofs[w], n = s->wlen[w], o = 0;
        for (int32_t i = 0; i < n; i++) {
            if (i + 1 < n && x[i] == a && x[i + 1] == b) {
                x[o++] = id;
                i++;
            } else {
                x[o++] = x[i];
            }
        }
        s->wlen[w] = o;
    }
}

static duet_status_t duet__syn_train(duet__syn_t *s, int32_t target)
{
    duet__tok_buf_t tmp = {0};
    duet__syn_pair_t *scratch = duet_malloc(sizeof(duet__syn_text) * sizeof(*scratch));
    duet_status_t st = DUET_OK;
    int32_t a, b, id;

    if (scratch == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "synthetic tokenizer: no memory");
    for (int32_t b0 = 0; b0 < 256; b0++) {
        char u[4];
        size_t n = duet__tok_utf8_put(duet__tok_byte_to_cp((uint8_t)b0), u);
        if (duet__syn_add(s, u, n) < 0)
            goto err_oom;
    }
    if ((st = duet__syn_words(s)) != DUET_OK)
        goto out;
    while (s->n_tok < target && duet__syn_best_pair(s, scratch, &a, &b)) {
        if (duet__syn_merge(s, a, b, &tmp, &id) < 0)
            goto err_oom;
        duet__syn_apply(s, a, b, id);
    }
    /* filler: token i + byte j, in order, whenever the result is new */
    for (int32_t i = 0, j = 0; s->n_tok < target; j = (j + 1) & 255, i += j == 0) {
        if (i >= s->n_tok) { /* cannot happen: every token has 256 extensions */
            st = duet_error(DUET_ERR_INTERNAL, "synthetic tokenizer: filler ran out");
            goto out;
        }
        tmp.len = 0;
        if (duet__tok_buf_put(&tmp, s->text.data + s->off[i], s->len[i]) != DUET_OK ||
            duet__tok_buf_put(&tmp, s->text.data + s->off[j], s->len[j]) != DUET_OK)
            goto err_oom;
        if (duet__syn_find(s, tmp.data, tmp.len) >= 0)
            continue;
        if (duet__syn_merge(s, i, j, &tmp, &id) < 0)
            goto err_oom;
    }
    goto out;
err_oom:
    st = duet_error(DUET_ERR_NO_MEMORY, "synthetic tokenizer: no memory");
out:
    duet__tok_buf_free(&tmp);
    duet_free(scratch);
    return st;
}

static duet_status_t duet__syn_json_string(duet__tok_buf_t *o, const char *s, size_t n)
{
    duet_status_t st = duet__tok_buf_put(o, "\"", 1);
    for (size_t i = 0; i < n && st == DUET_OK; i++) {
        if (s[i] == '"' || s[i] == '\\') {
            char esc[2] = {'\\', s[i]};
            st = duet__tok_buf_put(o, esc, 2);
        } else {
            st = duet__tok_buf_put(o, s + i, 1);
        }
    }
    return st != DUET_OK ? st : duet__tok_buf_put(o, "\"", 1);
}

static duet_status_t duet__syn_puts(duet__tok_buf_t *o, const char *s)
{
    return duet__tok_buf_put(o, s, strlen(s));
}

static duet_status_t duet__syn_render(const duet__syn_t *s, int vocab_size, duet__tok_buf_t *o)
{
    char line[512];
    duet_status_t st;
    int bos = vocab_size - 2, eos = vocab_size - 1;

    snprintf(line, sizeof(line),
             "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
             "  \"added_tokens\": [\n"
             "    {\"id\": %d, \"content\": \"<|bos|>\", \"single_word\": false, \"lstrip\": "
             "false, \"rstrip\": false, \"normalized\": false, \"special\": true},\n"
             "    {\"id\": %d, \"content\": \"<|eos|>\", \"single_word\": false, \"lstrip\": "
             "false, \"rstrip\": false, \"normalized\": false, \"special\": true}\n  ],\n"
             "  \"normalizer\": null,\n",
             bos, eos);
    if ((st = duet__syn_puts(o, line)) != DUET_OK)
        return st;
    if ((st = duet__syn_puts(o, "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                                "\"add_prefix_space\": false, \"trim_offsets\": true, "
                                "\"use_regex\": true},\n")) != DUET_OK)
        return st;
    snprintf(line, sizeof(line),
             "  \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
             "[{\"SpecialToken\": {\"id\": \"<|bos|>\", \"type_id\": 0}}, {\"Sequence\": "
             "{\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": {\"id\": "
             "\"<|bos|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
             "{\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], \"special_tokens\": "
             "{\"<|bos|>\": {\"id\": \"<|bos|>\", \"ids\": [%d], \"tokens\": [\"<|bos|>\"]}}},\n",
             bos);
    if ((st = duet__syn_puts(o, line)) != DUET_OK ||
        (st = duet__syn_puts(o, "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                                "true, \"trim_offsets\": true, \"use_regex\": true},\n")) ||
        (st = duet__syn_puts(o, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
                                "    \"unk_token\": null,\n    \"continuing_subword_prefix\": "
                                "null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": "
                                "false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": "
                                "false,\n    \"vocab\": {")))
        return st;
    for (int32_t i = 0; i < s->n_tok; i++) {
        snprintf(line, sizeof(line), ": %d%s", i, i + 1 < s->n_tok ? ",\n" : "");
        if ((st = duet__syn_puts(o, i == 0 ? "\n      " : "      ")) ||
            (st = duet__syn_json_string(o, s->text.data + s->off[i], s->len[i])) ||
            (st = duet__syn_puts(o, line)))
            return st;
    }
    if ((st = duet__syn_puts(o, "\n    },\n    \"merges\": [")) != DUET_OK)
        return st;
    for (int32_t m = 0; m < s->n_merges; m++) {
        int32_t a = s->merges[m][0], b = s->merges[m][1];
        if ((st = duet__syn_puts(o, m == 0 ? "\n      [" : ",\n      [")) ||
            (st = duet__syn_json_string(o, s->text.data + s->off[a], s->len[a])) ||
            (st = duet__syn_puts(o, ", ")) ||
            (st = duet__syn_json_string(o, s->text.data + s->off[b], s->len[b])) ||
            (st = duet__syn_puts(o, "]")))
            return st;
    }
    return duet__syn_puts(o, "\n    ]\n  }\n}\n");
}

duet_status_t duet_tokenizer_write_synthetic(const char *path, int vocab_size)
{
    duet__syn_t s;
    duet__tok_buf_t out = {0};
    duet_status_t st;
    uint32_t cap = 16;
    FILE *f;

    if (path == NULL)
        return duet_error(DUET_ERR_INVALID, "synthetic tokenizer: no path");
    if (vocab_size < 260 || vocab_size > DUET__SYN_MAX_VOCAB)
        return duet_error(DUET_ERR_INVALID,
                          "%s: synthetic tokenizer vocab_size %d is out of range 260..%d", path,
                          vocab_size, DUET__SYN_MAX_VOCAB);
    memset(&s, 0, sizeof(s));
    while (cap < (uint32_t)vocab_size * 2)
        cap *= 2;
    s.mask = cap - 1;
    s.hash = duet_malloc(cap * sizeof(int32_t));
    s.off = duet_malloc((size_t)vocab_size * sizeof(uint32_t));
    s.len = duet_malloc((size_t)vocab_size * sizeof(uint32_t));
    /* trained merges may reuse tokens: at most one per symbol of the text */
    s.merges = duet_malloc(((size_t)vocab_size + sizeof(duet__syn_text)) * sizeof(*s.merges));
    if (s.hash == NULL || s.off == NULL || s.len == NULL || s.merges == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
        goto out;
    }
    memset(s.hash, 0xFF, cap * sizeof(int32_t));
    if ((st = duet__syn_train(&s, vocab_size - 2)) != DUET_OK ||
        (st = duet__syn_render(&s, vocab_size, &out)) != DUET_OK)
        goto out;
    if ((f = fopen(path, "wb")) == NULL) {
        st = duet_error(DUET_ERR_IO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (fwrite(out.data, 1, out.len, f) != out.len) {
        st = duet_error(DUET_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        fclose(f);
        goto out;
    }
    if (fclose(f) != 0) {
        st = duet_error(DUET_ERR_IO, "%s: close failed: %s", path, strerror(errno));
        goto out;
    }
    st = DUET_OK;
out:
    duet__tok_buf_free(&out);
    duet__tok_buf_free(&s.text);
    duet_free(s.hash);
    duet_free(s.off);
    duet_free(s.len);
    duet_free(s.merges);
    duet_free(s.sym);
    duet_free(s.wofs);
    duet_free(s.wlen);
    duet_free(s.wfreq);
    return st;
}
