/* duet-prefill internals (DESIGN §1): the daemon context shared by its
 * files.
 *
 * Threads: gRPC completion-queue threads run the handlers (service.c);
 * one scheduler thread batches prompts, runs the engine and posts the KV
 * (sched.c); the engine's rank threads call the per-layer hook; the
 * transfer ranks' progress threads run the send callbacks; the node's
 * worker thread does the blocking bootstrap connects (node/link.h).
 *
 * Locks: `lock` guards the request queue, the in-flight list and the
 * counters; the node's `links_lock` guards the decode links.  Neither is
 * held while calling into gRPC or the engine. */
#ifndef DUET_PREFILL_PREFILL_H
#define DUET_PREFILL_PREFILL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/rpc.h"
#include "duet/v1/prefill.pb-c.h"
#include "engine/logprobs.h"
#include "engine/sampling.h"
#include "engine/tp.h"
#include "node/link.h"
#include "node/node.h"
#include "node/replay.h"

/* slots of the table of grants served (node/replay.h; 24 bytes each) */
#define DUET_PF_GRANTS_SEEN (1u << 18)

typedef struct duet_pf_req {
    duet_rpc_call_t *call; /* NULL once answered */
    char request_id[128];
    uint64_t transfer_id;
    duet_node_link_t *link; /* the decode's (key: its instance id); holds a reference */
    int32_t *prompt;
    int n_prompt;
    int32_t *dst_pages;
    int n_pages;                /* pages covering the prompt */
    int32_t *src_pages;         /* ours, while computing and sending */
    /* prefix caches (docs/prefix-cache.md): decode has the first skip
     * pages already (dst_pages covers the n_pages - skip after them, and
     * only those are sent); our own cache had the first n_hit */
    int skip, n_hit;
    duet_kv_page_hash_t *hashes; /* [duet_kv_prefix_insert_pages] while computing */
    /* packed transfer (transfer/xfer_pack.h): staging page runs on both
     * sides and, per rank, the copies that stage a layer */
    bool packed;
    int32_t dst_stage0, src_stage0; /* src_stage0 >= 0 while held */
    int progress_layers;            /* packed: decode asked for progress this often (0: never) */
    int stage_units;                /* units from src_stage0 (node.stage) */
    /* packed, chunked (PrefillRequest.chunk_pages; chunks.c): pages per
     * chunk, 0 when the request moves whole */
    int chunk_pages;
    duet_kv_copy_t **pack;          /* [tp] */
    int *n_pack;                    /* [tp] */
    duet_sampling_t sampling;
    uint64_t first_index; /* the output index of the token it samples (a migrated stream's) */
    atomic_bool aborted;
    bool announce_start; /* the call wants a {started} message when it leaves the queue */
    bool begun;          /* sends begun on every rank */
    /* completion, written by the progress threads */
    atomic_int ranks_pending; /* sends not ended + the scheduler's until send_end */
    _Atomic duet_status_t status;
    char detail[256];
    atomic_flag detail_set;
    int32_t first_token;
    /* log-probabilities asked (docs/api-logprobs.md), computed by the
     * scheduler from the forward's logits, sent with the reply */
    bool logprobs, prompt_logprobs;
    int top_logprobs;
    duet_logprob_t first_lp;
    duet_logprob_t *prompt_lps; /* [n_prompt - 1] when prompt_logprobs */
    float *logits;              /* the forward's rows while computing */
    _Atomic uint64_t bytes;
    int64_t t_arrival, t_start, t_computed;
    struct duet_pf_req *next;
} duet_pf_req_t;

typedef struct {
    duet_node_t node; /* engine, pages, links, server, start-up (node/node.h) */

    pthread_mutex_t lock;
    pthread_cond_t cv;
    duet_pf_req_t *queue_head, *queue_tail;
    duet_pf_req_t *inflight; /* computing or sending */
    int n_queued, n_inflight;
    uint64_t requests_total, requests_failed;
    /* the router's admission signal (Info): prompt tokens queued or in
     * the batch computing; measured tokens per second and prompt length
     * (moving averages, 0 before the first batch) */
    int64_t queue_tokens;
    double tokens_per_s, prompt_mean;
    bool stop;
    pthread_t sched_thread;
    bool sched_started;
    /* the grants served, refused when replayed (node/replay.h) */
    duet_node_replay_t *grants_seen;

    /* the batch whose layers the engine hook posts (scheduler-owned) */
    duet_pf_req_t **batch;
    int n_batch;
} duet_prefill_t;

/* service.c */
duet_status_t duet_pf_service_register(duet_prefill_t *pf);
/* The checks Prefill runs on a request before queueing it (fills req;
 * the caller frees it with duet_pf_req_free).  Exposed for fuzz/. */
struct Duet__V1__PrefillRequest;
duet_status_t duet_pf_validate(duet_prefill_t *pf, const struct Duet__V1__PrefillRequest *m,
                               duet_pf_req_t *req);

/* grant.c: verify the page grant of a validated request (req->link set)
 * before it is queued, and take it (a grant is served once); an error
 * naming why: DUET_ERR_INVALID (the caller answers PERMISSION_DENIED) or
 * DUET_ERR_EXHAUSTED (too many grants live). */
duet_status_t duet_pf_grant_check(duet_prefill_t *pf, const Duet__V1__PrefillRequest *m,
                                  const duet_pf_req_t *req);

/* cache.c (scheduler thread; docs/prefix-cache.md) */
/* Give req its source pages: the longest prefix its prompt finds in the
 * prefix cache (req->n_hit pages, referenced) and new pages for the rest.
 * DUET_ERR_EXHAUSTED (nothing held) when the pool cannot cover the rest. */
duet_status_t duet_pf_cache_take(duet_prefill_t *pf, duet_pf_req_t *req);
/* req's KV is computed: keep its full prompt pages in the cache. */
void duet_pf_cache_keep(duet_prefill_t *pf, duet_pf_req_t *req);

/* sched.c */
duet_status_t duet_pf_sched_start(duet_prefill_t *pf);
void duet_pf_sched_stop(duet_prefill_t *pf);
/* Queue a validated request (takes ownership). */
void duet_pf_submit(duet_prefill_t *pf, duet_pf_req_t *req);
/* Abort by (decode id, transfer id); true when found. */
bool duet_pf_abort(duet_prefill_t *pf, const char *decode_id, uint64_t transfer_id);
void duet_pf_on_layer(void *ud, int rank, int layer, bool last_chunk);
void duet_pf_req_free(duet_prefill_t *pf, duet_pf_req_t *req);

/* chunks.c (scheduler thread): send a chunked request's KV, computed in
 * its pages, chunk by chunk (PrefillRequest.chunk_pages): stage chunk k,
 * put it as transfer transfer_id + k into decode's staging half k % 2 with
 * first_token in its notifications, and wait until every rank's send of
 * it ended (all decode ranks acknowledged) before staging the next.
 * DUET_OK once every chunk was acknowledged; else the failure (message in
 * duet_error_msg()), nothing sent after it.  Adds the bytes sent to
 * req->bytes. */
duet_status_t duet_pf_send_chunks(duet_prefill_t *pf, duet_pf_req_t *req, int32_t first_token);

/* logprobs.c (docs/api-logprobs.md; scheduler thread) */
/* Ask the forward for the logits req's log-probabilities need (the last
 * row, or every row with prompt_logprobs) into req->logits. */
duet_status_t duet_pf_logprobs_prepare(duet_prefill_t *pf, duet_pf_req_t *req,
                                       duet_engine_seq_t *seq);
/* After the forward: compute them for the sampled first token and free
 * the rows. */
duet_status_t duet_pf_logprobs_compute(duet_prefill_t *pf, duet_pf_req_t *req, int32_t first);
/* Fill the reply's logprob fields; the storage is allocated and released
 * by duet_pf_logprobs_reply_free once the reply is sent.  False: no
 * memory. */
typedef struct {
    Duet__V1__TokenLogprob *msgs;    /* [n_prompt] */
    Duet__V1__TokenLogprob **ptrs;   /* [n_prompt] */
    Duet__V1__TopLogprob *tops;      /* [n_prompt][DUET_LOGPROBS_TOP_MAX] */
    Duet__V1__TopLogprob **top_ptrs; /* likewise */
} duet_pf_lp_reply_t;
bool duet_pf_logprobs_reply(const duet_pf_req_t *req, Duet__V1__PrefillResponse *resp,
                            duet_pf_lp_reply_t *r);
void duet_pf_logprobs_reply_free(duet_pf_lp_reply_t *r);

/* Requests not finished (queued or in flight), for the drain. */
int duet_pf_pending(void *arg);
/* The drain deadline passed: abort what is left. */
void duet_pf_drain_abort(void *arg);
/* After the gRPC server shut down: wait for the sends still in flight. */
void duet_pf_quiesce(void *arg);

#endif
