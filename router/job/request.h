/* Request preparation shared by the HTTP and gRPC front ends: request ids,
 * the API key check, prompt token ids, max_tokens, chat prompts, and the
 * decode request (duet.v1.GenerateRequest) every job is created from.  The
 * protobuf is built here and only here, for both front ends. */
#ifndef DUET_ROUTER_JOB_REQUEST_H
#define DUET_ROUTER_JOB_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "duet/v1/generate.pb-c.h"
#include "router/job/ctx.h"
#include "router/job/job.h"
#include "router/openai/openai.h"

/* A fresh request id "<prefix>-<32 random hex digits>" into buf;
 * DUET_ERR_IO when the kernel gives no randomness (never a guessable id). */
duet_status_t duet_router_new_id(duet_router_t *rt, const char *prefix, char *buf, size_t cap);
/* Check the bearer token in an Authorization header value (NULL: absent). */
bool duet_router_auth_ok(const duet_router_t *rt, const char *header, size_t len);
/* Token ids for a prompt: text is tokenized (BOS as the tokenizer says when
 * add_special), ids are range-checked; then the prompt limit.  *ids_p is
 * duet_malloc'd.  Errors fill err (400 + context_length_exceeded...). */
duet_status_t duet_router_prompt_ids(duet_router_t *rt, const char *text, size_t len,
                                     bool add_special, const int32_t *ids, size_t n,
                                     const char *param, int32_t **ids_p, size_t *n_p,
                                     duet_router_oai_error_t *err);
/* max_tokens to send: requested (0 = default) capped by the context room. */
uint32_t duet_router_max_tokens(const duet_router_t *rt, size_t n_prompt, int64_t requested);
/* Whether a request of n_prompt tokens and `requested` max_tokens (as
 * duet_router_max_tokens caps it) fits the largest decode KV pool the
 * workers' Info reported (docs/limits: a request that can never fit is
 * refused up front, not queued).  DUET_OK when it fits or no decode has
 * reported yet; else err is 400 (gRPC INVALID_ARGUMENT) naming the pool. */
duet_status_t duet_router_fit_check(duet_router_t *rt, size_t n_prompt, int64_t requested,
                                    duet_router_oai_error_t *err);
/* Render a chat request's messages into a prompt (400 when the model has
 * no usable template or the template raises). */
duet_status_t duet_router_chat_prompt(duet_router_t *rt, const duet_router_oai_req_t *req,
                                      char **text_p, size_t *len_p, duet_router_oai_error_t *err);

/* The seed of choice i of a request seeded with seed, on HTTP and gRPC
 * (docs/api-logprobs.md "Seeds"): choice 0 uses it as given (so n = 1 is
 * unchanged), the others a splitmix64 mix of it and their index. */
uint64_t duet_router_choice_seed(uint64_t seed, int i);

/* ---- the decode request ---- */

/* A GenerateRequest and the messages it points to, on the caller's stack.
 * Shallow: strings and arrays are borrowed from what it was built from. */
typedef struct {
    Duet__V1__GenerateRequest g;
    Duet__V1__SamplingParams sp;
    Duet__V1__TokenIds tids;
    char id[192];
} duet_router_gen_t;

/* HTTP: the decode request of one prompt of a parsed OpenAI request: its
 * token ids, req's sampling and output fields, max_tokens capped by the
 * context room (duet_router_max_tokens).  No request id yet (each choice
 * gets its own: duet_router_job_create_choice). */
void duet_router_gen_from_oai(duet_router_gen_t *gen, const duet_router_t *rt,
                              const duet_router_oai_req_t *req, const int32_t *ids, size_t n_ids);
/* gRPC: the decode request of a validated client request in: in with the
 * token ids, request id id, no model and max_tokens capped by the context
 * room; every other field as the client sent it. */
void duet_router_gen_from_client(duet_router_gen_t *gen, const duet_router_t *rt,
                                 const Duet__V1__GenerateRequest *in, const char *id,
                                 const int32_t *ids, size_t n_ids);
/* Choice i of n of base: request id base_id ("<base_id>-<i>" when n > 1,
 * since every choice is its own decode request), its seed
 * (duet_router_choice_seed) and n = 0: decode sees one choice. */
void duet_router_gen_choice(duet_router_gen_t *out, const Duet__V1__GenerateRequest *base,
                            const char *base_id, int i, int n);
/* duet_router_gen_choice, then duet_router_job_create of the result. */
duet_status_t duet_router_job_create_choice(duet_router_t *rt,
                                            const Duet__V1__GenerateRequest *base,
                                            const char *base_id, int i, int n, int64_t deadline_ns,
                                            const duet_router_sink_t *sink, void *sink_arg,
                                            duet_router_job_t **job_p);

#endif
