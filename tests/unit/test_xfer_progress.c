/* transfer/xfer, progress messages of packed sends (duet_xfer_send_t
 * progress_layers, duet_xfer_expect_t progress) between real processes, on
 * every transport under test (sm,self and tcp,self, or DUET_XFER_TLS
 * alone), for the plans 1x2, 2x1, 2x2 and 4x2 (without and with
 * replication on prefill).
 *
 * The prefill child packs and releases one layer at a time per sender, the
 * senders skewed (sender 0's layer l, a short sleep, sender 1's layer l,
 * ...), so that a progress message sent before its data landed, or one
 * receiver told of a sender's layers before another sender's, shows; it
 * releases the next layer once the sender posted the last one's puts, so
 * every chunk is one layer.  The
 * decode child fills its pool and staging arena with junk, expects packed
 * with a progress callback that records the layers it is told of and, at
 * each call, snapshots the rank's staging.  Once a request completed:
 *  - every rank heard at least one call; the values rise strictly, lie in
 *    [k, layers) (k = progress_layers) and, from a single sender, at
 *    least k apart (the sender announces at least k layers after its last
 *    announcement; the least over several senders may rise by less); with
 *    chunks of one layer they are multiples of k (from a single sender
 *    k, 2k, ... exactly) ending at the last multiple below the layers;
 *  - the snapshot at each call equals the final staging over planes
 *    [0, 2 * value) of every block the rank receives: nothing announced
 *    was still in flight;
 *  - no call came after the completion, the progress_received statistic
 *    counts the calls and nothing was dropped as invalid; prefill's
 *    progress_sent is at least the calls;
 *  - unpacking every layer reproduces every byte of the request's pages.
 * Also: progress_layers = 0 sends no progress and calls nothing; an
 * expectation without a callback completes as usual against a sender with
 * progress; a per-page send ignores progress_layers (and a per-page
 * expectation its callback); a cancelled expectation hears nothing after
 * the cancellation, though messages come; progress_layers < 0 is refused
 * at begin. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "kv/copy.h"
#include "tests/integration/xfer/xfer_scenes.h"
#include "transfer/xfer_pack.h"

#define PG_LAYERS 8    /* overrides the scenes' LAYERS: room for progress */
#define PG_PS     16   /* tokens a page */
#define PG_N      7    /* pages a request (100 tokens) */
#define PG_AREA   64   /* request pages lie in [0, PG_AREA) */
#define PG_SLOT   8    /* staging units a request */
#define PG_SKEW   2000 /* us between one sender's release and the next's */

/* The requests of a pair, each on its own pages and staging (q = index). */
static const struct {
    int packed;   /* DUET_XFER_SEND_PACKED / DUET_XFER_EXPECT_PACKED */
    int progress; /* the sends' progress_layers */
    int callback; /* the expectations have a progress callback */
    int cancel;   /* decode cancels after the first progress call */
} cases[] = {
    {1, 1, 1, 0}, /* every layer announced */
    {1, 3, 1, 0}, /* every third */
    {1, 0, 1, 0}, /* none asked for */
    {1, 1, 0, 0}, /* announced to an expectation that does not listen */
    {0, 1, 1, 0}, /* per-page: progress_layers ignored */
    {1, 1, 1, 1}, /* no call after the cancellation */
};
#define PG_CASES ((int)(sizeof(cases) / sizeof(cases[0])))

static void pg_pages(int32_t *pages, int prefill, int q)
{
    if (prefill)
        duet_testkit_pages(pages, PG_N, PG_AREA, 3, 505, q * ((PG_N + 2) / 3));
    else
        duet_testkit_pages(pages, PG_N, PG_AREA, 4, 606, q * ((PG_N + 3) / 4));
}

static int32_t pg_stage(int prefill, int q)
{
    return q * PG_SLOT + (prefill ? 0 : 1);
}

static uint64_t pg_id(int q)
{
    return 7000 + (uint64_t)q;
}

static void pg_side_init(duet_testkit_side_t *sd, const spec_t *sp, duet_xfer_role_t role)
{
    side_init(sd, sp, role, PG_PS);
    sd->layout.n_layers = PG_LAYERS;
    sd->layout.n_pages = PG_AREA;
    sd->stage_units = PG_CASES * PG_SLOT + 1;
}

/* Pack (prefill rank `rank`, the runs it sends) or unpack (decode rank
 * `rank`, the runs it receives) request q's layers [l0, l1). */
static int pg_copy(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int rank, int q,
                   int unpack, int l0, int l1)
{
    const duet_slice_run_t *runs;
    int n_runs = unpack ? duet_slice_plan_dst_runs(plan, rank, &runs)
                        : duet_slice_plan_src_runs(plan, rank, &runs);
    duet_kv_copy_t *copies =
        duet_malloc(sizeof(*copies) * ((size_t)PG_N * (size_t)duet_xfer_pack_slots(runs, n_runs)));
    int32_t pages[PG_N];
    int nc;
    DUET_TESTKIT_CHECK(copies != NULL, "out of memory");
    pg_pages(pages, !unpack, q);
    nc = duet_xfer_pack_copies(&sd->layout, pages, PG_N, pg_stage(!unpack, q), runs, n_runs, unpack,
                               copies);
    for (int layer = l0; layer < l1; layer++)
        duet_kv_copy_apply_host(&sd->layout, sd->base[rank], layer, copies, nc);
    duet_free(copies);
    return 0;
}

static duet_xfer_stats_t pg_stats(duet_testkit_side_t *sd, int rank)
{
    duet_xfer_stats_t st;
    duet_xfer_rank_stats(duet_xfer_rank(sd->x, rank), &st);
    return st;
}

static uint64_t pg_progress_sent(duet_testkit_side_t *sd)
{
    uint64_t n = 0;
    for (int s = 0; s < sd->tp; s++)
        n += pg_stats(sd, s).progress_sent;
    return n;
}

/* ---- prefill ------------------------------------------------------------------------------ */

static duet_xfer_send_t pg_send_desc(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int s,
                                     int q, int32_t *src, int32_t *dst)
{
    duet_xfer_send_t x;
    pg_pages(src, 1, q);
    pg_pages(dst, 0, q);
    memset(&x, 0, sizeof(x));
    x.transfer_id = pg_id(q);
    x.plan = plan;
    x.peers = sd->peers[s];
    x.src_pages = src;
    x.dst_pages = dst;
    x.n_pages = PG_N;
    x.flags = cases[q].packed ? DUET_XFER_SEND_PACKED : 0;
    x.src_stage0 = pg_stage(1, q);
    x.dst_stage0 = pg_stage(0, q);
    x.progress_layers = cases[q].progress;
    x.deadline_ns = duet_deadline_in_ms(WAIT_MS);
    return x;
}

/* progress_layers < 0 is refused before anything is sent, packed or not. */
static int pg_refuse(duet_testkit_side_t *sd, const duet_slice_plan_t *plan)
{
    for (int packed = 0; packed < 2; packed++) {
        int32_t a[PG_N], b[PG_N];
        duet_xfer_send_t x = pg_send_desc(sd, plan, 0, 0, a, b);
        duet_status_t st;
        x.transfer_id = 6999;
        x.flags = packed ? DUET_XFER_SEND_PACKED : 0;
        x.progress_layers = -1;
        duet_error_clear();
        st = duet_xfer_send_begin(duet_xfer_rank(sd->x, 0), &x);
        DUET_TESTKIT_CHECK(st == DUET_ERR_INVALID &&
                               strstr(duet_error_msg(), "request 6999: progress_layers -1"),
                           "progress_layers -1 (packed %d): %s '%s'", packed, duet_status_name(st),
                           duet_error_msg());
    }
    return 0;
}

/* Wait until prefill rank s posted `chunks` chunks (a put per run each),
 * so that every chunk is one layer and announcements fall on multiples
 * of progress_layers whatever the machine's load. */
static int pg_wait_posted(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int s,
                          uint64_t puts0, int chunks)
{
    const duet_slice_run_t *runs;
    uint64_t want = (uint64_t)duet_slice_plan_src_runs(plan, s, &runs) * (uint64_t)chunks;
    int64_t dl = duet_deadline_in_ms(WAIT_MS);
    while (pg_stats(sd, s).puts - puts0 < want && duet_now_ns() < dl)
        usleep(100);
    DUET_TESTKIT_CHECK(
        pg_stats(sd, s).puts - puts0 >= want, "prefill rank %d: %llu puts posted, expected %llu", s,
        (unsigned long long)(pg_stats(sd, s).puts - puts0), (unsigned long long)want);
    return 0;
}

/* Request q: begin on every sender, then per layer and sender pack and
 * release it (skewed), then end; every send must succeed (or, when decode
 * cancels, end cancelled: the last two layers wait for its word, so that
 * a progress message comes after the cancellation). */
static int pg_send(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int fd, int q)
{
    uint64_t puts0[DUET_TP_MAX];
    for (int s = 0; s < sd->tp; s++) {
        int32_t a[PG_N], b[PG_N];
        duet_xfer_send_t x = pg_send_desc(sd, plan, s, q, a, b);
        DUET_TESTKIT_OK(duet_xfer_send_begin(duet_xfer_rank(sd->x, s), &x));
        puts0[s] = pg_stats(sd, s).puts;
    }
    for (int l = 0; l < PG_LAYERS; l++)
        for (int s = 0; s < sd->tp; s++) {
            if (cases[q].cancel && l == PG_LAYERS - 2 && s == 0)
                DUET_TESTKIT_CHECK(duet_testkit_chan_expect(fd, "cancelled", WAIT_MS) == 0,
                                   "decode did not cancel request %d", q);
            if (cases[q].packed && pg_copy(sd, plan, s, q, 0, l, l + 1))
                return 1;
            DUET_TESTKIT_OK(duet_xfer_send_layers(duet_xfer_rank(sd->x, s), pg_id(q), l, l + 1));
            if (cases[q].packed && pg_wait_posted(sd, plan, s, puts0[s], l + 1))
                return 1;
            usleep(PG_SKEW);
        }
    for (int s = 0; s < sd->tp; s++)
        DUET_TESTKIT_OK(duet_xfer_send_end(duet_xfer_rank(sd->x, s), pg_id(q), DUET_OK, TOKEN));
    for (int s = 0; s < sd->tp; s++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_send_wait(duet_xfer_rank(sd->x, s), pg_id(q),
                                            duet_deadline_in_ms(WAIT_MS), &res));
        int recv[DUET_TP_MAX]; /* a rank that sends nothing is done at once */
        int sends = duet_slice_plan_receivers(plan, s, recv) > 0;
        DUET_TESTKIT_CHECK(
            cases[q].cancel && sends ? res.status == DUET_ERR_CANCELLED : res.status == DUET_OK,
            "prefill rank %d request %d: %s (%s)", s, q, duet_status_name(res.status), res.detail);
    }
    return 0;
}

/* Prefill's progress_sent for request q against the calls decode heard
 * (a message's send completes after it left: wait for the count). */
static int pg_check_sent(duet_testkit_side_t *sd, int q, uint64_t before, long calls)
{
    int64_t dl = duet_deadline_in_ms(5000);
    uint64_t want =
        cases[q].packed && cases[q].progress > 0 ? (uint64_t)(calls > 0 ? calls : 1) : 0;
    uint64_t sent = pg_progress_sent(sd) - before;
    while (sent < want && duet_now_ns() < dl) {
        usleep(1000);
        sent = pg_progress_sent(sd) - before;
    }
    if (want == 0)
        DUET_TESTKIT_CHECK(sent == 0, "request %d (progress_layers %d, %s): %llu progress sent", q,
                           cases[q].progress, cases[q].packed ? "packed" : "per-page",
                           (unsigned long long)sent);
    else
        DUET_TESTKIT_CHECK(sent >= want,
                           "request %d: %llu progress messages sent, decode heard %ld calls", q,
                           (unsigned long long)sent, calls);
    return 0;
}

static int pg_prefill(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    pg_side_init(&sd, sp, DUET_XFER_PREFILL);
    if (duet_testkit_side_start(&sd) || duet_testkit_side_connect(&sd, sp->fd_p))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
    /* junk everywhere, the pattern in every request's pages */
    for (int r = 0; r < sd.tp; r++) {
        int h0 = head0_of(sd.kv_heads, sd.tp, r);
        for (int pg = 0; pg < PG_AREA; pg++)
            duet_testkit_fill_page(&sd.layout, sd.base[r], h0, pg, 1000000 + (int64_t)pg * PG_PS);
        for (int q = 0; q < PG_CASES; q++) {
            int32_t pages[PG_N];
            pg_pages(pages, 1, q);
            for (int i = 0; i < PG_N; i++)
                duet_testkit_fill_page(&sd.layout, sd.base[r], h0, pages[i], (int64_t)i * PG_PS);
        }
    }
    if (pg_refuse(&sd, plan))
        return 1;
    for (int q = 0; q < PG_CASES; q++) {
        uint64_t before = pg_progress_sent(&sd);
        void *msg = NULL;
        uint32_t len;
        long calls = -1;
        int bad;
        DUET_TESTKIT_CHECK(duet_testkit_chan_expect(sp->fd_p, "go", WAIT_MS) == 0,
                           "decode not ready for request %d", q);
        if (pg_send(&sd, plan, sp->fd_p, q))
            return 1;
        DUET_TESTKIT_CHECK(duet_testkit_chan_recv(sp->fd_p, &msg, &len, WAIT_MS) == 0,
                           "decode did not check request %d", q);
        if (sscanf(msg, "calls %ld", &calls) != 1)
            calls = -1;
        duet_free(msg);
        DUET_TESTKIT_CHECK(calls >= 0, "request %d: decode failed", q);
        bad = pg_check_sent(&sd, q, before, calls);
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(sp->fd_p, bad ? "failed" : "checked") == 0,
                           "channel");
        if (bad)
            return 1;
    }
    return scene_stop(&sd, plan);
}

/* ---- decode ------------------------------------------------------------------------------- */

typedef struct {
    uint64_t id;
    const unsigned char *region; /* the rank's staging of the request */
    size_t region_off, region_len;
    atomic_int n_calls;
    atomic_int ended; /* set once the rank's completion was delivered */
    atomic_int late, wrong_id, overflow;
    int values[PG_LAYERS];
    unsigned char *snap[PG_LAYERS];
} pg_rec_t;

/* The expectation's progress callback (the rank's progress thread). */
static void pg_on_progress(void *arg, uint64_t transfer_id, int layers)
{
    pg_rec_t *rc = arg;
    int i = atomic_load(&rc->n_calls);
    if (transfer_id != rc->id)
        atomic_fetch_add(&rc->wrong_id, 1);
    if (atomic_load(&rc->ended))
        atomic_fetch_add(&rc->late, 1);
    if (i >= PG_LAYERS) {
        atomic_fetch_add(&rc->overflow, 1);
        return;
    }
    rc->values[i] = layers;
    memcpy(rc->snap[i], rc->region + rc->region_off, rc->region_len);
    atomic_store(&rc->n_calls, i + 1);
}

/* The values rank d heard for request q. */
static int pg_check_values(const duet_slice_plan_t *plan, int d, int q, const pg_rec_t *rc)
{
    int k = cases[q].progress, n = atomic_load(&rc->n_calls), senders[DUET_TP_MAX];
    int single = duet_slice_plan_senders(plan, d, senders) == 1;
    DUET_TESTKIT_CHECK(atomic_load(&rc->wrong_id) == 0 && atomic_load(&rc->overflow) == 0 &&
                           atomic_load(&rc->late) == 0,
                       "decode rank %d request %d: %d calls for another id, %d too many, %d after "
                       "the completion",
                       d, q, atomic_load(&rc->wrong_id), atomic_load(&rc->overflow),
                       atomic_load(&rc->late));
    if (!cases[q].callback)
        return 0;
    if (!cases[q].packed || k == 0) {
        DUET_TESTKIT_CHECK(n == 0, "decode rank %d request %d (progress_layers %d, %s): %d calls",
                           d, q, k, cases[q].packed ? "packed" : "per-page", n);
        return 0;
    }
    DUET_TESTKIT_CHECK(n >= 1, "decode rank %d request %d (progress_layers %d): no progress", d, q,
                       k);
    for (int i = 0; i < n; i++) {
        int v = rc->values[i], prev = i > 0 ? rc->values[i - 1] : 0;
        DUET_TESTKIT_CHECK(v >= k && v < PG_LAYERS && v > prev,
                           "decode rank %d request %d (progress_layers %d): call %d says %d "
                           "layers after %d",
                           d, q, k, i, v, prev);
        DUET_TESTKIT_CHECK(!single || v - prev >= k,
                           "decode rank %d request %d (one sender, progress_layers %d): call %d "
                           "says %d layers, only %d after %d",
                           d, q, k, i, v, v - prev, prev);
        /* chunks of one layer (pg_wait_posted): every sender announces
         * k, 2k, ..., so the least over them is one of those */
        DUET_TESTKIT_CHECK(v % k == 0 && (!single || v == (i + 1) * k),
                           "decode rank %d request %d (progress_layers %d, %s sender): call %d "
                           "says %d layers",
                           d, q, k, single ? "one" : "several", i, v);
    }
    /* each sender's last announcement came before its notification */
    DUET_TESTKIT_CHECK(cases[q].cancel || rc->values[n - 1] == (PG_LAYERS - 1) / k * k,
                       "decode rank %d request %d (progress_layers %d): the last call says %d "
                       "layers, expected %d",
                       d, q, k, rc->values[n - 1], (PG_LAYERS - 1) / k * k);
    return 0;
}

/* Each snapshot of rank d equals the final staging over the planes it
 * announced, in every block the rank receives. */
static int pg_check_snaps(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int d, int q,
                          const pg_rec_t *rc)
{
    const duet_slice_run_t *runs;
    int n_runs = duet_slice_plan_dst_runs(plan, d, &runs);
    size_t hb = duet_kv_head_bytes(&sd->layout);
    for (int i = 0; i < atomic_load(&rc->n_calls); i++)
        for (int j = 0; j < n_runs; j++)
            for (int p = 0; p < 2 * rc->values[i]; p++) {
                uint64_t off = duet_xfer_pack_block(&sd->layout, PG_N, pg_stage(0, q),
                                                    runs[j].dst_head, runs[j].n_heads, p);
                size_t len = (size_t)runs[j].n_heads * PG_N * hb;
                DUET_TESTKIT_CHECK(off >= rc->region_off &&
                                       off + len <= rc->region_off + rc->region_len,
                                   "block outside the staging region");
                DUET_TESTKIT_CHECK(
                    memcmp(rc->snap[i] + (off - rc->region_off), sd->base[d] + off, len) == 0,
                    "decode rank %d request %d: at progress call %d (%d layers) "
                    "plane %d of the run from prefill rank %d had not landed yet",
                    d, q, i, rc->values[i], p, runs[j].src_rank);
            }
    return 0;
}

/* Request q's pages on rank d (packed: unpacked first) hold the pattern. */
static int pg_verify(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int d, int q)
{
    int32_t pages[PG_N];
    int h0 = head0_of(sd->kv_heads, sd->tp, d);
    if (cases[q].packed && pg_copy(sd, plan, d, q, 1, 0, PG_LAYERS))
        return 1;
    pg_pages(pages, 0, q);
    for (int i = 0; i < PG_N; i++) {
        char what[64];
        snprintf(what, sizeof(what), "decode rank %d request %d", d, q);
        if (duet_testkit_check_page(&sd->layout, sd->base[d], h0, pages[i], (int64_t)i * PG_PS,
                                    what) != 0)
            return 1;
    }
    return 0;
}

/* Expect request q on every rank (recs[d]: rank d's record, ready). */
static int pg_expect(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int q, pg_rec_t *recs)
{
    for (int d = 0; d < sd->tp; d++) {
        int32_t pages[PG_N];
        duet_xfer_expect_t e;
        pg_pages(pages, 0, q);
        memset(&e, 0, sizeof(e));
        e.transfer_id = pg_id(q);
        e.plan = plan;
        e.peers = sd->peers[d];
        e.pages = pages;
        e.n_pages = PG_N;
        e.flags = cases[q].packed ? DUET_XFER_EXPECT_PACKED : 0;
        e.dst_stage0 = pg_stage(0, q);
        e.deadline_ns = duet_deadline_in_ms(WAIT_MS);
        if (cases[q].callback) {
            e.progress = pg_on_progress;
            e.progress_arg = &recs[d];
        }
        DUET_TESTKIT_OK(duet_xfer_recv_expect(duet_xfer_rank(sd->x, d), &e));
    }
    return 0;
}

/* Wait for request q on every rank and check it; *calls_p: the calls. */
static int pg_check(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int q, pg_rec_t *recs,
                    const duet_xfer_stats_t *st0, long *calls_p)
{
    *calls_p = 0;
    for (int d = 0; d < sd->tp; d++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_recv_wait(duet_xfer_rank(sd->x, d), pg_id(q),
                                            duet_deadline_in_ms(WAIT_MS), &res));
        atomic_store(&recs[d].ended, 1);
        DUET_TESTKIT_CHECK(res.status == DUET_OK && res.first_token == TOKEN,
                           "decode rank %d request %d: %s", d, q, res.detail);
    }
    for (int d = 0; d < sd->tp; d++) {
        duet_xfer_stats_t st = pg_stats(sd, d);
        int n = atomic_load(&recs[d].n_calls);
        if (pg_check_values(plan, d, q, &recs[d]) || pg_check_snaps(sd, plan, d, q, &recs[d]) ||
            pg_verify(sd, plan, d, q))
            return 1;
        DUET_TESTKIT_CHECK(st.progress_received - st0[d].progress_received == (uint64_t)n &&
                               st.dropped_invalid == st0[d].dropped_invalid,
                           "decode rank %d request %d: %d calls, %llu progress received, %llu "
                           "dropped as invalid",
                           d, q, n,
                           (unsigned long long)(st.progress_received - st0[d].progress_received),
                           (unsigned long long)(st.dropped_invalid - st0[d].dropped_invalid));
        *calls_p += n;
    }
    return 0;
}

/* Cancel request q on every rank once each heard a progress call. */
static int pg_cancel(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int fd, int q,
                     pg_rec_t *recs, long *calls_p)
{
    int64_t dl = duet_deadline_in_ms(WAIT_MS);
    *calls_p = 0;
    for (int d = 0; d < sd->tp; d++) {
        duet_xfer_result_t res;
        while (atomic_load(&recs[d].n_calls) == 0 && duet_now_ns() < dl)
            usleep(200);
        DUET_TESTKIT_OK(duet_xfer_recv_cancel(duet_xfer_rank(sd->x, d), pg_id(q)));
        atomic_store(&recs[d].ended, 1);
        DUET_TESTKIT_CHECK(duet_xfer_recv_wait(duet_xfer_rank(sd->x, d), pg_id(q),
                                               duet_deadline_in_ms(10), &res) == DUET_ERR_NOT_FOUND,
                           "decode rank %d request %d: still there after its cancellation", d, q);
        if (pg_check_values(plan, d, q, &recs[d]))
            return 1;
        *calls_p += atomic_load(&recs[d].n_calls);
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(fd, "cancelled") == 0, "channel");
    return 0;
}

/* Rank d's record of request q, its staging junk. */
static int pg_rec_init(duet_testkit_side_t *sd, int d, int q, pg_rec_t *rc)
{
    const duet_kv_layout_t *l = &sd->layout;
    memset(rc, 0, sizeof(*rc));
    rc->id = pg_id(q);
    rc->region = sd->base[d];
    rc->region_off =
        duet_kv_total_bytes(l) + (size_t)pg_stage(0, q) * duet_xfer_stage_unit_bytes(l);
    rc->region_len =
        (size_t)duet_xfer_pack_units(l, PG_N, l->n_kv_heads) * duet_xfer_stage_unit_bytes(l);
    memset(sd->base[d] + rc->region_off, 0xEE, rc->region_len);
    for (int i = 0; i < PG_LAYERS; i++)
        DUET_TESTKIT_CHECK((rc->snap[i] = duet_malloc(rc->region_len)) != NULL, "out of memory");
    return 0;
}

static void pg_rec_free(pg_rec_t *rc)
{
    for (int i = 0; i < PG_LAYERS; i++)
        duet_free(rc->snap[i]);
}

/* Request q end to end on decode's side: 0, or 1 after reporting (then
 * prefill hears "failed"). */
static int pg_receive(duet_testkit_side_t *sd, const duet_slice_plan_t *plan, int fd, int q)
{
    pg_rec_t recs[DUET_TP_MAX];
    duet_xfer_stats_t st0[DUET_TP_MAX];
    int rc = 0, d;
    long calls = -1;
    char word[32];
    memset(recs, 0, sizeof(recs));
    for (d = 0; d < sd->tp && rc == 0; d++) {
        rc = pg_rec_init(sd, d, q, &recs[d]);
        st0[d] = pg_stats(sd, d);
    }
    if (rc == 0)
        rc = pg_expect(sd, plan, q, recs);
    if (rc == 0 && duet_testkit_chan_say(fd, "go") != 0)
        rc = 1;
    if (rc == 0)
        rc = cases[q].cancel ? pg_cancel(sd, plan, fd, q, recs, &calls)
                             : pg_check(sd, plan, q, recs, st0, &calls);
    snprintf(word, sizeof(word), rc == 0 ? "calls %ld" : "failed", calls);
    if (duet_testkit_chan_say(fd, word) != 0 ||
        (rc == 0 && duet_testkit_chan_expect(fd, "checked", WAIT_MS) != 0))
        rc = 1;
    /* prefill ended its sends and checked its statistics meanwhile (and
     * after a cancellation its last progress messages had time to come):
     * no call came since */
    if (rc == 0 && cases[q].cancel)
        usleep(50000);
    for (d = 0; d < sd->tp && rc == 0; d++)
        if (atomic_load(&recs[d].late) != 0 || atomic_load(&recs[d].overflow) != 0) {
            duet_testkit_fail("decode rank %d request %d: a progress call after the completion", d,
                              q);
            rc = 1;
        }
    for (d = 0; d < sd->tp; d++)
        pg_rec_free(&recs[d]);
    return rc;
}

static int pg_decode(void *arg)
{
    const spec_t *sp = arg;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    pg_side_init(&sd, sp, DUET_XFER_DECODE);
    if (duet_testkit_side_start(&sd))
        return 1;
    for (int d = 0; d < sd.tp; d++) /* planes and arena */
        memset(sd.base[d], 0xEE,
               duet_kv_total_bytes(&sd.layout) +
                   (size_t)sd.stage_units * duet_xfer_stage_unit_bytes(&sd.layout));
    if (duet_testkit_side_connect(&sd, sp->fd_d))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(sp->P, sp->D, sp->H, &plan));
    for (int q = 0; q < PG_CASES; q++)
        if (pg_receive(&sd, plan, sp->fd_d, q))
            return 1;
    return scene_stop(&sd, plan);
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_progress(void **state)
{
    /* P x D x H: one sender per receiver (1x2, 2x2), two (2x1, 4x2 with 8
     * heads), replication on prefill (4x2 with 2 heads) */
    static const int plans[][3] = {{1, 2, 2}, {2, 1, 2}, {2, 2, 2}, {4, 2, 2}, {4, 2, 8}};
    (void)state;
    for (int t = 0; t < n_tls; t++)
        for (size_t k = 0; k < sizeof(plans) / sizeof(plans[0]); k++) {
            spec_t sp = spec_of(plans[k][0], plans[k][1], plans[k][2], tls_list[t]);
            sp.reg_d = k == 1; /* a registered pool: puts not one-sided */
            pair_channels(&sp);
            run_pair(&sp, pg_prefill, pg_decode, 60000);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress),
    };
    xs_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
