/* KV transfer engine (DESIGN §5): moves a request's KV pages from the
 * prefill daemon's ranks into the decode daemon's ranks with one-sided puts,
 * then tells each decode rank, with one notification per (request, prefill
 * engine rank), that its slice has landed.
 *
 * Layers: the slice plan says which heads go where (transfer/slice_plan.h);
 * sends and expectations turn it into puts, flushes and notifications; a
 * transport carries those (transfer/transport.h, an ops table; UCX in
 * transfer/transport_ucx.c is the one implementation and the only code that
 * calls UCX).
 *
 * Objects
 *   duet_xfer_t       one per daemon process: the transport context and tp
 *                     ranks.
 *   duet_xfer_rank_t  one per engine rank: a transport worker, the rank's KV
 *                     pool (registered once), a progress thread, the tables
 *                     of requests being sent (prefill) or expected (decode).
 *   duet_xfer_peer_t  a connection from one local rank to one remote rank,
 *                     made from the remote rank's descriptor.
 *
 * Bootstrap: every rank packs a descriptor (an opaque, versioned byte blob:
 * worker address, packed rkey, pool base and size, layout, dtype, model
 * fingerprint) that the daemons exchange through gRPC.  Each prefill rank
 * connects to every decode rank it sends to and each decode rank to every
 * prefill rank it hears from (it acknowledges through that connection).
 *
 * A request: decode calls duet_xfer_recv_expect on each of its ranks (before
 * asking prefill to run it), prefill calls duet_xfer_send_begin, then
 * duet_xfer_send_layers as layers become ready, then duet_xfer_send_end with
 * the first sampled token (or a failure).  Per decode rank the sender issues
 * the puts, flushes them, then sends the notification; the decode rank checks
 * the byte count (and CRC32C when sent) and acknowledges.  The request is
 * complete on decode rank d exactly when every rank of senders(d) reported
 * success; on prefill when every receiver acknowledged.  Failure reports,
 * peer failures and deadlines end it with an error naming the ranks.
 *
 * Threads: every rank runs one progress thread that owns its worker and
 * tables; it sleeps in epoll on the worker's event fd when nothing is in
 * flight.  All functions below are thread-safe unless they say otherwise;
 * they hand work to the progress thread (the per-layer and end calls return
 * at once, so a rank thread can post layer l and go on computing l+1).
 * Completion callbacks (duet_xfer_done_cb_t, the peer error callback) run on
 * the progress thread of the rank concerned: keep them short, don't block in
 * them.  From a callback of rank r, call only functions marked
 * "callback-safe" and only on rank r (other ranks' functions are refused
 * there with DUET_ERR_INVALID: two ranks waiting on each other would hang).
 *
 * Transports: puts into a pool from duet_xfer_pool_alloc on the same host go
 * over shared memory and are one-sided (the decode side does no work); the
 * notification and acknowledgement travel on an endpoint with UCX peer error
 * handling (tcp here) so a dead peer is noticed within milliseconds.  With
 * UCX_TLS naming only shared memory there is no peer failure detection: a
 * dead peer shows up as a deadline error.  Elsewhere (tcp, registered
 * memory) the puts share that endpoint.  Each connection logs which path it
 * runs.
 *
 * Checksums: CRC32C over the bytes of one (request, prefill rank, decode
 * rank) slice in the order defined in transfer/xfer_segs.h (layer, K then V,
 * page, run, head), over the source pages on the sender and over the
 * destination pages on the receiver; for packed requests in the packed
 * order of transfer/xfer_pack.h, over the staging of either side.
 * Where the data lives decides who computes it: a host pool is read by the
 * CPU (the sender checksums each put's source as it posts it; packed: once
 * a receiver's puts are posted); a rank with
 * a checksum hook (duet_xfer_rank_set_checksum; a device pool needs one)
 * hands the slice's byte ranges to the hook instead -- the sender once all
 * of a receiver's puts are posted, before its notification, the receiver
 * when the notification arrives.
 *
 * Packed requests (DUET_XFER_SEND_PACKED / DUET_XFER_EXPECT_PACKED): each
 * side stages the request in consecutive units of the staging arena after
 * its pool's planes (transfer/xfer_pack.h; the pool registered with
 * duet_xfer_pool_alloc / _register_device is that much larger than
 * duet_kv_total_bytes), and the send issues one put per (receiver, run,
 * chunk of released layers) from staging to staging instead of one per
 * page and head: at most O(layers x runs) operations whatever the page
 * count and TP pair.  Packing (before
 * a layer is released with duet_xfer_send_layers) and unpacking (after the
 * expectation completed) are the caller's: copies listed by
 * duet_xfer_pack_copies, run by whoever owns the pool's memory.  The
 * notification says whether a slice was packed; an expectation of the other
 * kind fails the request (DUET_ERR_MISMATCH).
 *
 * Page contents: whole pages move (the tail of a partial last page carries
 * whatever the source page held; decode overwrites it as it appends).  The
 * decode daemon must not hand the destination pages to another request until
 * the expectation has ended (completed, failed or cancelled) *and* prefill
 * can no longer write them: after a failure or cancel that is when prefill's
 * failure notification arrived or its Abort call returned.  For a packed
 * request the same holds for its staging units (until they are unpacked),
 * and prefill keeps its own staging units until the send has ended. */
#ifndef DUET_TRANSFER_XFER_H
#define DUET_TRANSFER_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/crc32c.h"
#include "common/status.h"
#include "kv/dtype.h"
#include "kv/layout.h"
#include "transfer/slice_plan.h"

#define DUET_XFER_DESC_VERSION 1
/* first_token value meaning "none supplied". */
#define DUET_XFER_NO_TOKEN   (-1)
#define DUET_XFER_DETAIL_MAX 192

typedef enum {
    DUET_XFER_PREFILL = 1,
    DUET_XFER_DECODE = 2,
} duet_xfer_role_t;

typedef struct duet_xfer duet_xfer_t;
typedef struct duet_xfer_rank duet_xfer_rank_t;
typedef struct duet_xfer_peer duet_xfer_peer_t;

/* The outcome of one request on one rank. */
typedef struct {
    duet_status_t status;
    char detail[DUET_XFER_DETAIL_MAX]; /* for errors: what failed, naming ranks */
    uint64_t bytes;                    /* bytes moved into (decode) / out of (prefill) the rank */
    uint64_t puts;                     /* prefill: puts issued */
    int64_t first_token;               /* decode: the token the senders reported */
    uint64_t missing_mask;             /* decode: senders that had not reported success */
} duet_xfer_result_t;

/* Called once when a request ends on a rank (progress thread; see above).
 * `res` is valid during the call only. */
typedef void (*duet_xfer_done_cb_t)(void *arg, uint64_t transfer_id, const duet_xfer_result_t *res);

/* A packed expectation's progress: layers [0, layers) of this rank's slice
 * have landed from every sender (each flushed them before saying so), so
 * the receiver may unpack them while the rest is in flight.  Runs on the
 * rank's progress thread with the same rules as duet_xfer_done_cb_t; never
 * after the expectation ended or was cancelled, never with layers = all
 * (the completion says that). */
typedef void (*duet_xfer_progress_cb_t)(void *arg, uint64_t transfer_id, int layers);

/* A peer's connection failed (the remote process died or closed it).  Work
 * that depended on it has already been failed; disconnect the peer (from
 * another thread: disconnecting is not callback-safe) and connect again with
 * the peer's new descriptor once it is back. */
typedef void (*duet_xfer_peer_error_cb_t)(void *arg, duet_xfer_peer_t *peer, duet_status_t st,
                                          const char *detail);

typedef struct {
    duet_xfer_role_t role;
    int tp;                     /* engine ranks of this daemon */
    int kv_heads;               /* total KV heads of the model (H) */
    duet_dtype_t dtype;         /* KV element type; its size must be layout.elem_size */
    duet_kv_layout_t layout;    /* of every rank; n_kv_heads is local (engine/tp.h) */
    uint64_t model_fingerprint; /* peers must present the same value */
    const char *tls;            /* UCX_TLS for this context; NULL: environment/UCX default */
    int early_ttl_ms;           /* keep notifications that beat their expectation (<= 0: 5000) */
    int early_max;              /* at most this many per rank (<= 0: 1024) */
    duet_xfer_peer_error_cb_t on_peer_error; /* optional */
    void *cb_arg;
} duet_xfer_config_t;

/* Counters of one rank (monotonic, except the two gauges). */
typedef struct {
    uint64_t puts, put_bytes;
    uint64_t notify_sent, notify_received, ack_sent, ack_received;
    uint64_t recv_done, recv_failed, send_done, send_failed;
    uint64_t early_buffered;    /* notifications that arrived before their expectation */
    uint64_t dropped_late;      /* for requests already cancelled or ended here */
    uint64_t dropped_unknown;   /* never expected (buffer expired or full) */
    uint64_t dropped_duplicate; /* a sender reporting twice */
    uint64_t dropped_invalid;   /* malformed, misaddressed or from an unexpected sender */
    uint64_t acks_dropped;      /* prefill: acknowledgements for requests no longer here */
    uint64_t crc_failures, peer_failures, timeouts;
    uint64_t progress_sent;     /* prefill: progress messages (packed, progress_layers) */
    uint64_t progress_received; /* decode: progress messages applied */
    /* decode: slices whose bytes landed (a successful notification) for a
     * transfer that had already completed here, or that was never expected
     * (counted when dropped): pages nobody granted at that moment were
     * written -- a replay or a rogue sender (decode drops its prefix cache) */
    uint64_t unsolicited;
    uint64_t active_recv, active_send; /* gauges: entries held now */
} duet_xfer_stats_t;

/* Public view of a decoded descriptor. */
typedef struct {
    duet_xfer_role_t role;
    int rank, tp, kv_heads;
    duet_dtype_t dtype;
    duet_kv_layout_t layout;
    uint64_t model_fingerprint;
    uint64_t instance; /* random per duet_xfer_t: a restarted peer has a new one */
    uint64_t host_id;  /* hostname + boot id: shared memory is only tried on the same host */
    uint64_t pool_bytes;
    bool pool_device; /* the pool is CUDA device memory (duet_xfer_pool_register_device) */
} duet_xfer_desc_info_t;

/* ---- context and ranks (not thread-safe: one owner) -------------------- */

/* Create the UCP context and cfg->tp ranks, each with its worker and a
 * running progress thread.  Validates cfg (DUET_ERR_CONFIG naming the field).
 * tls/strings are copied. */
duet_status_t duet_xfer_create(const duet_xfer_config_t *cfg, duet_xfer_t **xfer_p);

/* Stop every rank: work still pending ends with DUET_ERR_SHUTDOWN (its
 * callbacks run before this returns; nothing is sent to peers), endpoints
 * are closed, rkeys destroyed, threads joined, pools unmapped (memory from
 * duet_xfer_pool_alloc is gone; registered memory stays the caller's).
 * Every peer handle becomes invalid.  Not from a callback.  Accepts NULL. */
void duet_xfer_destroy(duet_xfer_t *xfer);

/* Rank `i` (0..tp-1) of this daemon, or NULL when out of range. */
duet_xfer_rank_t *duet_xfer_rank(duet_xfer_t *xfer, int i);

/* ---- the KV pool (call once per rank, before descriptors and transfers;
 * not thread-safe with other calls on the same rank) -------------------- */

/* Allocate the rank's pool through the transport (UCX allocates it, in
 * memory it can share) so that shared-memory puts into it are one-sided.
 * bytes must be at least duet_kv_total_bytes(&cfg->layout).  *base_p is owned
 * by the rank until duet_xfer_destroy.  DUET_ERR_INVALID if the rank already
 * has a pool. */
duet_status_t duet_xfer_pool_alloc(duet_xfer_rank_t *r, size_t bytes, void **base_p);

/* Register memory the caller already owns (host memory; the pinned-host
 * staging path of the CUDA backend).  The memory must outlive the xfer. */
duet_status_t duet_xfer_pool_register(duet_xfer_rank_t *r, void *base, size_t bytes);

/* Whether this UCX build can move CUDA device memory (its memory types
 * include CUDA: cuda_copy / cuda_ipc transports).  Thread-safe. */
bool duet_xfer_supports_cuda_memory(const duet_xfer_t *xfer);

/* Run fn(arg) on the rank's progress thread and return its status (for
 * per-thread set-up such as making the rank's GPU current there, which UCX's
 * CUDA transports need).  Not callback-safe. */
duet_status_t duet_xfer_rank_run(duet_xfer_rank_t *r, duet_status_t (*fn)(void *arg), void *arg);

/* Whether puts from and into CUDA device memory work with this UCX: CUDA
 * transports, and its new protocols (the default from UCX 1.16,
 * UCX_PROTO_ENABLE=y before; the original ones read a put's source on the
 * CPU).  *why gets the reason either way.  Thread-safe. */
bool duet_xfer_device_puts(const duet_xfer_t *xfer, const char **why);

/* The UCX library's version as major * 100 + minor (1.13 -> 113). */
int duet_xfer_ucx_version(void);

/* Register CUDA device memory the caller owns as the pool (needs
 * duet_xfer_device_puts): puts then run from and into device
 * memory (cuda_ipc between GPUs of one host), with no host copy.  Peers
 * must have device pools too (their descriptors say so; a mismatch is
 * refused at connect).  Checksums (DUET_XFER_SEND_CRC) need a checksum hook
 * (duet_xfer_rank_set_checksum): the CPU does not read the pool.
 * Unregister before freeing the memory. */
duet_status_t duet_xfer_pool_register_device(duet_xfer_rank_t *r, void *base, size_t bytes);

/* Undo duet_xfer_pool_register / _register_device once nothing uses the
 * pool any more (no transfers in flight; before the memory is freed).  A
 * no-op for other pools. */
void duet_xfer_pool_unregister(duet_xfer_rank_t *r);

/* "ucx-alloc", "registered", "registered-cuda" or "none": which pool path
 * this rank runs. */
const char *duet_xfer_pool_kind(const duet_xfer_rank_t *r);

/* A checksum hook: *crc_p = the CRC32C (common/crc32c.h, the convention of
 * the inline host path, so either side may compute either way) of the
 * rank's pool bytes ranges[0..n) concatenated in order (offsets from the
 * pool's start).  Runs on the rank's progress thread, synchronously; the
 * bytes do not change during the call.  An error fails the slice (sender:
 * the receivers get a failure notification; receiver: the request fails
 * and the sender is told). */
typedef duet_status_t (*duet_xfer_checksum_fn)(void *ctx, const duet_crc32c_range_t *ranges, int n,
                                               uint32_t *crc_p);

/* Install fn(ctx, ...) as the rank's checksum hook (fn NULL removes it):
 * from now on checksums of this rank are computed through it instead of by
 * reading the pool on the CPU, and a device pool accepts
 * DUET_XFER_SEND_CRC.  For pools the CPU cannot read: the owner of the
 * memory computes (the engine's duet_engine_kv_crc, a GPU kernel).  Call
 * it like the pool calls: before transfers, not concurrently with other
 * calls on the rank. */
void duet_xfer_rank_set_checksum(duet_xfer_rank_t *r, duet_xfer_checksum_fn fn, void *ctx);

/* ---- descriptors and peers --------------------------------------------- */

/* This rank's descriptor.  *blob_p is allocated (duet_free it).  Needs the
 * pool. */
duet_status_t duet_xfer_desc_pack(duet_xfer_rank_t *r, void **blob_p, size_t *len_p);

/* Decode and check a descriptor blob without connecting (for the daemon's
 * bootstrap bookkeeping).  Malformed blobs are DUET_ERR_FORMAT, unknown
 * versions DUET_ERR_UNSUPPORTED. Pure, thread-safe. */
duet_status_t duet_xfer_desc_peek(const void *blob, size_t len, duet_xfer_desc_info_t *info_p);

/* Connect rank r to the remote rank described by blob.  Refuses a blob that
 * does not match this daemon (role, model fingerprint, dtype, layers,
 * page size, head_dim, kv heads) with DUET_ERR_MISMATCH and a message like
 * "peer decode rank 1: head_dim 64 != 128" (peer's value first).  Waits until
 * the connection is wired up or the deadline passes (DUET_ERR_TIMEOUT).
 * Not callback-safe. */
duet_status_t duet_xfer_peer_connect(duet_xfer_rank_t *r, const void *blob, size_t len,
                                     int64_t deadline_ns, duet_xfer_peer_t **peer_p);

/* Try n peer descriptors (blobs[i], lens[i]) the way duet_xfer_peer_connect
 * will hand them to UCX -- an endpoint to each worker address and, with
 * rkeys, the rkey unpacked on it -- in a short-lived child process
 * (/proc/self/exe --duet-xfer-probe, which must run duet_xfer_probe_main),
 * killed at deadline_ns (transfer/xfer_probe.c; docs/security.md).
 * DUET_OK: UCX read them without dying (it may still refuse them with an
 * error); DUET_ERR_PEER: reading them killed the child or did not finish,
 * so this process must not call UCX with them; DUET_ERR_IO: no child could
 * run.  Blocks; any thread but a rank's progress thread. */
duet_status_t duet_xfer_probe_descs(duet_xfer_t *x, const void *const *blobs, const size_t *lens,
                                    int n, bool rkeys, int64_t deadline_ns);
/* The child's side: read the descriptors from stdin, try them with a UCX
 * context of transport list tls ("" = the environment's), exit 0 (or 3 when
 * it could not start).  Does not return on success. */
int duet_xfer_probe_main(const char *tls);
#define DUET_XFER_PROBE_FLAG "--duet-xfer-probe"

/* Close the connection: work still using the peer fails (DUET_ERR_PEER),
 * endpoints are closed, the rkey destroyed and the handle freed.  Accepts
 * NULL.  Not callback-safe. */
void duet_xfer_peer_disconnect(duet_xfer_peer_t *peer);

/* Cut the link to peer (connected on rank r) at once: its endpoints are
 * force-closed, so nothing it still sends lands here, and it fails like a
 * broken peer (its requests fail, on_peer_error follows).  For a peer that
 * may still write pages about to be reused (decode: a Prefill call that
 * ended without prefill's answer).  No effect on a peer already gone or
 * closing.  Not callback-safe. */
duet_status_t duet_xfer_peer_cut(duet_xfer_rank_t *r, duet_xfer_peer_t *peer, const char *why);

/* The remote side of a peer (fixed at connect; thread-safe). */
const duet_xfer_desc_info_t *duet_xfer_peer_info(const duet_xfer_peer_t *peer);

/* ---- decode side: expectations ------------------------------------------ */

typedef struct {
    uint64_t transfer_id;
    const duet_slice_plan_t *plan;  /* D = local tp; read during the call only */
    duet_xfer_peer_t *const *peers; /* [P] this rank's peers by prefill engine rank; every
                                       rank of senders(this rank) must be connected */
    const int32_t *pages;           /* [n_pages] destination page ids (copied) */
    int n_pages;
    int64_t deadline_ns;    /* the request fails with DUET_ERR_TIMEOUT after it */
    duet_xfer_done_cb_t cb; /* NULL: collect the outcome with duet_xfer_recv_wait */
    void *arg;
    unsigned flags;     /* DUET_XFER_EXPECT_* (0: the senders put into `pages`) */
    int32_t dst_stage0; /* PACKED: first of the n_pages staging units the senders put into
                           (duet_xfer_pack_units with every local head); inside the arena */
    /* PACKED, optional: called as the senders' progress messages (see
     * progress_layers of duet_xfer_send_t) show more layers landed */
    duet_xfer_progress_cb_t progress;
    void *progress_arg;
} duet_xfer_expect_t;

enum {
    DUET_XFER_EXPECT_PACKED = 1u << 0, /* the senders put into staging (see "Packed requests") */
    /* the senders' start is announced (duet_xfer_recv_started): until then
     * nothing was written, so a timeout before it fails this request alone
     * and leaves the link up; without the flag, or after the start, a
     * timeout cuts the link to the senders that did not report (their late
     * puts must not land in pages given to other requests) */
    DUET_XFER_EXPECT_STARTS = 1u << 1,
};

/* Register an expectation on rank r: the request completes when every rank
 * of senders(r) has reported success.  Register it before asking prefill to
 * run the request; notifications that still arrive first are kept for
 * early_ttl_ms and applied now (after that they are dropped, counted as
 * dropped_unknown, and the sender is told DUET_ERR_NOT_FOUND).
 * DUET_ERR_INVALID for a request id already expected here, bad pages, bad
 * staging units (PACKED) or unconnected senders.  Callback-safe. */
duet_status_t duet_xfer_recv_expect(duet_xfer_rank_t *r, const duet_xfer_expect_t *e);

/* duet_xfer_recv_expect of in[i] on ranks[i] for i < n, the ranks' threads
 * registering them at once (one wake-up round trip for all, not one per
 * rank in turn: this sits between a request's admission and its Prefill
 * call).  st[i] is each rank's result: the caller cancels the ones that
 * succeeded when another failed.  Returns the first failure (its message
 * in duet_error_msg()) or DUET_OK.  Not callback-safe. */
duet_status_t duet_xfer_recv_expect_all(duet_xfer_rank_t *const *ranks,
                                        const duet_xfer_expect_t *in, int n, duet_status_t *st);

/* Wait for the outcome of an expectation registered without a callback and
 * release it.  Returns DUET_OK with *res_p filled (res_p->status is the
 * request's status), DUET_ERR_TIMEOUT if deadline_ns passed first (the
 * expectation stays), DUET_ERR_NOT_FOUND for an unknown id.  Not
 * callback-safe. */
duet_status_t duet_xfer_recv_wait(duet_xfer_rank_t *r, uint64_t transfer_id, int64_t deadline_ns,
                                  duet_xfer_result_t *res_p);

/* Drop an expectation whatever its state; its callback will not run after
 * this returns.  Later notifications for it are dropped and counted
 * (dropped_late) and acknowledged as cancelled.  DUET_ERR_NOT_FOUND for an
 * unknown id.  Callback-safe. */
duet_status_t duet_xfer_recv_cancel(duet_xfer_rank_t *r, uint64_t transfer_id);

/* The senders of an expectation registered with DUET_XFER_EXPECT_STARTS
 * began (prefill dequeued the request): its deadline becomes deadline_ns
 * and a timeout from now on cuts the link as without the flag.  No effect
 * on an expectation that has ended.  DUET_ERR_NOT_FOUND for an unknown
 * id.  Not callback-safe. */
duet_status_t duet_xfer_recv_started(duet_xfer_rank_t *r, uint64_t transfer_id,
                                     int64_t deadline_ns);

/* ---- prefill side: sends ------------------------------------------------ */

enum {
    DUET_XFER_SEND_CRC = 1u << 0,    /* checksum the bytes; the receiver verifies */
    DUET_XFER_SEND_PACKED = 1u << 1, /* staging -> staging (see "Packed requests") */
};

typedef struct {
    uint64_t transfer_id;
    const duet_slice_plan_t *plan;  /* P = local tp, D = the peers' tp; read during the call */
    duet_xfer_peer_t *const *peers; /* [D] by decode engine rank; every rank of
                                       receivers(this rank) must be connected */
    const int32_t *src_pages;       /* [n_pages] this rank's pages (copied) */
    const int32_t *dst_pages;       /* [n_pages] the decode daemon's pages (copied) */
    int n_pages;
    unsigned flags;         /* DUET_XFER_SEND_* */
    int64_t deadline_ns;    /* posting, flushing and acknowledgements must finish by then */
    duet_xfer_done_cb_t cb; /* NULL: collect with duet_xfer_send_wait */
    void *arg;
    /* PACKED: the first staging unit on this rank (duet_xfer_pack_units of
     * the slots of its runs; a layer is packed there before
     * duet_xfer_send_layers releases it) and on the receivers (n_pages
     * units); each range inside its side's arena. */
    int32_t src_stage0, dst_stage0;
    /* PACKED, optional (0: none): once a chunk's puts to a receiver are
     * posted and it ends at least this many layers after the last one the
     * receiver was told of (and before the last layer), flush that
     * receiver's endpoint and send it a progress message naming the layers
     * landed, so it can unpack them early (duet_xfer_progress_cb_t).  A
     * receiver built before progress messages drops them (dropped_invalid):
     * the decode daemon asks for them in its Prefill call. */
    int progress_layers;
} duet_xfer_send_t;

/* Start sending a request from rank r.  A rank that sends nothing to
 * anyone (replication) still gets its outcome: DUET_OK, 0 bytes.
 * DUET_ERR_INVALID for a duplicate id, bad pages, bad staging units
 * (PACKED) or unconnected receivers; DUET_ERR_PEER when a receiver's
 * connection already failed.  Callback-safe. */
duet_status_t duet_xfer_send_begin(duet_xfer_rank_t *r, const duet_xfer_send_t *s);

/* duet_xfer_send_begin of in[i] on ranks[i] for i < n at once, as
 * duet_xfer_recv_expect_all: st[i] per rank (the ones that began need
 * their duet_xfer_send_end), the first failure returned.  Not
 * callback-safe. */
duet_status_t duet_xfer_send_begin_all(duet_xfer_rank_t *const *ranks, const duet_xfer_send_t *in,
                                       int n, duet_status_t *st);

/* Queue the puts of layers [l0, l1) (all heads of every receiver, K and V;
 * for a packed send their staging must be packed already: the puts read it
 * from now on).  Layers must be posted in order, each once: l0 is the first
 * layer not yet posted; otherwise the send fails with DUET_ERR_INVALID.
 * Returns at once; unknown (e.g. cancelled) ids are ignored.
 * Callback-safe. */
duet_status_t duet_xfer_send_layers(duet_xfer_rank_t *r, uint64_t transfer_id, int l0, int l1);

/* Finish: after all layers were posted, flush each receiver and send its
 * notification with `first_token`.  With status != DUET_OK the receivers get
 * a failure notification instead (once the puts already posted are flushed).
 * Returns at once.  Callback-safe. */
duet_status_t duet_xfer_send_end(duet_xfer_rank_t *r, uint64_t transfer_id, duet_status_t status,
                                 int64_t first_token);

/* begin + all layers + end. */
duet_status_t duet_xfer_send_post(duet_xfer_rank_t *r, const duet_xfer_send_t *s,
                                  int64_t first_token);

/* Like duet_xfer_recv_wait, for a send registered without a callback. */
duet_status_t duet_xfer_send_wait(duet_xfer_rank_t *r, uint64_t transfer_id, int64_t deadline_ns,
                                  duet_xfer_result_t *res_p);

/* Stop sending: no more puts are issued; receivers that were not yet
 * notified get a DUET_ERR_CANCELLED notification once the posted puts are
 * flushed; the state is released.  The callback does not run after this
 * returns.  DUET_ERR_NOT_FOUND for an unknown id.  Callback-safe. */
duet_status_t duet_xfer_send_cancel(duet_xfer_rank_t *r, uint64_t transfer_id);

/* ---- observation and diagnostics ---------------------------------------- */

/* Snapshot of the rank's counters.  Thread-safe, callback-safe. */
void duet_xfer_rank_stats(const duet_xfer_rank_t *r, duet_xfer_stats_t *stats_p);

/* Benchmarks: one put of `bytes` from pool offset src_off into the peer's
 * pool at dst_off, then a flush; returns when both completed.  Not
 * callback-safe. */
duet_status_t duet_xfer_debug_put(duet_xfer_peer_t *peer, size_t src_off, size_t dst_off,
                                  size_t bytes, int64_t deadline_ns);

/* Tests: corrupt what the rank's n-th put from now (0 = the next) delivers,
 * so the receiver's CRC check must fail.  n < 0 disables.  On the inline
 * path (host pool, no checksum hook) one byte of the put's source is
 * flipped after its checksum was taken (the rank's own pool keeps the
 * flip).  With a checksum hook or a device pool (the checksum is taken
 * after posting, so the source must stay intact), one more put follows the
 * real one on the same endpoint, after a transport fence: up to 64 bytes
 * of the source shifted by one byte, written over the middle of the
 * destination (a window of constant bytes would come out unchanged; KV
 * data is not constant).  A fault point (common/fault.h; DUET_FAULTS
 * xfer.corrupt_put=n arms every rank made after): DUET_ERR_UNSUPPORTED,
 * nothing armed, where fault injection is compiled out. */
duet_status_t duet_xfer_debug_corrupt_put(duet_xfer_rank_t *r, long n);

#endif
