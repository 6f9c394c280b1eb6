/* The gRPC layer every duet daemon shares: a server over the gRPC C core
 * completion-queue API, a client with a channel cache, status mapping and the
 * standard grpc.health.v1 service.  Messages are opaque bytes here; callers
 * pack and unpack them with protobuf-c.
 *
 * Server lifecycle
 *   duet_rpc_server_create()            binds the port (known at once)
 *   duet_rpc_server_add_method() ...    before start
 *   duet_rpc_server_start()             starts n_threads completion-queue threads
 *   duet_rpc_server_shutdown()          stop accepting, grace, cancel the rest
 *   duet_rpc_server_destroy()
 *
 * Server threading: each method handler and each on_cancel callback runs on a
 * completion-queue (CQ) thread of the server and must not block for long.
 * Every duet_rpc_call_* function may be called from any thread.
 *
 * Call ownership: a handler receives a call handle that it owns until it
 * calls exactly one terminal function — duet_rpc_call_reply, _fail,
 * _fail_status or _finish — at once or later, from any thread.  The terminal
 * function always releases the handle, even when it returns an error (for
 * instance DUET_ERR_CANCELLED because the client went away); the handle must
 * not be used afterwards.  The request bytes stay valid until then.
 *
 * Cancellation: when the client cancels, the deadline passes, the connection
 * drops or the server shuts down (after its grace period), the on_cancel
 * callback registered on the call runs exactly once on a CQ thread, provided
 * the application has not yet called its terminal function.  The application
 * must still call one terminal function afterwards (it returns
 * DUET_ERR_CANCELLED).  When a terminal function returns, on_cancel is
 * guaranteed not to be running any more and never to run later, so the
 * application may free what the callback's arg points to.  The price: a
 * terminal function called while on_cancel runs on another thread waits for
 * it, so on_cancel must be short and must never wait for a lock that the
 * application may hold while calling a terminal function of the same call —
 * set an atomic flag, post a semaphore, write an eventfd, or queue work.
 * (Calling a terminal function from inside on_cancel is fine.)  Writes after
 * the cancellation return DUET_ERR_CANCELLED.
 *
 * Client threading: blocking calls run on the caller's thread; stream
 * callbacks run on the client's CQ threads.  All functions are thread-safe. */
#ifndef DUET_COMMON_RPC_H
#define DUET_COMMON_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

#include "common/status.h"

/* ---- status mapping -------------------------------------------------------
 * duet -> gRPC: INVALID->INVALID_ARGUMENT, NOT_FOUND->NOT_FOUND,
 * EXHAUSTED->RESOURCE_EXHAUSTED, TIMEOUT->DEADLINE_EXCEEDED,
 * CANCELLED->CANCELLED, UNSUPPORTED->UNIMPLEMENTED, PEER and SHUTDOWN ->
 * UNAVAILABLE, CONFIG and MISMATCH->FAILED_PRECONDITION, TOO_LONG ->
 * OUT_OF_RANGE, everything else->INTERNAL.
 * gRPC -> duet is the inverse where one exists (UNAVAILABLE->PEER,
 * FAILED_PRECONDITION->MISMATCH, OUT_OF_RANGE->TOO_LONG); ABORTED,
 * UNAUTHENTICATED and PERMISSION_DENIED -> PEER; ALREADY_EXISTS -> INVALID;
 * UNKNOWN, INTERNAL, DATA_LOSS and unknown codes -> INTERNAL. */
grpc_status_code duet_rpc_status_to_grpc(duet_status_t st);
duet_status_t duet_rpc_status_from_grpc(grpc_status_code code);
/* "UNAVAILABLE", "DEADLINE_EXCEEDED", ...; never NULL. */
const char *duet_rpc_code_name(grpc_status_code code);

/* ---- server ------------------------------------------------------------- */

typedef struct duet_rpc_server duet_rpc_server_t;
typedef struct duet_rpc_call duet_rpc_call_t;
/* Authentication material (common/rpc_auth.h); NULL = none. */
typedef struct duet_rpc_auth duet_rpc_auth_t;

typedef enum {
    DUET_RPC_UNARY = 0,            /* one request, one reply */
    DUET_RPC_SERVER_STREAMING = 1, /* one request, any number of replies */
} duet_rpc_kind_t;

/* A method handler.  req (req_len bytes, NULL when empty) is owned by the call
 * and valid until the terminal function.  Runs on a CQ thread. */
typedef void (*duet_rpc_handler_cb)(duet_rpc_call_t *call, const uint8_t *req, size_t req_len,
                                    void *arg);
/* The client cancelled, the deadline passed, or the server is shutting down. */
typedef void (*duet_rpc_cancel_cb)(duet_rpc_call_t *call, void *arg);
/* Optional per-server admission check, run on a CQ thread before every
 * handler (e.g. an API key in the metadata, read with duet_rpc_call_metadata).
 * Return GRPC_STATUS_OK to admit; otherwise the call fails with that code and
 * *msg_p (a static or call-lifetime string, may stay NULL).  It also sees
 * /grpc.health.v1.Health/ calls: admit those, probes carry no key. */
typedef grpc_status_code (*duet_rpc_check_cb)(duet_rpc_call_t *call, void *arg, const char **msg_p);
/* Runs on the thread calling duet_rpc_server_shutdown, before the grace
 * period: the place to end long-lived streams (health Watch does). */
typedef void (*duet_rpc_shutdown_cb)(duet_rpc_server_t *srv, void *arg);

typedef struct {
    const char *bind_addr;     /* "0.0.0.0:50051"; port 0 picks a free one */
    int n_threads;             /* completion-queue threads, 1..64 */
    size_t max_message_bytes;  /* per message, both directions; bigger requests
                                  fail with RESOURCE_EXHAUSTED (by gRPC) */
    size_t stream_queue_limit; /* queued writes per stream before
                                  duet_rpc_call_write says DUET_ERR_EXHAUSTED */
    int64_t shutdown_grace_ms; /* grace used by duet_rpc_server_destroy */
    duet_rpc_check_cb check;   /* optional */
    void *check_arg;
    duet_rpc_auth_t *auth; /* optional (rpc_auth.h): TLS credentials and a
                              check run before everything else, health
                              and unknown methods included; outlives
                              the server */
    /* connection limits (docs/security.md "Connection limits"; gRPC core
     * 1.51 has no cap on connections, per client or in total): */
    int handshake_timeout_ms;   /* TLS + HTTP/2 preface done within this */
    int max_connection_idle_ms; /* a connection without calls this long is
                                   closed (GOAWAY; clients reconnect) */
    int max_streams;            /* concurrent calls per connection */
    /* Streaming writes made on application threads are started by a
     * sender thread of the server, so the writer never waits on the
     * socket (the decode scheduler: its next step runs while the last
     * step's tokens go out).  Writes keep their order per call. */
    bool defer_sends;
} duet_rpc_server_config_t;

/* Defaults: "0.0.0.0:0", 2 threads, 4 MiB, 1024 queued writes, 5000 ms;
 * handshake 10 s, idle connections closed after 5 min, 4096 calls per
 * connection. */
void duet_rpc_server_config_init(duet_rpc_server_config_t *cfg);

/* Create a server and bind its port.  Fails with DUET_ERR_IO when the address
 * cannot be bound (in use, bad address), DUET_ERR_INVALID on a bad config. */
duet_status_t duet_rpc_server_create(const duet_rpc_server_config_t *cfg,
                                     duet_rpc_server_t **srv_p);

/* Register a method by full path ("/duet.v1.Decode/Generate") before start.
 * The path is copied; arg must outlive the server.  DUET_ERR_INVALID for a
 * bad path or a duplicate, DUET_ERR_SHUTDOWN after start. */
duet_status_t duet_rpc_server_add_method(duet_rpc_server_t *srv, const char *path,
                                         duet_rpc_kind_t kind, duet_rpc_handler_cb handler,
                                         void *arg);

/* Add a shutdown hook (at most 8), before start. */
duet_status_t duet_rpc_server_on_shutdown(duet_rpc_server_t *srv, duet_rpc_shutdown_cb cb,
                                          void *arg);

/* Start serving.  Unregistered methods are answered UNIMPLEMENTED. */
duet_status_t duet_rpc_server_start(duet_rpc_server_t *srv);

/* The bound TCP port (the real one when bind_addr asked for port 0). */
int duet_rpc_server_port(const duet_rpc_server_t *srv);

/* Calls whose handles are alive (handler not finished or still sending). */
size_t duet_rpc_server_active_calls(duet_rpc_server_t *srv);

/* Stop accepting calls, run the shutdown hooks, let in-flight calls finish for
 * up to grace_ms, then cancel the rest (their on_cancel callbacks fire) and
 * wait until every call handle has been released by its terminal function.
 * Blocking; call once, never from a handler or callback (DUET_ERR_INVALID).
 * Returns DUET_ERR_TIMEOUT when the grace period had to cancel calls. */
duet_status_t duet_rpc_server_shutdown(duet_rpc_server_t *srv, int64_t grace_ms);

/* Shut down (with the configured grace) if still running, join the threads
 * and free everything.  Accepts NULL. */
void duet_rpc_server_destroy(duet_rpc_server_t *srv);

/* ---- server call -------------------------------------------------------- */

/* The full method path, e.g. "/duet.v1.Decode/Generate". */
const char *duet_rpc_call_method(const duet_rpc_call_t *call);

/* Identities (docs/security.md "Identities and roles"): with TLS on, a
 * caller's identity is the one URI subject alternative name of its
 * certificate of the form spiffe://duet/<role>/<name>, <name> 1..63 bytes
 * of [A-Za-z0-9._-].  The server refuses a method the caller's role may not
 * call (PERMISSION_DENIED) before its handler runs (common/rpc_auth.c has
 * the table). */
typedef enum {
    DUET_RPC_ROLE_NONE = 0, /* TLS off, or the certificate names no identity */
    DUET_RPC_ROLE_ROUTER = 1,
    DUET_RPC_ROLE_PREFILL = 2,
    DUET_RPC_ROLE_DECODE = 3,
    DUET_RPC_ROLE_CLIENT = 4,
} duet_rpc_role_t;
#define DUET_RPC_ID_NAME_MAX 64 /* name bytes + NUL */

/* "router", "prefill", "decode", "client"; "" for NONE. */
const char *duet_rpc_role_name(duet_rpc_role_t role);

/* The caller's identity; DUET_RPC_ROLE_NONE (and name "") when TLS is off
 * or its certificate names none.  name is valid until the terminal
 * function. */
duet_rpc_role_t duet_rpc_call_identity(const duet_rpc_call_t *call, const char **name_p);

/* Kind of the method (unregistered methods never reach a handler). */
duet_rpc_kind_t duet_rpc_call_kind(const duet_rpc_call_t *call);

/* The client's deadline on the CLOCK_MONOTONIC scale of duet_now_ns(), or
 * INT64_MAX when the client set none. */
int64_t duet_rpc_call_deadline_ns(const duet_rpc_call_t *call);

/* Value of request metadata `key` (lowercase), not NUL-terminated; NULL when
 * absent.  Valid until the terminal function. */
const char *duet_rpc_call_metadata(const duet_rpc_call_t *call, const char *key, size_t *len_p);

/* Register the cancellation callback (replacing an earlier one).  Returns
 * DUET_ERR_CANCELLED, and never calls cb, when the call is already
 * cancelled. */
duet_status_t duet_rpc_call_on_cancel(duet_rpc_call_t *call, duet_rpc_cancel_cb cb, void *arg);

/* Server streaming: queue one message (copied).  At most one send is in
 * flight per stream; the rest wait in a queue of stream_queue_limit entries.
 * Returns DUET_ERR_EXHAUSTED when the queue is full (nothing queued: retry
 * after duet_rpc_call_wait_writable), DUET_ERR_CANCELLED after cancellation,
 * DUET_ERR_INVALID on a unary call or after finish. */
duet_status_t duet_rpc_call_write(duet_rpc_call_t *call, const void *data, size_t len);

/* Block until a write would be accepted, the call is cancelled
 * (DUET_ERR_CANCELLED) or deadline_ns passes (DUET_ERR_TIMEOUT).  Not from a
 * CQ thread (handlers, callbacks): DUET_ERR_INVALID. */
duet_status_t duet_rpc_call_wait_writable(duet_rpc_call_t *call, int64_t deadline_ns);

/* Terminal functions (see "Call ownership" above).
 * reply:  unary OK with one message (on a stream: a last message, then OK).
 * fail:   non-OK status with msg (may be NULL); `code` OK is treated as a
 *         handler bug and sent as INTERNAL.
 * finish: end a stream after its queued messages with code/msg.
 * Return DUET_OK when the reply was handed to gRPC, DUET_ERR_CANCELLED when
 * the call had been cancelled (nothing sent), DUET_ERR_NO_MEMORY when the
 * reply could not be copied (the client gets RESOURCE_EXHAUSTED). */
duet_status_t duet_rpc_call_reply(duet_rpc_call_t *call, const void *data, size_t len);
duet_status_t duet_rpc_call_fail(duet_rpc_call_t *call, grpc_status_code code, const char *msg);
duet_status_t duet_rpc_call_fail_status(duet_rpc_call_t *call, duet_status_t st, const char *msg);
duet_status_t duet_rpc_call_finish(duet_rpc_call_t *call, grpc_status_code code, const char *msg);

/* ---- client ------------------------------------------------------------- */

typedef struct duet_rpc_client duet_rpc_client_t;
typedef struct duet_rpc_stream duet_rpc_stream_t;

typedef struct {
    size_t max_message_bytes;     /* per message, both directions */
    int64_t keepalive_ms;         /* HTTP/2 keepalive ping period; 0 = off */
    int64_t keepalive_timeout_ms; /* drop the connection after this without ack */
    int64_t reconnect_backoff_ms; /* longest wait between reconnect attempts */
    int n_threads;                /* CQ threads for streams, 1..64 */
    duet_rpc_auth_t *auth;        /* optional (rpc_auth.h): TLS credentials and
                                     the secret on every call; outlives the
                                     client */
} duet_rpc_client_config_t;

/* Defaults: 4 MiB, keepalive 30000 ms / 10000 ms, backoff 1000 ms, 1 thread. */
void duet_rpc_client_config_init(duet_rpc_client_config_t *cfg);

duet_status_t duet_rpc_client_create(const duet_rpc_client_config_t *cfg,
                                     duet_rpc_client_t **cli_p);

/* Cancel open streams (their on_done fires with CANCELLED), wait for them,
 * join the threads, close the channels.  Accepts NULL.  Not from a stream
 * callback. */
void duet_rpc_client_destroy(duet_rpc_client_t *cli);

/* Drop the cached channel to target (calls in flight keep it alive until they
 * end).  The next call opens a fresh channel. */
void duet_rpc_client_forget(duet_rpc_client_t *cli, const char *target);

/* Result of a unary call: code and message from the peer (or from gRPC:
 * UNAVAILABLE, DEADLINE_EXCEEDED...), and the reply when code is OK. */
typedef struct {
    grpc_status_code code;
    char *message; /* "" when none; NULL only when out of memory */
    uint8_t *data; /* NULL when len is 0 */
    size_t len;
} duet_rpc_result_t;

void duet_rpc_result_cleanup(duet_rpc_result_t *res);

/* Blocking unary call to target ("host:port") with a deadline (CLOCK_MONOTONIC
 * ns, INT64_MAX for none).  Channels are cached per target and calls do not
 * wait for a connection: an unreachable peer fails at once with UNAVAILABLE.
 * *res is always filled (clean it up).  Returns DUET_OK when code is OK, else
 * duet_rpc_status_from_grpc(code) with the message in duet_error_msg();
 * DUET_ERR_INVALID/NO_MEMORY for local failures (then res->code is INTERNAL). */
duet_status_t duet_rpc_client_unary(duet_rpc_client_t *cli, const char *target, const char *method,
                                    const void *req, size_t req_len, int64_t deadline_ns,
                                    duet_rpc_result_t *res);

/* Stream callbacks run on a client CQ thread, one at a time per stream.
 * on_message gets each message in order (data valid during the callback);
 * once duet_rpc_stream_cancel has been called no new on_message starts (one
 * already running on another thread finishes).  on_done is called exactly
 * once per started stream, after every on_message. */
typedef void (*duet_rpc_stream_message_cb)(duet_rpc_stream_t *stream, const uint8_t *data,
                                           size_t len, void *arg);
typedef void (*duet_rpc_stream_done_cb)(duet_rpc_stream_t *stream, grpc_status_code code,
                                        const char *msg, void *arg);

/* Start a server-streaming call.  On success on_done will be called exactly
 * once; when stream_p is not NULL it receives a handle, owned by the caller,
 * for duet_rpc_stream_cancel, released with duet_rpc_stream_release.  On
 * failure nothing is called and *stream_p is untouched. */
duet_status_t duet_rpc_client_stream(duet_rpc_client_t *cli, const char *target, const char *method,
                                     const void *req, size_t req_len, int64_t deadline_ns,
                                     duet_rpc_stream_message_cb on_message,
                                     duet_rpc_stream_done_cb on_done, void *arg,
                                     duet_rpc_stream_t **stream_p);

/* Cancel from any thread (also from the stream's callbacks).  Unless on_done
 * has already been decided, it reports CANCELLED.  Idempotent. */
void duet_rpc_stream_cancel(duet_rpc_stream_t *stream);

/* Drop the caller's handle (does not cancel).  Accepts NULL. */
void duet_rpc_stream_release(duet_rpc_stream_t *stream);

/* Every message of a server-streaming call and its final status. */
typedef struct {
    size_t count;
    uint8_t **data; /* [count], each NULL when its len is 0 */
    size_t *len;    /* [count] */
    grpc_status_code code;
    char *message;
} duet_rpc_messages_t;

void duet_rpc_messages_cleanup(duet_rpc_messages_t *msgs);

/* Blocking server-streaming call collecting the messages (at most
 * max_messages; more cancels the call with DUET_ERR_EXHAUSTED).  Returns like
 * duet_rpc_client_unary.  Not from a CQ thread (DUET_ERR_INVALID). */
duet_status_t duet_rpc_client_stream_collect(duet_rpc_client_t *cli, const char *target,
                                             const char *method, const void *req, size_t req_len,
                                             int64_t deadline_ns, size_t max_messages,
                                             duet_rpc_messages_t *out);

/* ---- grpc.health.v1.Health ------------------------------------------------ */

typedef struct duet_rpc_health duet_rpc_health_t;

/* Values of grpc.health.v1.HealthCheckResponse.ServingStatus. */
typedef enum {
    DUET_RPC_HEALTH_UNKNOWN = 0,
    DUET_RPC_HEALTH_SERVING = 1,
    DUET_RPC_HEALTH_NOT_SERVING = 2,
    DUET_RPC_HEALTH_SERVICE_UNKNOWN = 3,
} duet_rpc_health_status_t;

/* Register /grpc.health.v1.Health/Check and /Watch on srv (before start) and
 * a shutdown hook.  The overall service "" starts with `overall`.  Destroy
 * the health object only after the server. */
duet_status_t duet_rpc_health_create(duet_rpc_server_t *srv, duet_rpc_health_status_t overall,
                                     duet_rpc_health_t **health_p);

/* Set a service's status ("" = whole server); Watch streams see the change.
 * Service names are at most 256 bytes.  Ignored after duet_rpc_health_shutdown
 * (returns DUET_ERR_SHUTDOWN).  Thread-safe. */
duet_status_t duet_rpc_health_set(duet_rpc_health_t *health, const char *service,
                                  duet_rpc_health_status_t status);

/* Forget a service: Check answers NOT_FOUND, watchers see SERVICE_UNKNOWN. */
duet_status_t duet_rpc_health_clear(duet_rpc_health_t *health, const char *service);

/* Current status, DUET_RPC_HEALTH_SERVICE_UNKNOWN when not set. */
duet_rpc_health_status_t duet_rpc_health_get(duet_rpc_health_t *health, const char *service);

/* Drain: every service becomes NOT_SERVING (watchers see it), later sets are
 * refused, and Watch streams are finished (UNAVAILABLE) after that last
 * message.  Runs by itself at server shutdown.  Idempotent. */
void duet_rpc_health_shutdown(duet_rpc_health_t *health);

/* Number of open Watch streams (for tests and /metrics). */
size_t duet_rpc_health_watchers(duet_rpc_health_t *health);

/* Accepts NULL.  The server must have been destroyed first. */
void duet_rpc_health_destroy(duet_rpc_health_t *health);

#endif
