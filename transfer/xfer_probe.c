/* Trying a peer's descriptors in a short-lived child process before this
 * daemon hands them to UCX (issue 25; docs/security.md "UCX never sees
 * unchecked bytes").
 *
 * Why a process.  UCX parses a worker address (ucp_address_unpack, inside
 * ucp_ep_create) and a packed rkey (ucp_ep_rkey_unpack) trusting every
 * byte: neither call takes the blob's length, and a malformed one trips
 * an assertion (1.13 and 1.22: address.c, "addr_version ==
 * UCP_OBJECT_VERSION_V2") or reads past the blob -- an abort of the whole
 * daemon.  The format is UCX's own and changes between releases (v1/v2
 * addresses, per-transport packing), so duet does not re-implement a
 * validator that would go stale; instead the same calls, on the same
 * transport configuration (this process's environment and tls), run first
 * in a child: /proc/self/exe --duet-xfer-probe TLS, descriptors on its
 * stdin.  The child creates a UCX context and worker and makes the
 * daemon's own sequence of calls for each descriptor (xfer_peer.c's
 * connect: the endpoints with and without failure detection, whose
 * transports differ; the rkey unpacked, tested for a shared-memory
 * mapping and destroyed where the daemon does; the endpoints flushed,
 * which runs wire-up with whatever answers at the address, for up to
 * 1 s); then it exits without closing anything.  Its exit status is the
 * verdict: 0 read them (or refused them with an error: the daemon's own
 * call will refuse them the same way); killed by a signal (UCX's abort) or
 * stuck past the deadline: the descriptors are refused and the daemon
 * never calls UCX with them.
 *
 * What it does not cover: a blob that UCX reads without crashing but
 * whose content is hostile (an address of another host, an rkey naming
 * another segment), and a peer that answers the probe well and the daemon
 * badly (UCX trusts what a connected peer sends: its tcp transport
 * asserts on a bad header) -- keeping those out is authentication's and
 * the roles' job.  The probe's wire-up with a real peer leaves that peer
 * an endpoint whose connection drops when the child exits. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "transfer/xfer_internal.h"

extern char **environ;

#define DUET__PROBE_MAX_DESCS 64
#define DUET__PROBE_FLUSH_MS  1000

duet_status_t duet__desc_pad(duet__desc_t *d, void **buf_p)
{
    uint8_t *b = duet_calloc(1, d->rkey_len + d->addr_len + 2 * DUET__DESC_PAD);
    if (b == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "descriptor: no memory");
    memcpy(b, d->rkey, d->rkey_len);
    memcpy(b + d->rkey_len + DUET__DESC_PAD, d->addr, d->addr_len);
    d->rkey = b;
    d->addr = b + d->rkey_len + DUET__DESC_PAD;
    *buf_p = b;
    return DUET_OK;
}

/* ---- the child ------------------------------------------------------------------------ */

static int duet__probe_read_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void duet__probe_ep_error(void *arg, const char *why)
{
    (void)arg;
    (void)why;
}

static void duet__probe_flushed(void *arg, duet_status_t st, const char *why)
{
    (void)st;
    (void)why;
    (*(int *)arg)--;
}

/* Flush ep as the daemon's connect does: wire-up with whatever answers at
 * the address runs here, so a reply UCX cannot take (a descriptor whose
 * address now points at some other listener) kills the child. */
static void duet__probe_flush(const duet_xfer_transport_ops_t *ops, duet_xfer_ep_t *ep,
                              int *pending)
{
    const char *why = NULL;
    if (ops->flush(ep, duet__probe_flushed, pending, &why) == DUET_XFER_OP_PENDING)
        (*pending)++;
}

/* One descriptor, in the order xfer_peer.c's connect makes its calls
 * (duet__peer_exec_connect and duet__peer_connect_data), rkey destruction
 * included: a malformed rkey has been seen to crash UCX only in a call
 * that follows the destruction of its partial unpack. */
static void duet__probe_one(const duet_xfer_transport_ops_t *ops, duet_xfer_worker_t *w,
                            bool peer_mode, bool prefill, uint64_t host_id, const duet__desc_t *d,
                            int *pending)
{
    duet_xfer_ep_t *ctl = NULL, *data = NULL;
    duet_xfer_rkey_t *rkey = NULL;
    const char *why = NULL;

    if (peer_mode &&
        ops->ep_create(w, d->addr, d->addr_len, duet__probe_ep_error, NULL, &ctl, &why) != DUET_OK)
        ctl = NULL;
    if (prefill) {
        if (ctl != NULL) {
            if (ops->rkey_unpack(ctl, d->rkey, d->rkey_len, &rkey, &why) != DUET_OK)
                return; /* the daemon's connect fails here too */
            bool mapped = !d->info.pool_device && d->info.host_id == host_id &&
                          ops->rkey_mapped(rkey, d->pool_base);
            if (!mapped) {
                data = ctl;
            } else {
                ops->rkey_destroy(rkey);
                rkey = NULL;
            }
        }
        if (data == NULL) {
            if (ops->ep_create(w, d->addr, d->addr_len, NULL, NULL, &data, &why) != DUET_OK)
                return;
            if (ops->rkey_unpack(data, d->rkey, d->rkey_len, &rkey, &why) != DUET_OK)
                return;
        }
        if (!d->info.pool_device && d->info.host_id == host_id)
            (void)ops->rkey_mapped(rkey, d->pool_base);
    }
    if (ctl == NULL && data == NULL &&
        ops->ep_create(w, d->addr, d->addr_len, NULL, NULL, &ctl, &why) != DUET_OK)
        return;
    if (ctl != NULL)
        duet__probe_flush(ops, ctl, pending);
    if (data != NULL && data != ctl)
        duet__probe_flush(ops, data, pending);
    /* nothing is closed: exiting drops it all */
}

int duet_xfer_probe_main(const char *tls)
{
    const duet_xfer_transport_ops_t *ops = &duet_xfer_transport_ucx;
    duet_xfer_transport_t *t = NULL;
    duet_xfer_worker_t *w = NULL;
    uint32_t hdr[2];
    uint64_t host_id;
    int pending = 0;

    /* framing: u32 count, u32 flags (bit 0: the prefill side, which
     * unpacks rkeys; bit 1: endpoints with failure detection, as the
     * parent's no_peer_mode says), u64 the parent's host id, then per descriptor u32
     * length + bytes (host order: the parent wrote it) */
    if (duet__probe_read_all(0, hdr, sizeof(hdr)) != 0 || hdr[0] > DUET__PROBE_MAX_DESCS ||
        duet__probe_read_all(0, &host_id, sizeof(host_id)) != 0)
        return 3;
    if (ops->create(tls != NULL && tls[0] != '\0' ? tls : NULL, &t) != DUET_OK ||
        ops->worker_create(t, NULL, NULL, &w) != DUET_OK) {
        fprintf(stderr, "duet xfer probe: %s\n", duet_error_msg());
        return 3;
    }
    bool peer_mode = (hdr[1] & 2u) != 0;
    for (uint32_t i = 0; i < hdr[0]; i++) {
        uint32_t len;
        duet__desc_t d;
        void *blob;

        if (duet__probe_read_all(0, &len, sizeof(len)) != 0 || len > 4 * DUET__DESC_BLOB_MAX)
            return 3;
        blob = duet_malloc(len > 0 ? len : 1);
        if (blob == NULL || duet__probe_read_all(0, blob, len) != 0)
            return 3;
        /* (a blob that does not decode: the daemon refuses it on its own) */
        void *padded = NULL;
        if (duet__desc_decode(blob, len, &d) == DUET_OK && duet__desc_pad(&d, &padded) == DUET_OK)
            duet__probe_one(ops, w, peer_mode, (hdr[1] & 1u) != 0, host_id, &d, &pending);
    }
    /* until every flush ended (a real peer answers in a round trip) or a
     * while: a peer that does not answer is the daemon's deadline's case */
    int64_t until = duet_now_ns() + DUET__PROBE_FLUSH_MS * DUET_NS_PER_MS;
    while (pending > 0 && duet_now_ns() < until) {
        if (ops->progress(w) == 0) {
            struct timespec ts = {0, 200 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    fflush(NULL);
    _exit(0);
}

/* ---- the parent ----------------------------------------------------------------------- */

static int duet__probe_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Wait for pid until deadline_ns; kill it past that.  Its wait status, or
 * -1 when it had to be killed. */
static int duet__probe_wait(pid_t pid, int64_t deadline_ns)
{
    int status = 0;
    for (;;) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid)
            return status;
        if (got < 0 && errno != EINTR)
            return -2;
        if (duet_now_ns() > deadline_ns) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            return -1;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

duet_status_t duet_xfer_probe_descs(duet_xfer_t *x, const void *const *blobs, const size_t *lens,
                                    int n, bool rkeys, int64_t deadline_ns)
{
    char *argv[4] = {"duet-xfer-probe", DUET_XFER_PROBE_FLAG, x->tls != NULL ? x->tls : "", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t sa;
    sigset_t none, all;
    int pipefd[2], status, err;
    pid_t pid;
    int64_t t0 = duet_now_ns();
    uint32_t hdr[2] = {(uint32_t)n, (rkeys ? 1u : 0u) | (atomic_load(&x->no_peer_mode) ? 0u : 2u)};

    if (n < 0 || n > DUET__PROBE_MAX_DESCS)
        return duet_error(DUET_ERR_INVALID, "descriptor probe: %d descriptors", n);
    if (x->ops != &duet_xfer_transport_ucx)
        return DUET_OK; /* only UCX's parsers abort */
    if (pipe2(pipefd, O_CLOEXEC) != 0)
        return duet_error(DUET_ERR_IO, "descriptor probe: pipe: %s", strerror(errno));
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[0], 0);
    posix_spawnattr_init(&sa);
    /* the daemon blocks its signals in every thread: the child must be
     * able to die of UCX's abort, with default handlers */
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&sa, &none);
    posix_spawnattr_setsigdefault(&sa, &all);
    posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    err = posix_spawn(&pid, "/proc/self/exe", &fa, &sa, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&sa);
    close(pipefd[0]);
    if (err != 0) {
        close(pipefd[1]);
        return duet_error(DUET_ERR_IO, "descriptor probe: cannot start a process: %s",
                          strerror(err));
    }
    /* a child that died early makes write fail with EPIPE, not a signal:
     * the daemon blocks SIGPIPE (common/daemon.c) */
    int wrote = duet__probe_write_all(pipefd[1], hdr, sizeof(hdr));
    if (wrote == 0)
        wrote = duet__probe_write_all(pipefd[1], &x->host_id, sizeof(x->host_id));
    for (int i = 0; i < n && wrote == 0; i++) {
        uint32_t len = (uint32_t)lens[i];
        wrote = duet__probe_write_all(pipefd[1], &len, sizeof(len));
        if (wrote == 0)
            wrote = duet__probe_write_all(pipefd[1], blobs[i], lens[i]);
    }
    close(pipefd[1]);
    status = duet__probe_wait(pid, deadline_ns);
    DUET_LOG_INFO("xfer: descriptor probe of %d peer ranks: %.1f ms", n,
                  (double)(duet_now_ns() - t0) / 1e6);
    if (status == -1)
        return duet_error(DUET_ERR_PEER,
                          "UCX did not finish reading the peer's worker address or rkey before "
                          "the deadline (a probe process; docs/security.md): refused");
    if (status == -2)
        return duet_error(DUET_ERR_IO, "descriptor probe: waitpid: %s", strerror(errno));
    if (WIFSIGNALED(status))
        return duet_error(DUET_ERR_PEER,
                          "UCX cannot read the peer's worker address or rkey (a probe process "
                          "reading them died of signal %d, %s; docs/security.md): refused",
                          WTERMSIG(status), strsignal(WTERMSIG(status)));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return duet_error(DUET_ERR_IO,
                          "descriptor probe: the probe process failed (exit %d): refused",
                          WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return DUET_OK;
}
