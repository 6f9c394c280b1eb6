/* Transfer engine benchmark: plan-driven KV transfer between two processes
 * (a prefill daemon with P rank threads, a decode daemon with D), per page
 * and packed (transfer/xfer_pack.h), next to one single large put of the
 * same bytes over the same endpoint, and a plain in-process memcpy, all in
 * the same run.
 *
 * KV shape: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, page 16 tokens,
 * 2-byte elements: 128 KiB per token).  The plan-driven time runs from the
 * first post to the last acknowledgement on every prefill rank (puts, flush,
 * notification, the receiver's checks, ack); the single put is put + flush.
 * The packed time is end to end: from the start of the first layer's pack
 * (one thread per prefill rank packs layer by layer into staging and
 * releases each layer as it is packed, as the engine does) to the last
 * acknowledgement, plus the decode side's unpack (one thread per decode
 * rank, after all its ranks completed).  Page ids are consecutive on both
 * sides (the page allocator prefers contiguous runs); staging follows them.
 *
 *   bench_transfer [--tls LIST] [--plans PxD,...] [--tokens N,...] [--min-ms MS]
 *     --tls     transports, ';'-separated UCX_TLS values (default
 *               "sm,self;tcp,self")
 *     --plans   default 1x1,1x2,2x4,4x2,2x1
 *     --tokens  default 512,2048,8192
 *     --min-ms  measure each size at least this long (default 200; at least
 *               3 rounds of plan + put + memcpy, after a warm-up round)
 *     --tcp-max-tokens  skip larger sizes on tcp transports (default 2048:
 *               ~1 GB/s there, a 1 GiB request takes a second per round)
 *
 * Each (transport, plan) runs in a fresh pair of processes. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"
#include "kv/copy.h"
#include "testkit/testkit.h"
#include "transfer/slice_plan.h"
#include "transfer/xfer_pack.h"

#define B_LAYERS      32
#define B_HEADS       8
#define B_HEAD_DIM    128
#define B_PAGE        16
#define B_ELEM        2
#define B_TOKEN_BYTES ((size_t)B_LAYERS * 2 * B_HEADS * B_HEAD_DIM * B_ELEM)
#define B_MAX_SIZES   8
#define B_MAX_ITERS   50

typedef struct {
    const char *tls;
    int P, D;
    int tokens[B_MAX_SIZES];
    int n_tokens;
    int min_ms;
    int max_tokens; /* of this transport */
    int tcp_max_tokens;
    int fd_p, fd_d;
} bench_t;

static int max_pages(const bench_t *b)
{
    int m = 0;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] > m && b->tokens[i] <= b->max_tokens)
            m = b->tokens[i];
    return (m + B_PAGE - 1) / B_PAGE;
}

/* Every rank's pool can hold a whole request, so rank 0 can also take the
 * single large put, and holds a request and its staging. */
static int side_setup(duet_testkit_side_t *sd, const bench_t *b, duet_xfer_role_t role, int fd)
{
    int tp = role == DUET_XFER_PREFILL ? b->P : b->D;
    memset(sd, 0, sizeof(*sd));
    sd->role = role;
    sd->tp = tp;
    sd->remote_tp = role == DUET_XFER_PREFILL ? b->D : b->P;
    sd->kv_heads = B_HEADS;
    sd->layout.n_layers = B_LAYERS;
    sd->layout.page_size = B_PAGE;
    sd->layout.head_dim = B_HEAD_DIM;
    sd->layout.elem_size = B_ELEM;
    sd->layout.n_pages = max_pages(b) * (tp < 2 ? 2 : tp < B_HEADS ? tp : B_HEADS);
    sd->stage_units = sd->layout.n_pages;
    sd->dtype = DUET_DTYPE_BF16;
    sd->fingerprint = 0x11a3a3b8b0000001ULL;
    sd->tls = b->tls;
    if (duet_testkit_side_start(sd))
        return 1;
    /* Pages are faulted in by each size's untimed warm-up round. */
    return duet_testkit_side_connect(sd, fd);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    const bench_t *b;
    duet_testkit_side_t *sd;
    const duet_slice_plan_t *plan;
    int n_pages;
    size_t bytes;
    uint64_t puts, packed_puts;
    unsigned char *scratch;
    uint64_t next_id;
} run_t;

/* One prefill rank's packed send: pack layer l into staging, release it. */
typedef struct {
    run_t *rn;
    int s;
    uint64_t id;
    int32_t *pages;
    int failed;
} pack_job_t;

/* One plan-driven request; the decode side registered it before we start
 * the clock (it did so on "exp"), and reports back after its ranks ended. */
static int run_plan_setup(run_t *rn, uint64_t id, int packed)
{
    char msg[64];
    snprintf(msg, sizeof(msg), "exp %llu %d %d", (unsigned long long)id, rn->n_pages, packed);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(rn->b->fd_p, msg) == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(rn->b->fd_p, "ok", 60000) == 0,
                       "decode did not register");
    return 0;
}

static int32_t *seq_pages(int n)
{
    int32_t *p = duet_malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; p != NULL && i < n; i++)
        p[i] = i;
    return p;
}

static int run_plan_once(run_t *rn, uint64_t id)
{
    int32_t *pages = seq_pages(rn->n_pages);
    uint64_t puts = 0;
    DUET_TESTKIT_CHECK(pages != NULL, "out of memory");
    for (int s = 0; s < rn->b->P; s++) {
        duet_xfer_send_t x;
        memset(&x, 0, sizeof(x));
        x.transfer_id = id;
        x.plan = rn->plan;
        x.peers = rn->sd->peers[s];
        x.src_pages = pages;
        x.dst_pages = pages;
        x.n_pages = rn->n_pages;
        x.deadline_ns = duet_deadline_in_ms(60000);
        DUET_TESTKIT_OK(duet_xfer_send_post(duet_xfer_rank(rn->sd->x, s), &x, 1));
    }
    for (int s = 0; s < rn->b->P; s++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_send_wait(duet_xfer_rank(rn->sd->x, s), id,
                                            duet_deadline_in_ms(60000), &res));
        DUET_TESTKIT_CHECK(res.status == DUET_OK, "prefill rank %d: %s", s, res.detail);
        puts += res.puts;
    }
    duet_free(pages);
    rn->puts = puts;
    return 0;
}

static void *pack_main(void *arg)
{
    pack_job_t *j = arg;
    run_t *rn = j->rn;
    const duet_kv_layout_t *l = &rn->sd->layout;
    duet_xfer_rank_t *r = duet_xfer_rank(rn->sd->x, j->s);
    const duet_slice_run_t *runs;
    int n_runs = duet_slice_plan_src_runs(rn->plan, j->s, &runs), nc;
    duet_kv_copy_t *copies = duet_malloc(
        sizeof(*copies) * ((size_t)rn->n_pages * (size_t)duet_xfer_pack_slots(runs, n_runs) + 1));
    duet_xfer_send_t x;

    j->failed = 1;
    if (copies == NULL)
        return NULL;
    nc = duet_xfer_pack_copies(l, j->pages, rn->n_pages, 0, runs, n_runs, 0, copies);
    memset(&x, 0, sizeof(x));
    x.transfer_id = j->id;
    x.plan = rn->plan;
    x.peers = rn->sd->peers[j->s];
    x.src_pages = j->pages;
    x.dst_pages = j->pages;
    x.n_pages = rn->n_pages;
    x.flags = DUET_XFER_SEND_PACKED;
    x.src_stage0 = x.dst_stage0 = 0;
    x.deadline_ns = duet_deadline_in_ms(60000);
    if (duet_xfer_send_begin(r, &x) == DUET_OK) {
        int layer = 0;
        for (; layer < l->n_layers; layer++) {
            duet_kv_copy_apply_host(l, rn->sd->base[j->s], layer, copies, nc);
            if (duet_xfer_send_layers(r, j->id, layer, layer + 1) != DUET_OK)
                break;
        }
        if (layer == l->n_layers && duet_xfer_send_end(r, j->id, DUET_OK, 1) == DUET_OK)
            j->failed = 0;
    }
    if (j->failed)
        duet_testkit_fail("prefill rank %d: packed send: %s", j->s, duet_error_msg());
    duet_free(copies);
    return NULL;
}

/* The packed request: one pack-and-release thread per prefill rank. */
static int run_packed_once(run_t *rn, uint64_t id)
{
    pack_job_t jobs[B_HEADS * 8];
    pthread_t th[B_HEADS * 8];
    int32_t *pages = seq_pages(rn->n_pages);
    uint64_t puts = 0;
    int bad = 0;
    DUET_TESTKIT_CHECK(pages != NULL, "out of memory");
    for (int s = 0; s < rn->b->P; s++) {
        jobs[s] = (pack_job_t){.rn = rn, .s = s, .id = id, .pages = pages, .failed = 1};
        DUET_TESTKIT_CHECK(pthread_create(&th[s], NULL, pack_main, &jobs[s]) == 0, "thread");
    }
    for (int s = 0; s < rn->b->P; s++) {
        pthread_join(th[s], NULL);
        bad |= jobs[s].failed;
    }
    DUET_TESTKIT_CHECK(!bad, "a packed send could not be posted");
    for (int s = 0; s < rn->b->P; s++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_send_wait(duet_xfer_rank(rn->sd->x, s), id,
                                            duet_deadline_in_ms(60000), &res));
        DUET_TESTKIT_CHECK(res.status == DUET_OK, "prefill rank %d: %s", s, res.detail);
        puts += res.puts;
    }
    duet_free(pages);
    rn->packed_puts = puts;
    return 0;
}

/* Packed, end to end: pack + puts + acks here, plus decode's unpack time,
 * which it reports with "done". */
static double time_packed(run_t *rn)
{
    uint64_t id = rn->next_id++;
    unsigned long long unpack_ns;
    uint32_t len;
    void *msg;
    int64_t t0;
    double t;
    int ok;
    if (run_plan_setup(rn, id, 1) != 0)
        return -1;
    t0 = duet_now_ns();
    if (run_packed_once(rn, id) != 0)
        return -1;
    t = (double)(duet_now_ns() - t0) / 1e9;
    if (duet_testkit_chan_recv(rn->b->fd_p, &msg, &len, 60000) != 0)
        return -1;
    ok = sscanf(msg, "done %llu", &unpack_ns) == 1;
    duet_free(msg);
    return ok ? t + (double)unpack_ns / 1e9 : -1;
}

/* One plan-driven request, timed from the first post to the last ack; the
 * decode side's registration (before) and its report (after) are outside. */
static double time_plan(run_t *rn)
{
    uint64_t id = rn->next_id++;
    uint32_t len;
    void *msg;
    int64_t t0;
    double t;
    if (run_plan_setup(rn, id, 0) != 0)
        return -1;
    t0 = duet_now_ns();
    if (run_plan_once(rn, id) != 0)
        return -1;
    t = (double)(duet_now_ns() - t0) / 1e9;
    if (duet_testkit_chan_recv(rn->b->fd_p, &msg, &len, 60000) != 0)
        return -1;
    if (strncmp(msg, "done", 4) != 0)
        t = -1;
    duet_free(msg);
    return t;
}

static double time_put(run_t *rn)
{
    int64_t t0 = duet_now_ns();
    DUET_TESTKIT_OK(
        duet_xfer_debug_put(rn->sd->peers[0][0], 0, 0, rn->bytes, duet_deadline_in_ms(60000)));
    return (double)(duet_now_ns() - t0) / 1e9;
}

static double time_memcpy(run_t *rn, int iter)
{
    int64_t t0 = duet_now_ns();
    memcpy(rn->scratch, rn->sd->base[0], rn->bytes);
    rn->scratch[iter % 4096] ^= 1;
    return (double)(duet_now_ns() - t0) / 1e9;
}

typedef struct {
    double plan, packed, put, cpy; /* seconds, medians */
    double packed_plan, plan_put;  /* medians of the per-round ratios */
} times_t;

/* The machine is shared and noisy: the four are interleaved round by round
 * (after one warm-up round), and the ratios are medians of the per-round
 * ratios. */
static int measure(run_t *rn, times_t *t_p)
{
    double tp[B_MAX_ITERS], tk[B_MAX_ITERS], tu[B_MAX_ITERS], tc[B_MAX_ITERS];
    double ratio[B_MAX_ITERS], kratio[B_MAX_ITERS];
    int64_t start = 0;
    int n = 0;
    for (int round = 0; n < B_MAX_ITERS; round++) {
        double a = time_plan(rn), k = time_packed(rn), b = time_put(rn), c = time_memcpy(rn, round);
        if (a <= 0 || k <= 0 || b <= 0)
            return -1;
        if (round == 0) {
            start = duet_now_ns();
            continue;
        }
        tp[n] = a;
        tk[n] = k;
        tu[n] = b;
        tc[n] = c;
        ratio[n] = b / a;
        kratio[n] = a / k;
        n++;
        if (n >= 3 && duet_now_ns() - start >= (int64_t)rn->b->min_ms * DUET_NS_PER_MS)
            break;
    }
    t_p->plan = median(tp, n);
    t_p->packed = median(tk, n);
    t_p->put = median(tu, n);
    t_p->cpy = median(tc, n);
    t_p->plan_put = median(ratio, n);
    t_p->packed_plan = median(kratio, n);
    return 0;
}

static int bench_prefill(void *arg)
{
    const bench_t *b = arg;
    duet_slice_plan_t *plan;
    duet_testkit_side_t sd;
    run_t rn;
    if (side_setup(&sd, b, DUET_XFER_PREFILL, b->fd_p))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(b->P, b->D, B_HEADS, &plan));
    memset(&rn, 0, sizeof(rn));
    rn.b = b;
    rn.sd = &sd;
    rn.plan = plan;
    rn.next_id = 1;
    rn.scratch = malloc((size_t)max_pages(b) * B_PAGE * B_TOKEN_BYTES);
    DUET_TESTKIT_CHECK(rn.scratch != NULL, "out of memory");
    for (int i = 0; i < b->n_tokens; i++) {
        times_t t;
        if (b->tokens[i] > b->max_tokens)
            continue;
        rn.n_pages = (b->tokens[i] + B_PAGE - 1) / B_PAGE;
        rn.bytes = (size_t)rn.n_pages * B_PAGE * B_TOKEN_BYTES;
        DUET_TESTKIT_CHECK(measure(&rn, &t) == 0, "measurement failed");
        printf("%-9s %2d %2d %6d %8.1f %7llu %6llu %9.2f %9.2f %9.2f %9.2f %7.2f %7.2f\n", b->tls,
               b->P, b->D, b->tokens[i], rn.bytes / 1048576.0, (unsigned long long)rn.puts,
               (unsigned long long)rn.packed_puts, rn.bytes / t.plan / 1e9,
               rn.bytes / t.packed / 1e9, rn.bytes / t.put / 1e9, rn.bytes / t.cpy / 1e9,
               t.plan_put, t.packed_plan);
        fflush(stdout);
    }
    free(rn.scratch);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(b->fd_p, "bye") == 0, "channel");
    duet_slice_plan_destroy(plan);
    return duet_testkit_side_stop(&sd);
}

/* One decode rank's unpack: staging -> pages, every layer. */
typedef struct {
    duet_testkit_side_t *sd;
    int d;
    const duet_kv_copy_t *copies;
    int n_copies;
} unpack_job_t;

static void *unpack_main(void *arg)
{
    unpack_job_t *j = arg;
    for (int layer = 0; layer < j->sd->layout.n_layers; layer++)
        duet_kv_copy_apply_host(&j->sd->layout, j->sd->base[j->d], layer, j->copies, j->n_copies);
    return NULL;
}

/* Unpack request pages[0..n) from staging unit 0 on every rank, one
 * thread per rank; returns the time it took (ns), -1 on failure. */
static int64_t unpack_all(duet_testkit_side_t *sd, const duet_slice_plan_t *plan,
                          const int32_t *pages, int n)
{
    unpack_job_t jobs[B_HEADS * 8];
    pthread_t th[B_HEADS * 8];
    size_t cap = (size_t)n * (size_t)sd->layout.n_kv_heads;
    duet_kv_copy_t *copies = duet_malloc(sizeof(*copies) * cap * (size_t)sd->tp);
    int64_t t0 = duet_now_ns(), t;
    int started = 0;
    if (copies == NULL)
        return -1;
    for (int d = 0; d < sd->tp; d++) {
        const duet_slice_run_t *runs;
        int n_runs = duet_slice_plan_dst_runs(plan, d, &runs);
        int nc = duet_xfer_pack_copies(&sd->layout, pages, n, 0, runs, n_runs, 1,
                                       copies + (size_t)d * cap);
        jobs[d] =
            (unpack_job_t){.sd = sd, .d = d, .copies = copies + (size_t)d * cap, .n_copies = nc};
        if (pthread_create(&th[d], NULL, unpack_main, &jobs[d]) != 0)
            break;
        started++;
    }
    for (int d = 0; d < started; d++)
        pthread_join(th[d], NULL);
    t = duet_now_ns() - t0;
    duet_free(copies);
    return started == sd->tp ? t : -1;
}

static int bench_decode(void *arg)
{
    const bench_t *b = arg;
    duet_slice_plan_t *plan;
    int32_t *pages;
    duet_testkit_side_t sd;
    if (side_setup(&sd, b, DUET_XFER_DECODE, b->fd_d))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(b->P, b->D, B_HEADS, &plan));
    pages = seq_pages(max_pages(b));
    DUET_TESTKIT_CHECK(pages != NULL, "out of memory");
    for (;;) {
        unsigned long long id;
        uint32_t len;
        void *msg;
        char done[64];
        int n, packed;
        int64_t unpack_ns = 0;
        DUET_TESTKIT_CHECK(duet_testkit_chan_recv(b->fd_d, &msg, &len, 300000) == 0,
                           "prefill went away");
        if (strcmp(msg, "bye") == 0) {
            duet_free(msg);
            break;
        }
        DUET_TESTKIT_CHECK(sscanf(msg, "exp %llu %d %d", &id, &n, &packed) == 3, "bad message '%s'",
                           (char *)msg);
        duet_free(msg);
        for (int d = 0; d < b->D; d++) {
            duet_xfer_expect_t e = {.transfer_id = id,
                                    .plan = plan,
                                    .peers = sd.peers[d],
                                    .pages = pages,
                                    .n_pages = n,
                                    .deadline_ns = duet_deadline_in_ms(60000),
                                    .flags = packed ? DUET_XFER_EXPECT_PACKED : 0,
                                    .dst_stage0 = 0};
            DUET_TESTKIT_OK(duet_xfer_recv_expect(duet_xfer_rank(sd.x, d), &e));
        }
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(b->fd_d, "ok") == 0, "channel");
        for (int d = 0; d < b->D; d++) {
            duet_xfer_result_t res;
            DUET_TESTKIT_OK(
                duet_xfer_recv_wait(duet_xfer_rank(sd.x, d), id, duet_deadline_in_ms(60000), &res));
            DUET_TESTKIT_CHECK(res.status == DUET_OK, "decode rank %d: %s", d, res.detail);
        }
        if (packed) {
            unpack_ns = unpack_all(&sd, plan, pages, n);
            DUET_TESTKIT_CHECK(unpack_ns >= 0, "unpack failed");
        }
        snprintf(done, sizeof(done), "done %lld", (long long)unpack_ns);
        DUET_TESTKIT_CHECK(duet_testkit_chan_say(b->fd_d, done) == 0, "channel");
    }
    duet_free(pages);
    duet_slice_plan_destroy(plan);
    return duet_testkit_side_stop(&sd);
}

static int parse_ints(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0)
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv)
{
    char tls_buf[256] = "sm,self;tcp,self", plans_buf[256] = "1x1,1x2,2x4,4x2,2x1";
    bench_t b;
    int bad = 0;
    memset(&b, 0, sizeof(b));
    b.n_tokens = 3;
    b.tokens[0] = 512;
    b.tokens[1] = 2048;
    b.tokens[2] = 8192;
    b.min_ms = 200;
    b.tcp_max_tokens = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--tls") == 0)
            snprintf(tls_buf, sizeof(tls_buf), "%s", argv[i + 1]);
        else if (strcmp(argv[i], "--plans") == 0)
            snprintf(plans_buf, sizeof(plans_buf), "%s", argv[i + 1]);
        else if (strcmp(argv[i], "--tokens") == 0)
            b.n_tokens = parse_ints(argv[i + 1], b.tokens, B_MAX_SIZES);
        else if (strcmp(argv[i], "--min-ms") == 0)
            b.min_ms = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--tcp-max-tokens") == 0)
            b.tcp_max_tokens = atoi(argv[i + 1]);
        else
            b.n_tokens = -1;
    }
    if (b.n_tokens <= 0 || b.min_ms < 0 || argc % 2 == 0) {
        fprintf(stderr,
                "usage: %s [--tls 'sm,self;tcp,self'] [--plans 1x1,2x4] "
                "[--tokens 512,8192] [--min-ms 200] [--tcp-max-tokens 2048]\n",
                argv[0]);
        return 2;
    }
    duet_log_set_level(DUET_LOG_LEVEL_ERROR);
    duet_log_init_from_env();
    signal(SIGPIPE, SIG_IGN);
    printf("# Llama-3-8B KV (32 layers, 8 KV heads, head_dim 128, page 16, 2-byte elements, "
           "128 KiB/token); %d CPUs here%s\n",
           duet_cpu_count(),
           duet_cpu_count() < 4 ? ": with P+D > 2 the rank threads of both daemons share them"
                                : "");
    printf("# plan: per-page puts, post -> last ack on every prefill rank; packed: pack + "
           "puts + acks + unpack, end to end; put: one put of the same bytes + flush, same "
           "endpoint; memcpy: one thread, in-process; pk/plan: plan time / packed time\n");
    printf("%-9s %2s %2s %6s %8s %7s %6s %9s %9s %9s %9s %7s %7s\n", "# tls", "P", "D", "tokens",
           "MiB", "puts", "pk_put", "plan_GB/s", "pk_GB/s", "put_GB/s", "cpy_GB/s", "plan/put",
           "pk/plan");
    for (char *tsave = NULL, *tls = strtok_r(tls_buf, ";", &tsave); tls != NULL;
         tls = strtok_r(NULL, ";", &tsave)) {
        char plans[256];
        snprintf(plans, sizeof(plans), "%s", plans_buf);
        for (char *psave = NULL, *pl = strtok_r(plans, ",", &psave); pl != NULL;
             pl = strtok_r(NULL, ",", &psave)) {
            int fds[2];
            pid_t pids[2];
            int rc[2];
            if (sscanf(pl, "%dx%d", &b.P, &b.D) != 2 || b.P < 1 || b.D < 1 || b.P > B_HEADS * 8 ||
                b.D > B_HEADS * 8) {
                fprintf(stderr, "bad plan '%s'\n", pl);
                return 2;
            }
            b.tls = tls;
            b.max_tokens = strncmp(tls, "tcp", 3) == 0 ? b.tcp_max_tokens : 1 << 30;
            if (max_pages(&b) == 0)
                continue;
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
                return 1;
            b.fd_p = fds[0];
            b.fd_d = fds[1];
            pids[0] = duet_testkit_spawn("prefill", bench_prefill, &b, &fds[1], 1);
            pids[1] = duet_testkit_spawn("decode", bench_decode, &b, &fds[0], 1);
            if (duet_testkit_wait_all(pids, 2, duet_deadline_in_ms(600000), rc) != 0) {
                fprintf(stderr, "%s %s: prefill exit %d, decode exit %d\n", tls, pl, rc[0], rc[1]);
                bad++;
            }
            close(fds[0]);
            close(fds[1]);
        }
    }
    return bad ? 1 : 0;
}
