/* duet-decode internals (DESIGN §1).
 *
 * Threads and ownership:
 *  - gRPC completion-queue threads run the handlers (service.c): they
 *    validate and tokenize a request, then hand it to the scheduler as an
 *    event.  They never touch scheduler state.
 *  - One scheduler thread (sched.c) owns every request and link after
 *    that: admission (KV pages), the prefill phase (prefill_path.c), the
 *    continuous-batching decode loop, streaming (output.c), cancellation
 *    and release.
 *  - Transfer progress threads, gRPC client threads and the bootstrap
 *    worker only post events (duet_dc_post); a request is freed only after
 *    every callback that can name it has fired or been cancelled and the
 *    event queue has been drained past its terminal call (the "zombie"
 *    list), so an event never outlives its request.
 * `evlock` guards the event queue and the counters that Info reads. */
#ifndef DUET_DECODE_DECODE_H
#define DUET_DECODE_DECODE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/cluster.h"
#include "common/limits.h"
#include "common/rpc.h"
#include "engine/logprobs.h"
#include "engine/sampling.h"
#include "engine/tp.h"
#include "node/link.h"
#include "node/node.h"
#include "tokenizer/tokenizer.h"

#define DUET_DC_MAX_STOPS    DUET_LIMIT_STOP_STRINGS
#define DUET_DC_STOP_MAX_LEN DUET_LIMIT_STOP_BYTES
#define DUET_DC_ABORT_TOKEN_MIN 16
#define DUET_DC_ABORT_TOKEN_MAX 64

typedef struct duet_dc_req duet_dc_req_t;

/* A prefill daemon we bootstrap with: the node's link (key: the prefill's
 * address) and the requests waiting for its bootstrap.  Only the scheduler
 * changes the node's link table, so it reads the table without the lock;
 * the bootstrap worker fills the link's remote fields before posting
 * LINK_DONE. */
typedef struct duet_dc_link {
    duet_node_link_t base;    /* first: the table holds &base */
    duet_dc_req_t *waiting;   /* requests waiting for the bootstrap */
} duet_dc_link_t;

static inline duet_dc_link_t *duet_dc_link_of(duet_node_link_t *link)
{
    return (duet_dc_link_t *)link;
}

typedef enum {
    DUET_DC_NEW,      /* in no list (being moved between phases) */
    DUET_DC_QUEUED,   /* waiting for KV pages */
    DUET_DC_LINKING,  /* waiting for a bootstrap */
    DUET_DC_PREFILL,  /* expectations registered, Prefill call in flight */
    DUET_DC_READY,    /* KV complete, waiting for a batch slot */
    DUET_DC_RUNNING,  /* in the decode batch */
    DUET_DC_ENDED,    /* answered; releasing */
} duet_dc_state_t;

typedef struct {
    void *dc; /* duet_decode_t */
    duet_dc_req_t *req;
    int rank;
    /* the KV_DONE event its callback posts, allocated when the expectation
     * is registered: a callback cannot fail, and a lost event would leave
     * the request waiting forever */
    struct duet_dc_ev *ev;
    int landed; /* packed: layers [0, landed) of the rank's KV in its staging */
} duet_dc_rank_arg_t;

struct duet_dc_req {
    char request_id[128];
    uint64_t transfer_id;                 /* transfer id */
    duet_rpc_call_t *call;        /* until the terminal call */
    duet_dc_state_t state;
    int64_t t_arrival, t_first, deadline_ns;
    /* remote prefill's phases (duet_now_ns; 0: not reached), logged at
     * debug with the first token: the Prefill call sent, every rank's KV
     * (and the reply, with logprobs) in */
    int64_t t_called, t_kv;

    int32_t *prompt;
    int n_prompt;
    int max_tokens;
    duet_sampling_t sampling;
    bool ignore_eos;
    int32_t *stop_ids;
    int n_stop_ids;
    char *stops[DUET_DC_MAX_STOPS];
    int n_stops;
    char prefill_target[128];
    bool prefill_local;           /* its prompt runs on our engine (local_prefill.c) */
    bool local_asked;             /* the caller asked for that (DecodeGenerateRequest) */
    /* Decode.Abort must present it (docs/security.md); "" = none given */
    char abort_token[DUET_DC_ABORT_TOKEN_MAX + 1];

    int32_t *pages;               /* reserved for prompt + max_tokens */
    int n_pages;
    bool pages_held;              /* taken from the allocator */
    int n_prompt_pages;           /* the pages of the prompt */
    /* the prefix cache (docs/prefix-cache.md): the first n_cached_pages
     * pages came from it (referenced, never written); prefill writes the
     * n_prompt_pages - n_cached_pages after them (duet_dc_xfer_pages) */
    int n_cached_pages;
    duet_kv_page_hash_t *hashes;  /* [duet_kv_prefix_insert_pages], cache on */
    /* its KV is complete in its pages (set once the prompt's is in; cleared
     * by a failure that may leave it incomplete): at its end the pages of
     * its generated tokens go to the cache (duet_dc_cache_keep_generated) */
    bool kv_whole;
    int32_t stage0;               /* packed transfer: first of duet_dc_xfer_pages staging units
                                     (node.stage) while held (transfer/xfer_pack.h); -1: not
                                     packed */
    int unpacked;                 /* packed: layers [0, unpacked) queued for unpacking */
    bool unpack_queued;           /* an unpack was queued without waiting: wait for it before
                                     the staging or the pages are reused (duet_dc_unpack_wait) */

    /* prefill phase */
    duet_dc_link_t *link;         /* a reference while expectations may use its peers */
    duet_dc_rank_arg_t *rank_args; /* [D] */
    bool *expecting;              /* [D] expectation registered and not ended */
    int n_expecting;
    bool kv_failed;
    int32_t kv_first_token;
    int kv_ok;                    /* ranks that completed */
    bool rpc_started, rpc_done;
    duet_rpc_stream_t *rpc_stream;
    bool retried;                 /* re-bootstrapped once already */
    bool abort_sent;              /* Prefill.Abort posted */

    /* log-probabilities (docs/api-logprobs.md; lp.c).  The Prefill
     * reply's (pf_*) are written by the call's message callback before it
     * posts RPC_DONE and read by the scheduler only after that event. */
    bool logprobs, prompt_logprobs;
    int top_logprobs;
    float *logits;           /* [vocab] the decode step's row */
    duet_logprob_t first_lp; /* output 0's, once known (have_first_lp) */
    bool have_first_lp;
    duet_logprob_t *prompt_lps; /* [n_prompt - 1], sent with the first chunk */
    bool prompt_lps_sent;
    duet_logprob_t pf_first_lp;
    duet_logprob_t *pf_prompt_lps;
    bool pf_reply;         /* the reply came and was parsed */
    char pf_lp_error[160]; /* why its logprobs were refused */

    /* output */
    int32_t *out;
    int n_out;
    duet_detok_t *detok;
    char *held;                   /* text not yet sent: may begin a stop string */
    size_t held_len, held_cap;
    bool cancelled;               /* the client went away or Abort */
    atomic_bool cancel_requested; /* set by the call's on_cancel (any thread) */

    duet_dc_req_t *next;          /* queue / list membership */
};

typedef enum {
    DUET_DC_EV_NEW,
    DUET_DC_EV_ABORT,      /* Decode.Abort(request_id) */
    DUET_DC_EV_KV_DONE,    /* one rank's expectation ended */
    DUET_DC_EV_KV_PROGRESS, /* packed: more layers landed on one rank */
    DUET_DC_EV_RPC_DONE,   /* the Prefill call returned */
    DUET_DC_EV_LINK_DONE,  /* a bootstrap finished */
    DUET_DC_EV_PEER_ERROR, /* a transfer peer failed (peer pointer, compared only) */
    DUET_DC_EV_WAKE,
} duet_dc_ev_type_t;

typedef struct duet_dc_ev {
    duet_dc_ev_type_t type;
    duet_dc_req_t *req;
    duet_dc_link_t *link;
    const void *peer;
    uint64_t transfer_id;                 /* KV_DONE: the transfer it reports on */
    uint64_t peer_instance;       /* PEER_ERROR: the remote side of peer */
    int rank;                     /* KV_*: decode rank; PEER_ERROR: remote rank */
    int layers;                   /* KV_PROGRESS: layers [0, layers) landed on that rank */
    duet_status_t status;
    int64_t first_token;
    char detail[256];
    duet_rpc_call_t *call;        /* ABORT: the Abort call to answer */
    char request_id[128];         /* ABORT */
    /* ABORT: the token the caller presented */
    char abort_token[DUET_DC_ABORT_TOKEN_MAX + 1];
    struct duet_dc_ev *next;
} duet_dc_ev_t;

typedef struct {
    duet_node_t node;             /* engine, pages, links, server, client (node/node.h) */
    duet_tokenizer_t *tok;
    int max_ctx;
    atomic_int waiting;           /* requests not yet running (queue limit) */
    int next_prefill;             /* round-robin over the configured prefills */

    pthread_mutex_t evlock;
    pthread_cond_t evcv;
    duet_dc_ev_t *ev_head, *ev_tail;
    bool stop;
    bool sched_gone;              /* the scheduler has left: events carrying a call are refused */
    /* Info (under evlock) */
    int info_queued, info_running;
    uint64_t requests_total, requests_failed;
    uint64_t prefills_local, prefills_remote; /* the prefill decisions taken */
    uint64_t unpacked_early;                  /* layers unpacked before their transfer ended */
    uint64_t unstaged;                        /* packed requests moved unpacked (no staging) */

    /* scheduler-owned */
    duet_prefill_local_t local_mode; /* the instance's prefill_local */
    pthread_t sched_thread;
    bool sched_started;
    duet_dc_req_t *queue_head, *queue_tail; /* QUEUED */
    duet_dc_req_t *prefilling;    /* PREFILL and LINKING-over requests */
    duet_dc_req_t *ready_head, *ready_tail;
    duet_dc_req_t **running;      /* [max_seqs] */
    int n_running;
    duet_dc_req_t *ending;        /* ENDED, waiting for callbacks */
    duet_dc_req_t *zombies;       /* free after the next event drain */
    duet_engine_seq_t *seqs;      /* [max_seqs] */
    int32_t *sampled;
    int32_t *inputs;
    long fault_step_delay_ms;     /* fault decode.step_delay_ms (tests) */
    bool fault_kv_copy;           /* fault decode.kv_copy_fail (tests) */
    char *piece;                  /* detokenizer output, piece_cap bytes */
    size_t piece_cap;
} duet_decode_t;

/* service.c */
duet_status_t duet_dc_service_register(duet_decode_t *dc);
/* The checks Generate runs on a request before posting it (fills req,
 * tokenizing a text prompt; the caller frees it with duet_dc_req_free).
 * Exposed for fuzz/. */
struct Duet__V1__DecodeGenerateRequest;
duet_status_t duet_dc_validate(duet_decode_t *dc, const struct Duet__V1__DecodeGenerateRequest *m,
                               duet_dc_req_t *req);

/* sched.c */
duet_status_t duet_dc_sched_start(duet_decode_t *dc);
void duet_dc_sched_stop(duet_decode_t *dc);
/* Queue an event for the scheduler (any thread; takes ownership). */
void duet_dc_post(duet_decode_t *dc, duet_dc_ev_t *ev);
/* The same for an event whose call the scheduler must answer: false, and
 * ev stays the caller's, once the scheduler has left (shutdown). */
bool duet_dc_post_live(duet_decode_t *dc, duet_dc_ev_t *ev);
duet_dc_ev_t *duet_dc_ev_new(duet_dc_ev_type_t type, duet_dc_req_t *req);
/* Count of requests in each phase, for Info and draining. */
void duet_dc_counts(duet_decode_t *dc, int *queued_p, int *running_p);
/* queued + running, for the drain (any thread). */
int duet_dc_pending(void *arg);
void duet_dc_req_free(duet_decode_t *dc, duet_dc_req_t *req);
/* Scheduler: end a request with an error status (terminal call), then
 * release it once safe. */
void duet_dc_fail(duet_decode_t *dc, duet_dc_req_t *req, duet_status_t st, const char *msg);
void duet_dc_release(duet_decode_t *dc, duet_dc_req_t *req);
/* Give back a packed request's staging units (it then moves unpacked if it
 * has not started; see sched.c). */
void duet_dc_stage_release(duet_decode_t *dc, duet_dc_req_t *req);
/* A packed request must move unpacked (no room in a staging arena): count
 * it, warn the first time. */
void duet_dc_unstaged(duet_decode_t *dc, duet_dc_req_t *req, const char *why);
/* Packed: unpack layers [l0, l1) of the request's staging into its pages
 * on every rank; wait = false returns once queued (unpack_queued), wait =
 * true once everything queued landed. */
duet_status_t duet_dc_unpack_layers(duet_decode_t *dc, duet_dc_req_t *req, int l0, int l1,
                                    bool wait);
/* Wait for the unpacks queued without waiting, if any (before the
 * request's staging or pages are reused or given back). */
void duet_dc_unpack_wait(duet_decode_t *dc, duet_dc_req_t *req);
/* The KV of a request is complete on every rank (state NEW): stream its
 * first token and queue it for the decode batch. */
void duet_dc_kv_ready(duet_decode_t *dc, duet_dc_req_t *req);

/* prefill_path.c (scheduler thread unless noted) */
void duet_dc_prefill_start(duet_decode_t *dc, duet_dc_req_t *req);
void duet_dc_on_kv_done(duet_decode_t *dc, duet_dc_ev_t *ev);
void duet_dc_on_kv_progress(duet_decode_t *dc, duet_dc_ev_t *ev);
void duet_dc_on_rpc_done(duet_decode_t *dc, duet_dc_ev_t *ev);
void duet_dc_on_link_done(duet_decode_t *dc, duet_dc_ev_t *ev);
void duet_dc_on_peer_failed(duet_decode_t *dc, duet_dc_ev_t *ev);
/* End the prefill phase of a request that is ending: abort on prefill,
 * cancel expectations once the Prefill call returned.  True when nothing
 * can still write its pages or call back. */
bool duet_dc_prefill_quiesce(duet_decode_t *dc, duet_dc_req_t *req);
/* Transfer layer callback (progress thread). */
void duet_dc_on_peer_error(void *arg, duet_xfer_peer_t *peer, duet_status_t st,
                           const char *detail);

/* owner.c (any thread; docs/security.md "Page grants and ownership") */
/* Set req's request id (the caller's, or 128 random bits as hex) and its
 * abort token (checked: empty, or 16..64 bytes). */
duet_status_t duet_dc_request_owner(duet_decode_t *dc, const char *request_id,
                                    const char *abort_token, duet_dc_req_t *req);
/* May the holder of token abort req?  Constant time in the token bytes. */
bool duet_dc_abort_allowed(const duet_dc_req_t *req, const char *token);
/* Is target a prefill instance of this cluster: an address of the config,
 * or (with resolve: a DNS lookup, worker threads only) one of the addresses
 * a prefill entry's discover name resolves to?  DUET_OK; DUET_ERR_INVALID
 * with the same message whatever listens at target; without resolve,
 * DUET_ERR_NOT_FOUND (no message) when only a lookup can tell. */
duet_status_t duet_dc_target_check(duet_decode_t *dc, const char *target, bool resolve);

/* local_prefill.c (scheduler thread): colocated mode and conditional
 * disaggregation (docs/design-notes.md) */
/* Should req (pages held, not yet started) prefill on our own engine?
 * busy: sequences decoding or about to (running, ready, admitted now). */
bool duet_dc_local_wanted(duet_decode_t *dc, const duet_dc_req_t *req, int busy);
/* Prefill reqs[0..n) (n <= max_seqs) in one engine call, sample each
 * first token, and hand each on as remote KV would be (duet_dc_kv_ready);
 * a request that cannot is failed. */
void duet_dc_local_prefill(duet_decode_t *dc, duet_dc_req_t **reqs, int n);

/* lp.c (docs/api-logprobs.md) */
/* Does req need the Prefill reply before decoding (its logprobs)? */
bool duet_dc_lp_wants_reply(const duet_dc_req_t *req);
/* Client thread, Prefill's reply message: keep its logprobs in req->pf_*. */
void duet_dc_lp_take_reply(duet_decode_t *dc, duet_dc_req_t *req, const uint8_t *data, size_t len);
/* Scheduler, once KV and reply are both in: adopt the reply's logprobs
 * (checked against the first token).  False: req was failed. */
bool duet_dc_lp_adopt_reply(duet_decode_t *dc, duet_dc_req_t *req);
/* Allocate the decode step's logits row (output init). */
duet_status_t duet_dc_lp_init(duet_decode_t *dc, duet_dc_req_t *req);
/* Free what lp.c allocated (req_free). */
void duet_dc_lp_cleanup(duet_dc_req_t *req);
/* Local prefill: point seq at rows for req's logprobs; after the forward,
 * compute them for the sampled first token. */
duet_status_t duet_dc_lp_local_prepare(duet_decode_t *dc, duet_dc_req_t *req,
                                       duet_engine_seq_t *seq);
duet_status_t duet_dc_lp_local_compute(duet_decode_t *dc, duet_dc_req_t *req, int32_t first);
/* Decode step: the logprob of the sampled token from req->logits into *lp;
 * NULL when req asked none. */
const duet_logprob_t *duet_dc_lp_step(duet_decode_t *dc, duet_dc_req_t *req, int32_t token,
                                      duet_logprob_t *lp);
/* cache.c (scheduler thread; docs/prefix-cache.md) */
/* Take req's pages: the longest cached prefix of its prompt (at most
 * duet_kv_prefix_lookup_pages, referenced) and new ones for the rest;
 * sets pages_held.  DUET_ERR_EXHAUSTED (nothing held) when the pool cannot
 * cover the rest. */
duet_status_t duet_dc_cache_take(duet_decode_t *dc, duet_dc_req_t *req);
/* req's prompt KV is complete in its pages: keep its full prompt pages. */
void duet_dc_cache_keep(duet_decode_t *dc, duet_dc_req_t *req);
/* req ends with kv_whole: keep the full pages of prompt + output whose KV
 * was computed (every output token's but the last, whose KV is not written)
 * beyond the prompt's (docs/prefix-cache.md "Generated pages"). */
void duet_dc_cache_keep_generated(duet_decode_t *dc, duet_dc_req_t *req);
/* Prompt tokens whose KV req still needs (after take). */
int duet_dc_uncached_tokens(const duet_decode_t *dc, const duet_dc_req_t *req);
/* True when the cache held every page it may (only the last page's tokens
 * are left): no prefill instance is needed. */
bool duet_dc_cache_covers(const duet_decode_t *dc, const duet_dc_req_t *req);

/* Prompt pages a remote prefill writes (those after the cached prefix). */
static inline int duet_dc_xfer_pages(const duet_dc_req_t *req)
{
    return req->n_prompt_pages - req->n_cached_pages;
}

/* output.c (scheduler thread) */
duet_status_t duet_dc_output_init(duet_decode_t *dc, duet_dc_req_t *req);
/* Account a new token and stream it; returns true when the request ended
 * (finished or failed). */
bool duet_dc_emit(duet_decode_t *dc, duet_dc_req_t *req, int32_t token);
/* The same with the token's log-probability (NULL: none); the first chunk
 * also carries req->prompt_lps when asked. */
bool duet_dc_emit_lp(duet_decode_t *dc, duet_dc_req_t *req, int32_t token,
                     const duet_logprob_t *lp);

#endif
