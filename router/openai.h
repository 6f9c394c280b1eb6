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
 *   n            1 only; best_of 1 only; echo false; logprobs null/0/false
 *   stream, stream_options.include_usage, ignore_eos   bools
 * Unknown fields are ignored, as OpenAI clients send extras ("user"). */
#ifndef DUET_ROUTER_OPENAI_H
#define DUET_ROUTER_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "router/buf.h"
#include "router/chat_template.h"

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
} duet_router_oai_req_t;

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
