/* Tokenizer from a Hugging Face tokenizer.json.
 *
 * Two model families are supported:
 *  - SentencePiece-style BPE (Llama-2, stories260K): normalizer Prepend("▁")
 *    + Replace(" ", "▁"), BPE merges, byte_fallback to <0xNN> pieces; decoder
 *    Replace("▁", " "), ByteFallback, Fuse, Strip(1 leading space).
 *  - byte-level BPE (GPT-2 / Llama-3 / Qwen2): ByteLevel pre-tokenizer with
 *    the split regex, bytes mapped to printable code points, BPE merges.
 * Added/special tokens in the text are matched as whole tokens.
 *
 * A loaded tokenizer is immutable and safe to share between threads. */
#ifndef DUET_TOKENIZER_TOKENIZER_H
#define DUET_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct duet_tokenizer duet_tokenizer_t;

/* Load DIR/tokenizer.json (and DIR/tokenizer_config.json when present, for
 * add_bos_token / add_eos_token / bos and eos tokens / chat_template).
 * Unsupported model types or a malformed file are DUET_ERR_FORMAT /
 * DUET_ERR_UNSUPPORTED naming the file and the offending field. */
duet_status_t duet_tokenizer_load(const char *dir, duet_tokenizer_t **tok_p);
/* Load from explicit paths; config_path may be NULL. */
duet_status_t duet_tokenizer_load_files(const char *tokenizer_json, const char *config_path,
                                        duet_tokenizer_t **tok_p);
void duet_tokenizer_destroy(duet_tokenizer_t *tok);

int duet_tokenizer_vocab_size(const duet_tokenizer_t *tok);
int duet_tokenizer_bos(const duet_tokenizer_t *tok); /* -1 when none */
int duet_tokenizer_eos(const duet_tokenizer_t *tok); /* -1 when none */
/* The chat template from tokenizer_config.json, or NULL. */
const char *duet_tokenizer_chat_template(const duet_tokenizer_t *tok);

/* Encode len bytes of UTF-8 text.  add_special: prepend BOS (and append EOS)
 * as the tokenizer's post-processor / tokenizer_config says.  *ids_p is
 * allocated with duet_malloc (caller frees with duet_free).  Invalid UTF-8
 * bytes are encoded through byte fallback / byte-level, never rejected. */
duet_status_t duet_tokenizer_encode(const duet_tokenizer_t *tok, const char *text, size_t len,
                                    bool add_special, int32_t **ids_p, size_t *n_p);

/* The piece text of one id ("▁the", "<0x0A>", "Ġthe"), or NULL if out of
 * range. */
const char *duet_tokenizer_piece(const duet_tokenizer_t *tok, int32_t id);

/* Streaming-safe decoder: feed ids one at a time, get UTF-8 text out only
 * when it forms complete characters (a multi-byte character split across
 * byte-fallback tokens is held back until complete).  Special tokens (BOS,
 * EOS) decode to nothing when skip_special is set.  The decoder state is
 * per stream; create one per request. */
typedef struct duet_detok duet_detok_t;

duet_status_t duet_detok_create(const duet_tokenizer_t *tok, bool skip_special,
                                duet_detok_t **dt_p);
void duet_detok_destroy(duet_detok_t *dt);
/* Append the text that id completes to out (capacity out_cap, always
 * NUL-terminated); *out_len_p is the number of bytes written.  Returns
 * DUET_ERR_INVALID for an out-of-range id. */
duet_status_t duet_detok_push(duet_detok_t *dt, int32_t id, char *out, size_t out_cap,
                              size_t *out_len_p);
/* Flush held-back bytes at the end of a stream (incomplete UTF-8 becomes
 * U+FFFD). */
duet_status_t duet_detok_flush(duet_detok_t *dt, char *out, size_t out_cap, size_t *out_len_p);

/* Decode a whole id sequence into a NUL-terminated duet_malloc'd string. */
duet_status_t duet_tokenizer_decode(const duet_tokenizer_t *tok, const int32_t *ids, size_t n,
                                    bool skip_special, char **text_p);

/* Write a byte-level BPE tokenizer.json with exactly vocab_size entries
 * (vocab_size >= 260): the 256 byte tokens, merges learned from a fixed
 * built-in English text, and two special tokens <|bos|> = vocab_size - 2
 * and <|eos|> = vocab_size - 1.  Deterministic.  Used by duet mkmodel. */
duet_status_t duet_tokenizer_write_synthetic(const char *path, int vocab_size);

/* Additions (tokenizer owner). */

/* An out_cap for duet_detok_push / duet_detok_flush that always suffices
 * for this tokenizer (a smaller buffer may get DUET_ERR_TOO_LONG, in which
 * case the decoder state is left as it was before the call). */
size_t duet_detok_max_chunk(const duet_tokenizer_t *tok);

/* Feed a context the stream continues (a prompt) without its text: the
 * state afterwards is the one pushing every id would leave, at the cost of
 * the context's tail (the held-back bytes and the start-of-text handling
 * depend on the last few bytes only).  DUET_ERR_INVALID names an
 * out-of-range id and leaves the state as it was. */
duet_status_t duet_detok_prime(duet_detok_t *dt, const int32_t *ids, size_t n);

/* Like duet_tokenizer_decode but without UTF-8 repair: the exact bytes the
 * tokens stand for (byte-level and byte-fallback tokens may form invalid
 * UTF-8), in a duet_malloc'd buffer of *len_p bytes plus a NUL. */
duet_status_t duet_tokenizer_decode_bytes(const duet_tokenizer_t *tok, const int32_t *ids, size_t n,
                                          bool skip_special, char **bytes_p, size_t *len_p);

#endif
