/* The mechanics of a remote prefill (prefill_path.c; DESIGN §1 steps
 * 2-3): links and their bootstrap, the transfer id, every rank's
 * expectation, the Prefill and Abort calls, and the callbacks that turn
 * their completions into events (events.h).  Leaves: each returns a status
 * and touches no request state; req.c decides what a result means and
 * holds the resources they hand it. */
#ifndef DUET_DECODE_PREFILL_PATH_H
#define DUET_DECODE_PREFILL_PATH_H

#include <stdbool.h>
#include <stdint.h>

#include "decode/decode.h"

/* A failure of the prefill phase as the client sees it: the request was
 * validated here, so what the transfer layer or the prefill daemon finds
 * invalid or unknown is an internal error (retried by the router), not the
 * client's INVALID_ARGUMENT or NOT_FOUND. */
duet_status_t duet_dc_phase_status(duet_status_t st);

/* The prefill instance for req: its own target, else the next configured
 * one with an address (round robin); NULL: none. */
const char *duet_dc_prefill_pick(duet_decode_t *dc, const duet_dc_req_t *req);

/* The node's link to target; a new one is added BOOTING and its bootstrap
 * posted to the work queue (LINK_DONE follows).  NULL: no memory. */
duet_dc_link_t *duet_dc_link_get(duet_decode_t *dc, const char *target);

/* The most pages of a packed transfer (or of each of its chunks) that
 * every prefill rank of link can stage (transfer/xfer_pack.h); INT_MAX
 * when no rank sends, 0 when a sender's descriptor is unknown. */
int duet_dc_stage_max_pages(const duet_dc_link_t *link);

/* Packed: the layer count between announcements of landed layers that
 * req asks for (0: none), where they pay (node/kv_engine.h). */
int duet_dc_progress_layers(const duet_decode_t *dc, const duet_dc_req_t *req,
                            const duet_dc_link_t *link);

/* A transfer id no other transfer of ours is using: random, so no caller
 * can guess it (Prefill.Abort takes it), and checked against the requests
 * in the prefill phase, where ids are live.  span: the ids from it that
 * the request uses (a chunked one: one per chunk, id + k). */
duet_status_t duet_dc_transfer_id_new(duet_decode_t *dc, int span, uint64_t *id_p);

/* Register on every decode rank at once what req's transfer over link
 * brings (the slice plan's senders), with deadline and progress; each
 * rank's callback posts the KV_DONE event allocated here (rank_args).
 * rank_st[d]: whether rank d registered (it then calls back, or must be
 * cancelled).  Not DUET_OK: some rank did not (message names it). */
duet_status_t duet_dc_expect_all(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link,
                                 int64_t deadline_ns, int progress, duet_status_t *rank_st);

/* Make req's Prefill call over link (its page grant signed, expiring with
 * the call); its reply's logprobs go to lp.c and its end posts RPC_DONE.
 * *stream_p: the call, released by whoever takes RPC_DONE. */
duet_status_t duet_dc_prefill_call(duet_decode_t *dc, duet_dc_req_t *req, duet_dc_link_t *link,
                                   int64_t now_ns, int progress, duet_rpc_stream_t **stream_p);

/* Ask req's prefill to stop (Prefill.Abort; its Prefill reply follows);
 * a failure to ask is logged. */
void duet_dc_prefill_abort(duet_decode_t *dc, const duet_dc_req_t *req);

/* PEER_ERROR (scheduler): retire the link whose connection failed. */
void duet_dc_on_peer_failed(duet_decode_t *dc, const duet_dc_ev_t *ev);
/* Force-close every connection of link (duet_xfer_peer_cut) and retire
 * it: nothing its prefill still sends can land here. */
void duet_dc_link_cut(duet_decode_t *dc, duet_dc_link_t *link, const char *why);
/* Transfer layer callback (progress thread): post PEER_ERROR. */
void duet_dc_on_peer_error(void *arg, duet_xfer_peer_t *peer, duet_status_t st, const char *detail);

#endif
