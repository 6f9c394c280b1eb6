/* The job API: one client request's choice routed to a prefill/decode pair
 * (job.c admission, routing, retry; job_fork.c fork-style n).  This is the
 * seam between the front ends (http/, grpc/) above and the fleet (fleet/)
 * below: a front end builds the decode request (job/request.h), creates a
 * job with a sink, starts it and hears back through the sink. */
#ifndef DUET_ROUTER_JOB_JOB_H
#define DUET_ROUTER_JOB_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rpc.h"
#include "common/status.h"
#include "duet/v1/generate.pb-c.h"
#include "router/job/ctx.h"

typedef struct {
    bool ok;               /* finished normally (then the fields below) */
    grpc_status_code code; /* the failure, when !ok */
    const char *message;
    bool started; /* a token reached the sink before the end */
    int reason;   /* duet.v1.FinishReason */
    uint32_t prompt_tokens, completion_tokens;
    const uint8_t *raw; /* the finished GenerateResponse bytes (ok only) */
    size_t raw_len;
} duet_router_job_end_t;

typedef struct {
    /* A chunk, on a client CQ thread, in order.  raw: the GenerateResponse
     * bytes.  Return false when the client cannot keep up: the job is
     * cancelled and ends with RESOURCE_EXHAUSTED. */
    bool (*on_chunk)(void *arg, const Duet__V1__TokenChunk *chunk, const uint8_t *raw, size_t len);
    /* Exactly once per started job, from any thread (also from inside
     * duet_router_job_cancel). */
    void (*on_end)(void *arg, const duet_router_job_end_t *end);
} duet_router_sink_t;

/* A job for req (packed and copied; request_id must be set) with a deadline
 * (CLOCK_MONOTONIC ns).  The caller holds one reference. */
duet_status_t duet_router_job_create(duet_router_t *rt, const Duet__V1__GenerateRequest *req,
                                     int64_t deadline_ns, const duet_router_sink_t *sink,
                                     void *sink_arg, duet_router_job_t **job_p);
/* Admit: run now, or queue.  DUET_OK: on_end will follow exactly once.
 * Otherwise nothing is called: DUET_ERR_EXHAUSTED (queue full: 429),
 * DUET_ERR_PEER (no healthy worker: 503), DUET_ERR_SHUTDOWN (draining: 503),
 * DUET_ERR_CANCELLED (cancelled before start). */
duet_status_t duet_router_job_start(duet_router_job_t *job);
/* Start job as a follower of leader (started already; NULL: as
 * duet_router_job_start): an n > 1 request's choices 1..n-1 after its
 * choice 0 (docs/api-logprobs.md "Fork-style sharing").  When the prompt
 * can share its pages (a full page before its last token, no prompt
 * logprobs, a decode of the config with prefix_cache on) job waits for the
 * leader's first token -- its prompt's KV then sits in its decode's prefix
 * cache -- and starts pinned to the leader's prefill/decode pair
 * (duet_router_workers_pick_pinned); when the leader ends before a first
 * token it starts unpinned.  Otherwise it starts at once.  Returns as
 * duet_router_job_start; after DUET_OK on_end follows exactly once (a
 * waiting job that later cannot start ends with the reason: UNAVAILABLE,
 * RESOURCE_EXHAUSTED, ...; cancelled while waiting: CANCELLED). */
duet_status_t duet_router_job_start_after(duet_router_job_t *job, duet_router_job_t *leader);
/* The client went away: abort downstream (or leave the queue).  Any thread,
 * idempotent; on_end follows (maybe on this thread, before it returns). */
void duet_router_job_cancel(duet_router_job_t *job);
/* Another reference (returns job). */
duet_router_job_t *duet_router_job_ref(duet_router_job_t *job);
void duet_router_job_release(duet_router_job_t *job);
/* The status of a job that could not start (duet_router_job_start's
 * result st): RESOURCE_EXHAUSTED, CANCELLED, UNAVAILABLE or INTERNAL. */
grpc_status_code duet_router_job_start_code(duet_status_t st);
/* End queued jobs whose deadline passed (ticker). */
void duet_router_jobs_expire(duet_router_t *rt);
/* Start queued jobs the admission holds now that the prefills may have
 * room (ticker). */
void duet_router_jobs_admit(duet_router_t *rt);
/* Cut started streams whose decode sent no token for the configured
 * stall_timeout_ms; each then migrates (ticker; docs/migration.md). */
void duet_router_jobs_watch(duet_router_t *rt);
/* Move started streams off draining decodes, make-before-break: each
 * continues on a healthy decode, and only once that one sent its first
 * message is it cancelled on the draining one; until then the draining
 * decode generates it (ticker; docs/migration.md "Drains", job_handoff.c). */
void duet_router_jobs_handoff(duet_router_t *rt);
/* Cancel every admitted job (end of drain). */
void duet_router_jobs_cancel_all(duet_router_t *rt);

#endif
