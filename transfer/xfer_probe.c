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
 * stdin.  The child creates a UCX context and worker, the endpoints the
 * daemon may create to each descriptor's address (with failure detection
 * when the transport has it, and without: their transports differ) and,
 * when asked, unpacks the rkey on each; then it exits at once without closing anything (no flush, no
 * wire-up traffic is progressed).  Its exit status is the verdict: 0 read
 * them (or refused them with an error: the daemon's own call will refuse
 * them the same way); killed by a signal (UCX's abort) or stuck past the
 * deadline: the descriptors are refused and the daemon never calls UCX
 * with them.
 *
 * What it does not cover: a blob that UCX reads without crashing but
 * whose content is hostile (an address of another host, an rkey naming
 * another segment) -- that is what authentication and roles are for.  The
 * probe's endpoint creation may open a connection to the address (tcp)
 * that is closed when the child exits. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

int duet_xfer_probe_main(const char *tls)
{
    const duet_xfer_transport_ops_t *ops = &duet_xfer_transport_ucx;
    duet_xfer_transport_t *t = NULL;
    duet_xfer_worker_t *w = NULL;
    uint32_t hdr[2];

    /* framing: u32 count, u32 flags (bit 0: unpack rkeys), then per
     * descriptor u32 length + bytes (host order: the parent wrote it) */
    if (duet__probe_read_all(0, hdr, sizeof(hdr)) != 0 || hdr[0] > DUET__PROBE_MAX_DESCS)
        return 3;
    if (ops->create(tls != NULL && tls[0] != '\0' ? tls : NULL, &t) != DUET_OK ||
        ops->worker_create(t, NULL, NULL, &w) != DUET_OK) {
        fprintf(stderr, "duet xfer probe: %s\n", duet_error_msg());
        return 3;
    }
    bool peer_mode = ops->detects_peer_failure(t);
    for (uint32_t i = 0; i < hdr[0]; i++) {
        uint32_t len;
        duet__desc_t d;
        duet_xfer_ep_t *ep = NULL;
        duet_xfer_rkey_t *rkey = NULL;
        const char *why = NULL;
        void *blob;

        if (duet__probe_read_all(0, &len, sizeof(len)) != 0 || len > 4 * DUET__DESC_BLOB_MAX)
            return 3;
        blob = duet_malloc(len > 0 ? len : 1);
        if (blob == NULL || duet__probe_read_all(0, blob, len) != 0)
            return 3;
        if (duet__desc_decode(blob, len, &d) != DUET_OK)
            continue; /* the daemon refuses it on its own */
        /* both endpoints the daemon may make (xfer_peer.c): the control
         * one with failure detection (when the transport has it) and the
         * data one without, whose lanes differ (shared memory: 1.13 builds
         * no mm endpoint under failure detection); an error is a clean
         * refusal, as the daemon's own call will be */
        for (int mode = peer_mode ? 0 : 1; mode < 2; mode++) {
            if (ops->ep_create(w, d.addr, d.addr_len, mode == 0 ? duet__probe_ep_error : NULL,
                               NULL, &ep, &why) != DUET_OK)
                continue;
            /* UCX's cuda_ipc rkey unpack writes into the blob: ours is a copy */
            if ((hdr[1] & 1u) && ops->rkey_unpack(ep, d.rkey, d.rkey_len, &rkey, &why) == DUET_OK)
                (void)ops->rkey_mapped(rkey, d.pool_base);
        }
        /* nothing is closed: exiting drops it all, and progressing would
         * start wire-up with the peer */
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
    uint32_t hdr[2] = {(uint32_t)n, rkeys ? 1u : 0u};

    if (n < 0 || n > DUET__PROBE_MAX_DESCS)
        return duet_error(DUET_ERR_INVALID, "descriptor probe: %d descriptors", n);
    if (x->ops != &duet_xfer_transport_ucx || getenv("DUET_XFER_PROBE_OFF") != NULL)
        return DUET_OK; /* only UCX parses them; tests can compare the cost */
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
