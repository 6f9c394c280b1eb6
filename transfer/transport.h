/* The transport under the transfer engine: the one-sided puts, the small
 * messages (notifications and acknowledgements) and the progress machinery,
 * behind an ops table.  UCX (transfer/transport_ucx.c) is the implementation;
 * it is the only file that speaks UCX.  The rest of transfer/ plans puts,
 * tracks requests and reads notifications, and reaches the network only
 * through these operations.
 *
 * Objects (all opaque)
 *   duet_xfer_transport_t  one per duet_xfer_t: the transport's context.
 *   duet_xfer_worker_t     one per rank: the progress engine that owns the
 *                          rank's endpoints and requests.
 *   duet_xfer_mem_t        a registered (or transport-allocated) memory
 *                          region: the rank's KV pool.
 *   duet_xfer_ep_t         an endpoint from a worker to a remote worker.
 *   duet_xfer_rkey_t       a remote region's key, unpacked on an endpoint.
 *
 * Threads: the capability queries, mem_map and mem_unmap are thread-safe;
 * create and destroy belong to one owner.  A worker, its endpoints and
 * rkeys are used by one thread at a time: the rank's progress thread once it
 * runs.  Callbacks run on that thread, from inside ops->progress.
 *
 * Asynchronous operations (put, flush, msg_send, ep_close) end in one of
 * three ways, returned as duet_xfer_op_t:
 *   DUET_XFER_OP_DONE     completed at once; cb will not run;
 *   DUET_XFER_OP_PENDING  in flight; cb runs exactly once, later (unless
 *                         the worker is destroyed first);
 *   DUET_XFER_OP_FAILED   failed at once (*why_p says why); cb will not run.
 * A completion reports DUET_OK, DUET_ERR_CANCELLED (the endpoint was closed
 * under it) or DUET_ERR_PEER, with the transport's reason as static text. */
#ifndef DUET_TRANSFER_TRANSPORT_H
#define DUET_TRANSFER_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct duet_xfer_transport duet_xfer_transport_t;
typedef struct duet_xfer_worker duet_xfer_worker_t;
typedef struct duet_xfer_mem duet_xfer_mem_t;
typedef struct duet_xfer_ep duet_xfer_ep_t;
typedef struct duet_xfer_rkey duet_xfer_rkey_t;

typedef enum {
    DUET_XFER_OP_FAILED = -1,
    DUET_XFER_OP_DONE = 0,
    DUET_XFER_OP_PENDING = 1,
} duet_xfer_op_t;

/* An asynchronous operation completed (see above).  `why` is static text. */
typedef void (*duet_xfer_op_cb_t)(void *arg, duet_status_t st, const char *why);

/* A message arrived on the worker (msg is valid during the call only).  A
 * message the transport cannot hand over whole arrives as (NULL, 0). */
typedef void (*duet_xfer_msg_cb_t)(void *arg, const void *msg, size_t len);

/* The remote side of an endpoint with failure detection failed.  Called
 * from progress; record it and act later (no transport calls on that
 * endpoint from here). */
typedef void (*duet_xfer_ep_error_cb_t)(void *arg, const char *why);

/* mem_map flags */
#define DUET_XFER_MEM_ALLOCATE 0x1u /* the transport allocates the region (base ignored) */
#define DUET_XFER_MEM_DEVICE   0x2u /* the region is CUDA device memory */

typedef struct {
    void *base;       /* the region's address (the allocation with ALLOCATE) */
    const void *rkey; /* packed key for peers; owned by the region */
    size_t rkey_len;
} duet_xfer_mem_info_t;

typedef struct duet_xfer_transport_ops {
    /* ---- context ---- */

    /* `tls` selects the transports (UCX_TLS; NULL: environment/default). */
    duet_status_t (*create)(const char *tls, duet_xfer_transport_t **t_p);
    void (*destroy)(duet_xfer_transport_t *t); /* accepts NULL */
    /* Whether any selected transport can report a dead peer to an endpoint
     * that asks for failure detection. */
    bool (*detects_peer_failure)(const duet_xfer_transport_t *t);
    /* Whether CUDA device memory can be registered and moved at all. */
    bool (*supports_cuda_memory)(const duet_xfer_transport_t *t);
    /* Whether puts from and into device memory work; *why_p either way. */
    bool (*device_puts)(const duet_xfer_transport_t *t, const char **why_p);
    /* The library's version as major * 100 + minor. */
    int (*version)(void);

    /* ---- memory ---- */

    /* Register bytes at base (or allocate them: DUET_XFER_MEM_ALLOCATE) for
     * puts from and into it; *info_p describes the region.  Errors carry a
     * message (duet_error). */
    duet_status_t (*mem_map)(duet_xfer_transport_t *t, void *base, size_t bytes, unsigned flags,
                             duet_xfer_mem_t **mem_p, duet_xfer_mem_info_t *info_p);
    /* Unregister (free, when allocated) the region.  Accepts NULL. */
    void (*mem_unmap)(duet_xfer_transport_t *t, duet_xfer_mem_t *mem);

    /* ---- worker ---- */

    /* A worker for one thread; on_msg(arg, ...) receives the messages that
     * msg_send delivers to it. */
    duet_status_t (*worker_create)(duet_xfer_transport_t *t, duet_xfer_msg_cb_t on_msg, void *arg,
                                   duet_xfer_worker_t **w_p);
    /* Destroys the worker with whatever endpoints are still open on it. */
    void (*worker_destroy)(duet_xfer_worker_t *w); /* accepts NULL */
    /* The worker's address, for a peer's ep_create (valid while it lives). */
    void (*worker_address)(const duet_xfer_worker_t *w, const void **addr_p, size_t *len_p);
    /* A file descriptor that becomes readable when the armed worker has
     * events. */
    int (*event_fd)(const duet_xfer_worker_t *w);
    /* Make progress: completions, messages and errors run their callbacks
     * here.  Nonzero when something happened. */
    unsigned (*progress)(duet_xfer_worker_t *w);
    /* Before sleeping on event_fd: 1 armed (sleep), 0 events are pending
     * (progress again first), -1 could not arm (sleep briefly). */
    int (*arm)(duet_xfer_worker_t *w);
    /* Operations of this worker still in flight. */
    long (*inflight)(const duet_xfer_worker_t *w);

    /* ---- endpoints ---- */

    /* Connect to the worker at addr.  With on_error set the endpoint detects
     * peer failure (the error callback fires when the remote dies); with
     * NULL it does not, and puts over shared memory stay one-sided.
     * DUET_ERR_PEER with *why_p when the peer is unreachable. */
    duet_status_t (*ep_create)(duet_xfer_worker_t *w, const void *addr, size_t addr_len,
                               duet_xfer_ep_error_cb_t on_error, void *arg, duet_xfer_ep_t **ep_p,
                               const char **why_p);
    /* Close; `force` (endpoints with failure detection only) drops what is
     * still queued.  The handle is invalid after the call; its error
     * callback may still run until the close completed (PENDING), never
     * after. */
    duet_xfer_op_t (*ep_close)(duet_xfer_ep_t *ep, bool force, duet_xfer_op_cb_t cb, void *arg,
                               const char **why_p);
    /* Complete every put issued on ep so far: remotely visible, or (puts
     * routed as messages where no lane does RMA: transport_ucx.c) ordered
     * before every later message on ep. */
    duet_xfer_op_t (*flush)(duet_xfer_ep_t *ep, duet_xfer_op_cb_t cb, void *arg,
                            const char **why_p);
    /* Unpack a peer's packed key for use on ep.  The transport may write
     * into blob (UCX 1.13's cuda_ipc does): pass a private copy. */
    duet_status_t (*rkey_unpack)(duet_xfer_ep_t *ep, const void *blob, size_t len,
                                 duet_xfer_rkey_t **rkey_p, const char **why_p);
    /* Destroy before the endpoint it was unpacked on is closed. */
    void (*rkey_destroy)(duet_xfer_rkey_t *rkey); /* accepts NULL */
    /* Whether the remote region is mapped into this process (shared
     * memory on one host), so puts into it need nothing from the remote. */
    bool (*rkey_mapped)(duet_xfer_rkey_t *rkey, uint64_t remote_addr);
    /* Write len bytes at src (inside mem) to remote_addr.  src must stay
     * unchanged until the put completed.  remote_addr must lie in a region
     * the remote transport mapped (a routed put elsewhere is dropped). */
    duet_xfer_op_t (*put)(duet_xfer_ep_t *ep, const duet_xfer_mem_t *mem, const void *src,
                          size_t len, uint64_t remote_addr, duet_xfer_rkey_t *rkey,
                          duet_xfer_op_cb_t cb, void *arg, const char **why_p);
    /* Puts the worker issues after this call land after those it issued
     * before (the debug corruption's ordering: duet_xfer_debug_corrupt_put). */
    duet_status_t (*fence)(duet_xfer_worker_t *w);
    /* Send a small message to the remote worker's on_msg.  msg must stay
     * valid until the send completed. */
    duet_xfer_op_t (*msg_send)(duet_xfer_ep_t *ep, const void *msg, size_t len,
                               duet_xfer_op_cb_t cb, void *arg, const char **why_p);
} duet_xfer_transport_ops_t;

/* The UCX implementation (transfer/transport_ucx.c). */
extern const duet_xfer_transport_ops_t duet_xfer_transport_ucx;

#endif
