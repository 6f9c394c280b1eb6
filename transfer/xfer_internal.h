/* Internals of the transfer engine shared by transfer/xfer_*.c.
 *
 * Layers (each file calls only the ones below it; none calls up):
 *   xfer_api.c       public entry points that post commands
 *   xfer_core.c      context, ranks, capabilities
 *   xfer_progress.c  the progress thread: command queue, loop, delivery
 *   xfer_send*.c     prefill: planning puts per receiver, flush, notify, acks
 *                    (post, course, notify, state: xfer_send_state.h)
 *   xfer_recv.c      decode: expectations, notifications, acknowledgements
 *   xfer_peer.c      connections to remote ranks and their failures
 *   xfer_outcome.c   completing commands and outcomes (rank bookkeeping)
 *   transport.h      the network, through an ops table (transport_ucx.c)
 * beside the pure helpers xfer_wire, xfer_segs, xfer_map, xfer_crc32c and
 * slice_plan, and xfer_pool.c (the KV pool and descriptors).
 *
 * Ownership: everything below the "progress thread" line of a rank belongs to
 * that rank's progress thread and is touched by no other thread.  Other
 * threads talk to it through commands (duet__cmd_t) queued under r->mu; a
 * synchronous command lives on the caller's stack and the caller sleeps on
 * r->cond until the thread marks it done.  When the caller *is* the progress
 * thread (a completion callback calling back in), the command runs inline;
 * commands that wait on the network (connect, disconnect, wait, put) are
 * refused there. */
#ifndef DUET_TRANSFER_XFER_INTERNAL_H
#define DUET_TRANSFER_XFER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/fault.h"
#include "transfer/transport.h"
#include "transfer/xfer.h"
#include "transfer/xfer_map.h"
#include "transfer/xfer_segs.h"
#include "transfer/xfer_wire.h"

#define DUET__PUT_BUDGET   512        /* puts issued per loop turn, so messages keep flowing */
#define DUET__PUT_BYTES    (8u << 20) /* ... and bytes */
#define DUET__PUT_INFLIGHT 4096       /* outstanding put requests per rank (tcp) */
#define DUET__TOMB_CAP     4096       /* ended request ids remembered per rank */
#define DUET__CLOSE_MS     5000       /* give up waiting for endpoint closes */

/* Counters: X(name) for every field of duet_xfer_stats_t. */
/* clang-format off */
#define DUET__STATS(X)                                                                             \
    X(puts) X(put_bytes)                                                                           \
    X(notify_sent) X(notify_received) X(ack_sent) X(ack_received)                                  \
    X(recv_done) X(recv_failed) X(send_done) X(send_failed)                                        \
    X(early_buffered) X(dropped_late) X(dropped_unknown) X(dropped_duplicate) X(dropped_invalid)   \
    X(acks_dropped) X(crc_failures) X(peer_failures) X(timeouts) X(active_recv) X(active_send)  \
    X(progress_sent) X(progress_received) X(unsolicited)
/* clang-format on */

typedef struct {
#define DUET__STAT_FIELD(name) _Atomic uint64_t name;
    DUET__STATS(DUET__STAT_FIELD)
#undef DUET__STAT_FIELD
} duet__stats_t;

#define DUET__STAT_ADD(r, name, v)                                                                 \
    atomic_fetch_add_explicit(&(r)->stats.name, (v), memory_order_relaxed)
#define DUET__STAT_SUB(r, name, v)                                                                 \
    atomic_fetch_sub_explicit(&(r)->stats.name, (v), memory_order_relaxed)

typedef struct duet__cmd duet__cmd_t;
typedef struct duet__send duet__send_t;
typedef struct duet__expect duet__expect_t;
typedef struct duet__put_op duet__put_op_t;

enum {
    DUET__CMD_CONNECT,
    DUET__CMD_DISCONNECT,
    DUET__CMD_EXPECT,
    DUET__CMD_SEND_BEGIN,
    DUET__CMD_SEND_LAYERS,
    DUET__CMD_SEND_END,
    DUET__CMD_WAIT,
    DUET__CMD_UNWAIT,
    DUET__CMD_CANCEL,
    DUET__CMD_PUT,
    DUET__CMD_RUN,
    DUET__CMD_STOP,
};

enum { DUET__SIDE_RECV = 0, DUET__SIDE_SEND = 1 };

/* A rank's pool: none yet, allocated by the transport, registered host
 * memory, registered CUDA device memory (duet_xfer_pool_kind's names). */
enum { DUET__POOL_NONE, DUET__POOL_ALLOC, DUET__POOL_REGISTERED, DUET__POOL_DEVICE };

struct duet__cmd {
    duet__cmd_t *next;
    int kind;
    int heap; /* asynchronous: the thread frees it */
    int done; /* synchronous: set under r->mu */
    duet_status_t status;
    char msg[DUET_XFER_DETAIL_MAX];
    union {
        struct {
            const duet__desc_t *desc; /* points into the caller's blob */
            int64_t deadline_ns;
            duet_xfer_peer_t *peer; /* result */
        } connect;
        duet_xfer_peer_t *peer; /* disconnect */
        duet__expect_t *expect;
        duet__send_t *send;
        struct {
            uint64_t transfer_id;
            int l0, l1;
        } layers;
        struct {
            uint64_t transfer_id;
            duet_status_t status;
            int64_t first_token;
        } end;
        struct {
            int side;
            uint64_t transfer_id;
            duet_xfer_result_t *res;
        } wait;
        duet__cmd_t *unwait; /* the wait command to detach */
        struct {
            int side;
            uint64_t transfer_id;
        } cancel;
        struct {
            duet_xfer_peer_t *peer;
            size_t src_off, dst_off, len;
            int64_t deadline_ns;
        } put;
        struct {
            duet_status_t (*fn)(void *arg);
            void *arg;
        } run;
    } u;
};

/* The outcome half of a send or an expectation (first member of both). */
typedef struct duet__outcome duet__outcome_t;
struct duet__outcome {
    uint64_t transfer_id;
    int side; /* DUET__SIDE_* */
    duet_xfer_done_cb_t cb;
    void *arg;
    duet__cmd_t *waiter; /* a duet__CMD_WAIT sleeping on it */
    int terminal;        /* res is final */
    int in_callback;
    int cancelled; /* cancelled from inside its own callback */
    int64_t deadline_ns;
    duet_xfer_result_t res;
    duet__outcome_t *due_prev, *due_next; /* r->due list: final, not yet delivered */
    int is_due;
};

struct duet_xfer_peer {
    duet_xfer_rank_t *r;
    duet_xfer_peer_t *next, *prev; /* r->peers */
    duet_xfer_desc_info_t info;    /* the remote rank */
    uint64_t remote_base;
    duet_xfer_ep_t *data_ep; /* puts (prefill side); no failure detection, so shared memory
                                stays one-sided */
    duet_xfer_rkey_t *rkey;
    duet_xfer_ep_t *ctl_ep; /* notifications/acks; failure detection when a transport has it */
    int ctl_shared;         /* ctl_ep == data_ep */
    int ctl_peer_mode;      /* ctl_ep detects peer failure */
    int one_sided;          /* puts go over shared memory into the mapped remote pool */
    int ready;              /* wired up */
    duet_status_t failed;
    char why[128];
    int error_reported;
    int closing;       /* disconnect started: no new work */
    int user_released; /* the handle is no longer the user's */
    int ops;           /* transport operations in flight that point at this peer */
    int close_stage;
    int64_t close_deadline_ns;
    duet__cmd_t *cmd; /* connect or disconnect waiting on it */
    int64_t connect_deadline_ns;
};

typedef struct {
    duet__msg_t msg;
    int64_t arrived_ns;
} duet__early_t;

struct duet_xfer_rank {
    duet_xfer_t *x;
    int index;
    duet_xfer_desc_info_t info;           /* this rank as peers see it */
    const duet_xfer_transport_ops_t *ops; /* = x->ops */
    duet_xfer_worker_t *worker;

    /* pool: set before any transfer, read-only afterwards */
    int pool_kind; /* DUET__POOL_* */
    duet_xfer_mem_t *mem;
    unsigned char *base;
    size_t bytes;
    const void *rkey_buf;
    size_t rkey_len;
    duet_xfer_checksum_fn crc_fn; /* duet_xfer_rank_set_checksum; NULL: the CPU reads the pool */
    void *crc_ctx;

    pthread_t thread;
    int thread_started;
    int evfd;       /* eventfd: commands queued */
    int arm_device; /* DUET_XFER_ARM_DEVICE=1: sleep (arm) with device puts in flight (A/B) */
    int epfd;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    duet__cmd_t *cmd_head, *cmd_tail; /* under mu */
    int closed;                       /* under mu: STOP queued, no more commands */

    duet__stats_t stats;
    duet_fault_count_t corrupt; /* fault xfer.corrupt_put; duet_xfer_debug_corrupt_put */

    /* ---- progress thread ---- */
    duet_xfer_peer_t *peers;
    duet__map_t sends;       /* req id -> duet__send_t, while the outcome is the user's */
    duet__send_t *send_list; /* every send state until freed */
    duet__send_t *posting;   /* sends with puts to issue */
    duet__map_t expects;     /* req id -> duet__expect_t */
    duet__map_t tombs;       /* ended req id -> (void *)(1 - status) */
    uint64_t *tomb_ring;
    size_t tomb_pos;
    duet__early_t *early;
    int n_early, early_head; /* ring of x->early_max */
    duet__msg_t *inbox;
    int n_inbox, cap_inbox;
    duet__outcome_t *due_head, *due_tail; /* outcomes to deliver */
    duet__put_op_t *put_ops;              /* duet_xfer_debug_put calls in flight */
    long put_reqs;                        /* puts in flight */
    int64_t next_deadline_ns;
    int stopping;
    duet__cmd_t *stop_cmd;
    int64_t stop_deadline_ns;
};

struct duet_xfer {
    duet_xfer_config_t cfg;
    char *tls;
    const duet_xfer_transport_ops_t *ops;
    duet_xfer_transport_t *transport;
    uint64_t instance;
    uint64_t host_id;
    atomic_int no_peer_mode; /* no transport with peer-failure detection */
    int n_ranks;
    duet_xfer_rank_t **ranks;
};

/* xfer_progress.c: the command queue and the progress thread */
duet_status_t duet__call(duet_xfer_rank_t *r, duet__cmd_t *c, int callback_safe);
duet_status_t duet__post_async(duet_xfer_rank_t *r, duet__cmd_t *c);
void duet__call_all(duet_xfer_rank_t *const *ranks, duet__cmd_t *cmds, const bool *skip, int n,
                    duet_status_t *st);
/* A finished command's status as duet_error (its message, else the
 * status's name). */
duet_status_t duet__cmd_result(const duet__cmd_t *c);
duet_status_t duet__wait(duet_xfer_rank_t *r, int side, uint64_t id, int64_t deadline_ns,
                         duet_xfer_result_t *res_p);
duet_status_t duet__cancel(duet_xfer_rank_t *r, int side, uint64_t id);
void duet__rank_on_msg(void *arg, const void *msg, size_t len);
void *duet__rank_main(void *arg);

/* xfer_send*.c (xfer_send_state.h) */
duet_status_t duet__send_prepare(duet_xfer_rank_t *r, const duet_xfer_send_t *in,
                                 duet__send_t **s_p);
void duet__send_free(duet__send_t *s);
void duet__send_exec_begin(duet_xfer_rank_t *r, duet__cmd_t *c);
void duet__send_exec_layers(duet_xfer_rank_t *r, duet__cmd_t *c);
void duet__send_exec_end(duet_xfer_rank_t *r, duet__cmd_t *c);
duet_status_t duet__send_cancel(duet_xfer_rank_t *r, uint64_t id, char *msg, size_t cap);
int duet__send_post_some(duet_xfer_rank_t *r);
void duet__send_on_ack(duet_xfer_rank_t *r, const duet__msg_t *m);
void duet__send_peer_gone(duet_xfer_rank_t *r, duet_xfer_peer_t *p);
void duet__send_scan(duet_xfer_rank_t *r, int64_t now, int64_t *next_p);
void duet__send_fail_all(duet_xfer_rank_t *r, duet_status_t st, const char *why);
duet__outcome_t *duet__send_outcome(duet_xfer_rank_t *r, uint64_t id);
void duet__send_release(duet_xfer_rank_t *r, duet__outcome_t *o);
int duet__sends_idle(const duet_xfer_rank_t *r);

/* xfer_recv.c */
duet_status_t duet__recv_prepare(duet_xfer_rank_t *r, const duet_xfer_expect_t *in,
                                 duet__expect_t **e_p);
void duet__recv_free(duet__expect_t *e);
void duet__recv_exec_expect(duet_xfer_rank_t *r, duet__cmd_t *c);
duet_status_t duet__recv_cancel(duet_xfer_rank_t *r, uint64_t id, char *msg, size_t cap);
void duet__recv_on_notify(duet_xfer_rank_t *r, const duet__msg_t *m);
void duet__recv_on_progress(duet_xfer_rank_t *r, const duet__msg_t *m);
void duet__recv_peer_gone(duet_xfer_rank_t *r, duet_xfer_peer_t *p, int disconnect);
void duet__recv_scan(duet_xfer_rank_t *r, int64_t now, int64_t *next_p);
void duet__recv_fail_all(duet_xfer_rank_t *r, duet_status_t st, const char *why);
duet__outcome_t *duet__recv_outcome(duet_xfer_rank_t *r, uint64_t id);
void duet__recv_release(duet_xfer_rank_t *r, duet__outcome_t *o);
void duet__recv_cleanup(duet_xfer_rank_t *r);

/* xfer_peer.c.  A peer never calls up: whoever closes a peer or learns of
 * its failure (xfer_progress.c) tells the sends and expectations using it. */
void duet__peer_exec_connect(duet_xfer_rank_t *r, duet__cmd_t *c);
int duet__peer_exec_disconnect(duet_xfer_rank_t *r, duet__cmd_t *c);
void duet__peer_exec_put(duet_xfer_rank_t *r, duet__cmd_t *c);
int duet__peer_known(const duet_xfer_rank_t *r, const duet_xfer_peer_t *p);
duet_xfer_peer_t *duet__peer_find(duet_xfer_rank_t *r, uint64_t instance, int rank);
void duet__peer_close_start(duet_xfer_rank_t *r, duet_xfer_peer_t *p);
/* Cut the link to p at once (force-close its endpoints, so that nothing it
 * still sends lands here) and fail it; 0 when its endpoints cannot be
 * forced (no failure detection: only deadlines cover it). */
int duet__peer_reset(duet_xfer_rank_t *r, duet_xfer_peer_t *p, const char *why);
void duet__peer_scan(duet_xfer_rank_t *r, int64_t now);
duet_xfer_peer_t *duet__peer_next_failure(duet_xfer_rank_t *r);
int duet__peers_idle(const duet_xfer_rank_t *r);
void duet__peer_drop_rkeys(duet_xfer_rank_t *r);
void duet__peer_reap_all(duet_xfer_rank_t *r);

/* xfer_checksum.c: a slice's checksum through the rank's hook.  The byte
 * ranges of one (prefill rank, decode rank) pair on this rank's side, in
 * checksum order: per page (transfer/xfer_segs.h) over pages[0..n_pages),
 * or packed (pages NULL; transfer/xfer_pack.h) over the staging at unit
 * stage0; dst != 0 reads the runs' dst_head (receiver: per page, and the
 * packed block at slot dst_head), else src_head (sender: per page) and the
 * packed blocks from slot slot0 on. */
duet_status_t duet__crc_hook(duet_xfer_rank_t *r, const duet_slice_run_t *runs, int n_runs,
                             const int32_t *pages, int n_pages, int32_t stage0, int dst, int slot0,
                             uint32_t *crc_p);
/* The same ranges into out (room for 2 L n_runs entries, times n_pages
 * per page); touching ranges merged.  Returns the count. */
int duet__crc_ranges(const duet_kv_layout_t *l, const duet_slice_run_t *runs, int n_runs,
                     const int32_t *pages, int n_pages, int32_t stage0, int dst, int slot0,
                     duet_crc32c_range_t *out);

/* duet_xfer_debug_corrupt_put where the source must stay intact (hook or
 * device pool): after a fence, up to 64 bytes of src (the source of the
 * put `seg` just issued to peer) shifted by one byte, put over the middle
 * of that put's destination.  Returns like ops->put (DONE when skipped). */
duet_xfer_op_t duet__corrupt_put(duet_xfer_rank_t *r, duet_xfer_peer_t *peer,
                                 const unsigned char *src, const duet__seg_t *seg,
                                 duet_xfer_op_cb_t cb, void *arg);

/* xfer_outcome.c */
void duet__cmd_done(duet_xfer_rank_t *r, duet__cmd_t *c, duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void duet__due(duet_xfer_rank_t *r, duet__outcome_t *o);
void duet__undue(duet_xfer_rank_t *r, duet__outcome_t *o);
void duet__deadline_hint(duet_xfer_rank_t *r, int64_t deadline_ns);
void duet__outcome_fail(duet__outcome_t *o, duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
