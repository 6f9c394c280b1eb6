/* The public calls that hand work to a rank's progress thread: each checks
 * and copies its arguments here, on the caller's thread (peer descriptor,
 * slice plan -> send state or expectation), and queues a command that
 * xfer_progress.c runs. */
#include "transfer/xfer_internal.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"

/* ---- peers ---------------------------------------------------------------------- */

duet_status_t duet_xfer_peer_connect(duet_xfer_rank_t *r, const void *blob, size_t len,
                                     int64_t deadline_ns, duet_xfer_peer_t **peer_p)
{
    duet__desc_t d;
    duet__cmd_t c;
    duet_status_t st;
    void *copy, *padded = NULL;

    if (r->pool_kind == DUET__POOL_NONE)
        return duet_error(DUET_ERR_INVALID, "xfer rank %d: connect needs the pool first", r->index);
    /* The transport gets a private copy: UCX's cuda_ipc rkey unpack (1.13)
     * writes into the packed rkey it is given, and the caller's blob may be
     * shared by several ranks connecting to the same peer (seen: the second
     * rank's checksum check failed); duet__desc_pad copies again. */
    copy = duet_malloc(len ? len : 1);
    if (copy == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer rank %d: connect: no memory", r->index);
    if (blob != NULL)
        memcpy(copy, blob, len);
    st = duet__desc_decode(blob != NULL ? copy : NULL, len, &d);
    if (st == DUET_OK)
        st = duet__desc_check_peer(&r->info, &d.info);
    if (st == DUET_OK)
        st = duet__desc_pad(&d, &padded);
    if (st == DUET_OK) {
        memset(&c, 0, sizeof(c));
        c.kind = DUET__CMD_CONNECT;
        c.u.connect.desc = &d;
        c.u.connect.deadline_ns = deadline_ns;
        st = duet__call(r, &c, 0);
        if (st == DUET_OK)
            *peer_p = c.u.connect.peer;
    }
    duet_free(padded);
    duet_free(copy);
    return st;
}

void duet_xfer_peer_disconnect(duet_xfer_peer_t *peer)
{
    duet__cmd_t c;
    if (peer == NULL)
        return;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_DISCONNECT;
    c.u.peer = peer;
    if (duet__call(peer->r, &c, 0) != DUET_OK)
        DUET_LOG_WARN("xfer: disconnect: %s", duet_error_msg());
}

duet_status_t duet_xfer_debug_put(duet_xfer_peer_t *peer, size_t src_off, size_t dst_off,
                                  size_t bytes, int64_t deadline_ns)
{
    duet__cmd_t c;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_PUT;
    c.u.put.peer = peer;
    c.u.put.src_off = src_off;
    c.u.put.dst_off = dst_off;
    c.u.put.len = bytes;
    c.u.put.deadline_ns = deadline_ns;
    return duet__call(peer->r, &c, 0);
}

duet_status_t duet_xfer_rank_run(duet_xfer_rank_t *r, duet_status_t (*fn)(void *arg), void *arg)
{
    duet__cmd_t c;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_RUN;
    c.u.run.fn = fn;
    c.u.run.arg = arg;
    return duet__call(r, &c, 0);
}

/* ---- one command on several ranks at once ----------------------------------------- */

/* Prepares rank r's command from its input (in the caller's thread), or
 * undoes that for a command that never reached the thread. */
typedef struct {
    duet_status_t (*prepare)(duet_xfer_rank_t *r, const void *in, duet__cmd_t *c);
    void (*unprepare)(duet__cmd_t *c);
} duet__batch_ops_t;

/* ops->prepare of in[i] (elements of `size` bytes) for ranks[i], then the
 * commands on every rank's thread at once (duet__call_all); st[i] per
 * rank, the first failure returned as duet_error. */
static duet_status_t duet__batch(duet_xfer_rank_t *const *ranks, const void *in, size_t size, int n,
                                 duet_status_t *st, const duet__batch_ops_t *ops)
{
    size_t m = (size_t)(n > 0 ? n : 1);
    duet__cmd_t *cmds = duet_calloc(m, sizeof(*cmds));
    bool *skip = duet_calloc(m, sizeof(*skip));
    duet_status_t rc = DUET_OK;

    if (cmds == NULL || skip == NULL) {
        for (int i = 0; i < n; i++)
            st[i] = DUET_ERR_NO_MEMORY;
        rc = duet_error(DUET_ERR_NO_MEMORY, "xfer: no memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if ((st[i] = ops->prepare(ranks[i], (const char *)in + (size_t)i * size, &cmds[i])) ==
            DUET_OK)
            continue;
        /* refused before the thread: keep its message (the next prepare
         * overwrites duet_error_msg) */
        cmds[i].status = st[i];
        snprintf(cmds[i].msg, sizeof(cmds[i].msg), "%s", duet_error_msg());
        skip[i] = true;
    }
    duet__call_all(ranks, cmds, skip, n, st);
    for (int i = 0; i < n; i++)
        if (!skip[i] && st[i] == DUET_ERR_SHUTDOWN)
            ops->unprepare(&cmds[i]);
    for (int i = 0; i < n && rc == DUET_OK; i++)
        rc = duet__cmd_result(&cmds[i]);
out:
    duet_free(cmds);
    duet_free(skip);
    return rc;
}

/* ---- decode side ------------------------------------------------------------------ */

duet_status_t duet_xfer_recv_expect(duet_xfer_rank_t *r, const duet_xfer_expect_t *in)
{
    duet__cmd_t c;
    duet__expect_t *e = NULL;
    duet_status_t st = duet__recv_prepare(r, in, &e);
    if (st != DUET_OK)
        return st;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_EXPECT;
    c.u.expect = e;
    st = duet__call(r, &c, 1);
    if (st == DUET_ERR_SHUTDOWN)
        duet__recv_free(e); /* never reached the thread */
    return st;
}

static duet_status_t duet__expect_prepare(duet_xfer_rank_t *r, const void *in, duet__cmd_t *c)
{
    c->kind = DUET__CMD_EXPECT;
    return duet__recv_prepare(r, in, &c->u.expect);
}

static void duet__expect_unprepare(duet__cmd_t *c)
{
    duet__recv_free(c->u.expect);
}

duet_status_t duet_xfer_recv_expect_all(duet_xfer_rank_t *const *ranks,
                                        const duet_xfer_expect_t *in, int n, duet_status_t *st)
{
    static const duet__batch_ops_t ops = {duet__expect_prepare, duet__expect_unprepare};
    return duet__batch(ranks, in, sizeof(*in), n, st, &ops);
}

duet_status_t duet_xfer_recv_wait(duet_xfer_rank_t *r, uint64_t transfer_id, int64_t deadline_ns,
                                  duet_xfer_result_t *res_p)
{
    return duet__wait(r, DUET__SIDE_RECV, transfer_id, deadline_ns, res_p);
}

duet_status_t duet_xfer_recv_cancel(duet_xfer_rank_t *r, uint64_t transfer_id)
{
    return duet__cancel(r, DUET__SIDE_RECV, transfer_id);
}

/* ---- prefill side ------------------------------------------------------------------ */

duet_status_t duet_xfer_send_begin(duet_xfer_rank_t *r, const duet_xfer_send_t *in)
{
    duet__cmd_t c;
    duet__send_t *s = NULL;
    duet_status_t st = duet__send_prepare(r, in, &s);
    if (st != DUET_OK)
        return st;
    memset(&c, 0, sizeof(c));
    c.kind = DUET__CMD_SEND_BEGIN;
    c.u.send = s;
    st = duet__call(r, &c, 1);
    if (st == DUET_ERR_SHUTDOWN)
        duet__send_free(s); /* never reached the thread */
    return st;
}

static duet_status_t duet__begin_prepare(duet_xfer_rank_t *r, const void *in, duet__cmd_t *c)
{
    c->kind = DUET__CMD_SEND_BEGIN;
    return duet__send_prepare(r, in, &c->u.send);
}

static void duet__begin_unprepare(duet__cmd_t *c)
{
    duet__send_free(c->u.send);
}

duet_status_t duet_xfer_send_begin_all(duet_xfer_rank_t *const *ranks, const duet_xfer_send_t *in,
                                       int n, duet_status_t *st)
{
    static const duet__batch_ops_t ops = {duet__begin_prepare, duet__begin_unprepare};
    return duet__batch(ranks, in, sizeof(*in), n, st, &ops);
}

duet_status_t duet_xfer_send_layers(duet_xfer_rank_t *r, uint64_t transfer_id, int l0, int l1)
{
    duet__cmd_t *c;
    if (l0 < 0 || l1 <= l0 || l1 > r->info.layout.n_layers)
        return duet_error(DUET_ERR_INVALID, "xfer send: layers [%d, %d) out of range 0..%d", l0, l1,
                          r->info.layout.n_layers);
    c = DUET_NEW(duet__cmd_t);
    if (c == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer send: layers");
    c->kind = DUET__CMD_SEND_LAYERS;
    c->u.layers.transfer_id = transfer_id;
    c->u.layers.l0 = l0;
    c->u.layers.l1 = l1;
    return duet__post_async(r, c);
}

duet_status_t duet_xfer_send_end(duet_xfer_rank_t *r, uint64_t transfer_id, duet_status_t status,
                                 int64_t first_token)
{
    duet__cmd_t *c = DUET_NEW(duet__cmd_t);
    if (c == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer send: end");
    c->kind = DUET__CMD_SEND_END;
    c->u.end.transfer_id = transfer_id;
    c->u.end.status = status;
    c->u.end.first_token = first_token;
    return duet__post_async(r, c);
}

duet_status_t duet_xfer_send_post(duet_xfer_rank_t *r, const duet_xfer_send_t *s,
                                  int64_t first_token)
{
    duet_status_t st = duet_xfer_send_begin(r, s);
    if (st == DUET_OK)
        st = duet_xfer_send_layers(r, s->transfer_id, 0, r->info.layout.n_layers);
    if (st == DUET_OK)
        st = duet_xfer_send_end(r, s->transfer_id, DUET_OK, first_token);
    return st;
}

duet_status_t duet_xfer_send_wait(duet_xfer_rank_t *r, uint64_t transfer_id, int64_t deadline_ns,
                                  duet_xfer_result_t *res_p)
{
    return duet__wait(r, DUET__SIDE_SEND, transfer_id, deadline_ns, res_p);
}

duet_status_t duet_xfer_send_cancel(duet_xfer_rank_t *r, uint64_t transfer_id)
{
    return duet__cancel(r, DUET__SIDE_SEND, transfer_id);
}
