/* Internals shared by common/rpc_*.c; not for use outside common/.
 *
 * Completion-queue tags: every pointer handed to gRPC as a tag points at a
 * duet__rpc_tag_t (first member of, or embedded in, the owning object), so a
 * CQ thread can tell request slots, call batches, client stream batches and
 * the server shutdown notification apart. */
#ifndef DUET_COMMON_RPC_INTERNAL_H
#define DUET_COMMON_RPC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "common/rpc.h"
#include "common/status.h"

#define DUET__RPC_MAX_THREADS 64
#define DUET__RPC_MAX_HOOKS   8

typedef enum {
    DUET__RPC_TAG_REQUEST,       /* a request slot got a call (or failed) */
    DUET__RPC_TAG_CALL_CLOSE,    /* server call: RECV_CLOSE_ON_SERVER done */
    DUET__RPC_TAG_CALL_SEND,     /* server call: a send batch done */
    DUET__RPC_TAG_CALL_RECV,     /* server call: its request message came */
    DUET__RPC_TAG_SHUTDOWN,      /* grpc_server_shutdown_and_notify done */
    DUET__RPC_TAG_STREAM_START,  /* client stream: send batch done */
    DUET__RPC_TAG_STREAM_MSG,    /* client stream: a RECV_MESSAGE done */
    DUET__RPC_TAG_STREAM_STATUS, /* client stream: RECV_STATUS_ON_CLIENT done */
} duet__rpc_tag_kind_t;

typedef struct {
    duet__rpc_tag_kind_t kind;
} duet__rpc_tag_t;

typedef struct {
    char *path;
    duet_rpc_kind_t kind;
    duet_rpc_handler_cb handler;
    void *arg;
    void *handle; /* from grpc_server_register_method */
} duet__rpc_method_t;

/* A server call.  refs: one for the application (dropped by the terminal
 * function), one while RECV_CLOSE_ON_SERVER is pending, one while a send batch
 * is in flight, one while the request message is awaited.  All mutable
 * fields are under lock. */
struct duet_rpc_call {
    duet__rpc_tag_t close_tag;
    duet__rpc_tag_t send_tag;
    duet__rpc_tag_t recv_tag;
    grpc_byte_buffer *recv_bb; /* RECV_MESSAGE output */
    duet_rpc_server_t *srv;
    const duet__rpc_method_t *method; /* NULL for an unregistered method */
    char *path;                       /* owned copy for unregistered methods */
    grpc_call *gcall;
    int64_t deadline_ns;
    grpc_metadata_array md;
    uint8_t *req; /* [req_len] */
    size_t req_len;

    atomic_int refs;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* writable, cancel callback finished */

    bool initial_md_sent;
    bool send_in_flight;
    bool finish_pending; /* status waits for the queue to drain */
    bool status_sent;
    bool app_done;        /* terminal function called */
    bool cancelled;       /* RECV_CLOSE said cancelled, or a send failed */
    bool closed;          /* RECV_CLOSE completed */
    bool cancel_notified; /* on_cancel ran or will never run */
    bool cancel_cb_running;
    pthread_t cancel_cb_thread;
    int close_cancelled; /* RECV_CLOSE_ON_SERVER output */

    grpc_byte_buffer *sending;
    bool kick_pending;                /* on the server's sender list (a reference) */
    struct duet_rpc_call *kick_next;
    grpc_byte_buffer **queue; /* ring [queue_cap] */
    size_t queue_cap, queue_head, queue_len;

    grpc_status_code finish_code;
    grpc_slice finish_details;
    bool has_details;

    duet_rpc_cancel_cb on_cancel;
    void *on_cancel_arg;

    /* set by the auth check (TLS on) */
    duet_rpc_role_t peer_role;
    char peer_name[DUET_RPC_ID_NAME_MAX];
    char deny_msg[224]; /* PERMISSION_DENIED message */
};

/* ---- rpc_util.c ---- */

/* Copy a received byte buffer into one duet_malloc'd block (NULL when
 * empty).  Does not destroy bb. */
duet_status_t duet__rpc_bb_flatten(grpc_byte_buffer *bb, uint8_t **data_p, size_t *len_p);
/* A byte buffer holding a copy of data; NULL on allocation failure. */
grpc_byte_buffer *duet__rpc_bb_from(const void *data, size_t len);
int64_t duet__rpc_deadline_from_gpr(gpr_timespec t);
gpr_timespec duet__rpc_deadline_to_gpr(int64_t deadline_ns);
/* An integer channel argument (key is not copied: a GRPC_ARG_* constant). */
grpc_arg duet__rpc_int_arg(const char *key, int value);
/* Mark the calling thread as a CQ thread of `owner` (NULL to clear) and ask
 * whether it is one: blocking waits are refused there. */
void duet__rpc_cq_thread_set(const void *owner);
bool duet__rpc_on_cq_thread(void);
/* grpc_init() once per live server/client; grpc_shutdown() on release. */
void duet__rpc_grpc_acquire(void);
void duet__rpc_grpc_release(void);

/* ---- rpc_call.c (server call state machine) ---- */

/* New call with one application reference and RECV_CLOSE_ON_SERVER posted.
 * Takes ownership of gcall and of md's contents (md is reset); the request
 * message comes later (duet__rpc_call_recv).  On failure gcall is cancelled and unreffed.  The
 * caller has counted the call with duet__rpc_server_call_added(); the count
 * drops when the call is freed, or at once on failure. */
duet_status_t duet__rpc_call_create(duet_rpc_server_t *srv, const duet__rpc_method_t *method,
                                    const char *path, grpc_call *gcall, gpr_timespec deadline,
                                    grpc_metadata_array *md, duet_rpc_call_t **call_p);
/* CQ thread: a call's batch completed. */
void duet__rpc_call_on_close(duet_rpc_call_t *call);
/* Ask for the request message (after the call passed its checks: nothing
 * of the message is read before).  On error the call has been failed. */
duet_status_t duet__rpc_call_recv(duet_rpc_call_t *call);
/* RECV_MESSAGE done: true when call->req holds the message and the handler
 * may run; false when the call has been failed (no message, cancelled, no
 * memory).  Drops the receive's reference either way, after which the
 * application's keeps the call. */
bool duet__rpc_call_on_recv(duet_rpc_call_t *call, bool success);
void duet__rpc_call_on_send(duet_rpc_call_t *call, bool success);

/* ---- rpc_auth.c ---- */

/* Credentials for auth (insecure ones when auth is NULL or has no TLS). */
grpc_server_credentials *duet__rpc_auth_server_creds(const duet_rpc_auth_t *auth);
grpc_channel_credentials *duet__rpc_auth_channel_creds(const duet_rpc_auth_t *auth);
/* The TLS target name override, NULL for none. */
const char *duet__rpc_auth_server_name(const duet_rpc_auth_t *auth);
/* The secret to send (false: none). */
bool duet__rpc_auth_secret(const duet_rpc_auth_t *auth, const char **secret_p, size_t *len_p);
/* CQ thread, before anything else runs for the call: GRPC_STATUS_OK, or
 * UNAUTHENTICATED / PERMISSION_DENIED (the caller's role may not call the
 * method) with *msg_p (static or in the call) after logging the refusal.
 * Sets the call's peer identity. */
grpc_status_code duet__rpc_auth_check(duet_rpc_auth_t *auth, duet_rpc_call_t *call,
                                      const char **msg_p);

/* ---- rpc_server.c ---- */
void duet__rpc_server_call_added(duet_rpc_server_t *srv);
void duet__rpc_server_call_removed(duet_rpc_server_t *srv);
size_t duet__rpc_server_queue_limit(const duet_rpc_server_t *srv);
bool duet__rpc_server_defers(const duet_rpc_server_t *srv);
/* Hand call (a reference the sender drops) to the sender thread, which
 * calls duet__rpc_call_kicked. */
void duet__rpc_server_kick(duet_rpc_server_t *srv, duet_rpc_call_t *call);
/* ---- rpc_call.c, for the sender thread ---- */
void duet__rpc_call_kicked(duet_rpc_call_t *call);

#endif
