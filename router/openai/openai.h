/* The OpenAI-compatible HTTP API, pure parts: request parsing and validation
 * for /v1/completions and /v1/chat/completions, response and stream-chunk
 * JSON, the OpenAI error shape, and SSE framing.  No I/O, no locks: every
 * function works on its arguments only and is safe from any thread.
 *
 * Field rules (documented in router/README.md):
 *   model        string; optional (the served model); checked by the caller
 *   prompt       string | [int] | [string] (one) | [[int]] (one); non-empty
 *   messages     chat: [{role, content: string | [{type:"text", text}] | null}]
 *   max_tokens   int 1..limits.max_tokens_limit (max_completion_tokens alias)
 *   temperature  number >= 0 (default 1); top_p (0,1] (default 1);
 *   top_k        int >= -1 (-1 and 0 = off); seed int
 *   stop         string | [string] (at most 16, non-empty); stop_token_ids
 *   prompt       completions: also [string, ...] | [[int], ...]: several
 *                prompts (at most DUET_ROUTER_OAI_PROMPTS_MAX)
 *   n            1..DUET_ROUTER_OAI_N_MAX choices per prompt; best_of = n
 *   logprobs     completions: int 0..5 (null/false: none); chat: bool
 *   top_logprobs chat: int 0..20, needs logprobs: true
 *   echo         completions: bool (the prompt, and with logprobs its
 *                tokens' logprobs, before the completion)
 *   (docs/api-logprobs.md; n x prompts <= DUET_ROUTER_OAI_CHOICES_MAX)
 *   stream, stream_options.include_usage, ignore_eos   bools
 * Unknown fields are ignored, as OpenAI clients send extras ("user"). */
#ifndef DUET_ROUTER_OPENAI_OPENAI_H
#define DUET_ROUTER_OPENAI_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/base/buf.h"
#include "router/chat/chat_template.h"

typedef enum {
    DUET_ROUTER_API_COMPLETIONS = 0,
    DUET_ROUTER_API_CHAT = 1,
} duet_router_api_t;

/* An error as the client sees it. */
typedef struct {
    int status;        /* HTTP status */
    const char *type;  /* "invalid_request_error", "authentication_error", ... */
    const char *code;  /* NULL or "model_not_found", "context_length_exceeded"... */
    const char *param; /* NULL or the offending field (static string) */
    char message[320];
} duet_router_oai_error_t;

/* Fill err: type follows from status (4xx invalid_request_error, 401
 * authentication_error, 429 rate_limit_error, 5xx server_error).
 * Returns DUET_ERR_INVALID so parsers can `return duet_router_oai_fail(...)`. */
duet_status_t duet_router_oai_fail(duet_router_oai_error_t *err, int status, const char *param,
                                   const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

typedef struct {
    int64_t max_tokens_limit;   /* largest max_tokens */
    int vocab_size;             /* token ids must be in 0..vocab_size-1 */
    int64_t default_max_tokens; /* completions without max_tokens (OpenAI: 16) */
} duet_router_oai_limits_t;

/* Limits of one request's fan-out (docs/api-logprobs.md). */
#define DUET_ROUTER_OAI_N_MAX       16
#define DUET_ROUTER_OAI_PROMPTS_MAX 64
#define DUET_ROUTER_OAI_CHOICES_MAX 64
/* OpenAI's caps on alternatives: legacy completions 5, chat 20. */
#define DUET_ROUTER_OAI_TOP_MAX_COMPLETIONS 5
#define DUET_ROUTER_OAI_TOP_MAX_CHAT        20

/* One prompt of a completions request: text or token ids. */
typedef struct {
    bool has_text;
    char *text; /* [text_len], NUL-terminated */
    size_t text_len;
    int32_t *ids; /* [n_ids] */
    size_t n_ids;
} duet_router_oai_prompt_t;

typedef struct {
    duet_router_api_t api;
    char *model;       /* NULL when absent */
    bool has_text;     /* completions: prompt is text (else ids) */
    char *prompt_text; /* [prompt_text_len], NUL-terminated */
    size_t prompt_text_len;
    int32_t *prompt_ids; /* [n_prompt_ids] */
    size_t n_prompt_ids;
    duet_router_chat_msg_t *msgs; /* chat: [n_msgs] */
    size_t n_msgs;
    bool add_generation_prompt; /* chat, default true */
    int64_t max_tokens;         /* 0 = not given */
    double temperature;
    double top_p;
    int top_k; /* 0 = off */
    bool has_seed;
    uint64_t seed;
    char **stop; /* [n_stop] */
    size_t n_stop;
    int32_t *stop_ids; /* [n_stop_ids] */
    size_t n_stop_ids;
    bool ignore_eos;
    bool stream;
    bool include_usage;
    /* prompts 1.. of a batch (completions); prompt 0 is the fields above */
    duet_router_oai_prompt_t *more_prompts; /* [n_more_prompts] */
    size_t n_more_prompts;
    int n;         /* choices per prompt, 1.. */
    bool logprobs; /* logprobs asked (then top_logprobs alternatives) */
    int top_logprobs;
    bool echo; /* completions */
} duet_router_oai_req_t;

/* openai_choices.c: parse n, best_of, logprobs, top_logprobs and echo
 * into req (400 naming the field for a bad value or combination). */
duet_status_t duet_router_oai_parse_choices(const void *root_json, duet_router_oai_req_t *req,
                                            duet_router_oai_error_t *err);
/* The number of prompts (1 + n_more_prompts) and a view of prompt i. */
size_t duet_router_oai_n_prompts(const duet_router_oai_req_t *req);
duet_router_oai_prompt_t duet_router_oai_prompt(const duet_router_oai_req_t *req, size_t i);

/* Refuse a body with a NUL byte, raw or escaped as \u0000 (a 400 naming the
 * key whose value holds it): C strings would silently end there.  Called
 * by duet_router_oai_parse. */
duet_status_t duet_router_oai_check_body(const char *body, size_t len,
                                         duet_router_oai_error_t *err);

/* Parse and validate a request body.  On success *req owns its strings
 * (free with duet_router_oai_req_cleanup).  Returns DUET_ERR_INVALID with
 * *err filled (status 400) for any client mistake, DUET_ERR_NO_MEMORY with
 * status 500 when out of memory; *req is then clean. */
duet_status_t duet_router_oai_parse(const char *body, size_t len, duet_router_api_t api,
                                    const duet_router_oai_limits_t *limits,
                                    duet_router_oai_req_t *req, duet_router_oai_error_t *err);
void duet_router_oai_req_cleanup(duet_router_oai_req_t *req);

/* The response identity shared by a completion and its chunks. */
typedef struct {
    duet_router_api_t api;
    const char *id;  /* "cmpl-..." / "chatcmpl-..." */
    int64_t created; /* unix seconds */
    const char *model;
} duet_router_oai_meta_t;

typedef struct {
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
} duet_router_oai_usage_t;

/* "stop", "length" or "abort" for duet.v1.FinishReason values 2, 1, 3. */
const char *duet_router_oai_finish_name(int reason);

/* A whole non-streaming response body. */
bool duet_router_oai_render_response(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                     const char *text, size_t len, const char *finish,
                                     const duet_router_oai_usage_t *usage);
/* One SSE event carrying a stream chunk: text (may be empty) and, on the
 * last one, finish (else NULL).  Chat: role_first adds the assistant role
 * to the delta (the first chunk of a chat stream). */
bool duet_router_oai_render_chunk(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                  const char *text, size_t len, const char *finish,
                                  bool role_first);
/* The include_usage event: empty choices and the usage object. */
bool duet_router_oai_render_usage_chunk(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                        const duet_router_oai_usage_t *usage);
/* ---- choices and logprobs (openai_logprobs.c; docs/api-logprobs.md) ---- */

/* One token's log-probability as decode streamed it. */
typedef struct {
    int32_t id;
    bool has_logprob; /* false: the prompt's first token (nothing predicts it) */
    float logprob;
    int n_top;
    int32_t top_ids[DUET_ROUTER_OAI_TOP_MAX_CHAT];
    float top_logprobs[DUET_ROUTER_OAI_TOP_MAX_CHAT];
} duet_router_oai_lp_t;

/* The bytes token id stands for, into buf (cap bytes); returns the length
 * (0 for an unknown id). */
typedef size_t (*duet_router_oai_tok_fn)(void *ud, int32_t id, char *buf, size_t cap);

/* The value of a choice's "logprobs" for lps[0..n) in the api's shape:
 * completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
 * (*offset_p: the text offset of lps[0], advanced by the tokens' byte
 * lengths), chat {"content": [{"token", "logprob", "bytes",
 * "top_logprobs"}]}. */
bool duet_router_oai_render_logprobs(duet_router_buf_t *b, duet_router_api_t api,
                                     const duet_router_oai_lp_t *lps, size_t n,
                                     duet_router_oai_tok_fn tok, void *ud, size_t *offset_p);
/* A non-streaming choice object {"index", "text"|"message", "logprobs",
 * "finish_reason"}; lp_json NULL: "logprobs": null. */
bool duet_router_oai_render_choice(duet_router_buf_t *b, duet_router_api_t api, int index,
                                   const char *text, size_t len, const char *lp_json, size_t lp_len,
                                   const char *finish);
/* The head of a whole response, up to and including `"choices":[`; the
 * caller appends the choices separated by commas, then
 * duet_router_oai_render_response_tail. */
bool duet_router_oai_render_response_head(duet_router_buf_t *b, const duet_router_oai_meta_t *m);
bool duet_router_oai_render_response_tail(duet_router_buf_t *b,
                                          const duet_router_oai_usage_t *usage);
/* The `"logprobs":` member of a choice: lp_json as it is, NULL: null. */
void duet_router_oai_put_logprobs(duet_router_buf_t *b, const char *lp_json, size_t lp_len);
/* One SSE event for choice index (as duet_router_oai_render_chunk), with
 * its logprobs (lp_json NULL: null). */
bool duet_router_oai_render_chunk_choice(duet_router_buf_t *b, const duet_router_oai_meta_t *m,
                                         int index, const char *text, size_t len,
                                         const char *lp_json, size_t lp_len, const char *finish,
                                         bool role_first);

/* {"error": {"message", "type", "param", "code"}} */
bool duet_router_oai_render_error(duet_router_buf_t *b, const duet_router_oai_error_t *err);

/* ---- SSE framing ---- */
/* "data: " + payload + "\n\n"; a payload with newlines becomes several data
 * lines (the SSE rule), so any text frames correctly. */
bool duet_router_sse_data(duet_router_buf_t *b, const char *payload, size_t len);
/* ": text\n\n" (a comment; clients ignore it). */
bool duet_router_sse_comment(duet_router_buf_t *b, const char *text);
/* "data: [DONE]\n\n" */
bool duet_router_sse_done(duet_router_buf_t *b);
/* An error event in the OpenAI error shape. */
bool duet_router_sse_error(duet_router_buf_t *b, const duet_router_oai_error_t *err);

#endif
