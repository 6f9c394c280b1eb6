/* The timing rule of a remote prefill, one place for both daemons
 * (DESIGN §3 rule 7; docs/security.md "Page grants and ownership").
 *
 * Decode registers what every rank expects at t0 and gives the request
 * until t0 + queue_timeout + transfer_timeout (a request may wait in
 * prefill's queue); once prefill says it started the request (at s, its
 * Prefill call's first message) the transfer has until s +
 * transfer_timeout.  The Prefill call may run one rpc timeout longer than
 * the first deadline (prefill answers only after every send ended), and the
 * page grant decode signs expires then too, on the wall clock.  Prefill, serving the call,
 * writes nothing after the call's deadline minus one rpc timeout: decode
 * has given up on the transfer by then and reuses the pages once the call
 * ended.  Pure functions; thread-safe. */
#ifndef DUET_NODE_DEADLINE_H
#define DUET_NODE_DEADLINE_H

#include <stdint.h>

#include "common/cluster.h"

/* Decode: the deadline of the expectations registered at now_ns
 * (monotonic, duet_now_ns). */
int64_t duet_node_deadline_transfer(const duet_cluster_config_t *c, int64_t now_ns);

/* Decode: the deadline of the expectations once prefill started the
 * request (its announcement arrived at now_ns). */
int64_t duet_node_deadline_started(const duet_cluster_config_t *c, int64_t now_ns);

/* Decode: the deadline of the Prefill call made at now_ns (monotonic). */
int64_t duet_node_deadline_prefill_call(const duet_cluster_config_t *c, int64_t now_ns);

/* Decode: the wall-clock expiry (ms since the epoch) of a grant signed
 * now (duet_node_grant_now_ms): as long as the Prefill call. */
uint64_t duet_node_deadline_grant_expiry(const duet_cluster_config_t *c);

/* Prefill: the last moment (monotonic) a request served at now_ns may
 * write into decode's pages, given the Prefill call's deadline (INT64_MAX:
 * none): its transfer timeout from now, and not past the decode's own
 * transfer deadline (call deadline minus one rpc timeout). */
int64_t duet_node_deadline_send(const duet_cluster_config_t *c, int64_t now_ns,
                                int64_t call_deadline_ns);

/* Prefill: the prompt tokens one batch may take (beyond its first
 * request, which always goes).  Its sends' deadline counts from the
 * batch's start (duet_node_deadline_send), so at the measured rate
 * tokens_per_s (<= 0: none yet) the batch must compute well within the
 * transfer timeout: at most half of it, and at most max_batch_tokens; at
 * least 1.  Otherwise a slow prefill (a loaded CPU, a big batch) times
 * its started transfers out and decode cuts the link. */
int duet_node_batch_tokens(const duet_cluster_config_t *c, int max_batch_tokens,
                           double tokens_per_s);

/* Either side: the deadline of a control-plane call (Abort, Bootstrap)
 * made at now_ns. */
int64_t duet_node_deadline_rpc(const duet_cluster_config_t *c, int64_t now_ns);

#endif
