/* The job object shared by job.c (admission, streams, retries) and
 * job_fork.c (fork-style n).  Router-internal. */
#ifndef DUET_ROUTER_JOB_JOB_INTERNAL_H
#define DUET_ROUTER_JOB_JOB_INTERNAL_H

#include <stdatomic.h>

#include "router/fleet/cache_index.h"
#include "router/job/job.h"

typedef enum {
    DUET__JOB_NEW,
    DUET__JOB_QUEUED,
    DUET__JOB_RUNNING,
    DUET__JOB_ENDED,
    DUET__JOB_WAITING, /* a follower waiting for its leader's first token */
} duet__job_state_t;

/* A drain hand-off's candidate stream (job_handoff.c). */
typedef struct duet__handoff duet__handoff_t;
/* A message of the primary stream held while a hand-off runs. */
typedef struct duet__held {
    struct duet__held *next;
    size_t len;
    uint8_t data[];
} duet__held_t;

/* The pair a follower is pinned to (on: its leader's first token came). */
typedef struct {
    bool on;
    duet_router_pin_t prefill, decode;
} duet__pins_t;

struct duet_router_job {
    duet_router_t *rt;
    atomic_int refs;
    const duet_router_sink_t *sink;
    void *sink_arg;
    uint8_t *req; /* packed GenerateRequest */
    size_t req_len;
    uint64_t *keys; /* cache_aware: the prompt's page keys (cache_index.h) */
    duet_router_ca_key_t key;
    /* cache_aware: prompt + output ids (under lock), recorded on the decode
     * when the job ends with output (docs/kv-aware-routing.md) */
    duet_router_ca_tokens_t toks;
    char *request_id;
    int64_t deadline_ns;
    int64_t t_create, t_admit;
    uint32_t n_prompt;    /* the prompt's tokens */
    uint32_t max_tokens;  /* the request's (0: the decode's default) */
    /* n_prompt counted in metrics.prompt_tokens_waiting until the first
     * token (or the job's end); atomic: set once by whoever takes it off */
    _Atomic bool prompt_waiting;
    bool prompt_logprobs; /* skips the prefix cache */
    duet__pins_t pins;    /* set before start; the first launch prefers it */

    /* under rt->adm_lock */
    duet__job_state_t state;
    duet_router_job_t *qnext;
    duet_router_job_t *anext, *aprev; /* rt->active */
    duet_router_job_t *leader;        /* WAITING: whose first token it waits for */
    duet_router_job_t *followers;     /* waiting for this job's first token */
    duet_router_job_t *fnext;
    bool forked; /* followers were released; fork_pins is what later ones get */
    duet__pins_t fork_pins;

    pthread_mutex_t lock; /* the fields below */
    bool cancelled;
    bool overflow;    /* the sink could not keep up */
    bool bad_message; /* decode sent something unparsable */
    bool started;
    int64_t t_first, t_last;
    int attempts;            /* streams opened */
    int done_attempts;       /* streams whose on_done ran */
    int prefill, decode;     /* current pair (-1 = none); after a failure, the pair to avoid */
    bool prefill_held;       /* counted in flight on the prefill worker */
    bool decode_held;        /* counted in flight on the decode worker */
    uint64_t inst_p, inst_d; /* the instances the pair's slots held at the pick */
    duet_rpc_stream_t *stream;
    uint8_t *fin_raw; /* the finished message, once it came */
    size_t fin_len;
    int fin_reason;
    uint32_t fin_prompt, fin_completion;
    bool have_fin;
    /* migration (docs/migration.md; job_migrate.c) */
    int32_t *gen; /* the ids the sink got, in order */
    size_t n_gen, gen_cap;
    size_t text_bytes; /* the text the sink got */
    int migrations;
    bool stalled;     /* the watch cut the stream: no token for stall_timeout_ms */
    bool att_started; /* the current attempt sent a chunk */
    /* make-before-break drain hand-off (docs/migration.md "Drains";
     * job_handoff.c): while hold, the primary stream's messages wait in
     * held; the candidate's first message makes it the primary (the old
     * one is cancelled: old_stream), its failure replays held (flushing) */
    duet__handoff_t *ho; /* the candidate, until its first message or its end */
    bool hold;
    bool flushing;
    bool held_fin; /* held has the primary's Finished */
    duet__held_t *held, **held_tail;
    int emitting;                  /* chunks on their way to the sink (outside lock) */
    pthread_cond_t cond;           /* emitting, flushing or a candidate's handle changed */
    duet_rpc_stream_t *old_stream; /* superseded: its messages and end are ignored */
    int64_t ho_next_ns;            /* no new hand-off before */
};

/* Why a started stream that ended so moves to another decode: "unavailable"
 * (connection lost, the decode gone or draining), "stall" (the watch cut
 * it), "error" (a failure the decode reported, or a stream that ended
 * without Finished); NULL: it does not move. */
const char *duet__job_migrate_reason(grpc_status_code code, const char *msg, bool stalled,
                                     bool no_fin);
/* Count a migration for reason in the metrics. */
void duet__job_migrate_count(duet_router_t *rt, const char *reason);
/* Record a chunk the sink got (job->lock held). */
duet_status_t duet__job_gen_append(duet_router_job_t *job, const int32_t *ids, size_t n,
                                   size_t text_bytes);
/* The GenerateRequest for the next attempt of a started stream: the prompt
 * followed by the ids so far, what is left of max_tokens, no prompt
 * logprobs (packed, *out_p; duet_free it).  *first_p: the ids so far,
 * *text_p: their text's bytes the client has.  *out_p NULL: nothing was
 * generated yet (the original request goes). */
duet_status_t duet__job_resume_request(duet_router_job_t *job, uint8_t **out_p, size_t *len_p,
                                       uint32_t *first_p, uint32_t *text_p);
/* The packed DecodeGenerateRequest for the job's next attempt (the
 * continuation of a started stream) through prefill target (or local). */
duet_status_t duet__job_decode_request(duet_router_job_t *job, const char *target, bool local,
                                       size_t cached, uint8_t **msg_p, size_t *len_p);
/* A stream whose tokens all came (max_tokens) but whose Finished was lost:
 * the job's finished message, made here (job->lock not held). */
duet_status_t duet__job_finish_made(duet_router_job_t *job);

/* A prefill/decode pair for the job's next stream and its packed
 * DecodeGenerateRequest (the continuation of a started stream).  The
 * workers are held (counted in flight) until released. */
typedef struct {
    int p, d; /* p -1: the decode prefills (colocated) */
    uint8_t *msg;
    size_t len;
    size_t cached;
} duet__route_t;
/* Pick a pair avoiding old_p/old_d where possible (need_new: fail when the
 * only pair is the old one; pinned: a follower's first launch prefers its
 * leader's pair) and build the request.  DUET_ERR_PEER when no healthy
 * pair exists. */
duet_status_t duet__job_route(duet_router_job_t *job, int old_p, int old_d, bool need_new,
                              bool pinned, duet__route_t *r);
/* Give back the workers the current attempt holds (job->lock held). */
void duet__job_release_workers_locked(duet_router_job_t *job);
/* Handle a message of the job's primary stream s (NULL: a held message
 * replayed by job_handoff.c, replay true). */
void duet__job_message(duet_router_job_t *job, duet_rpc_stream_t *s, const uint8_t *data,
                       size_t len, bool replay);
/* The job's primary stream s ended (its on_done). */
void duet__job_done(duet_router_job_t *job, duet_rpc_stream_t *s, grpc_status_code code,
                    const char *msg);
/* The primary stream ended while a hand-off runs (job_handoff.c; lock not
 * held): true when the candidate carries the stream on (the end is
 * consumed: the stream's reference dropped); false: the end is the job's
 * (held messages were replayed first). */
bool duet__job_handoff_primary_end(duet_router_job_t *job, duet_rpc_stream_t *s,
                                   grpc_status_code code);
/* The job was cancelled: cancel a hand-off's candidate too (job->lock
 * held). */
void duet__job_handoff_cancel_locked(duet_router_job_t *job);
/* Free the held messages (job->lock held). */
void duet__job_held_clear(duet_router_job_t *job);

/* Drop a reference; the last frees the job. */
void duet__job_unref(duet_router_job_t *job);
/* duet_router_job_start; a follower (part of a request admitted before a
 * drain began) starts while draining too. */
duet_status_t duet__job_start(duet_router_job_t *job, bool follower);
/* Release job's waiting followers, once (job_fork.c). */
void duet__job_fork(duet_router_job_t *job, bool pinned);
/* Take a waiting follower off its leader's list (adm_lock held); false
 * when it is not waiting (job_fork.c). */
bool duet__job_unwait_locked(duet_router_job_t *job);

#endif
