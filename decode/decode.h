/* duet-decode's types: the daemon context, a request, an event (DESIGN §1).
 * Declarations only of data; every room of decode/ has its own header:
 *
 *   main.c           start-up (node/node.h)                   (none)
 *   service.c        gRPC handlers                            service.h
 *   sched.c          the scheduler loop                       sched.h
 *   req.c            a request's states and edges             req.h
 *   events.c         the event queue                          events.h
 *   prefill_path.c   links, expectations, the Prefill call    prefill_path.h
 *   local_prefill.c  colocated prefill                        local_prefill.h
 *   output.c         streaming                                output.h
 *   lp.c             log-probabilities                        lp.h
 *   stage.c          packed transfers' unpacking              stage.h
 *   cache.c          the prefix cache                         cache.h
 *   owner.c          ids, abort tokens, targets               owner.h
 *   limits.c         input limits                             limits.h
 *
 * A file includes only the headers of rooms below it (the graph is in
 * docs/architecture.md "Decode request lifecycle"; only main includes
 * sched.h, only main and fuzz/ service.h): no room calls back into one
 * above it.
 *
 * Threads and ownership:
 *  - gRPC completion-queue threads run the handlers (service.c): they
 *    validate and tokenize a request, then hand it to the scheduler as an
 *    event.  They never touch scheduler state.
 *  - One scheduler thread (sched.c) owns every request and link after
 *    that.  A request changes state, and takes or gives back its pages,
 *    link, Prefill stream, staging and expectations, only in req.c's
 *    duet_dc_req_go (docs/architecture.md "Decode request lifecycle").
 *  - Transfer progress threads, gRPC client threads and the bootstrap
 *    worker only post events (events.h): the queue under `evlock` is the
 *    one hand-over between them and the scheduler.  A request is freed
 *    only after every callback that can name it has fired or been
 *    cancelled and the event queue has been drained past its terminal call
 *    (the "zombie" list), so an event never outlives its request.
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
    DUET_DC_NEW,      /* posted; or between two attempts of its prefill (in no list) */
    DUET_DC_QUEUED,   /* waiting for KV pages (queue) */
    DUET_DC_LOCAL,    /* pages held, prompt computing on our engine, whole or in chunks (local) */
    DUET_DC_LINKING,  /* waiting for a bootstrap (its link's waiting list) */
    DUET_DC_PREFILL,  /* expectations registered, Prefill call in flight (prefilling) */
    DUET_DC_KV_IN,    /* KV complete, output 0 known; the loop sends it (kv_in) */
    DUET_DC_READY,    /* output 0 sent, KV in its pages, waiting for a batch slot */
    DUET_DC_RUNNING,  /* in the decode batch */
    DUET_DC_ENDED,    /* answered; releasing (ending) */
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
    /* a migrated stream (docs/migration.md): the last first_index prompt
     * tokens are output the client has (resumed_text bytes of their text);
     * this decode's outputs are indexes first_index + 0, 1, ... */
    int first_index;
    size_t resumed_text;
    int max_tokens; /* this decode's outputs (what is left of the stream's) */
    duet_sampling_t sampling;
    bool ignore_eos;
    int32_t *stop_ids;
    int n_stop_ids;
    char *stops[DUET_DC_MAX_STOPS];
    int n_stops;
    char prefill_target[128];
    bool prefill_local;           /* its prompt runs on our engine (local_prefill.c) */
    bool local_asked;             /* the caller asked for that (DecodeGenerateRequest) */
    /* LOCAL: prompt tokens whose KV is in its pages (the cached prefix, then
     * each chunk computed); the next chunk starts there */
    int local_done;
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
    int stage_units;              /* staging units held from stage0 */
    /* packed, larger than a staging arena: the KV moves chunk_pages pages
     * at a time, chunk k as transfer transfer_id + k into the staging half
     * k % 2 (stage.h); 0: whole, one transfer */
    int chunk_pages, n_chunks;
    int chunk;                    /* the chunk in flight */
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
    int64_t call_deadline_ns;     /* the Prefill call's (node/deadline.h) */
    bool kv_started;              /* prefill announced its start (KV_STARTED) */
    bool kv_timed_out_queued;     /* a rank's transfer timed out before that */
    duet_rpc_stream_t *rpc_stream;
    bool retried;                 /* re-bootstrapped once already */
    /* its KV transfer failed and transfer.on_failure is recompute: it
     * prefills locally once nothing can write its pages (req.c) */
    bool recompute;
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
    DUET_DC_EV_ABORT,       /* Decode.Abort(request_id) */
    DUET_DC_EV_KV_DONE,     /* one rank's expectation ended */
    DUET_DC_EV_KV_PROGRESS, /* packed: more layers landed on one rank */
    DUET_DC_EV_KV_STARTED,  /* prefill began the request (its Prefill call's first message) */
    DUET_DC_EV_RPC_DONE,    /* the Prefill call returned */
    DUET_DC_EV_LINK_DONE,   /* a bootstrap finished */
    DUET_DC_EV_PEER_ERROR,  /* a transfer peer failed (peer pointer, compared only) */
    DUET_DC_EV_WAKE,
    DUET_DC_EV_DRAIN, /* SIGTERM: the drain began (counting streams handed back) */
} duet_dc_ev_type_t;

typedef struct duet_dc_ev {
    duet_dc_ev_type_t type;
    duet_dc_req_t *req;
    duet_dc_link_t *link;
    const void *peer;
    uint64_t transfer_id;                 /* KV_*: the transfer it reports on */
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
    uint64_t chunks_local;                    /* local prefill forwards (a whole prompt: one) */
    uint64_t unpacked_early;                  /* layers unpacked before their transfer ended */
    uint64_t unstaged;                        /* packed requests moved unpacked (no staging) */
    uint64_t chunked;                         /* packed requests moved in chunks */
    /* step timing (Info decode_steps..decode_cycle_ns) */
    uint64_t steps, forward_ns, cycles, cycle_ns;
    int64_t last_step_ns; /* scheduler-owned: the previous step's start */

    /* scheduler-owned */
    duet_prefill_local_t local_mode; /* the instance's prefill_local */
    /* prompt tokens of local prefills per decode step (prefill_chunk_tokens
     * capped to max_batch_tokens); 0: whole prompts at admission */
    int chunk_tokens;
    uint64_t unsolicited_seen;       /* slices nobody granted, as of the last check (cache.c) */
    pthread_t sched_thread;
    bool sched_started;
    duet_dc_req_t *queue_head, *queue_tail; /* QUEUED */
    duet_dc_req_t *prefilling;    /* PREFILL and LINKING-over requests */
    duet_dc_req_t *local_head, *local_tail; /* LOCAL, in admission order */
    duet_dc_req_t *kv_in_head, *kv_in_tail; /* KV_IN */
    duet_dc_req_t *ready_head, *ready_tail;
    duet_dc_req_t **running;      /* [max_seqs] */
    int n_running;
    duet_dc_req_t *ending;        /* ENDED, waiting for callbacks */
    duet_dc_req_t *zombies;       /* free after the next event drain */
    duet_engine_seq_t *seqs;      /* [2 * max_seqs]: running, then local chunks */
    int32_t *sampled;             /* [2 * max_seqs] */
    int32_t *inputs;
    struct duet_dc_local_result *local_res; /* [max_seqs] (local_prefill.h) */
    duet_dc_req_t **local_batch;  /* [max_seqs]: the local chunks of a step */
    bool drain_counting;          /* the drain began: a cancel is a stream handed back */
    atomic_int drain_moved, drain_in_flight; /* duet_dc_drain_report */
    long fault_step_delay_ms;     /* fault decode.step_delay_ms (tests) */
    bool fault_kv_copy;           /* fault decode.kv_copy_fail (tests) */
    char *piece;                  /* detokenizer output, piece_cap bytes */
    size_t piece_cap;
} duet_decode_t;

/* Prompt pages a remote prefill writes (those after the cached prefix). */
static inline int duet_dc_xfer_pages(const duet_dc_req_t *req)
{
    return req->n_prompt_pages - req->n_cached_pages;
}

/* The transfer in flight: the request's, or its chunk's (chunk_pages). */
static inline uint64_t duet_dc_xfer_id(const duet_dc_req_t *req)
{
    return req->transfer_id + (uint64_t)(req->chunk_pages > 0 ? req->chunk : 0);
}

/* The pages of the transfer in flight: from offset *first_p of the
 * request's xfer pages (after its cached prefix), into staging from unit
 * *stage_p.  Returns the count. */
static inline int duet_dc_xfer_span(const duet_dc_req_t *req, int *first_p, int32_t *stage_p)
{
    int n = duet_dc_xfer_pages(req);
    if (req->chunk_pages <= 0) {
        *first_p = 0;
        *stage_p = req->stage0;
        return n;
    }
    int first = req->chunk * req->chunk_pages, left = n - first;
    *first_p = first;
    *stage_p = req->stage0 + (req->chunk % 2) * req->chunk_pages;
    return left < req->chunk_pages ? left : req->chunk_pages;
}

#endif
