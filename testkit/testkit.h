/* duet_testkit: the multi-process harness that the transfer engine's tests
 * (tests/unit/test_xfer_*.c) and benchmarks (bench/bench_*transfer.c) share.
 * Not part of any daemon.
 *
 *   processes  duet_testkit_spawn / duet_testkit_wait_all fork children and
 *              wait for them with a deadline: a child still running at the
 *              deadline is killed and reported, so a hang fails instead of
 *              hanging.
 *   channels   duet_testkit_chan_*: length-prefixed messages over a
 *              socketpair, every read with a deadline.
 *   KV pages   contents that encode (layer, K|V, global head, token position,
 *              dim), and scattered page lists.
 *   sides      duet_testkit_side_*: one daemon's transfer engine in a child:
 *              create, allocate pools, swap descriptors with the other child,
 *              connect every local rank to every remote one.
 *
 * UCX is only ever initialised in children: the parent stays fork-safe.
 * duet_testkit_fail may be called from any thread (reports may interleave);
 * a channel or a side is used by one thread at a time. */
#ifndef DUET_TESTKIT_TESTKIT_H
#define DUET_TESTKIT_TESTKIT_H

#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"
#include "kv/dtype.h"
#include "kv/heads.h"
#include "kv/layout.h"
#include "transfer/xfer.h"

#define DUET_TESTKIT_MAX_CHILD 8

/* ---- reporting ---------------------------------------------------------------------------- */

/* Print "[who pid N] FAIL: message" to stderr; who is the name the process
 * was spawned under ("parent" in the parent). */
void duet_testkit_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* In a function returning int: report and return 1 unless cond holds. */
#define DUET_TESTKIT_CHECK(cond, ...)                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            duet_testkit_fail("%s:%d: %s", __FILE__, __LINE__, #cond);                             \
            duet_testkit_fail(__VA_ARGS__);                                                        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* In a function returning int: report the error and return 1 unless expr
 * returns DUET_OK. */
#define DUET_TESTKIT_OK(expr)                                                                      \
    do {                                                                                           \
        duet_status_t duet_testkit_st_ = (expr);                                                   \
        if (duet_testkit_st_ != DUET_OK) {                                                         \
            duet_testkit_fail("%s:%d: %s: %s: %s", __FILE__, __LINE__, #expr,                      \
                              duet_status_name(duet_testkit_st_), duet_error_msg());               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* ---- processes ---------------------------------------------------------------------------- */

typedef int (*duet_testkit_child_cb)(void *arg);

/* Fork a child named `name` running fn(arg); its exit status is 0 when fn
 * returns 0, else 1.  The n_close descriptors of close_fds (-1 entries are
 * skipped: the parent's ends of channels) are closed in the child first.
 * Returns the child's pid (-1 when fork failed). */
pid_t duet_testkit_spawn(const char *name, duet_testkit_child_cb fn, void *arg,
                         const int *close_fds, int n_close);

/* Wait for n (at most DUET_TESTKIT_MAX_CHILD) children until deadline_ns
 * (duet_now_ns clock).  rc_out[i] is the exit code, 128 + signal when
 * killed, or -1 when it was still running at the deadline (then it is
 * killed).  Returns the number of children that did not exit 0. */
int duet_testkit_wait_all(const pid_t *pids, int n, int64_t deadline_ns, int *rc_out);

/* ---- channels ----------------------------------------------------------------------------- */

/* Send one message of len bytes (within 10 s).  0 or -1. */
int duet_testkit_chan_send(int fd, const void *buf, uint32_t len);

/* Receive one message into a duet_malloc'ed buffer with a NUL byte after
 * its len bytes (the caller frees it with duet_free).  0, or -1 when
 * nothing complete came within timeout_ms (then *buf_p is untouched). */
int duet_testkit_chan_recv(int fd, void **buf_p, uint32_t *len_p, int timeout_ms);

/* Send a NUL-terminated word (without the NUL). */
int duet_testkit_chan_say(int fd, const char *word);

/* Wait for exactly `word`: 0, or -1 after reporting what came instead. */
int duet_testkit_chan_expect(int fd, const char *word, int timeout_ms);

/* ---- KV page contents --------------------------------------------------------------------- */

/* Fill page `page` of a rank's pool at base (first global head head0) with
 * the pattern for token positions pos0 + slot. */
void duet_testkit_fill_page(const duet_kv_layout_t *l, unsigned char *base, int head0, int page,
                            int64_t pos0);

/* Check a page against the pattern: 0, or -1 after reporting the first
 * wrong element (prefixed with `what`). */
int duet_testkit_check_page(const duet_kv_layout_t *l, const unsigned char *base, int head0,
                            int page, int64_t pos0, const char *what);

/* 1 when every byte of the page, in every plane, equals `byte`, else 0. */
int duet_testkit_page_is(const duet_kv_layout_t *l, const unsigned char *base, int page,
                         unsigned char byte);

/* n page ids out of a pool of `pool` pages, scattered: blocks of `block`
 * consecutive ids in a shuffled block order, starting after `skip` blocks
 * of that order (so requests with different skips are disjoint). */
void duet_testkit_pages(int32_t *out, int n, int pool, int block, uint64_t seed, int skip);

/* ---- one daemon side in a child ----------------------------------------------------------- */

typedef struct {
    duet_xfer_role_t role;
    int tp, remote_tp, kv_heads;
    duet_kv_layout_t layout; /* n_kv_heads filled by duet_testkit_side_start */
    duet_dtype_t dtype;
    uint64_t fingerprint;
    const char *tls;
    int early_ttl_ms;
    int registered;  /* pools from our allocator + duet_xfer_pool_register */
    int no_pools;    /* the caller sets each rank's pool up itself (device pools) */
    int stage_units; /* a staging arena of that many units after each pool
                        (transfer/xfer_pack.h; 0: none) */
    duet_xfer_t *x;
    void *owned[DUET_TP_MAX];
    unsigned char *base[DUET_TP_MAX];
    duet_xfer_peer_t *peers[DUET_TP_MAX][DUET_TP_MAX]; /* [local rank][remote rank] */
    long alloc_live0;
} duet_testkit_side_t;

/* Create the side's transfer engine from the fields the caller set and,
 * unless no_pools, give every rank a pool.  0, or 1 after reporting. */
int duet_testkit_side_start(duet_testkit_side_t *sd);

/* Send this side's descriptors over fd, receive the other side's and
 * connect every local rank to every remote rank.  0, or 1 after reporting. */
int duet_testkit_side_connect(duet_testkit_side_t *sd, int fd);

/* Destroy the engine and the pools; 1 (after reporting) when blocks of
 * duet_malloc allocated since duet_testkit_side_start are still live. */
int duet_testkit_side_stop(duet_testkit_side_t *sd);

#endif
