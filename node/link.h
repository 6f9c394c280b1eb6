/* Links between a prefill daemon and a decode daemon (DESIGN §1, §4, §5):
 * the one implementation of the bootstrap protocol and of the table of
 * links both daemons keep.
 *
 * A link is one remote daemon: its identity, its TP size, the slice plan of
 * the pair and the transfer peers of every (local rank, remote rank) pair
 * the plan connects.  Decode keys its links by the prefill's address and
 * makes them itself (Bootstrap call); prefill keys them by the decode's
 * instance id and makes them when a decode bootstraps.
 *
 * Bootstrap: the decode sends, per rank, its transfer descriptor, with its
 * instance id (new on every start), "<config name>@<host>", TP size, total
 * KV heads, model fingerprint and a fresh page-grant key (node/grant.h);
 * the prefill checks them, connects its ranks to the decode ranks they
 * send to -- and only once that worked replaces any older link of the
 * same instance id or name@host (a restarted decode: its siblings sharing
 * a config entry keep theirs), so a bootstrap that fails (a garbage
 * descriptor) leaves the working link alone -- and answers with its own
 * descriptors, which the decode checks before connecting its ranks to
 * their senders.  A mismatch
 * (model, KV heads; the transfer layer checks layout and dtype at connect)
 * is DUET_ERR_MISMATCH naming both values.
 *
 * Lifetime: a link is counted.  The table holds one reference while the
 * link is in it; users (requests) hold one each.  A link leaves the table
 * (retired: DEAD) when it is replaced, when connecting it failed, or when
 * one of its transfer connections failed; the next bootstrap makes a new
 * one.  The last reference disconnects its peers on the node's worker
 * (disconnecting blocks; progress threads may drop references).
 *
 * Threads: the table and the counts are guarded by node->links_lock, so
 * every function here is thread-safe.  A link's plan, peers and remote
 * fields are written before it becomes READY (by the thread connecting it)
 * and only read after. */
#ifndef DUET_NODE_LINK_H
#define DUET_NODE_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rpc.h"
#include "node/grant.h"
#include "node/node.h"
#include "transfer/slice_plan.h"
#include "transfer/xfer.h"

typedef enum {
    DUET_NODE_LINK_CONNECTING, /* in the table, its bootstrap running */
    DUET_NODE_LINK_READY,      /* peers connected */
    DUET_NODE_LINK_DEAD,       /* out of the table */
} duet_node_link_state_t;

struct duet_node_link {
    char key[128];         /* decode: the prefill's address; prefill: the decode's instance id */
    char remote_id[64];    /* the remote's instance id (new on every start) */
    char remote_name[160]; /* decode's "<name>@<host>" / prefill's config name */
    int remote_tp;
    duet_slice_plan_t *plan;  /* P = prefill TP, D = decode TP, H = total KV heads */
    duet_xfer_peer_t **peers; /* [local TP][remote TP]: NULL where the two ranks share nothing */
    duet_node_link_state_t state;
    int refs;
    char error[512]; /* why connecting failed */
    /* decode: one of our ranks is on the GPU of a prefill rank that sends
     * to it (BootstrapResponse.rank_gpus) */
    bool shares_gpu;
    /* the page-grant key of this bootstrap (node/grant.h): made by decode,
     * received by prefill; written before the link is READY */
    uint8_t grant_key[DUET_NODE_GRANT_KEY_LEN];
    duet_node_t *node;
    struct duet_node_link *next;
};

/* The peers of local rank r, indexed by remote rank ([remote_tp]). */
static inline duet_xfer_peer_t *const *duet_node_link_peers(const duet_node_link_t *link, int r)
{
    return &link->peers[r * link->remote_tp];
}

/* A new CONNECTING link under key, in the table (the table's reference is
 * the only one).  size >= sizeof(duet_node_link_t): a daemon may embed the
 * link as the first member of a larger struct.  NULL without memory. */
duet_node_link_t *duet_node_link_add(duet_node_t *node, const char *key, size_t size);

/* The link in the table under key, or NULL.  With hold, a counted
 * reference to a READY one only (release it with duet_node_link_put);
 * without, the bare pointer, for the only thread that retires links (the
 * decode scheduler). */
duet_node_link_t *duet_node_link_find(duet_node_t *node, const char *key, bool hold);
void duet_node_link_hold(duet_node_link_t *link);
/* Drop a reference (any thread; NULL is fine). */
void duet_node_link_put(duet_node_link_t *link);
/* Mark it READY (peers connected). */
void duet_node_link_ready(duet_node_link_t *link);
/* Take the link out of the table (DEAD; the table's reference goes).  A
 * link no longer in the table is left as it is. */
void duet_node_link_retire(duet_node_link_t *link);

/* A transfer connection failed: retire the READY link that holds peer,
 * checking the remote's identity as well (a peer pointer reported through a
 * queue may be stale).  Copies the link's key to key_out; false when no
 * link holds it (already retired). */
bool duet_node_link_retire_peer(duet_node_t *node, const duet_xfer_peer_t *peer, uint64_t instance,
                                int rank, char *key_out, size_t key_len);

/* Shutdown (node.c): before the worker goes, links released from then on
 * are kept for duet_node_links_destroy; that frees them and every link
 * still in the table once the worker is gone (a link released later still,
 * by a late callback, is left to the process's exit). */
void duet_node_links_close(duet_node_t *node);
void duet_node_links_destroy(duet_node_t *node);

/* Decode side (worker thread): bootstrap link with the prefill at its key
 * through node->cli, check the answer and connect every decode rank to its
 * senders; the link stays CONNECTING (the caller makes it READY).  On
 * failure link->error says why (logged here). */
duet_status_t duet_node_link_bootstrap(duet_node_t *node, duet_node_link_t *link);

/* Prefill side: the Prefill.Bootstrap handler (completion-queue thread;
 * the work runs on the node's worker, which answers the call). */
void duet_node_link_serve_bootstrap(duet_node_t *node, duet_rpc_call_t *call, const uint8_t *req,
                                    size_t len);

#endif
