/* The prefill scheduler: batches queued prompts, runs them through the
 * engine, and streams each layer's KV to the decode daemon as soon as the
 * layer is stored (duet_pf_on_layer), then sends the notifications with the
 * first sampled token.  A request is answered once every rank's send has
 * ended (all receivers acknowledged, or failed): from then on nothing writes
 * into the decode daemon's pages for it. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/rpc_pb.h"
#include "common/sync.h"
#include "duet/v1/prefill.pb-c.h"
#include "kv/heads.h"
#include "node/deadline.h"
#include "prefill/prefill.h"
#include "transfer/xfer_pack.h"

static int duet__pages_for(const duet_prefill_t *pf, int n_tokens)
{
    int ps = pf->node.args.cluster->page_size;
    return (n_tokens + ps - 1) / ps;
}

void duet_pf_req_free(duet_prefill_t *pf, duet_pf_req_t *req)
{
    if (req == NULL)
        return;
    duet_free(req->logits);
    duet_free(req->prompt_lps);
    if (req->src_pages != NULL)
        duet_kv_pool_release_chain(pf->node.pages, req->src_pages, req->n_pages);
    if (req->src_stage0 >= 0)
        duet_kv_pool_release_run(pf->node.stage, req->src_stage0, req->stage_units);
    if (req->pack != NULL) {
        for (int s = 0; s < pf->node.ke.tp; s++)
            duet_free(req->pack[s]);
    }
    duet_free(req->pack);
    duet_free(req->n_pack);
    duet_node_link_put(req->link);
    duet_free(req->prompt);
    duet_free(req->dst_pages);
    duet_free(req->src_pages);
    duet_free(req->hashes);
    duet_free(req);
}

static void duet__req_error(duet_pf_req_t *req, duet_status_t st, const char *detail)
{
    duet_status_t ok = DUET_OK;
    if (atomic_compare_exchange_strong(&req->status, &ok, st))
        snprintf(req->detail, sizeof(req->detail), "%s", detail);
}

/* Answer the call and release the request (any thread). */
static void duet__complete(duet_prefill_t *pf, duet_pf_req_t *req)
{
    duet_status_t st = atomic_load(&req->status);
    int64_t now = duet_now_ns();

    /* An abort that came after the sends ended OK changes nothing: every
     * decode rank has acknowledged its KV, so the reply says so. */
    if (st == DUET_OK) {
        Duet__V1__PrefillResponse resp = DUET__V1__PREFILL_RESPONSE__INIT;
        resp.first_token = req->first_token;
        resp.prompt_tokens = (uint32_t)req->n_prompt;
        resp.cached_tokens = (uint32_t)(req->n_hit * pf->node.args.cluster->page_size);
        resp.bytes_sent = atomic_load(&req->bytes);
        resp.queue_us = (uint32_t)((req->t_start - req->t_arrival) / 1000);
        resp.compute_us = (uint32_t)((req->t_computed - req->t_start) / 1000);
        resp.transfer_us = (uint32_t)((now - req->t_computed) / 1000);
        duet_pf_lp_reply_t lpr;
        if (duet_pf_logprobs_reply(req, &resp, &lpr))
            duet_pb_reply(req->call, &resp.base);
        else
            duet_rpc_call_fail_status(req->call, DUET_ERR_NO_MEMORY,
                                      "prefill: no memory for logprobs");
        duet_pf_logprobs_reply_free(&lpr);
    } else {
        DUET_LOG_DEBUG("prefill: request %s failed: %s", req->request_id, req->detail);
        duet_rpc_call_fail_status(req->call, st, req->detail);
    }
    req->call = NULL;
    pthread_mutex_lock(&pf->lock);
    for (duet_pf_req_t **pp = &pf->inflight; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == req) {
            *pp = req->next;
            break;
        }
    }
    if (st != DUET_OK)
        pf->requests_failed++;
    pthread_mutex_unlock(&pf->lock);
    /* pages back before the scheduler is woken (it may be waiting for
     * them), and the link released before n_inflight lets duet__prefill_stop
     * destroy the work queue and the links */
    duet_pf_req_free(pf, req);
    pthread_mutex_lock(&pf->lock);
    pf->n_inflight--;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->lock);
}

/* A rank's send ended (progress thread). */
static void duet__send_done(void *arg, uint64_t id, const duet_xfer_result_t *res)
{
    duet_pf_req_t *req = arg;
    if (res->status != DUET_OK)
        duet__req_error(req, res->status, res->detail);
    atomic_fetch_add(&req->bytes, res->bytes);
    if (atomic_fetch_sub(&req->ranks_pending, 1) == 1)
        duet__complete(req->link->node->ud, req);
}

/* Fail a request that never reached the senders. */
static void duet__fail_unsent(duet_prefill_t *pf, duet_pf_req_t *req, duet_status_t st,
                              const char *detail)
{
    duet__req_error(req, st, detail);
    duet__complete(pf, req);
}

typedef struct {
    duet_xfer_rank_t *xr;
    uint64_t transfer_id;
    int layer;
} duet__layer_post_t;

/* The layer's KV is where the transfer layer reads it: post its puts.
 * With a device pool this runs on a driver thread once the copy to the
 * host mirror landed (no blocking here; send_layers only queues). */
static void duet__post_layer(void *arg)
{
    duet__layer_post_t *p = arg;
    duet_xfer_send_layers(p->xr, p->transfer_id, p->layer, p->layer + 1);
    duet_free(p);
}

void duet_pf_on_layer(void *ud, int rank, int layer, bool last_chunk)
{
    duet_prefill_t *pf = ud;
    if (!last_chunk)
        return;
    duet_xfer_rank_t *xr = duet_xfer_rank(pf->node.ke.xfer, rank);
    for (int i = 0; i < pf->n_batch; i++) {
        duet_pf_req_t *req = pf->batch[i];
        duet__layer_post_t *p;
        if (!req->begun)
            continue;
        p = DUET_NEW(duet__layer_post_t);
        if (p == NULL) {
            /* send_end fails the send: a layer never posted */
            DUET_LOG_ERROR("prefill: no memory to post layer %d of %s", layer, req->request_id);
            continue;
        }
        *p = (duet__layer_post_t){xr, req->transfer_id, layer};
        /* packed: stage the layer, then release its puts (which read the
         * staging); otherwise the puts read the pages (or their mirror) */
        duet_status_t st =
            req->packed
                ? duet_engine_kv_copy_layer(pf->node.ke.engine, rank, layer, req->pack[rank],
                                            req->n_pack[rank], duet__post_layer, p)
                : duet_engine_kv_export_layer(pf->node.ke.engine, rank, layer,
                                              req->src_pages + req->skip, req->n_pages - req->skip,
                                              duet__post_layer, p);
        if (st != DUET_OK) {
            DUET_LOG_ERROR("prefill: kv export of layer %d failed: %s", layer, duet_error_msg());
            duet_free(p);
        }
    }
}

/* Per rank, the copies that stage the heads it sends (the same list serves
 * every layer). */
static duet_status_t duet__pack_lists(duet_prefill_t *pf, duet_pf_req_t *req)
{
    const duet_kv_layout_t *l = duet_engine_kv_layout(pf->node.ke.engine);
    int P = pf->node.ke.tp;

    req->pack = DUET_NEW_ARRAY(duet_kv_copy_t *, (size_t)P);
    req->n_pack = DUET_NEW_ARRAY(int, (size_t)P);
    if (req->pack == NULL || req->n_pack == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "packed transfer: no memory");
    for (int s = 0; s < P; s++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_src_runs(req->link->plan, s, &runs);
        int n_send = req->n_pages - req->skip;
        size_t slots = (size_t)duet_xfer_pack_slots(runs, n_runs);
        req->pack[s] = DUET_NEW_ARRAY(duet_kv_copy_t, (size_t)n_send * slots + 1);
        if (req->pack[s] == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "packed transfer: no memory");
        req->n_pack[s] = duet_xfer_pack_copies(l, req->src_pages + req->skip, n_send,
                                               req->src_stage0, runs, n_runs, 0, req->pack[s]);
    }
    return DUET_OK;
}

/* Tell the decode its request left our queue: its transfer deadline counts
 * from here (node/deadline.h). */
static duet_status_t duet__announce_start(duet_pf_req_t *req)
{
    Duet__V1__PrefillResponse m = DUET__V1__PREFILL_RESPONSE__INIT;
    uint8_t *buf = NULL;
    size_t len = 0;
    m.started = true;
    duet_status_t st = duet_pb_pack(&m.base, &buf, &len);
    if (st == DUET_OK)
        st = duet_rpc_call_write(req->call, buf, len);
    duet_free(buf);
    return st == DUET_OK ? DUET_OK : duet_error_wrap(st, "announcing the start: ");
}

/* Begin the sends of one request on every rank; false when it failed (and
 * was completed). */
static bool duet__req_begin(duet_prefill_t *pf, duet_pf_req_t *req)
{
    int P = pf->node.ke.tp;
    int64_t now = duet_now_ns();
    /* decode reuses the pages once its Prefill call ended: nothing is
     * written after its transfer deadline (node/deadline.h) */
    int64_t deadline =
        duet_node_deadline_send(pf->node.args.cluster, now, duet_rpc_call_deadline_ns(req->call));
    duet_status_t st0;

    if (req->aborted || deadline <= now) {
        duet__fail_unsent(pf, req, req->aborted ? DUET_ERR_CANCELLED : DUET_ERR_TIMEOUT,
                          req->aborted ? "aborted before it ran"
                                       : "the decode's transfer deadline passed before it ran");
        return false;
    }
    if (req->packed && req->chunk_pages == 0 && (st0 = duet__pack_lists(pf, req)) != DUET_OK) {
        duet__fail_unsent(pf, req, st0, duet_error_msg());
        return false;
    }
    if (req->announce_start && (st0 = duet__announce_start(req)) != DUET_OK) {
        duet__fail_unsent(pf, req, st0, duet_error_msg());
        return false;
    }
    /* chunked: sent once computed, by the scheduler (duet_pf_send_chunks),
     * not layer by layer as the forward stores them */
    if (req->chunk_pages > 0) {
        atomic_store(&req->ranks_pending, 1);
        return true;
    }
    /* one count per rank, plus the scheduler's own until it has ended the
     * sends: a send can fail (deadline, peer) while the batch computes */
    atomic_store(&req->ranks_pending, P + 1);
    duet_xfer_send_t snd[DUET_TP_MAX];
    duet_xfer_rank_t *ranks[DUET_TP_MAX];
    duet_status_t rank_st[DUET_TP_MAX];
    for (int s = 0; s < P; s++) {
        ranks[s] = duet_xfer_rank(pf->node.ke.xfer, s);
        snd[s] = (duet_xfer_send_t){
            .transfer_id = req->transfer_id,
            .plan = req->link->plan,
            .peers = duet_node_link_peers(req->link, s),
            .src_pages = req->src_pages + req->skip,
            .dst_pages = req->dst_pages,
            .n_pages = req->n_pages - req->skip,
            .flags = (pf->node.args.cluster->transfer_checksum ? DUET_XFER_SEND_CRC : 0) |
                     (req->packed ? DUET_XFER_SEND_PACKED : 0),
            .src_stage0 = req->src_stage0,
            .dst_stage0 = req->dst_stage0,
            .progress_layers = req->progress_layers,
            .deadline_ns = deadline,
            .cb = duet__send_done,
            .arg = req,
        };
    }
    /* every rank begins at once (one wake-up round trip, not P in turn) */
    duet_status_t st = duet_xfer_send_begin_all(ranks, snd, P, rank_st);
    if (st != DUET_OK) {
        int failed = 0;
        duet__req_error(req, st, duet_error_msg());
        /* the ranks that began call back once ended; the rest never will */
        for (int q = 0; q < P; q++) {
            if (rank_st[q] == DUET_OK)
                duet_xfer_send_end(ranks[q], req->transfer_id, st, DUET_XFER_NO_TOKEN);
            else
                failed++;
        }
        if (atomic_fetch_sub(&req->ranks_pending, failed + 1) == failed + 1)
            duet__complete(pf, req);
        return false;
    }
    req->begun = true;
    return true;
}

static void duet__run_batch(duet_prefill_t *pf, duet_pf_req_t **batch, int n)
{
    duet_engine_seq_t *seqs = DUET_NEW_ARRAY(duet_engine_seq_t, (size_t)n);
    int32_t *sampled = DUET_NEW_ARRAY(int32_t, (size_t)n);
    duet_pf_req_t **live = DUET_NEW_ARRAY(duet_pf_req_t *, (size_t)n);
    int n_live = 0;
    duet_status_t st;

    if (seqs == NULL || sampled == NULL || live == NULL) {
        for (int i = 0; i < n; i++)
            duet__fail_unsent(pf, batch[i], DUET_ERR_NO_MEMORY, "prefill: no memory");
        goto out;
    }
    int64_t t0 = duet_now_ns();
    for (int i = 0; i < n; i++) {
        duet_pf_req_t *req = batch[i];
        req->t_start = t0;
        if (duet__req_begin(pf, req))
            live[n_live++] = req;
    }
    if (n_live == 0)
        goto out;
    for (int i = 0; i < n_live; i++) {
        duet_pf_req_t *req = live[i];
        int cached = req->n_hit * pf->node.args.cluster->page_size;
        seqs[i] = (duet_engine_seq_t){
            .tokens = req->prompt + cached,
            .n_tokens = req->n_prompt - cached,
            .start_pos = cached,
            .pages = req->src_pages,
            .n_pages = req->n_pages,
            .sample = true,
            .sampling = req->sampling,
            .sample_index = req->first_index,
        };
        if (duet_pf_logprobs_prepare(pf, req, &seqs[i]) != DUET_OK) /* computed without them */
            duet__req_error(req, DUET_ERR_NO_MEMORY, duet_error_msg());
    }
    pf->batch = live;
    pf->n_batch = n_live;
    st = duet_engine_forward(pf->node.ke.engine, seqs, n_live, sampled);
    /* device pools: every layer's copy to the host mirror must have landed
     * (and been posted) before the notifications go out */
    if (st == DUET_OK)
        st = duet_engine_kv_export_sync(pf->node.ke.engine);
    pf->batch = NULL;
    pf->n_batch = 0;
    int64_t t1 = duet_now_ns();
    char failed[256] = "";
    if (st != DUET_OK) {
        snprintf(failed, sizeof(failed), "prefill engine failed: %s", duet_error_msg());
        DUET_LOG_ERROR("prefill: forward failed: %s", duet_error_msg());
    }
    for (int i = 0; i < n_live; i++) {
        duet_pf_req_t *req = live[i];
        duet_status_t rst = st != DUET_OK ? st : req->aborted ? DUET_ERR_CANCELLED : DUET_OK;
        const char *why = st != DUET_OK ? failed : "aborted";
        if (rst == DUET_OK && sampled[i] == DUET_ENGINE_NONFINITE) {
            /* broken weights: this request fails, not the daemon */
            rst = DUET_ERR_INTERNAL;
            why = "non-finite logits (NaN or inf) at the first output token: the model's "
                  "weights or activations are broken";
            DUET_LOG_ERROR("request %s: %s", req->request_id, why);
        }
        req->first_token = sampled[i];
        req->t_computed = t1;
        if (rst == DUET_OK && duet_pf_logprobs_compute(pf, req, sampled[i]) != DUET_OK) {
            rst = DUET_ERR_INTERNAL;
            why = duet_error_msg();
        }
        if (st == DUET_OK && sampled[i] != DUET_ENGINE_NONFINITE)
            duet_pf_cache_keep(pf, req);
        if (rst == DUET_OK && req->chunk_pages > 0 &&
            (rst = duet_pf_send_chunks(pf, req, sampled[i])) != DUET_OK)
            why = duet_error_msg();
        if (rst != DUET_OK)
            duet__req_error(req, rst, why);
        for (int s = 0; s < pf->node.ke.tp && req->chunk_pages == 0; s++)
            duet_xfer_send_end(duet_xfer_rank(pf->node.ke.xfer, s), req->transfer_id, rst,
                               rst == DUET_OK ? sampled[i] : DUET_XFER_NO_TOKEN);
        if (atomic_fetch_sub(&req->ranks_pending, 1) == 1)
            duet__complete(pf, req);
    }
    /* the engine cannot run again (a rank failed: collective deadline, rank
     * or device error): the process goes, the orchestrator restarts it */
    if (st != DUET_OK)
        duet_node_fail(&pf->node, failed);
out:
    duet_free(seqs);
    duet_free(sampled);
    duet_free(live);
}

/* Take the next batch off the queue (lock held).  Returns its size; 0 when
 * nothing can run now. */
static int duet__take_batch(duet_prefill_t *pf, duet_pf_req_t **batch, int max,
                            duet_pf_req_t **cancelled_p)
{
    const duet_instance_config_t *self = pf->node.args.self;
    int n = 0, tokens = 0;
    /* a batch computes within half the transfer timeout at the measured
     * rate: its sends' deadline counts from its start */
    int max_tokens =
        duet_node_batch_tokens(pf->node.args.cluster, self->max_batch_tokens, pf->tokens_per_s);

    while (pf->queue_head != NULL && n < max) {
        duet_pf_req_t *req = pf->queue_head;
        if (req->aborted) {
            pf->queue_head = req->next;
            pf->n_queued--;
            pf->queue_tokens -= req->n_prompt;
            req->next = *cancelled_p;
            *cancelled_p = req;
            continue;
        }
        if (n > 0 && tokens + req->n_prompt > max_tokens)
            break;
        /* (with the prefix cache, only the pages it lacks are new) */
        if (duet_pf_cache_take(pf, req) != DUET_OK)
            break; /* wait for pages: a send completing frees some */
        DUET_LOG_DEBUG("prefill: %s: %d of %d pages from the prefix cache, %d to send",
                       req->request_id, req->n_hit, req->n_pages, req->n_pages - req->skip);
        if (req->packed &&
            duet_kv_pool_alloc_run(pf->node.stage, req->stage_units, &req->src_stage0) != DUET_OK) {
            duet_kv_pool_release_chain(pf->node.pages, req->src_pages, req->n_pages);
            duet_free(req->src_pages);
            req->src_pages = NULL;
            req->src_stage0 = -1;
            break; /* wait for room in the staging arena */
        }
        pf->queue_head = req->next;
        pf->n_queued--;
        req->next = pf->inflight;
        pf->inflight = req;
        pf->n_inflight++;
        tokens += req->n_prompt - req->n_hit * pf->node.args.cluster->page_size;
        batch[n++] = req;
    }
    if (pf->queue_head == NULL)
        pf->queue_tail = NULL;
    return n;
}

/* A batch of n requests, tokens prompt tokens, left the queue and ran
 * (computed, sends posted) in wall_ns: the admission signal (lock held). */
static void duet__measure(duet_prefill_t *pf, int n, int tokens, int64_t wall_ns)
{
    const double a = 0.3; /* weight of the newest batch */
    double rate = (double)tokens * 1e9 / (double)(wall_ns > 0 ? wall_ns : 1);
    double mean = (double)tokens / n;
    pf->queue_tokens -= tokens;
    pf->tokens_per_s = pf->tokens_per_s > 0 ? (1 - a) * pf->tokens_per_s + a * rate : rate;
    pf->prompt_mean = pf->prompt_mean > 0 ? (1 - a) * pf->prompt_mean + a * mean : mean;
}

static void *duet__pf_sched_main(void *arg)
{
    duet_prefill_t *pf = arg;
    int max = pf->node.args.self->max_seqs;
    /* fault injection for the failure tests: hold every batch this long
     * before computing it, so a test can kill a peer mid-request */
    long delay_ms = duet_fault_value("prefill.delay_ms", 0);
    duet_pf_req_t **batch = DUET_NEW_ARRAY(duet_pf_req_t *, (size_t)max);

    duet_thread_set_name("pf-sched");
    if (batch == NULL) {
        DUET_LOG_ERROR("prefill: no memory for the scheduler");
        return NULL;
    }
    pthread_mutex_lock(&pf->lock);
    for (;;) {
        duet_pf_req_t *cancelled = NULL;
        int n = duet__take_batch(pf, batch, max, &cancelled);
        if (n == 0 && cancelled == NULL) {
            if (pf->stop && pf->queue_head == NULL)
                break;
            pthread_cond_wait(&pf->cv, &pf->lock);
            continue;
        }
        pthread_mutex_unlock(&pf->lock);
        while (cancelled != NULL) {
            duet_pf_req_t *req = cancelled;
            cancelled = req->next;
            duet__req_error(req, DUET_ERR_CANCELLED, "aborted before it ran");
            duet_rpc_call_fail_status(req->call, DUET_ERR_CANCELLED, req->detail);
            pthread_mutex_lock(&pf->lock);
            pf->requests_failed++;
            pthread_mutex_unlock(&pf->lock);
            duet_pf_req_free(pf, req);
        }
        int64_t t_batch = duet_now_ns();
        int batch_tokens = 0;
        for (int i = 0; i < n; i++)
            batch_tokens += batch[i]->n_prompt;
        if (n > 0 && delay_ms > 0) {
            DUET_LOG_WARN("prefill: fault injection: holding a batch for %ld ms", delay_ms);
            nanosleep(&(struct timespec){delay_ms / 1000, (delay_ms % 1000) * 1000000L}, NULL);
        }
        if (n > 0)
            duet__run_batch(pf, batch, n);
        pthread_mutex_lock(&pf->lock);
        if (n > 0)
            duet__measure(pf, n, batch_tokens, duet_now_ns() - t_batch);
    }
    pthread_mutex_unlock(&pf->lock);
    duet_free(batch);
    return NULL;
}

void duet_pf_submit(duet_prefill_t *pf, duet_pf_req_t *req)
{
    req->t_arrival = duet_now_ns();
    req->n_pages = duet__pages_for(pf, req->n_prompt);
    pthread_mutex_lock(&pf->lock);
    if (atomic_load(&pf->node.draining) || pf->stop) {
        pthread_mutex_unlock(&pf->lock);
        duet_rpc_call_fail_status(req->call, DUET_ERR_SHUTDOWN, "prefill is draining");
        duet_pf_req_free(pf, req);
        return;
    }
    if (pf->n_queued >= pf->node.args.self->max_queue && pf->node.args.self->max_queue > 0) {
        int q = pf->n_queued;
        pthread_mutex_unlock(&pf->lock);
        char msg[128];
        snprintf(msg, sizeof(msg), "prefill queue is full (%d requests)", q);
        duet_rpc_call_fail_status(req->call, DUET_ERR_EXHAUSTED, msg);
        duet_pf_req_free(pf, req);
        return;
    }
    req->next = NULL;
    if (pf->queue_tail != NULL)
        pf->queue_tail->next = req;
    else
        pf->queue_head = req;
    pf->queue_tail = req;
    pf->n_queued++;
    pf->queue_tokens += req->n_prompt;
    pf->requests_total++;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->lock);
}

bool duet_pf_abort(duet_prefill_t *pf, const char *decode_id, uint64_t transfer_id)
{
    bool found = false;
    pthread_mutex_lock(&pf->lock);
    for (int pass = 0; pass < 2 && !found; pass++) {
        for (duet_pf_req_t *r = pass ? pf->inflight : pf->queue_head; r != NULL; r = r->next) {
            if (r->transfer_id == transfer_id && strcmp(r->link->remote_id, decode_id) == 0) {
                r->aborted = true;
                found = true;
                break;
            }
        }
    }
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->lock);
    return found;
}

duet_status_t duet_pf_sched_start(duet_prefill_t *pf)
{
    if (pthread_create(&pf->sched_thread, NULL, duet__pf_sched_main, pf) != 0)
        return duet_error(DUET_ERR_NO_MEMORY, "prefill: cannot start the scheduler");
    return DUET_OK;
}

void duet_pf_sched_stop(duet_prefill_t *pf)
{
    pthread_mutex_lock(&pf->lock);
    pf->stop = true;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->lock);
    pthread_join(pf->sched_thread, NULL);
}

int duet_pf_pending(void *arg)
{
    duet_prefill_t *pf = arg;
    pthread_mutex_lock(&pf->lock);
    int n = pf->n_queued + pf->n_inflight;
    pthread_mutex_unlock(&pf->lock);
    return n;
}

void duet_pf_drain_abort(void *arg)
{
    duet_prefill_t *pf = arg;
    /* queued requests fail, sends end cancelled */
    pthread_mutex_lock(&pf->lock);
    for (duet_pf_req_t *r = pf->queue_head; r != NULL; r = r->next)
        r->aborted = true;
    for (duet_pf_req_t *r = pf->inflight; r != NULL; r = r->next)
        r->aborted = true;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->lock);
}

void duet_pf_quiesce(void *arg)
{
    duet_prefill_t *pf = arg;
    /* the scheduler is gone; sends still in flight end on their own
     * (acknowledged, failed or at their deadline) */
    if (pf->node.ke.xfer == NULL)
        return;
    for (;;) {
        pthread_mutex_lock(&pf->lock);
        int n = pf->n_inflight;
        pthread_mutex_unlock(&pf->lock);
        if (n == 0)
            break;
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
    }
}
