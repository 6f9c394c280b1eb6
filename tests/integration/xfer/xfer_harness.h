/* Multi-process harness for the transfer engine's tests and benchmark
 * (header-only; include from one translation unit).
 *
 *   xh_spawn / xh_wait_all  fork children and wait for them with a deadline;
 *                           a child still running at the deadline is killed
 *                           and reported, so a hang fails instead of hanging.
 *   xh_chan_*               length-prefixed messages over a socketpair, every
 *                           read with a deadline.
 *   xh_side_*               one daemon's transfer engine in a child: create,
 *                           allocate pools, swap descriptors with the other
 *                           child, connect every local rank to every remote.
 *   xh_pattern_* / xh_pages KV contents that encode (layer, K|V, global head,
 *                           token position, dim), and scattered page lists.
 *
 * UCX is only ever initialised in children: the parent stays fork-safe. */
#ifndef DUET_TESTS_XFER_HARNESS_H
#define DUET_TESTS_XFER_HARNESS_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "kv/heads.h"
#include "transfer/xfer.h"

#define XH_MAX_CHILD 8

/* ---- reporting from children ----------------------------------------------------- */

static char xh_who[32] = "parent";

static inline void xh_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void xh_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "[%s pid %d] FAIL: ", xh_who, (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

#define XH_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            xh_fail("%s:%d: %s", __FILE__, __LINE__, #cond);                                       \
            xh_fail(__VA_ARGS__);                                                                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define XH_OK(expr)                                                                                \
    do {                                                                                           \
        duet_status_t xh_st_ = (expr);                                                             \
        if (xh_st_ != DUET_OK) {                                                                   \
            xh_fail("%s:%d: %s: %s: %s", __FILE__, __LINE__, #expr, duet_status_name(xh_st_),      \
                    duet_error_msg());                                                             \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- processes --------------------------------------------------------------------- */

typedef int (*xh_child_fn)(void *arg);

/* Fork a child running fn(arg); its exit status is fn's result.  close_fd
 * (or -1) is closed in the child first (the parent's end of a channel). */
static inline pid_t xh_spawn(const char *name, xh_child_fn fn, void *arg, const int *close_fds,
                             int n_close)
{
    pid_t pid;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        int rc;
        /* The test runner's crash handlers would resume the parent's test
         * loop inside the child: crash plainly instead. */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        signal(SIGILL, SIG_DFL);
        signal(SIGFPE, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        for (int i = 0; i < n_close; i++)
            if (close_fds[i] >= 0)
                close(close_fds[i]);
        snprintf(xh_who, sizeof(xh_who), "%s", name);
        rc = fn(arg);
        fflush(NULL);
        exit(rc == 0 ? 0 : 1);
    }
    return pid;
}

/* Wait for n children; rc_out[i] is the exit code, 128+signal when killed,
 * or -1 when it was still running at the deadline (then it is killed).
 * Returns the number of children that did not exit 0. */
static inline int xh_wait_all(const pid_t *pids, int n, int64_t deadline_ns, int *rc_out)
{
    int left = n, bad = 0;
    int done[XH_MAX_CHILD] = {0};
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            int status;
            if (done[i])
                continue;
            pid_t w = waitpid(pids[i], &status, WNOHANG);
            if (w == pids[i]) {
                done[i] = 1;
                left--;
                rc_out[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
        }
        if (left == 0)
            break;
        if (duet_now_ns() > deadline_ns) {
            for (int i = 0; i < n; i++) {
                if (done[i])
                    continue;
                fprintf(stderr, "[parent] child %d (pid %d) hung: killing it\n", i, (int)pids[i]);
                kill(pids[i], SIGKILL);
                waitpid(pids[i], NULL, 0);
                rc_out[i] = -1;
            }
            break;
        }
        usleep(2000);
    }
    for (int i = 0; i < n; i++)
        bad += rc_out[i] != 0;
    return bad;
}

/* ---- channel ------------------------------------------------------------------------ */

static inline int xh_io(int fd, void *buf, size_t n, int writing, int64_t deadline_ns)
{
    size_t off = 0;
    while (off < n) {
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int64_t left = (deadline_ns - duet_now_ns()) / DUET_NS_PER_MS;
        ssize_t k;
        if (left <= 0)
            return -1;
        if (poll(&pfd, 1, (int)(left > 1000 ? 1000 : left)) <= 0)
            continue;
        k = writing ? write(fd, (char *)buf + off, n - off) : read(fd, (char *)buf + off, n - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        off += (size_t)k;
    }
    return 0;
}

static inline int xh_chan_send(int fd, const void *buf, uint32_t len)
{
    int64_t dl = duet_deadline_in_ms(10000);
    if (xh_io(fd, &len, sizeof(len), 1, dl) != 0 || (len && xh_io(fd, (void *)buf, len, 1, dl)))
        return -1;
    return 0;
}

/* Receive one message into a duet_malloc'ed buffer (NUL-terminated extra byte). */
static inline int xh_chan_recv(int fd, void **buf_p, uint32_t *len_p, int timeout_ms)
{
    int64_t dl = duet_deadline_in_ms(timeout_ms);
    uint32_t len;
    char *buf;
    if (xh_io(fd, &len, sizeof(len), 0, dl) != 0 || len > (1u << 24))
        return -1;
    buf = duet_malloc((size_t)len + 1);
    if (buf == NULL || (len && xh_io(fd, buf, len, 0, dl) != 0)) {
        duet_free(buf);
        return -1;
    }
    buf[len] = '\0';
    *buf_p = buf;
    *len_p = len;
    return 0;
}

static inline int xh_chan_say(int fd, const char *word)
{
    return xh_chan_send(fd, word, (uint32_t)strlen(word));
}

/* Wait for exactly `word`. */
static inline int xh_chan_expect(int fd, const char *word, int timeout_ms)
{
    void *buf;
    uint32_t len;
    int ok;
    if (xh_chan_recv(fd, &buf, &len, timeout_ms) != 0) {
        xh_fail("channel: no '%s' within %d ms", word, timeout_ms);
        return -1;
    }
    ok = len == strlen(word) && memcmp(buf, word, len) == 0;
    if (!ok)
        xh_fail("channel: got '%s', expected '%s'", (char *)buf, word);
    duet_free(buf);
    return ok ? 0 : -1;
}

/* ---- KV contents ---------------------------------------------------------------------- */

static inline uint32_t xh_hash(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* The element for (layer, kv, global head, token position, dim). */
static inline uint32_t xh_pattern(int layer, int kv, int gh, int64_t pos, int dim)
{
    uint64_t key = ((uint64_t)layer << 52) ^ ((uint64_t)kv << 51) ^ ((uint64_t)gh << 40) ^
                   ((uint64_t)(pos & 0xffffff) << 16) ^ (uint64_t)dim;
    return xh_hash(key);
}

static inline void xh_store(unsigned char *p, uint32_t v, int elem)
{
    for (int b = 0; b < elem; b++)
        p[b] = (unsigned char)(v >> (8 * (b & 3)));
}

/* Fill page `page` of a rank (first global head head0) with the pattern for
 * token positions pos0 + slot. */
static inline void xh_fill_page(const duet_kv_layout_t *l, unsigned char *base, int head0, int page,
                                int64_t pos0)
{
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < l->n_kv_heads; h++) {
                unsigned char *p = base + duet_kv_offset(l, layer, kv, page, h);
                for (int t = 0; t < l->page_size; t++)
                    for (int d = 0; d < l->head_dim; d++, p += l->elem_size)
                        xh_store(p, xh_pattern(layer, kv, head0 + h, pos0 + t, d), l->elem_size);
            }
}

/* Check a page against the pattern; returns 0 or reports the first miss. */
static inline int xh_check_page(const duet_kv_layout_t *l, const unsigned char *base, int head0,
                                int page, int64_t pos0, const char *what)
{
    unsigned char want[8];
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < l->n_kv_heads; h++) {
                const unsigned char *p = base + duet_kv_offset(l, layer, kv, page, h);
                for (int t = 0; t < l->page_size; t++)
                    for (int d = 0; d < l->head_dim; d++, p += l->elem_size) {
                        xh_store(want, xh_pattern(layer, kv, head0 + h, pos0 + t, d), l->elem_size);
                        if (memcmp(p, want, (size_t)l->elem_size) != 0) {
                            xh_fail("%s: page %d layer %d %c head %d (global %d) token %lld dim "
                                    "%d is wrong",
                                    what, page, layer, kv ? 'V' : 'K', h, head0 + h,
                                    (long long)(pos0 + t), d);
                            return -1;
                        }
                    }
            }
    return 0;
}

/* Every byte of the page in every plane equals `byte`. */
static inline int xh_page_is(const duet_kv_layout_t *l, const unsigned char *base, int page,
                             unsigned char byte)
{
    size_t n = duet_kv_page_bytes(l);
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++) {
            const unsigned char *p = base + duet_kv_offset(l, layer, kv, page, 0);
            for (size_t i = 0; i < n; i++)
                if (p[i] != byte)
                    return 0;
        }
    return 1;
}

/* n page ids out of a pool of `pool` pages, scattered: blocks of `block`
 * consecutive ids in a shuffled block order, starting after `skip` blocks
 * of that order (so requests with different skips are disjoint). */
static inline void xh_pages(int32_t *out, int n, int pool, int block, uint64_t seed, int skip)
{
    int nb = pool / block, k = 0;
    int *order = malloc(sizeof(int) * (size_t)nb);
    for (int i = 0; i < nb; i++)
        order[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(xh_hash(seed + (uint64_t)i) % (uint32_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int b = skip; b < nb && k < n; b++)
        for (int i = 0; i < block && k < n; i++)
            out[k++] = order[b] * block + i;
    free(order);
}

/* ---- one daemon side in a child ----------------------------------------------------------- */

typedef struct {
    duet_xfer_role_t role;
    int tp, remote_tp, kv_heads;
    duet_kv_layout_t layout; /* n_kv_heads filled by xh_side_start */
    duet_dtype_t dtype;
    uint64_t fingerprint;
    const char *tls;
    int early_ttl_ms;
    int registered; /* pools from our allocator + duet_xfer_pool_register */
    int no_pools;   /* the caller sets each rank's pool up itself (device pools) */
    duet_xfer_t *x;
    void *owned[DUET_TP_MAX];
    unsigned char *base[DUET_TP_MAX];
    duet_xfer_peer_t *peers[DUET_TP_MAX][DUET_TP_MAX]; /* [local rank][remote rank] */
    long alloc_live0;
} xh_side_t;

static inline int xh_side_start(xh_side_t *sd)
{
    duet_xfer_config_t cfg;
    int h0, nh;
    sd->alloc_live0 = duet_alloc_live();
    duet_kv_heads_owned(sd->kv_heads, sd->tp, 0, &h0, &nh);
    sd->layout.n_kv_heads = nh;
    memset(&cfg, 0, sizeof(cfg));
    cfg.role = sd->role;
    cfg.tp = sd->tp;
    cfg.kv_heads = sd->kv_heads;
    cfg.dtype = sd->dtype;
    cfg.layout = sd->layout;
    cfg.model_fingerprint = sd->fingerprint;
    cfg.tls = sd->tls;
    cfg.early_ttl_ms = sd->early_ttl_ms;
    XH_OK(duet_xfer_create(&cfg, &sd->x));
    for (int r = 0; r < sd->tp && !sd->no_pools; r++) {
        size_t bytes = duet_kv_total_bytes(&sd->layout);
        void *base;
        if (sd->registered) {
            sd->owned[r] = base = duet_aligned_alloc(4096, bytes);
            XH_CHECK(base != NULL, "out of memory");
            XH_OK(duet_xfer_pool_register(duet_xfer_rank(sd->x, r), base, bytes));
        } else {
            XH_OK(duet_xfer_pool_alloc(duet_xfer_rank(sd->x, r), bytes, &base));
        }
        sd->base[r] = base;
    }
    return 0;
}

/* Send this side's descriptors, receive the other side's and connect every
 * local rank to every remote rank. */
static inline int xh_side_connect(xh_side_t *sd, int fd)
{
    void *blobs[DUET_TP_MAX];
    uint32_t lens[DUET_TP_MAX];
    for (int r = 0; r < sd->tp; r++) {
        void *blob;
        size_t len;
        XH_OK(duet_xfer_desc_pack(duet_xfer_rank(sd->x, r), &blob, &len));
        XH_CHECK(xh_chan_send(fd, blob, (uint32_t)len) == 0, "sending descriptor %d", r);
        duet_free(blob);
    }
    for (int q = 0; q < sd->remote_tp; q++)
        XH_CHECK(xh_chan_recv(fd, &blobs[q], &lens[q], 20000) == 0, "receiving descriptor %d", q);
    for (int r = 0; r < sd->tp; r++)
        for (int q = 0; q < sd->remote_tp; q++) {
            duet_xfer_desc_info_t info;
            XH_OK(duet_xfer_desc_peek(blobs[q], lens[q], &info));
            XH_CHECK(info.rank == q, "descriptor %d names rank %d", q, info.rank);
            XH_OK(duet_xfer_peer_connect(duet_xfer_rank(sd->x, r), blobs[q], lens[q],
                                         duet_deadline_in_ms(15000), &sd->peers[r][q]));
        }
    for (int q = 0; q < sd->remote_tp; q++)
        duet_free(blobs[q]);
    return 0;
}

static inline int xh_side_stop(xh_side_t *sd)
{
    duet_xfer_destroy(sd->x);
    sd->x = NULL;
    for (int r = 0; r < sd->tp; r++) {
        duet_aligned_free(sd->owned[r]);
        sd->owned[r] = NULL;
    }
    XH_CHECK(duet_alloc_live() == sd->alloc_live0, "%ld blocks leaked",
             duet_alloc_live() - sd->alloc_live0);
    return 0;
}

#endif
