/* Deterministic prompt content for bench-serve.
 *
 * A prompt is token ids.  Token j of hash block b is a function of (b, j)
 * only, so two trace requests that share a hash id share that block's
 * tokens exactly (the prefix structure a prefix cache sees).  Ids are drawn
 * from [first_id, vocab_size): the default [3, 512) exists in any Llama-
 * family vocabulary and skips BOS/EOS/UNK.  Servers that take text only
 * (chat) get one word per id from a fixed list: equal ids give equal text,
 * though the server's tokenizer decides how many tokens a word becomes. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "tools/bench_serve/bench_serve.h"

uint64_t duet_bs_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double duet_bs_rand_unit(uint64_t *state)
{
    return (double)(duet_bs_rand(state) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t duet_bs_prompt_token(uint64_t block, size_t j, int first_id, int vocab_size)
{
    uint64_t s = block * 0x2545f4914f6cdd1dULL + (uint64_t)j * 0x9e3779b97f4a7c15ULL;
    uint64_t span = (uint64_t)(vocab_size - first_id);
    return (int32_t)(first_id + (int64_t)(duet_bs_rand(&s) % span));
}

/* Common short English words (most are one token in large vocabularies). */
static const char *const duet__words[] = {
    "the",     "of",       "and",    "to",        "in",        "is",        "was",    "it",
    "for",     "on",       "with",   "he",        "she",       "they",      "we",     "you",
    "at",      "by",       "this",   "that",      "from",      "but",       "not",    "or",
    "have",    "had",      "are",    "one",       "all",       "were",      "when",   "there",
    "can",     "an",       "which",  "their",     "if",        "do",        "will",   "each",
    "about",   "how",      "up",     "out",       "them",      "then",      "many",   "some",
    "so",      "these",    "would",  "other",     "into",      "has",       "more",   "her",
    "two",     "like",     "him",    "see",       "time",      "could",     "no",     "make",
    "than",    "first",    "been",   "its",       "who",       "now",       "people", "my",
    "made",    "over",     "did",    "down",      "only",      "way",       "find",   "use",
    "may",     "water",    "long",   "little",    "very",      "after",     "words",  "called",
    "just",    "where",    "most",   "know",      "get",       "through",   "back",   "much",
    "go",      "good",     "new",    "write",     "our",       "me",        "man",    "too",
    "any",     "day",      "same",   "right",     "look",      "think",     "also",   "around",
    "another", "came",     "come",   "work",      "three",     "word",      "must",   "because",
    "does",    "part",     "even",   "place",     "well",      "such",      "here",   "take",
    "why",     "things",   "help",   "put",       "years",     "different", "away",   "again",
    "off",     "went",     "old",    "number",    "great",     "tell",      "men",    "say",
    "small",   "every",    "found",  "still",     "between",   "name",      "should", "home",
    "big",     "give",     "air",    "line",      "set",       "own",       "under",  "read",
    "last",    "never",    "us",     "left",      "end",       "along",     "while",  "might",
    "next",    "sound",    "below",  "saw",       "something", "thought",   "both",   "few",
    "those",   "always",   "show",   "large",     "often",     "together",  "asked",  "house",
    "world",   "going",    "want",   "school",    "important", "until",     "form",   "food",
    "keep",    "children", "feet",   "land",      "side",      "without",   "boy",    "once",
    "animals", "life",     "enough", "took",      "sometimes", "four",      "head",   "above",
    "kind",    "began",    "almost", "live",      "page",      "got",       "earth",  "need",
    "far",     "hand",     "high",   "year",      "mother",    "light",     "parts",  "country",
    "father",  "let",      "night",  "following", "picture",   "being",     "study",  "second",
    "eyes",    "soon",     "times",  "story",     "boys",      "since",     "white",  "days",
    "ever",    "paper",    "hard",   "near",      "sentence",  "better",    "best",   "across",
    "during",  "today",    "others", "however",   "sure",      "means",     "knew",   "try",
    "told",
};

const char *duet_bs_prompt_word(int32_t id)
{
    size_t n = sizeof(duet__words) / sizeof(duet__words[0]);
    return duet__words[(size_t)(id < 0 ? -id : id) % n];
}

char *duet_bs_prompt_text(const int32_t *ids, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(duet_bs_prompt_word(ids[i])) + 1;
    char *s = duet_malloc(len), *p = s;
    if (s == NULL)
        return NULL;
    *p = '\0';
    for (size_t i = 0; i < n; i++) {
        const char *w = duet_bs_prompt_word(ids[i]);
        size_t wl = strlen(w);
        if (i > 0)
            *p++ = ' ';
        memcpy(p, w, wl);
        p += wl;
    }
    *p = '\0';
    return s;
}
