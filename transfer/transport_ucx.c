/* The transfer transport over UCX (transfer/transport.h): a UCP context with
 * RMA, active messages and wakeup; one single-threaded UCP worker per rank;
 * puts with ucp_put_nbx, messages as active-message headers, endpoints with
 * error mode "peer" when the caller wants failure detection.
 *
 * Requests carry the caller's callback in their reserved space
 * (ucp_params_t.request_size), so no allocation happens per operation: the
 * one completion function frees the request, counts it off the worker and
 * calls back.  UCX runs a request's callback only from progress, never from
 * the *_nbx call that returned it, so filling that space after the call
 * returns is safe.
 *
 * Endpoints are small wrappers (the error callback needs the caller's
 * function and argument); a worker keeps its open ones in a list and frees
 * those still open when it is destroyed (UCX destroys their endpoints).
 *
 * Routed puts (docs/security.md "Network faults").  Where no lane does RMA
 * (tcp), UCX emulates a put with a message whose target answers, and aborts
 * the target when that answer cannot be sent (ucp_put_handler: ucs_fatal,
 * 1.13 to 1.22).  There a put of host memory goes as eager messages of our
 * own (DUET__UCX_PUT_AM_ID, remote address in the header) that the target
 * copies, unanswered, into a host region mapped here, only from an open
 * endpoint of its worker; stream order puts them before later messages. */
#include "transfer/transport.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ucp/api/ucp.h>

#include "common/alloc.h"
#include "common/log.h"

#define DUET__UCX_AM_ID     0x2d /* active-message id of notifications and acks */
#define DUET__UCX_PUT_AM_ID 0x2e /* active-message id of routed puts */

struct duet_xfer_transport {
    ucp_context_h ucp;
    bool peer_failure;     /* some transport in UCX_TLS can report a dead peer */
    pthread_mutex_t lock;  /* mems */
    duet_xfer_mem_t *mems; /* host regions mapped here: where routed puts land */
};

struct duet_xfer_worker {
    duet_xfer_transport_t *t;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;
    long inflight;
    duet_xfer_msg_cb_t on_msg;
    void *msg_arg;
    duet_xfer_ep_t *eps;             /* wrappers not freed yet */
    int in_callback;                 /* inside a completion callback of ours */
    struct duet__ucx_put_box *boxes; /* routed puts in flight */
    duet_xfer_ep_t *deferred;        /* closes asked for from inside a callback */
};

struct duet_xfer_ep {
    ucp_ep_h ep;
    duet_xfer_worker_t *w;
    duet_xfer_ep_error_cb_t on_error;
    void *arg;
    bool routed_puts; /* no lane does RMA: puts go as our own messages */
    bool closed;      /* ep_close was called: accept no routed put from it */
    bool close_force; /* a deferred close: its arguments */
    duet_xfer_op_cb_t close_cb;
    void *close_arg;
    duet_xfer_ep_t *next_deferred; /* w->deferred */
    duet_xfer_ep_t *next, *prev;   /* w->eps */
};

struct duet_xfer_mem {
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    bool device;
    uintptr_t base; /* host regions: where routed puts may land */
    size_t bytes;
    duet_xfer_mem_t *next; /* t->mems */
};

/* Routed puts go in messages of at most this many bytes (the target
 * buffers each message whole before its handler runs). */
#define DUET__UCX_ROUTED_CHUNK ((size_t)256 << 10)

/* A routed put's headers (UCX 1.13 reads them until the send completed). */
typedef struct {
    uint64_t remote_addr;
} duet__ucx_put_hdr_t;

typedef struct duet__ucx_put_box {
    duet_xfer_worker_t *w;
    duet_xfer_op_cb_t cb;
    void *arg;
    struct duet__ucx_put_box *next, *prev; /* w->boxes */
    int pending;                           /* messages not completed */
    ucs_status_t status;                   /* the first failure */
    duet__ucx_put_hdr_t hdr[];             /* one per message */
} duet__ucx_put_box_t;

/* The reserved space of every request. */
typedef struct {
    duet_xfer_worker_t *w;
    duet_xfer_op_cb_t cb;
    void *arg;
    duet_xfer_ep_t *closed; /* ep_close: the wrapper to free once it completed */
} duet__ucx_req_t;

static ucp_rkey_h duet__ucx_rkey(duet_xfer_rkey_t *rkey)
{
    return (ucp_rkey_h)(void *)rkey;
}

/* ---- requests ---------------------------------------------------------------- */

static void duet__ucx_ep_free(duet_xfer_ep_t *e)
{
    duet_xfer_worker_t *w = e->w;
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        w->eps = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    duet_free(e);
}

static void duet__ucx_req_done(void *request, ucs_status_t status, void *user_data)
{
    duet__ucx_req_t q = *(duet__ucx_req_t *)request;
    duet_status_t st = status == UCS_OK             ? DUET_OK
                       : status == UCS_ERR_CANCELED ? DUET_ERR_CANCELLED
                                                    : DUET_ERR_PEER;
    (void)user_data;
    ucp_request_free(request);
    q.w->inflight--;
    if (q.closed != NULL)
        duet__ucx_ep_free(q.closed);
    q.w->in_callback++;
    q.cb(q.arg, st, ucs_status_string(status));
    q.w->in_callback--;
}

/* The three outcomes of a *_nbx call. */
static duet_xfer_op_t duet__ucx_started(duet_xfer_worker_t *w, ucs_status_ptr_t req,
                                        duet_xfer_op_cb_t cb, void *arg, const char **why_p)
{
    duet__ucx_req_t *q;
    if (req == NULL)
        return DUET_XFER_OP_DONE;
    if (UCS_PTR_IS_ERR(req)) {
        *why_p = ucs_status_string(UCS_PTR_STATUS(req));
        return DUET_XFER_OP_FAILED;
    }
    q = req;
    q->w = w;
    q->cb = cb;
    q->arg = arg;
    q->closed = NULL;
    w->inflight++;
    return DUET_XFER_OP_PENDING;
}

static void duet__ucx_params(ucp_request_param_t *rp)
{
    memset(rp, 0, sizeof(*rp));
    rp->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    rp->cb.send = duet__ucx_req_done;
}

/* ---- context ------------------------------------------------------------------- */

/* Can any transport in this UCX_TLS value report peer failures (UCX 1.13:
 * tcp and the InfiniBand ones; not self or shared memory)?  An explicit list
 * without one would only earn a UCX error line per connection attempt. */
static bool duet__ucx_tls_detects_failure(const char *tls)
{
    static const char *const capable[] = {"all", "tcp", "rc", "dc", "ud", "ib", "mlx5"};
    char buf[256], *save = NULL;
    if (tls == NULL || tls[0] == '\0' || tls[0] == '^')
        return true;
    snprintf(buf, sizeof(buf), "%s", tls);
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
        for (size_t k = 0; k < sizeof(capable) / sizeof(capable[0]); k++)
            if (strncmp(t, capable[k], strlen(capable[k])) == 0)
                return true;
    return false;
}

static duet_status_t duet__ucx_create(const char *tls, duet_xfer_transport_t **t_p)
{
    const char *tls_in_use = tls != NULL ? tls : getenv("UCX_TLS");
    duet_xfer_transport_t *t;
    ucp_config_t *config;
    ucp_params_t params;
    duet_status_t st;
    ucs_status_t us;

    t = DUET_NEW(duet_xfer_transport_t);
    if (t == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "ucx context");
    pthread_mutex_init(&t->lock, NULL);
    t->peer_failure = duet__ucx_tls_detects_failure(tls_in_use);
    if (!t->peer_failure)
        DUET_LOG_WARN("xfer: no transport in UCX_TLS %s detects peer failure; a dead peer is "
                      "found by deadlines and missing acknowledgements",
                      tls_in_use);

    us = ucp_config_read(NULL, NULL, &config);
    if (us != UCS_OK) {
        st = duet_error(DUET_ERR_CONFIG, "ucx config: %s", ucs_status_string(us));
        goto err_free;
    }
    if (tls != NULL && (us = ucp_config_modify(config, "TLS", tls)) != UCS_OK) {
        st = duet_error(DUET_ERR_CONFIG, "ucx TLS '%s': %s", tls, ucs_status_string(us));
        goto err_release_config;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask =
        UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_REQUEST_SIZE;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1; /* ranks map pools and run workers on their own threads */
    params.request_size = sizeof(duet__ucx_req_t);
    us = ucp_init(&params, config, &t->ucp);
    if (us != UCS_OK) {
        st = duet_error(DUET_ERR_IO, "ucp_init: %s", ucs_status_string(us));
        goto err_release_config;
    }
    ucp_config_release(config);
    *t_p = t;
    return DUET_OK;

err_release_config:
    ucp_config_release(config);
err_free:
    pthread_mutex_destroy(&t->lock);
    duet_free(t);
    return st;
}

static void duet__ucx_destroy(duet_xfer_transport_t *t)
{
    if (t == NULL)
        return;
    ucp_cleanup(t->ucp);
    pthread_mutex_destroy(&t->lock);
    duet_free(t);
}

static bool duet__ucx_detects_peer_failure(const duet_xfer_transport_t *t)
{
    return t->peer_failure;
}

static bool duet__ucx_supports_cuda_memory(const duet_xfer_transport_t *t)
{
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(t->ucp, &attr) != UCS_OK)
        return false;
    return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

/* Whether UCX_PROTO_ENABLE in the environment says yes (1) or no (0);
 * -1 when unset. */
static int duet__ucx_proto_env(void)
{
    const char *v = getenv("UCX_PROTO_ENABLE");
    if (v == NULL || *v == '\0')
        return -1;
    return strcasecmp(v, "y") == 0 || strcasecmp(v, "yes") == 0 || strcasecmp(v, "on") == 0 ||
           strcmp(v, "1") == 0;
}

static int duet__ucx_version(void)
{
    unsigned major, minor, release;
    ucp_get_version(&major, &minor, &release);
    return (int)(major * 100 + minor);
}

static bool duet__ucx_device_puts(const duet_xfer_transport_t *t, const char **why_p)
{
    int env = duet__ucx_proto_env();

    if (!duet__ucx_supports_cuda_memory(t)) {
        *why_p = "this UCX build has no CUDA transports";
        return false;
    }
    /* UCX's original protocols emulate a put whose rkey no lane serves by
     * reading the source on the CPU: a put from device memory then faults
     * (seen with 1.13 and cuda_ipc).  Its new protocols (the default since
     * 1.16, UCX_PROTO_ENABLE=y before) move device memory with cuda_ipc /
     * cuda_copy. */
    if (env == 0) {
        *why_p = "UCX_PROTO_ENABLE=n (UCX's original protocols cannot put from device memory)";
        return false;
    }
    if (env < 0 && duet__ucx_version() < 116) {
        *why_p = "this UCX (< 1.16) needs UCX_PROTO_ENABLE=y to put from device memory";
        return false;
    }
    *why_p = "UCX moves CUDA memory";
    return true;
}

/* ---- memory ---------------------------------------------------------------------- */

/* ucp_mem_map and ucp_rkey_pack are context calls, made thread-safe by the
 * context's mt_workers_shared. */
static duet_status_t duet__ucx_mem_map(duet_xfer_transport_t *t, void *base, size_t bytes,
                                       unsigned flags, duet_xfer_mem_t **mem_p,
                                       duet_xfer_mem_info_t *info_p)
{
    bool allocate = (flags & DUET_XFER_MEM_ALLOCATE) != 0;
    ucp_mem_map_params_t mp;
    duet_xfer_mem_t *mem;
    ucp_mem_attr_t ma;
    duet_status_t st;
    ucs_status_t us;

    mem = DUET_NEW(duet_xfer_mem_t);
    if (mem == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "memory region");
    mem->device = (flags & DUET_XFER_MEM_DEVICE) != 0;
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = allocate ? NULL : base;
    mp.length = bytes;
    mp.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
    if (mem->device) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    us = ucp_mem_map(t->ucp, &mp, &mem->memh);
    if (us != UCS_OK) {
        st = duet_error(allocate ? DUET_ERR_NO_MEMORY : DUET_ERR_IO, "ucp_mem_map of %zu bytes: %s",
                        bytes, ucs_status_string(us));
        goto err_free;
    }
    memset(&ma, 0, sizeof(ma));
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    us = ucp_mem_query(mem->memh, &ma);
    if (us == UCS_OK && ma.length < bytes)
        us = UCS_ERR_NO_MEMORY;
    if (us == UCS_OK)
        us = ucp_rkey_pack(t->ucp, mem->memh, &mem->rkey_buf, &mem->rkey_len);
    if (us != UCS_OK) {
        st = duet_error(DUET_ERR_IO, "pool query/rkey: %s", ucs_status_string(us));
        goto err_unmap;
    }
    info_p->base = ma.address;
    info_p->rkey = mem->rkey_buf;
    info_p->rkey_len = mem->rkey_len;
    if (!mem->device) {
        mem->base = (uintptr_t)ma.address;
        mem->bytes = bytes;
        pthread_mutex_lock(&t->lock);
        mem->next = t->mems;
        t->mems = mem;
        pthread_mutex_unlock(&t->lock);
    }
    *mem_p = mem;
    return DUET_OK;

err_unmap:
    ucp_mem_unmap(t->ucp, mem->memh);
err_free:
    duet_free(mem);
    return st;
}

static void duet__ucx_mem_unmap(duet_xfer_transport_t *t, duet_xfer_mem_t *mem)
{
    if (mem == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    for (duet_xfer_mem_t **pp = &t->mems; *pp != NULL; pp = &(*pp)->next)
        if (*pp == mem) {
            *pp = mem->next;
            break;
        }
    pthread_mutex_unlock(&t->lock);
    ucp_rkey_buffer_release(mem->rkey_buf);
    ucp_mem_unmap(t->ucp, mem->memh);
    duet_free(mem);
}

/* ---- worker ------------------------------------------------------------------------ */

static ucs_status_t duet__ucx_am_recv(void *arg, const void *header, size_t header_length,
                                      void *data, size_t length, const ucp_am_recv_param_t *param)
{
    duet_xfer_worker_t *w = arg;
    (void)data;
    (void)param;
    if (length != 0)
        w->on_msg(w->msg_arg, NULL, 0); /* messages travel in the header only */
    else
        w->on_msg(w->msg_arg, header, header_length);
    return UCS_OK;
}

/* Copy a routed put into the host region of t that holds all of it;
 * false when none does.  Under the lock: the region stays mapped. */
static bool duet__ucx_land(duet_xfer_transport_t *t, uint64_t addr, const void *data, size_t len)
{
    bool landed = false;
    pthread_mutex_lock(&t->lock);
    for (duet_xfer_mem_t *m = t->mems; m != NULL; m = m->next)
        if (addr >= m->base && len <= m->bytes && addr - m->base <= m->bytes - len) {
            memcpy((void *)(uintptr_t)addr, data, len);
            landed = true;
            break;
        }
    pthread_mutex_unlock(&t->lock);
    return landed;
}

/* Whether ep is an endpoint of w that is not closed. */
static bool duet__ucx_ep_open(const duet_xfer_worker_t *w, ucp_ep_h ep)
{
    for (const duet_xfer_ep_t *e = w->eps; e != NULL; e = e->next)
        if (e->ep == ep)
            return !e->closed;
    return false;
}

static ucs_status_t duet__ucx_put_recv(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length, const ucp_am_recv_param_t *param)
{
    duet_xfer_worker_t *w = arg;
    duet__ucx_put_hdr_t h;
    const char *why = NULL;

    if (header_length != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
        why = "malformed";
    else if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ||
             !duet__ucx_ep_open(w, param->reply_ep))
        why = "from an endpoint not open here";
    if (why == NULL) {
        memcpy(&h, header, sizeof(h));
        if (!duet__ucx_land(w->t, h.remote_addr, data, length))
            why = "outside every region mapped here";
    }
    if (why != NULL)
        DUET_LOG_WARN("xfer: dropped a routed put of %zu bytes: %s", length, why);
    return UCS_OK;
}

static void duet__ucx_worker_destroy(duet_xfer_worker_t *w)
{
    if (w == NULL)
        return;
    if (w->worker != NULL) {
        if (w->addr != NULL)
            ucp_worker_release_address(w->worker, w->addr);
        ucp_worker_destroy(w->worker); /* and the endpoints still open on it */
    }
    while (w->boxes != NULL) { /* routed puts UCX dropped with the worker */
        duet__ucx_put_box_t *b = w->boxes;
        w->boxes = b->next;
        duet_free(b);
    }
    while (w->eps != NULL)
        duet__ucx_ep_free(w->eps);
    duet_free(w);
}

static duet_status_t duet__ucx_worker_create(duet_xfer_transport_t *t, duet_xfer_msg_cb_t on_msg,
                                             void *arg, duet_xfer_worker_t **w_p)
{
    ucp_am_handler_param_t hp;
    ucp_worker_params_t wp;
    ucp_worker_attr_t wa;
    duet_xfer_worker_t *w;
    ucs_status_t us;

    w = DUET_NEW(duet_xfer_worker_t);
    if (w == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "ucx worker");
    w->t = t;
    w->efd = -1;
    w->on_msg = on_msg;
    w->msg_arg = arg;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    us = ucp_worker_create(t->ucp, &wp, &w->worker);
    if (us != UCS_OK) {
        w->worker = NULL;
        duet__ucx_worker_destroy(w);
        return duet_error(DUET_ERR_IO, "ucp_worker_create: %s", ucs_status_string(us));
    }
    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = DUET__UCX_AM_ID;
    hp.cb = duet__ucx_am_recv;
    hp.arg = w;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    us = ucp_worker_set_am_recv_handler(w->worker, &hp);
    if (us == UCS_OK) {
        hp.id = DUET__UCX_PUT_AM_ID;
        hp.cb = duet__ucx_put_recv;
        us = ucp_worker_set_am_recv_handler(w->worker, &hp);
    }
    if (us == UCS_OK) {
        memset(&wa, 0, sizeof(wa));
        wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
        us = ucp_worker_query(w->worker, &wa);
        if (us == UCS_OK) {
            w->addr = wa.address;
            w->addr_len = wa.address_length;
        }
    }
    if (us == UCS_OK)
        us = ucp_worker_get_efd(w->worker, &w->efd);
    if (us != UCS_OK) {
        duet__ucx_worker_destroy(w);
        return duet_error(DUET_ERR_IO, "worker setup: %s", ucs_status_string(us));
    }
    *w_p = w;
    return DUET_OK;
}

static void duet__ucx_worker_address(const duet_xfer_worker_t *w, const void **addr_p,
                                     size_t *len_p)
{
    *addr_p = w->addr;
    *len_p = w->addr_len;
}

static int duet__ucx_event_fd(const duet_xfer_worker_t *w)
{
    return w->efd;
}

static void duet__ucx_run_deferred(duet_xfer_worker_t *w);

static unsigned duet__ucx_progress(duet_xfer_worker_t *w)
{
    unsigned n = ucp_worker_progress(w->worker);
    if (w->deferred != NULL) {
        duet__ucx_run_deferred(w);
        n++;
    }
    return n;
}

static int duet__ucx_arm(duet_xfer_worker_t *w)
{
    ucs_status_t us = ucp_worker_arm(w->worker);
    return us == UCS_OK ? 1 : us == UCS_ERR_BUSY ? 0 : -1;
}

static long duet__ucx_inflight(const duet_xfer_worker_t *w)
{
    return w->inflight;
}

/* ---- endpoints ---------------------------------------------------------------------- */

static void duet__ucx_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    duet_xfer_ep_t *e = arg;
    (void)ep;
    if (e->on_error != NULL)
        e->on_error(e->arg, ucs_status_string(status));
}

/* Whether some lane of ep does RMA (UCX's own description of the endpoint:
 * its lanes' uses, "rma#0" or "rma_bw#0" among them).  True when the
 * description cannot be read: puts then stay UCX's. */
static bool duet__ucx_ep_has_rma(ucp_ep_h ep)
{
    char *text = NULL, *save = NULL;
    size_t len = 0;
    bool lanes = false, rma = false;
    FILE *f = open_memstream(&text, &len);

    if (f == NULL)
        return true;
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        if (strstr(line, "lane[") == NULL)
            continue;
        lanes = true;
        if (strstr(line, " rma#") != NULL || strstr(line, " rma_bw#") != NULL)
            rma = true;
    }
    free(text);
    return rma || !lanes;
}

static duet_status_t duet__ucx_ep_create(duet_xfer_worker_t *w, const void *addr, size_t addr_len,
                                         duet_xfer_ep_error_cb_t on_error, void *arg,
                                         duet_xfer_ep_t **ep_p, const char **why_p)
{
    ucp_ep_params_t ep;
    duet_xfer_ep_t *e;
    ucs_status_t us;

    (void)addr_len; /* a UCP worker address knows its length */
    e = DUET_NEW(duet_xfer_ep_t);
    if (e == NULL) {
        *why_p = "out of memory";
        return DUET_ERR_NO_MEMORY;
    }
    e->w = w;
    e->on_error = on_error;
    e->arg = arg;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = addr;
    ep.err_mode = on_error != NULL ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    if (on_error != NULL) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler.cb = duet__ucx_ep_error;
        ep.err_handler.arg = e;
    }
    us = ucp_ep_create(w->worker, &ep, &e->ep);
    if (us != UCS_OK) {
        duet_free(e);
        *why_p = ucs_status_string(us);
        return DUET_ERR_PEER;
    }
    e->routed_puts = !duet__ucx_ep_has_rma(e->ep);
    e->next = w->eps;
    if (w->eps != NULL)
        w->eps->prev = e;
    w->eps = e;
    *ep_p = e;
    return DUET_OK;
}

static duet_xfer_op_t duet__ucx_ep_close_now(duet_xfer_ep_t *e, bool force, duet_xfer_op_cb_t cb,
                                             void *arg, const char **why_p)
{
    ucp_request_param_t rp;
    duet_xfer_op_t op;
    ucs_status_ptr_t req;

    duet__ucx_params(&rp);
    if (force) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        rp.flags = UCP_EP_CLOSE_FLAG_FORCE; /* allowed only on error-mode-peer endpoints */
    }
    req = ucp_ep_close_nbx(e->ep, &rp);
    op = duet__ucx_started(e->w, req, cb, arg, why_p);
    if (op == DUET_XFER_OP_PENDING)
        ((duet__ucx_req_t *)req)->closed = e; /* its error callback may still run until then */
    else if (op == DUET_XFER_OP_DONE)
        duet__ucx_ep_free(e);
    else
        e->on_error = NULL; /* the endpoint may live on until the worker goes: stay silent */
    return op;
}

/* Closes asked for inside a completion callback run after progress: UCX
 * completes requests from inside ucp_ep_set_failed, and closing that
 * endpoint there frees it under UCX (1.13: SIGSEGV in
 * ucp_worker_discard_uct_ep).  The caller was told PENDING: its callback
 * runs once, here or from the close's completion. */
static void duet__ucx_run_deferred(duet_xfer_worker_t *w)
{
    while (w->deferred != NULL) {
        duet_xfer_ep_t *e = w->deferred;
        duet_xfer_op_cb_t cb = e->close_cb;
        void *arg = e->close_arg;
        const char *why = NULL;
        duet_xfer_op_t op;

        w->deferred = e->next_deferred;
        w->inflight--;
        op = duet__ucx_ep_close_now(e, e->close_force, cb, arg, &why);
        if (op == DUET_XFER_OP_DONE)
            cb(arg, DUET_OK, "closed");
        else if (op == DUET_XFER_OP_FAILED)
            cb(arg, DUET_ERR_PEER, why);
    }
}

static duet_xfer_op_t duet__ucx_ep_close(duet_xfer_ep_t *e, bool force, duet_xfer_op_cb_t cb,
                                         void *arg, const char **why_p)
{
    duet_xfer_worker_t *w = e->w;

    e->closed = true;
    if (w->in_callback == 0)
        return duet__ucx_ep_close_now(e, force, cb, arg, why_p);
    e->close_force = force;
    e->close_cb = cb;
    e->close_arg = arg;
    e->next_deferred = w->deferred;
    w->deferred = e;
    w->inflight++;
    return DUET_XFER_OP_PENDING;
}

static duet_xfer_op_t duet__ucx_flush(duet_xfer_ep_t *e, duet_xfer_op_cb_t cb, void *arg,
                                      const char **why_p)
{
    ucp_request_param_t rp;
    duet__ucx_params(&rp);
    return duet__ucx_started(e->w, ucp_ep_flush_nbx(e->ep, &rp), cb, arg, why_p);
}

static duet_status_t duet__ucx_rkey_unpack(duet_xfer_ep_t *e, const void *blob, size_t len,
                                           duet_xfer_rkey_t **rkey_p, const char **why_p)
{
    ucp_rkey_h rkey;
    ucs_status_t us;
    (void)len; /* a packed UCP rkey knows its length */
    us = ucp_ep_rkey_unpack(e->ep, blob, &rkey);
    if (us != UCS_OK) {
        *why_p = ucs_status_string(us);
        return DUET_ERR_PEER;
    }
    *rkey_p = (duet_xfer_rkey_t *)(void *)rkey;
    return DUET_OK;
}

static void duet__ucx_rkey_destroy(duet_xfer_rkey_t *rkey)
{
    if (rkey != NULL)
        ucp_rkey_destroy(duet__ucx_rkey(rkey));
}

static bool duet__ucx_rkey_mapped(duet_xfer_rkey_t *rkey, uint64_t remote_addr)
{
    void *ptr;
    return ucp_rkey_ptr(duet__ucx_rkey(rkey), remote_addr, &ptr) == UCS_OK;
}

static void duet__ucx_box_unlink(duet__ucx_put_box_t *b)
{
    if (b->prev != NULL)
        b->prev->next = b->next;
    else
        b->w->boxes = b->next;
    if (b->next != NULL)
        b->next->prev = b->prev;
}

static void duet__ucx_routed_done(void *request, ucs_status_t status, void *user_data)
{
    duet__ucx_put_box_t *b = user_data;
    duet_xfer_worker_t *w = b->w;
    duet_xfer_op_cb_t cb = b->cb;
    void *arg = b->arg;

    ucp_request_free(request);
    if (status != UCS_OK && b->status == UCS_OK)
        b->status = status;
    if (--b->pending > 0)
        return;
    status = b->status;
    duet__ucx_box_unlink(b);
    duet_free(b);
    w->inflight--;
    w->in_callback++;
    cb(arg,
       status == UCS_OK             ? DUET_OK
       : status == UCS_ERR_CANCELED ? DUET_ERR_CANCELLED
                                    : DUET_ERR_PEER,
       ucs_status_string(status));
    w->in_callback--;
}

/* A put as our own eager messages (see "Routed puts" above). */
static duet_xfer_op_t duet__ucx_put_routed(duet_xfer_ep_t *e, const void *src, size_t len,
                                           uint64_t remote_addr, duet_xfer_op_cb_t cb, void *arg,
                                           const char **why_p)
{
    size_t n = len == 0 ? 1 : (len + DUET__UCX_ROUTED_CHUNK - 1) / DUET__UCX_ROUTED_CHUNK;
    ucp_request_param_t rp;
    duet__ucx_put_box_t *b;

    b = duet_calloc(1, sizeof(*b) + n * sizeof(b->hdr[0]));
    if (b == NULL) {
        *why_p = "out of memory";
        return DUET_XFER_OP_FAILED;
    }
    b->w = e->w;
    b->cb = cb;
    b->arg = arg;
    b->status = UCS_OK;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = duet__ucx_routed_done;
    rp.user_data = b;
    rp.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    for (size_t i = 0, off = 0; i < n; i++, off += DUET__UCX_ROUTED_CHUNK) {
        size_t part = len - off < DUET__UCX_ROUTED_CHUNK ? len - off : DUET__UCX_ROUTED_CHUNK;
        ucs_status_ptr_t req;

        b->hdr[i].remote_addr = remote_addr + off;
        req = ucp_am_send_nbx(e->ep, DUET__UCX_PUT_AM_ID, &b->hdr[i], sizeof(b->hdr[i]),
                              (const char *)src + off, part, &rp);
        if (UCS_PTR_IS_ERR(req)) {
            b->status = UCS_PTR_STATUS(req);
            break;
        }
        if (req != NULL)
            b->pending++; /* completions run from progress only, never in here */
    }
    if (b->pending == 0) {
        ucs_status_t us = b->status;
        duet_free(b);
        if (us == UCS_OK)
            return DUET_XFER_OP_DONE;
        *why_p = ucs_status_string(us);
        return DUET_XFER_OP_FAILED;
    }
    b->prev = NULL;
    b->next = e->w->boxes;
    if (b->next != NULL)
        b->next->prev = b;
    e->w->boxes = b;
    e->w->inflight++;
    return DUET_XFER_OP_PENDING; /* a failure to post a later part is reported at the end */
}

static duet_xfer_op_t duet__ucx_put(duet_xfer_ep_t *e, const duet_xfer_mem_t *mem, const void *src,
                                    size_t len, uint64_t remote_addr, duet_xfer_rkey_t *rkey,
                                    duet_xfer_op_cb_t cb, void *arg, const char **why_p)
{
    ucp_request_param_t rp;
    if (e->routed_puts && !mem->device)
        return duet__ucx_put_routed(e, src, len, remote_addr, cb, arg, why_p);
    duet__ucx_params(&rp);
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    rp.memh = mem->memh;
    if (mem->device) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        rp.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    return duet__ucx_started(
        e->w, ucp_put_nbx(e->ep, src, len, remote_addr, duet__ucx_rkey(rkey), &rp), cb, arg, why_p);
}

/* ucp_worker_fence: puts issued after it complete remotely after those
 * issued before it, on every endpoint of the worker. */
static duet_status_t duet__ucx_fence(duet_xfer_worker_t *w)
{
    ucs_status_t us = ucp_worker_fence(w->worker);
    if (us != UCS_OK)
        return duet_error(DUET_ERR_IO, "ucp_worker_fence: %s", ucs_status_string(us));
    return DUET_OK;
}

static duet_xfer_op_t duet__ucx_msg_send(duet_xfer_ep_t *e, const void *msg, size_t len,
                                         duet_xfer_op_cb_t cb, void *arg, const char **why_p)
{
    ucp_request_param_t rp;
    duet__ucx_params(&rp);
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_EAGER;
    return duet__ucx_started(e->w, ucp_am_send_nbx(e->ep, DUET__UCX_AM_ID, msg, len, NULL, 0, &rp),
                             cb, arg, why_p);
}

const duet_xfer_transport_ops_t duet_xfer_transport_ucx = {
    .create = duet__ucx_create,
    .destroy = duet__ucx_destroy,
    .detects_peer_failure = duet__ucx_detects_peer_failure,
    .supports_cuda_memory = duet__ucx_supports_cuda_memory,
    .device_puts = duet__ucx_device_puts,
    .version = duet__ucx_version,
    .mem_map = duet__ucx_mem_map,
    .mem_unmap = duet__ucx_mem_unmap,
    .worker_create = duet__ucx_worker_create,
    .worker_destroy = duet__ucx_worker_destroy,
    .worker_address = duet__ucx_worker_address,
    .event_fd = duet__ucx_event_fd,
    .progress = duet__ucx_progress,
    .arm = duet__ucx_arm,
    .inflight = duet__ucx_inflight,
    .ep_create = duet__ucx_ep_create,
    .ep_close = duet__ucx_ep_close,
    .flush = duet__ucx_flush,
    .rkey_unpack = duet__ucx_rkey_unpack,
    .rkey_destroy = duet__ucx_rkey_destroy,
    .rkey_mapped = duet__ucx_rkey_mapped,
    .put = duet__ucx_put,
    .fence = duet__ucx_fence,
    .msg_send = duet__ucx_msg_send,
};
