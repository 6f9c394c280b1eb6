/* GPU KV transfer benchmark: device-to-device KV transfer between a prefill
 * and a decode process over the staged path the daemons run, next to the
 * copies that bound it, all measured in the same run.
 *
 * Each process keeps, per engine rank, a KV pool in device memory
 * (cudaMalloc) and a pinned host *mirror* of it with the same layout, which
 * is the transfer engine's pool (duet_xfer_pool_alloc + cudaHostRegister,
 * as transfer/kv_engine.c and engine/forward.c set it up).  One request:
 *   prefill  per layer, on each rank's copy stream: cudaMemcpyAsync of the
 *            layer's K and V pages device -> mirror, then cudaLaunchHostFunc
 *            posting that layer's puts (duet_xfer_send_layers); after the
 *            stream drained, duet_xfer_send_end (engine/cuda/kv_mirror.c,
 *            prefill/sched.c)
 *   decode   duet_xfer_recv_wait on every rank, then every layer's pages
 *            mirror -> device, waiting until they landed (decode/sched.c)
 * End to end: from the first device->host copy being issued on prefill to
 * the last host->device copy landed on decode (CLOCK_MONOTONIC, shared by
 * both processes).  Stages: export (last layer landed in the prefill
 * mirror), puts (every decode rank notified), import (copies landed).
 * After every transfer decode reads its destination pages back and compares
 * every byte with the pattern the source was filled with; a mismatch fails
 * the run.  Before every transfer both mirrors and the destination pages are
 * overwritten, so stale data cannot pass.
 *
 * --mirror packed is the device-direct path with packed transfers
 * (transfer/xfer_pack.h), as the daemons run it on GPUs: per layer prefill
 * stages the layer's runs for its receivers in its staging arena (the engine's
 * kv_copy kernel, engine/cuda/kv_copy.cu, on the copy stream) and then posts
 * one put per (run, chunk of released layers); decode unstages every layer into the pages
 * once all senders reported (counted as import).  The puts column is the
 * transport operations of one request, all prefill ranks.
 *
 * --mirror device runs the device-direct path instead: no mirror, each
 * rank's device pool itself is the transfer engine's pool
 * (duet_xfer_pool_register_device; needs a UCX with CUDA transports), so the
 * puts go device pool -> device pool (cuda_ipc).  The pool is filled before
 * the timed region; prefill still posts each layer's puts from a host
 * function on the copy stream, in the same order as the staged path, with
 * no copy before it (export ~0), and decode imports nothing (import 0).
 * Verification reads the destination device pages back as on the staged
 * path; before every transfer prefill rewrites its source pages from the
 * host pattern and decode overwrites its destination pages (device copies
 * and memsets).  --checksum works here too: the GPU computes the CRC32C
 * (the cuda backend's kv_crc as the transfer's checksum hook, as the
 * daemons install it), and --corrupt-put then fails the run with a checksum
 * mismatch (the corruption is an extra put: transfer/xfer.h).
 *
 * Same run, a separate process first: cudaMemcpyPeer GPU 0 -> GPU 1 (peer
 * access enabled when the GPUs allow it), pinned host -> device, device ->
 * host, device -> device on GPU 0, one copy of each request size (median of
 * the rounds).  Per transfer case the host-side put of the same bytes
 * between the two mirrors (one duet_xfer_debug_put + flush, the number
 * bench_transfer reports; with --mirror device between the two device
 * pools) is interleaved with the transfers.
 *
 * KV shape: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, page 16 tokens,
 * bf16: 128 KiB per token); page ids are consecutive on both sides.
 *
 *   bench_gpu_transfer [--plans 1x1,1x2,2x1] [--tokens 512,1024,2048,4096,8192]
 *                      [--variants spread,same] [--rounds 5] [--tls sm,self]
 *                      [--mirror ucx-alloc|registered|device] [--no-cuda]
 *     spread   prefill rank i on GPU i mod n, decode ranks on the last D GPUs
 *              (1x1: 0 -> 1; 1x2: 0 -> 0,1; 2x1: 0,1 -> 1), as
 *              tests/gpu/disagg_gpu.sh places the daemons
 *     same     every rank of both processes on GPU 0
 *     affine   where P != D, each rank of the side with fewer ranks on the
 *              GPU of its first peer (4x2 on 4 GPUs: prefill 0,1,2,3 ->
 *              decode 0,2; 2x4: prefill 0,2 -> decode 0,1,2,3), so part of
 *              every rank's KV stays on its GPU; P == D: as spread
 *     --mirror registered  the mirror from our allocator, registered with
 *              duet_xfer_pool_register (puts are then emulated over active
 *              messages: the decode side progresses them)
 *     --mirror device  no mirror: the device pools are registered with UCX
 *              (see above; default --tls sm,self,cuda_copy,cuda_ipc).  When
 *              this UCX has no CUDA transports it says so and exits 0
 *              without measuring
 *     --no-cuda  host memory stands in for device memory and memcpy for the
 *              copies (runs without a GPU: a self-test of everything else)
 *     --mirror auto  what the daemons run on GPUs (DUET_KV_TRANSFER_PACK=auto):
 *              packed when P != D, the unpacked direct path when P == D
 *              (consecutive pages coalesce: one put per plane already), with
 *              --layer-done event unless told otherwise (the daemons' copy
 *              stream releases layers from a completion thread, kv_done.c)
 *     --layer-done event  release each layer's puts from a waiter thread that
 *              waits for an event recorded after the layer (instead of a
 *              host function on the copy stream, which holds the stream
 *              for a GPU -> host -> GPU round trip per layer)
 *     --layer-done signal  the same, but a pack's layer (packed requests)
 *              is released when the pack kernel's signal reached host
 *              memory (engine/cuda/kv_done.c: what the daemons do); the
 *              waiter spins on that word, not in the driver.  Unpacked
 *              layers keep their event.  The default with --mirror auto.
 *     --corrupt-put N  corrupt what prefill rank 0's N-th put (0 = the
 *              first) delivers (duet_xfer_debug_corrupt_put): the run must
 *              fail -- by the byte verification, and with --checksum by the
 *              receiver's CRC first ("checksum mismatch")
 *     --progress auto|N|off  packed requests: prefill announces every N
 *              layers it put to a decode rank (progress_layers), and decode
 *              unpacks the layers every sender of a rank announced as they
 *              come, the rest once the transfer completed (what the decode
 *              daemon does, DUET_KV_TRANSFER_PROGRESS); auto (default, the
 *              daemons'): every 8 layers for requests of at least
 *              DUET_XFER_PROGRESS_MIN_BYTES, none below; off: one unpack at
 *              the end.  Either
 *              way decode learns of the end from the expectation's
 *              callback (the daemons' way), not duet_xfer_recv_wait, and
 *              import is from the end to the last unpack landed
 *     --checksum  DUET_XFER_SEND_CRC on every request (transfer.checksum):
 *              the CPU checksums host pools and mirrors, the GPU device
 *              pools; e2e includes it (compare with a run without)
 *
 * CUDA is only initialised in children (fork after CUDA init is not
 * allowed), like UCX. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <limits.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"
#include "testkit/testkit.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_kernels.h"
#include "kv/copy.h"
#include "transfer/slice_plan.h"
#include "transfer/xfer_pack.h"

#define G_LAYERS      32
#define G_HEADS       8
#define G_HEAD_DIM    128
#define G_PAGE        16
#define G_ELEM        2
#define G_TOKEN_BYTES ((size_t)G_LAYERS * 2 * G_HEADS * G_HEAD_DIM * G_ELEM)
#define G_MAX_SIZES   8
#define G_MAX_ROUNDS  64
#define G_MAX_TP      8
#define G_TIMEOUT_MS  60000
#define G_TLS         "sm,self"
#define G_TLS_DEVICE  "sm,self,cuda_copy,cuda_ipc"

#define G_CUDA(x)                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            duet_testkit_fail("%s:%d: %s: %s", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Copy rates of the baseline process, GB/s (0: not measured). */
typedef struct {
    int n_dev;
    int p2p;      /* GPU 0 and 1 reach each other's memory directly */
    int ucx_cuda; /* --mirror device: this UCX moves CUDA memory (not measured otherwise) */
    double d2h[G_MAX_SIZES], h2d[G_MAX_SIZES], peer[G_MAX_SIZES], d2d[G_MAX_SIZES];
} base_t;

typedef struct {
    bool cuda;
    bool registered;
    bool device;     /* --mirror device: the device pools are the transfer pools, no mirror */
    bool packed;     /* --mirror packed: device pools, packed transfer (transfer/xfer_pack.h) */
    bool auto_pack;  /* --mirror auto: packed when P != D, else unpacked (the daemons' rule) */
    bool event_done; /* --layer-done event: a waiter thread releases layers (see below) */
    bool signal;     /* --layer-done signal: packs signal their layers (kv_done.c) */
    const char *tls;
    int tokens[G_MAX_SIZES];
    int n_tokens;
    int rounds;
    long corrupt_put;   /* >= 0: corrupt that put (checks the checker) */
    bool checksum;      /* --checksum: DUET_XFER_SEND_CRC */
    int progress;       /* --progress: layers per progress message (0: off) */
    bool progress_auto; /* ... and where a decode rank shares a sender's GPU, only where
                           duet_xfer_pack_progress_pays (the daemons' rule) */
    bool shares_gpu;    /* a decode rank is on the GPU of a prefill rank sending to it */
    const char *variant;
    int P, D;
    int pdev[G_MAX_TP], ddev[G_MAX_TP];
    base_t base;
    int fd_p, fd_d;
} bench_t;

/* ---- copies: CUDA streams, or memcpy with --no-cuda ------------------------------ */

typedef struct {
    bool cuda;
    int dev;
    cudaStream_t s;
} gstream_t;

static int gs_copy(const gstream_t *s, void *dst, const void *src, size_t n, bool to_host)
{
    if (!s->cuda) {
        memcpy(dst, src, n);
        return 0;
    }
    G_CUDA(cudaSetDevice(s->dev));
    G_CUDA(cudaMemcpyAsync(dst, src, n, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                           s->s));
    return 0;
}

static int gs_memset(const gstream_t *s, void *dev, int byte, size_t n)
{
    if (!s->cuda) {
        memset(dev, byte, n);
        return 0;
    }
    G_CUDA(cudaSetDevice(s->dev));
    G_CUDA(cudaMemsetAsync(dev, byte, n, s->s));
    return 0;
}

/* fn runs once the work queued before it landed (at once without CUDA). */
static int gs_host_fn(const gstream_t *s, cudaHostFn_t fn, void *arg)
{
    if (!s->cuda) {
        fn(arg);
        return 0;
    }
    G_CUDA(cudaSetDevice(s->dev));
    G_CUDA(cudaLaunchHostFunc(s->s, fn, arg));
    return 0;
}

static int gs_sync(const gstream_t *s)
{
    if (s->cuda) {
        G_CUDA(cudaSetDevice(s->dev));
        G_CUDA(cudaStreamSynchronize(s->s));
    }
    return 0;
}

/* ---- KV contents ------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Pages [0, n_pages) of every (layer, K|V) plane in a buffer whose planes
 * are plane_bytes apart: one 64-bit word per 4 elements, from (layer, K|V,
 * global head, token position, word). */
static void fill_pattern(const duet_kv_layout_t *l, unsigned char *base, size_t plane_bytes,
                         int head0, int n_pages)
{
    int words = l->head_dim * l->elem_size / 8;
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int page = 0; page < n_pages; page++)
                for (int h = 0; h < l->n_kv_heads; h++) {
                    uint64_t *w = (uint64_t *)(base + plane_bytes * (size_t)(layer * 2 + kv) +
                                               duet_kv_page_bytes(l) * (size_t)page +
                                               duet_kv_head_bytes(l) * (size_t)h);
                    for (int t = 0; t < l->page_size; t++) {
                        uint64_t pos = (uint64_t)page * (uint64_t)l->page_size + (uint64_t)t;
                        uint64_t key = ((uint64_t)(layer * 2 + kv) << 48) ^
                                       ((uint64_t)(head0 + h) << 40) ^ (pos << 8);
                        for (int i = 0; i < words; i++)
                            *w++ = mix64(key ^ (uint64_t)i);
                    }
                }
}

/* ---- one process's ranks ------------------------------------------------------------ */

typedef struct gside gside_t;

typedef struct {
    gside_t *g;
    int rank, layer;
} gpost_t; /* argument of one layer's host function */

typedef struct {
    gstream_t st;        /* prefill: the copy stream; decode: the rank's stream */
    unsigned char *pool; /* device pool, the mirror's layout (--mirror device: the xfer pool) */
    bool pinned;         /* the mirror is page-locked for the GPU */
    int head0, n_heads;  /* global KV heads of this rank */
    unsigned char *ref;  /* decode: expected pages [0, max_pages), compact planes */
    unsigned char *back; /* decode: the device pages read back, same layout as ref */
    unsigned char *src;  /* prefill, --mirror device: the source pattern, compact planes
                            (pinned), rewritten into the pool before every transfer */
    gpost_t post[G_LAYERS];
    duet_kv_copy_t *hlist, *dlist; /* --mirror packed: this request's (un)pack copies */
    int n_list;                    /* dlist's entries: hlist cut into the engine's pieces */
    size_t dcap;                   /* dlist's capacity */
    uint64_t puts;                 /* prefill: puts of the last request */
    cudaEvent_t ev[G_LAYERS];      /* --layer-done event: recorded after each layer's stage */
    /* --layer-done signal: the word the packs write, its device address,
     * their counter, the seq of this round's layer 0 */
    unsigned long long *sig_word, *sig_word_dev;
    unsigned *sig_ctr;
    unsigned long long sig_seq0;
    atomic_int recorded;      /* layers whose event is recorded */
    atomic_int launch_failed; /* the launcher gave up */
    pthread_t waiter, launcher;
    duet_backend_rank_t *crc_br; /* --checksum on a device pool: kv_crc is the checksum hook */
} grank_t;

struct gside {
    const bench_t *b;
    duet_xfer_role_t role;
    duet_testkit_side_t sd;
    grank_t rk[G_MAX_TP];
    int tp;
    int max_pages;     /* of the largest request */
    size_t pool_bytes; /* of one rank's pool and mirror */
    size_t cplane;     /* bytes of one plane in ref/back: max_pages pages */
    _Atomic uint64_t cur_id;
    atomic_int landed; /* layers landed in the mirror this round, all ranks */
    atomic_int post_errors;
    _Atomic int64_t landed_ns;   /* when the last of them landed */
    _Atomic int64_t launched_ns; /* --layer-done event: when the last launcher had queued all */
    atomic_int waiters_done;     /* --layer-done event: waiters past their last layer */
    _Atomic int64_t ended_ns;    /* when every rank's send was ended (0: not yet) */
    atomic_int go;               /* --layer-done event: the round's threads may start */
};

static int max_pages(const bench_t *b)
{
    int m = 0;
    for (int i = 0; i < b->n_tokens; i++)
        m = b->tokens[i] > m ? b->tokens[i] : m;
    return (m + G_PAGE - 1) / G_PAGE;
}

static void CUDART_CB on_layer_landed(void *arg)
{
    gpost_t *p = arg;
    gside_t *g = p->g;
    int64_t now = duet_now_ns(), prev = atomic_load(&g->landed_ns);
    if (duet_xfer_send_layers(duet_xfer_rank(g->sd.x, p->rank), atomic_load(&g->cur_id), p->layer,
                              p->layer + 1) != DUET_OK)
        atomic_fetch_add(&g->post_errors, 1);
    while (now > prev && !atomic_compare_exchange_weak(&g->landed_ns, &prev, now)) {
    }
    atomic_fetch_add(&g->landed, 1);
}

/* Queue the copies of layers [l0, l1) of pages[0..n) between rank r's pool
 * and its mirror; a run of consecutive page ids is one copy. */
static int copy_pages(gside_t *g, int r, int l0, int l1, const int32_t *pages, int n, bool to_host)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    for (int layer = l0; layer < l1; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < n;) {
                int run = 1;
                while (i + run < n && pages[i + run] == pages[i] + run)
                    run++;
                size_t off = duet_kv_offset(l, layer, kv, pages[i], 0);
                unsigned char *d = k->pool + off, *h = g->sd.base[r] + off;
                if (gs_copy(&k->st, to_host ? h : d, to_host ? d : h,
                            (size_t)run * duet_kv_page_bytes(l), to_host))
                    return 1;
                i += run;
            }
    return 0;
}

/* Overwrite pages [0, n) of every plane of rank r's mirror (and, on decode,
 * of its device pool), so data from an earlier round cannot pass.  With
 * --mirror device (no mirror) decode overwrites its device pages and
 * prefill rewrites its source pages from the host pattern, on the device. */
static int clear_pages(gside_t *g, int r, int n)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t len = (size_t)n * duet_kv_page_bytes(l);
    for (int p = 0; p < 2 * l->n_layers; p++) {
        size_t off = duet_kv_plane_bytes(l) * (size_t)p;
        if (!g->b->device)
            memset(g->sd.base[r] + off, 0x5a, len);
        if (g->role == DUET_XFER_DECODE && gs_memset(&k->st, k->pool + off, 0xa5, len))
            return 1;
        if (g->role == DUET_XFER_PREFILL && g->b->device &&
            gs_copy(&k->st, k->pool + off, k->src + g->cplane * (size_t)p, len, false))
            return 1;
    }
    /* packed: staging from an earlier round must not pass either (the
     * request's staging: every plane of its n units, from unit 0) */
    if (g->b->packed && gs_memset(&k->st, k->pool + duet_kv_total_bytes(l),
                                  g->role == DUET_XFER_DECODE ? 0x3c : 0xc3,
                                  2u * (size_t)n * duet_xfer_stage_unit_bytes(l)))
        return 1;
    return gs_sync(&k->st);
}

/* Device pool, stream and pinned mirror of rank r (--mirror device: the
 * device pool registered with the transfer engine instead); prefill fills
 * its pool with the pattern, decode builds the expected contents. */
/* duet_xfer_rank_run: make *arg (a device id) current on the calling thread. */
static duet_status_t bind_device(void *arg)
{
    if (cudaSetDevice(*(const int *)arg) != cudaSuccess || cudaFree(NULL) != cudaSuccess)
        return duet_error(DUET_ERR_IO, "cudaSetDevice(%d): %s", *(const int *)arg,
                          cudaGetErrorString(cudaGetLastError()));
    return DUET_OK;
}

/* --checksum on device pools: the transfer's checksum hook, the cuda
 * backend's kv_crc over the rank's pool (node/kv_engine.c installs the
 * same through the engine). */
static duet_status_t crc_hook(void *ctx, const duet_crc32c_range_t *ranges, int n, uint32_t *crc_p)
{
    return duet_backend_cuda.kv_crc(ctx, ranges, n, crc_p);
}

static int rank_start(gside_t *g, int r, int dev)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t cbytes = g->cplane * 2 * (size_t)l->n_layers;
    unsigned char *src = NULL;

    duet_kv_heads_owned(G_HEADS, g->tp, r, &k->head0, &k->n_heads);
    k->st.cuda = g->b->cuda;
    k->st.dev = dev;
    for (int layer = 0; layer < G_LAYERS; layer++)
        k->post[layer] = (gpost_t){g, r, layer};
    if (g->b->cuda) {
        cudaError_t e;
        G_CUDA(cudaSetDevice(dev));
        G_CUDA(cudaStreamCreateWithFlags(&k->st.s, cudaStreamNonBlocking));
        G_CUDA(cudaMalloc((void **)&k->pool, g->pool_bytes));
        if (g->b->device) {
            DUET_TESTKIT_OK(
                duet_xfer_pool_register_device(duet_xfer_rank(g->sd.x, r), k->pool, g->pool_bytes));
            /* UCX's CUDA transports use the progress thread's current
             * context: the rank's GPU (transfer/kv_engine.c does the same) */
            DUET_TESTKIT_OK(
                duet_xfer_rank_run(duet_xfer_rank(g->sd.x, r), bind_device, &k->st.dev));
            if (g->b->checksum) {
                duet_backend_rank_opts_t o = {
                    .rank = r, .tp = g->tp, .threads = 1, .device = dev, .kv_layout = *l};
                DUET_TESTKIT_OK(duet_backend_cuda.rank_create(&o, &k->crc_br));
                duet_backend_cuda.kv_attach(k->crc_br, k->pool);
                duet_xfer_rank_set_checksum(duet_xfer_rank(g->sd.x, r), crc_hook, k->crc_br);
            }
        } else {
            e = cudaHostRegister(g->sd.base[r], g->pool_bytes, cudaHostRegisterPortable);
            k->pinned = e == cudaSuccess;
            if (!k->pinned) {
                (void)cudaGetLastError();
                fprintf(stderr,
                        "# rank %d: mirror not pinned: %s (copies will be staged by the "
                        "driver)\n",
                        r, cudaGetErrorString(e));
            }
        }
    } else {
        k->pool = duet_aligned_alloc(4096, g->pool_bytes);
        DUET_TESTKIT_CHECK(k->pool != NULL, "out of memory");
    }
    if (g->role == DUET_XFER_PREFILL) {
        if (!g->b->cuda) {
            fill_pattern(l, k->pool, duet_kv_plane_bytes(l), k->head0, g->max_pages);
            return 0;
        }
        /* --mirror device keeps the pattern to rewrite the source before every transfer */
        if (g->b->device)
            G_CUDA(cudaMallocHost((void **)&k->src, cbytes));
        src = g->b->device ? k->src : duet_aligned_alloc(4096, cbytes);
        DUET_TESTKIT_CHECK(src != NULL, "out of memory");
        fill_pattern(l, src, g->cplane, k->head0, g->max_pages);
        for (int p = 0; p < 2 * l->n_layers; p++) {
            cudaError_t e =
                cudaMemcpy(k->pool + duet_kv_plane_bytes(l) * (size_t)p,
                           src + g->cplane * (size_t)p, g->cplane, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) {
                if (src != k->src)
                    duet_aligned_free(src);
                G_CUDA(e);
            }
        }
        if (src != k->src)
            duet_aligned_free(src);
        return 0;
    }
    k->ref = duet_aligned_alloc(4096, cbytes);
    DUET_TESTKIT_CHECK(k->ref != NULL, "out of memory");
    fill_pattern(l, k->ref, g->cplane, k->head0, g->max_pages);
    if (g->b->cuda)
        G_CUDA(cudaMallocHost((void **)&k->back, cbytes));
    else
        k->back = duet_aligned_alloc(4096, cbytes);
    DUET_TESTKIT_CHECK(k->back != NULL, "out of memory");
    return 0;
}

/* --mirror device: duet_testkit_side_start without the pools (rank_start registers
 * each rank's device pool once it is allocated), on a UCX that can. */
static int device_side_start(duet_testkit_side_t *sd)
{
    sd->no_pools = 1;
    if (duet_testkit_side_start(sd))
        return 1;
    DUET_TESTKIT_CHECK(duet_xfer_supports_cuda_memory(sd->x),
                       "--mirror device: this UCX build has no CUDA transports (UCX_TLS %s)",
                       sd->tls);
    return 0;
}

static int gside_start(gside_t *g, const bench_t *b, duet_xfer_role_t role, int fd)
{
    duet_testkit_side_t *sd = &g->sd;
    const int *devs = role == DUET_XFER_PREFILL ? b->pdev : b->ddev;
    memset(g, 0, sizeof(*g));
    g->b = b;
    g->role = role;
    g->tp = role == DUET_XFER_PREFILL ? b->P : b->D;
    g->max_pages = max_pages(b);
    sd->role = role;
    sd->tp = g->tp;
    sd->remote_tp = role == DUET_XFER_PREFILL ? b->D : b->P;
    sd->kv_heads = G_HEADS;
    sd->layout.n_layers = G_LAYERS;
    sd->layout.page_size = G_PAGE;
    sd->layout.head_dim = G_HEAD_DIM;
    sd->layout.elem_size = G_ELEM;
    /* every rank can hold a whole request: rank 0 also takes the single put */
    sd->layout.n_pages = g->max_pages * (g->tp < G_HEADS ? g->tp : G_HEADS);
    sd->dtype = DUET_DTYPE_BF16;
    sd->fingerprint = 0x11a3a3b8b0000002ULL;
    sd->tls = b->tls;
    sd->registered = b->registered;
    if (b->device ? device_side_start(sd) : duet_testkit_side_start(sd))
        return 1;
    g->pool_bytes = duet_kv_total_bytes(&sd->layout);
    /* packed: a staging arena after the planes (transfer/xfer_pack.h), the
     * request's staging from unit 0 */
    if (b->packed)
        g->pool_bytes += 2u * (size_t)g->max_pages * duet_xfer_stage_unit_bytes(&sd->layout);
    g->cplane = (size_t)g->max_pages * duet_kv_page_bytes(&sd->layout);
    for (int r = 0; r < g->tp; r++)
        if (rank_start(g, r, devs[r]))
            return 1;
    printf("# %-7s ranks on %s %d", role == DUET_XFER_PREFILL ? "prefill" : "decode",
           b->cuda ? "GPUs" : "(host memory)", devs[0]);
    for (int r = 1; r < g->tp; r++)
        printf(",%d", devs[r]);
    if (b->device)
        printf("; pool device (registered with UCX, no mirror: %s); UCX CUDA memory support %s\n",
               duet_xfer_pool_kind(duet_xfer_rank(sd->x, 0)),
               duet_xfer_supports_cuda_memory(sd->x) ? "yes (used)" : "no");
    else
        printf("; mirror %s, pinned %s; UCX CUDA memory support %s\n",
               duet_xfer_pool_kind(duet_xfer_rank(sd->x, 0)),
               !b->cuda          ? "n/a"
               : g->rk[0].pinned ? "yes"
                                 : "NO",
               duet_xfer_supports_cuda_memory(sd->x) ? "yes (unused)" : "no");
    fflush(stdout);
    return duet_testkit_side_connect(sd, fd);
}

/* Unpin the mirrors and unregister the device pools, stop the transfer
 * engine (which unmaps the mirrors and counts our allocations), then free
 * the CUDA memory. */
static int gside_stop(gside_t *g)
{
    int rc;
    for (int r = 0; r < g->tp; r++) {
        grank_t *k = &g->rk[r];
        duet_aligned_free(k->ref);
        k->ref = NULL;
        duet_free(k->hlist);
        k->hlist = NULL;
        if (!g->b->cuda) {
            duet_aligned_free(k->pool);
            duet_aligned_free(k->back);
            k->pool = k->back = NULL;
            continue;
        }
        cudaSetDevice(k->st.dev);
        if (k->pinned)
            cudaHostUnregister(g->sd.base[r]);
        if (g->b->device)
            duet_xfer_pool_unregister(duet_xfer_rank(g->sd.x, r)); /* before cudaFree */
        if (k->crc_br != NULL) {
            /* nothing is in flight any more: the hook goes first, then its
             * backend rank (before side_stop counts the blocks still live) */
            duet_xfer_rank_set_checksum(duet_xfer_rank(g->sd.x, r), NULL, NULL);
            duet_backend_cuda.rank_destroy(k->crc_br);
            k->crc_br = NULL;
        }
    }
    rc = duet_testkit_side_stop(&g->sd);
    for (int r = 0; g->b->cuda && r < g->tp; r++) {
        grank_t *k = &g->rk[r];
        cudaSetDevice(k->st.dev);
        cudaFreeHost(k->back);
        cudaFreeHost(k->src);
        cudaFree(k->pool);
        cudaFree(k->dlist);
        for (int l = 0; l < G_LAYERS; l++)
            if (k->ev[l] != NULL)
                cudaEventDestroy(k->ev[l]);
        cudaFreeHost(k->sig_word);
        cudaFree(k->sig_ctr);
        if (k->st.s != NULL)
            cudaStreamDestroy(k->st.s);
    }
    return rc;
}

/* --mirror packed: build rank r's copies that stage (prefill: the runs it
 * sends) or unstage (decode: the runs it receives) pages[0..n) with
 * staging from unit 0, and upload them (before the timed region). */
static int upload_list(gside_t *g, int r, const duet_slice_plan_t *plan, const int32_t *pages,
                       int n)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t cap = 2u * (size_t)g->max_pages * (size_t)l->n_kv_heads;
    const duet_slice_run_t *runs;
    int n_runs = g->role == DUET_XFER_PREFILL ? duet_slice_plan_src_runs(plan, r, &runs)
                                              : duet_slice_plan_dst_runs(plan, r, &runs);
    DUET_TESTKIT_CHECK((size_t)n * (size_t)duet_xfer_pack_slots(runs, n_runs) <= cap,
                       "rank %d: %d runs overflow the copy list", r, n_runs);
    if (k->hlist == NULL) {
        k->hlist = DUET_NEW_ARRAY(duet_kv_copy_t, cap);
        DUET_TESTKIT_CHECK(k->hlist != NULL, "out of memory");
    }
    int m =
        duet_xfer_pack_copies(l, pages, n, 0, runs, n_runs, g->role == DUET_XFER_DECODE, k->hlist);
    /* cut into the engine's pieces, as kv_copy_host.c does (a page run of
     * all a rank's heads is one long copy) */
    size_t pieces = duet__cuda_kv_copy_pieces(k->hlist, m);
    duet_kv_copy_t *split = DUET_NEW_ARRAY(duet_kv_copy_t, pieces + 1);
    DUET_TESTKIT_CHECK(split != NULL && pieces <= INT_MAX, "out of memory");
    duet__cuda_kv_copy_split(k->hlist, m, split);
    k->n_list = (int)pieces;
    G_CUDA(cudaSetDevice(k->st.dev));
    if (pieces > k->dcap) {
        cudaFree(k->dlist);
        k->dlist = NULL;
        G_CUDA(cudaMalloc((void **)&k->dlist, pieces * sizeof(duet_kv_copy_t)));
        k->dcap = pieces;
    }
    G_CUDA(cudaMemcpy(k->dlist, split, pieces * sizeof(duet_kv_copy_t), cudaMemcpyHostToDevice));
    duet_free(split);
    return 0;
}

/* --mirror packed: queue rank r's copies on planes [plane0, plane0 + n_planes). */
static int run_list(gside_t *g, int r, int plane0, int n_planes)
{
    grank_t *k = &g->rk[r];
    G_CUDA(cudaSetDevice(k->st.dev));
    DUET_TESTKIT_OK(duet__cuda_kv_copy(k->st.s, k->pool, duet_kv_plane_bytes(&g->sd.layout), plane0,
                                       n_planes, k->dlist, k->n_list, NULL));
    return 0;
}

/* End every rank's send of the current request (once). */
static void end_sends(gside_t *g)
{
    int64_t zero = 0;
    for (int s = 0; s < g->tp; s++)
        if (duet_xfer_send_end(duet_xfer_rank(g->sd.x, s), atomic_load(&g->cur_id), DUET_OK, 1) !=
            DUET_OK)
            atomic_fetch_add(&g->post_errors, 1);
    atomic_compare_exchange_strong(&g->ended_ns, &zero, duet_now_ns());
}

/* --layer-done event: instead of a host function on the copy stream (which
 * holds the stream until the host ran it, so layer l+1's copies wait for a
 * GPU -> host -> GPU round trip), each layer's end is an event that this
 * thread waits for, in layer order, releasing the layer's puts. */
typedef struct {
    gside_t *g;
    int r;
    const int32_t *pages; /* the request's pages, n of them (the launcher's staged copies) */
    int n;
} gwait_t;

static void *layer_waiter(void *arg)
{
    gwait_t *w = arg;
    grank_t *k = &w->g->rk[w->r];
    cudaSetDevice(k->st.dev);
    while (!atomic_load(&w->g->go)) {
    }
    for (int l = 0; l < G_LAYERS; l++) {
        while (atomic_load(&k->recorded) <= l)
            if (atomic_load(&k->launch_failed))
                return NULL;
        if (w->g->b->signal && w->g->b->packed) {
            /* the engine's wait (kv_done.c), with a deadline for a failed
             * stream instead of its cudaStreamQuery */
            int64_t give_up = duet_now_ns() + (int64_t)G_TIMEOUT_MS * 1000000;
            while (__atomic_load_n(k->sig_word, __ATOMIC_ACQUIRE) < k->sig_seq0 + (unsigned)l)
                if (duet_now_ns() > give_up) {
                    atomic_fetch_add(&w->g->post_errors, 1);
                    return NULL;
                }
        } else if (cudaEventSynchronize(k->ev[l]) != cudaSuccess) {
            atomic_fetch_add(&w->g->post_errors, 1);
        }
        on_layer_landed(&k->post[l]);
    }
    /* every rank's layers released: the last waiter ends every send, as the
     * prefill daemon does once its forward returned (ending them after
     * joining these threads counted their exit: 0.1-0.25 ms on 4 GPUs) */
    if (atomic_fetch_add(&w->g->waiters_done, 1) + 1 == w->g->tp)
        end_sends(w->g);
    return NULL;
}

/* --layer-done event: rank r's own thread queues its layers (stage, then
 * an event), as each engine rank thread does in the daemons: one host
 * thread launching every rank's copies would make the launches, not the
 * GPU, the bench's per-layer cost. */
static void *layer_launcher(void *arg)
{
    gwait_t *w = arg;
    gside_t *g = w->g;
    grank_t *k = &g->rk[w->r];
    if (cudaSetDevice(k->st.dev) != cudaSuccess)
        goto err_launch;
    while (!atomic_load(&g->go)) {
    }
    for (int l = 0; l < G_LAYERS; l++) {
        if (!g->b->device && copy_pages(g, w->r, l, l + 1, w->pages, w->n, true))
            goto err_launch;
        duet__cuda_signal_t sig = {k->sig_ctr, k->sig_word_dev, k->sig_seq0 + (unsigned)l};
        bool signalled = g->b->signal && g->b->packed;
        if (g->b->packed &&
            duet__cuda_kv_copy(k->st.s, k->pool, duet_kv_plane_bytes(&g->sd.layout), 2 * l, 2,
                               k->dlist, k->n_list, signalled ? &sig : NULL) != DUET_OK)
            goto err_launch;
        if (!signalled && cudaEventRecord(k->ev[l], k->st.s) != cudaSuccess)
            goto err_launch;
        atomic_store(&k->recorded, l + 1);
    }
    int64_t now = duet_now_ns(), prev = atomic_load(&g->launched_ns);
    while (now > prev && !atomic_compare_exchange_weak(&g->launched_ns, &prev, now)) {
    }
    return NULL;
err_launch:
    atomic_fetch_add(&g->post_errors, 1);
    atomic_store(&k->launch_failed, 1);
    return NULL;
}

static int32_t *seq_pages(int n)
{
    int32_t *p = duet_malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; p != NULL && i < n; i++)
        p[i] = i;
    return p;
}

/* ---- decode ---------------------------------------------------------------------------- */

/* Read rank r's destination pages [0, n) back and compare every byte. */
static int verify(gside_t *g, int r, int n, char *why, size_t why_len)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t len = (size_t)n * duet_kv_page_bytes(l);
    for (int p = 0; p < 2 * l->n_layers; p++)
        if (gs_copy(&k->st, k->back + g->cplane * (size_t)p,
                    k->pool + duet_kv_plane_bytes(l) * (size_t)p, len, true))
            return 1;
    if (gs_sync(&k->st))
        return 1;
    for (int p = 0; p < 2 * l->n_layers; p++) {
        const unsigned char *got = k->back + g->cplane * (size_t)p;
        const unsigned char *want = k->ref + g->cplane * (size_t)p;
        size_t i = 0, row = (size_t)l->head_dim * (size_t)l->elem_size;
        if (memcmp(got, want, len) == 0)
            continue;
        while (got[i] == want[i])
            i++;
        snprintf(why, why_len,
                 "decode rank %d: layer %d %c page %zu head %zu token %zu byte %zu is 0x%02x, "
                 "want 0x%02x",
                 r, p / 2, p % 2 ? 'V' : 'K', i / duet_kv_page_bytes(l),
                 k->head0 + i % duet_kv_page_bytes(l) / duet_kv_head_bytes(l),
                 i / duet_kv_page_bytes(l) * (size_t)l->page_size + i % duet_kv_head_bytes(l) / row,
                 i % row, got[i], want[i]);
        return 1;
    }
    return 0;
}

/* The progress messages a request of n pages gets (the decode daemon's
 * rule, decode/prefill_path.c and node/kv_engine.h). */
static int progress_of(const bench_t *b, int n)
{
    duet_kv_layout_t l = {
        .n_layers = G_LAYERS, .page_size = G_PAGE, .head_dim = G_HEAD_DIM, .elem_size = G_ELEM};
    if (b->progress_auto && b->shares_gpu && !duet_xfer_pack_progress_pays(&l, G_HEADS, n))
        return 0;
    return b->progress;
}

/* A packed expectation's callbacks (progress thread): what landed, and
 * the end. */
typedef struct {
    atomic_int landed, done;
    duet_status_t status;
    char detail[DUET_XFER_DETAIL_MAX];
} gexp_t;

static void on_exp_progress(void *arg, uint64_t id, int layers)
{
    (void)id;
    atomic_store(&((gexp_t *)arg)->landed, layers);
}

static void on_exp_done(void *arg, uint64_t id, const duet_xfer_result_t *res)
{
    gexp_t *x = arg;
    (void)id;
    x->status = res->status;
    snprintf(x->detail, sizeof(x->detail), "%s", res->detail);
    atomic_store(&x->done, 1);
}

/* Packed: wait for every rank's end, unpacking on the way the layers all
 * ranks have landed (as decode/prefill_path.c does with its progress
 * events); *unpacked_p: the layers queued so far. */
static int packed_wait(gside_t *g, gexp_t *x, int *unpacked_p)
{
    int64_t give_up = duet_now_ns() + (int64_t)G_TIMEOUT_MS * 1000000;
    /* BENCH_PROGRESS_NO_UNPACK=1 (a diagnostic): hear the progress but
     * unpack everything at the end, which splits the cost of announcing
     * (prefill) from the cost of unpacking early (decode) */
    bool early = getenv("BENCH_PROGRESS_NO_UNPACK") == NULL;
    for (;;) {
        int least = G_LAYERS, done = 0;
        for (int d = 0; d < g->tp; d++) {
            int l = atomic_load(&x[d].landed);
            least = l < least ? l : least;
            done += atomic_load(&x[d].done);
        }
        if (done == g->tp)
            break;
        if (early && least > *unpacked_p && least < G_LAYERS) {
            for (int d = 0; d < g->tp; d++)
                if (run_list(g, d, 2 * *unpacked_p, 2 * (least - *unpacked_p)))
                    return 1;
            *unpacked_p = least;
        }
        DUET_TESTKIT_CHECK(duet_now_ns() < give_up, "decode: the transfer did not end");
    }
    for (int d = 0; d < g->tp; d++)
        DUET_TESTKIT_CHECK(x[d].status == DUET_OK, "decode rank %d: %s", d, x[d].detail);
    return 0;
}

/* One request: clear, expect, wait for the KV, import, verify.  Reports
 * "done <notified ns> <imported ns>" or "bad <what>" to prefill. */
static int decode_request(gside_t *g, const duet_slice_plan_t *plan, const int32_t *pages,
                          uint64_t id, int n)
{
    int fd = g->b->fd_d;
    int64_t t_recv, t1;
    char msg[256];
    gexp_t x[G_MAX_TP];
    int unpacked = 0;
    for (int d = 0; d < g->tp; d++)
        if (clear_pages(g, d, n))
            return 1;
    for (int d = 0; d < g->tp; d++) {
        duet_xfer_expect_t e = {.transfer_id = id,
                                .plan = plan,
                                .peers = g->sd.peers[d],
                                .pages = pages,
                                .n_pages = n,
                                .deadline_ns = duet_deadline_in_ms(G_TIMEOUT_MS),
                                .flags = g->b->packed ? DUET_XFER_EXPECT_PACKED : 0,
                                .dst_stage0 = 0};
        if (g->b->packed) {
            memset(&x[d], 0, sizeof(x[d]));
            e.cb = on_exp_done;
            e.arg = &x[d];
            e.progress = progress_of(g->b, n) > 0 ? on_exp_progress : NULL;
            e.progress_arg = &x[d];
        }
        if (g->b->packed && upload_list(g, d, plan, pages, n))
            return 1;
        DUET_TESTKIT_OK(duet_xfer_recv_expect(duet_xfer_rank(g->sd.x, d), &e));
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(fd, "ok") == 0, "channel");
    if (g->b->packed && packed_wait(g, x, &unpacked))
        return 1;
    for (int d = 0; d < g->tp && !g->b->packed; d++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_recv_wait(duet_xfer_rank(g->sd.x, d), id,
                                            duet_deadline_in_ms(G_TIMEOUT_MS), &res));
        DUET_TESTKIT_CHECK(res.status == DUET_OK, "decode rank %d: %s", d, res.detail);
    }
    t_recv = duet_now_ns();
    /* --mirror device: the KV already is in the device pages, nothing to
     * import; --mirror packed: unstage every layer into the pages */
    for (int d = 0; d < g->tp && !g->b->device; d++)
        if (copy_pages(g, d, 0, G_LAYERS, pages, n, false))
            return 1;
    for (int d = 0; d < g->tp && g->b->packed; d++)
        if (run_list(g, d, 2 * unpacked, 2 * (G_LAYERS - unpacked)))
            return 1;
    int64_t t_launched = duet_now_ns();
    for (int d = 0; d < g->tp && (!g->b->device || g->b->packed); d++)
        if (gs_sync(&g->rk[d].st))
            return 1;
    t1 = g->b->device && !g->b->packed ? t_recv : duet_now_ns();
    if (g->b->packed && getenv("BENCH_IMPORT_DETAIL") != NULL) {
        /* where the unpack's time goes: the launches, the wait, and the
         * same unpack again at once (a warm GPU, nothing in flight) */
        int64_t t2 = duet_now_ns();
        for (int d = 0; d < g->tp; d++)
            if (run_list(g, d, 0, 2 * G_LAYERS))
                return 1;
        for (int d = 0; d < g->tp; d++)
            if (gs_sync(&g->rk[d].st))
                return 1;
        fprintf(stderr,
                "# import detail: %d pages, %d layers unpacked early, launch %.1f us, wait %.1f "
                "us, all again %.1f us\n",
                n, unpacked, (double)(t_launched - t_recv) / 1e3, (double)(t1 - t_launched) / 1e3,
                (double)(duet_now_ns() - t2) / 1e3);
    }
    for (int d = 0; d < g->tp; d++) {
        char why[200];
        if (verify(g, d, n, why, sizeof(why))) {
            duet_testkit_fail("request %llu, %d pages: %s", (unsigned long long)id, n, why);
            snprintf(msg, sizeof(msg), "bad %s", why);
            duet_testkit_chan_say(fd, msg);
            return 1;
        }
    }
    if (getenv("BENCH_TIMELINE") != NULL)
        fprintf(stderr, "timeline decode: received %lld imported %lld (us)\n",
                (long long)(t_recv / 1000), (long long)(t1 / 1000));
    snprintf(msg, sizeof(msg), "done %lld %lld", (long long)t_recv, (long long)t1);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(fd, msg) == 0, "channel");
    return 0;
}

static int bench_decode(void *arg)
{
    const bench_t *b = arg;
    duet_slice_plan_t *plan;
    int32_t *pages;
    gside_t *g = DUET_NEW(gside_t);
    int rc = 0;
    DUET_TESTKIT_CHECK(g != NULL, "out of memory");
    if (gside_start(g, b, DUET_XFER_DECODE, b->fd_d))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(b->P, b->D, G_HEADS, &plan));
    pages = seq_pages(g->max_pages);
    DUET_TESTKIT_CHECK(pages != NULL, "out of memory");
    while (rc == 0) {
        unsigned long long id;
        uint32_t len;
        void *msg;
        int n;
        DUET_TESTKIT_CHECK(duet_testkit_chan_recv(b->fd_d, &msg, &len, 300000) == 0,
                           "prefill went away");
        if (strcmp(msg, "bye") == 0) {
            duet_free(msg);
            break;
        }
        if (sscanf(msg, "exp %llu %d", &id, &n) != 2)
            n = -1;
        DUET_TESTKIT_CHECK(n > 0 && n <= g->max_pages, "bad message '%s'", (char *)msg);
        duet_free(msg);
        rc = decode_request(g, plan, pages, id, n);
    }
    duet_free(pages);
    duet_slice_plan_destroy(plan);
    if (gside_stop(g))
        rc = 1;
    duet_free(g);
    return rc;
}

/* ---- prefill ----------------------------------------------------------------------------- */

enum { T_E2E, T_EXPORT, T_PUTS, T_IMPORT, T_PUT1, T_LAUNCH, T_N };

/* One request; t[] gets the stage times in seconds. */
static int prefill_request(gside_t *g, const duet_slice_plan_t *plan, const int32_t *pages,
                           uint64_t id, int n, double *t)
{
    const bench_t *b = g->b;
    long long t_recv, t1;
    int64_t t0, t_put;
    size_t bytes = (size_t)n * G_PAGE * G_TOKEN_BYTES;
    char msg[64];
    void *reply;
    uint32_t len;

    for (int s = 0; s < g->tp; s++)
        if (clear_pages(g, s, n))
            return 1;
    snprintf(msg, sizeof(msg), "exp %llu %d", (unsigned long long)id, n);
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(b->fd_p, msg) == 0, "channel");
    DUET_TESTKIT_CHECK(duet_testkit_chan_expect(b->fd_p, "ok", G_TIMEOUT_MS) == 0,
                       "decode did not register");
    for (int s = 0; s < g->tp; s++) {
        duet_xfer_send_t x = {.transfer_id = id,
                              .plan = plan,
                              .peers = g->sd.peers[s],
                              .src_pages = pages,
                              .dst_pages = pages,
                              .n_pages = n,
                              .flags = (b->packed ? DUET_XFER_SEND_PACKED : 0u) |
                                       (b->checksum ? DUET_XFER_SEND_CRC : 0u),
                              .deadline_ns = duet_deadline_in_ms(G_TIMEOUT_MS),
                              .src_stage0 = 0,
                              .dst_stage0 = 0,
                              .progress_layers = b->packed ? progress_of(b, n) : 0};
        if (b->packed && upload_list(g, s, plan, pages, n))
            return 1;
        DUET_TESTKIT_OK(duet_xfer_send_begin(duet_xfer_rank(g->sd.x, s), &x));
    }
    atomic_store(&g->cur_id, id);
    atomic_store(&g->landed, 0);
    atomic_store(&g->landed_ns, 0);
    atomic_store(&g->launched_ns, 0);
    atomic_store(&g->waiters_done, 0);
    atomic_store(&g->ended_ns, 0);
    t0 = duet_now_ns();
    /* what the rank threads do as each layer's KV is stored; --mirror device
     * exports nothing (the pool was rewritten and synchronised before t0)
     * but posts the puts from the same host functions on the copy stream
     * (--layer-done event: from each rank's waiter thread, the layers
     * queued by each rank's launcher thread) */
    gwait_t waits[G_MAX_TP];
    for (int s = 0; s < g->tp && b->event_done; s++) {
        grank_t *k = &g->rk[s];
        waits[s] = (gwait_t){g, s, pages, n};
        atomic_store(&k->recorded, 0);
        atomic_store(&k->launch_failed, 0);
        G_CUDA(cudaSetDevice(k->st.dev));
        for (int l = 0; l < G_LAYERS; l++)
            if (k->ev[l] == NULL)
                G_CUDA(cudaEventCreateWithFlags(&k->ev[l], cudaEventDisableTiming));
        if (b->signal && k->sig_word == NULL) {
            G_CUDA(cudaHostAlloc((void **)&k->sig_word, sizeof(*k->sig_word),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
            G_CUDA(cudaHostGetDevicePointer((void **)&k->sig_word_dev, k->sig_word, 0));
            G_CUDA(cudaMalloc((void **)&k->sig_ctr, sizeof(*k->sig_ctr)));
            G_CUDA(cudaMemset(k->sig_ctr, 0, sizeof(*k->sig_ctr)));
            *k->sig_word = 0;
        }
        /* this round's seqs follow the last round's (the word only grows) */
        k->sig_seq0 = k->sig_word != NULL ? *k->sig_word + 1 : 0;
    }
    if (b->event_done) {
        /* the threads start (and bind their GPU) before t0: in the daemons
         * the rank and completion threads exist before the request */
        atomic_store(&g->go, 0);
        for (int s = 0; s < g->tp; s++)
            DUET_TESTKIT_CHECK(
                pthread_create(&g->rk[s].waiter, NULL, layer_waiter, &waits[s]) == 0 &&
                    pthread_create(&g->rk[s].launcher, NULL, layer_launcher, &waits[s]) == 0,
                "pthread_create");
        usleep(2000); /* past their cudaSetDevice */
        t0 = duet_now_ns();
        atomic_store(&g->go, 1);
        for (int s = 0; s < g->tp; s++) {
            pthread_join(g->rk[s].launcher, NULL);
            pthread_join(g->rk[s].waiter, NULL);
        }
    }
    for (int l = 0; l < G_LAYERS && !b->event_done; l++)
        for (int s = 0; s < g->tp; s++) {
            grank_t *k = &g->rk[s];
            if ((!b->device && copy_pages(g, s, l, l + 1, pages, n, true)) ||
                (b->packed && run_list(g, s, 2 * l, 2)))
                return 1;
            if (gs_host_fn(&k->st, on_layer_landed, &k->post[l]))
                return 1;
        }
    /* the end of every rank's send: as the prefill daemon ends them once
     * its forward returned, every rank's layers released (--layer-done
     * event: the last waiter did, unless one failed; a stream synchronize
     * of every rank first, which the daemons do not do, cost 0.26-0.45 ms
     * on 4 GPUs); with host functions their stream must have run them */
    for (int s = 0; s < g->tp && !b->event_done; s++)
        if (gs_sync(&g->rk[s].st))
            return 1;
    if (atomic_load(&g->ended_ns) == 0)
        end_sends(g);
    int64_t t_ended = atomic_load(&g->ended_ns);
    for (int s = 0; s < g->tp && b->event_done; s++)
        if (gs_sync(&g->rk[s].st))
            return 1;
    int64_t t_synced = duet_now_ns();
    if (getenv("BENCH_TIMELINE") != NULL) /* with DUET_LOG_LEVEL=trace: the transfer's own */
        fprintf(stderr,
                "timeline prefill: request %llu t0 %lld launched %lld landed %lld synced %lld "
                "ended %lld (us)\n",
                (unsigned long long)id, (long long)(t0 / 1000),
                (long long)(atomic_load(&g->launched_ns) / 1000),
                (long long)(atomic_load(&g->landed_ns) / 1000), (long long)(t_synced / 1000),
                (long long)(t_ended / 1000));
    for (int s = 0; s < g->tp; s++) {
        duet_xfer_result_t res;
        DUET_TESTKIT_OK(duet_xfer_send_wait(duet_xfer_rank(g->sd.x, s), id,
                                            duet_deadline_in_ms(G_TIMEOUT_MS), &res));
        DUET_TESTKIT_CHECK(res.status == DUET_OK, "prefill rank %d: %s", s, res.detail);
        g->rk[s].puts = res.puts;
    }
    DUET_TESTKIT_CHECK(atomic_load(&g->landed) == G_LAYERS * g->tp &&
                           atomic_load(&g->post_errors) == 0,
                       "%d of %d layers landed, %d posts refused", atomic_load(&g->landed),
                       G_LAYERS * g->tp, atomic_load(&g->post_errors));
    DUET_TESTKIT_CHECK(duet_testkit_chan_recv(b->fd_p, &reply, &len, G_TIMEOUT_MS) == 0,
                       "no word from decode");
    if (sscanf(reply, "done %lld %lld", &t_recv, &t1) != 2) {
        duet_testkit_fail("decode: %s", (char *)reply);
        duet_free(reply);
        return 1;
    }
    duet_free(reply);
    t[T_E2E] = (double)(t1 - t0) / 1e9;
    t[T_EXPORT] = (double)(atomic_load(&g->landed_ns) - t0) / 1e9;
    t[T_LAUNCH] = b->event_done ? (double)(atomic_load(&g->launched_ns) - t0) / 1e9 : 0.0;
    t[T_PUTS] = (double)(t_recv - atomic_load(&g->landed_ns)) / 1e9;
    t[T_IMPORT] = (double)(t1 - t_recv) / 1e9;
    /* one put of the same bytes, mirror to mirror (--mirror device: device
     * pool to device pool) */
    t_put = duet_now_ns();
    DUET_TESTKIT_OK(
        duet_xfer_debug_put(g->sd.peers[0][0], 0, 0, bytes, duet_deadline_in_ms(G_TIMEOUT_MS)));
    t[T_PUT1] = (double)(duet_now_ns() - t_put) / 1e9;
    return 0;
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

static int bench_prefill(void *arg)
{
    const bench_t *b = arg;
    duet_slice_plan_t *plan;
    int32_t *pages;
    gside_t *g = DUET_NEW(gside_t);
    uint64_t id = 1;
    DUET_TESTKIT_CHECK(g != NULL, "out of memory");
    if (gside_start(g, b, DUET_XFER_PREFILL, b->fd_p))
        return 1;
    DUET_TESTKIT_OK(duet_slice_plan_create(b->P, b->D, G_HEADS, &plan));
    pages = seq_pages(g->max_pages);
    DUET_TESTKIT_CHECK(pages != NULL, "out of memory");
    DUET_TESTKIT_OK(duet_xfer_debug_corrupt_put(duet_xfer_rank(g->sd.x, 0), b->corrupt_put));
    for (int i = 0; i < b->n_tokens; i++) {
        double t[T_N][G_MAX_ROUNDS], med[T_N], r[T_N];
        int n = (b->tokens[i] + G_PAGE - 1) / G_PAGE;
        double bytes = (double)n * G_PAGE * G_TOKEN_BYTES;
        /* round 0 warms up (first touch of the pages, UCX attach) */
        for (int round = 0; round <= b->rounds; round++) {
            if (prefill_request(g, plan, pages, id++, n, r))
                return 1;
            for (int k = 0; round > 0 && k < T_N; k++)
                t[k][round - 1] = r[k];
        }
        for (int k = 0; k < T_N; k++)
            med[k] = median(t[k], b->rounds);
        /* a staged copy cannot beat max(d2h, put) + h2d of the same bytes; the
         * device-direct path is its puts alone */
        double put = bytes / med[T_PUT1] / 1e9, d2h = b->base.d2h[i], h2d = b->base.h2d[i];
        double model = b->device            ? put
                       : d2h > 0 && h2d > 0 ? 1.0 / ((1.0 / (d2h < put ? d2h : put)) + 1.0 / h2d)
                                            : 0;
        double e2e = bytes / med[T_E2E] / 1e9;
        double ref = strcmp(b->variant, "same") == 0 ? b->base.d2d[i] : b->base.peer[i];
        uint64_t puts = 0;
        for (int s = 0; s < g->tp; s++)
            puts += g->rk[s].puts;
        printf("%-7s %2d %2d %6d %7.0f %9.2f %9.2f %8.2f %9.2f %9.2f %9.2f %9.2f %8.2f %7llu "
               "%9.2f%s\n",
               b->variant, b->P, b->D, b->tokens[i], bytes / 1048576.0, e2e, med[T_EXPORT] * 1e3,
               med[T_PUTS] * 1e3, med[T_IMPORT] * 1e3, put, model, ref, ref > 0 ? e2e / ref : 0.0,
               (unsigned long long)puts, med[T_LAUNCH] * 1e3,
               !b->auto_pack ? ""
               : b->packed   ? " packed"
                             : " direct");
        fflush(stdout);
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_say(b->fd_p, "bye") == 0, "channel");
    duet_free(pages);
    duet_slice_plan_destroy(plan);
    int rc = gside_stop(g);
    duet_free(g);
    return rc;
}

/* ---- baselines ---------------------------------------------------------------------------- */

enum { C_D2H, C_H2D, C_PEER, C_D2D };

/* Median GB/s of `rounds` copies of `bytes` (after one warm-up). */
static int time_copy(const bench_t *b, int what, void *dst, const void *src, size_t bytes,
                     cudaStream_t s, double *gbps_p)
{
    double t[G_MAX_ROUNDS + 1];
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (b->cuda) {
        G_CUDA(cudaEventCreate(&e0));
        G_CUDA(cudaEventCreate(&e1));
    }
    for (int i = 0; i <= b->rounds; i++) {
        int64_t h0 = duet_now_ns();
        float ms = 0;
        if (!b->cuda) {
            memcpy(dst, src, bytes);
            t[i] = (double)(duet_now_ns() - h0) / 1e9;
            continue;
        }
        G_CUDA(cudaEventRecord(e0, s));
        if (what == C_PEER)
            G_CUDA(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, s));
        else
            G_CUDA(cudaMemcpyAsync(dst, src, bytes,
                                   what == C_D2H   ? cudaMemcpyDeviceToHost
                                   : what == C_H2D ? cudaMemcpyHostToDevice
                                                   : cudaMemcpyDeviceToDevice,
                                   s));
        G_CUDA(cudaEventRecord(e1, s));
        G_CUDA(cudaEventSynchronize(e1));
        G_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        t[i] = ms / 1e3;
    }
    if (b->cuda) {
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    *gbps_p = (double)bytes / median(t + 1, b->rounds) / 1e9;
    return 0;
}

static int describe_gpus(base_t *r)
{
    int drv = 0, rt = 0;
    G_CUDA(cudaGetDeviceCount(&r->n_dev));
    G_CUDA(cudaDriverGetVersion(&drv));
    G_CUDA(cudaRuntimeGetVersion(&rt));
    printf("# CUDA driver %d.%d, runtime %d.%d, %d GPU(s)\n", drv / 1000, drv % 1000 / 10,
           rt / 1000, rt % 1000 / 10, r->n_dev);
    for (int d = 0; d < r->n_dev; d++) {
        struct cudaDeviceProp p;
        char bus[32] = "";
        G_CUDA(cudaGetDeviceProperties(&p, d));
        cudaDeviceGetPCIBusId(bus, sizeof(bus), d);
        printf("# GPU %d: %s, %.1f GiB, PCI %s\n", d, p.name, p.totalGlobalMem / 1073741824.0, bus);
    }
    if (r->n_dev >= 2) {
        int a = 0, c = 0, perf = -1;
        G_CUDA(cudaDeviceCanAccessPeer(&a, 0, 1));
        G_CUDA(cudaDeviceCanAccessPeer(&c, 1, 0));
        cudaDeviceGetP2PAttribute(&perf, cudaDevP2PAttrPerformanceRank, 0, 1);
        r->p2p = a && c;
        if (r->p2p) {
            G_CUDA(cudaSetDevice(0));
            G_CUDA(cudaDeviceEnablePeerAccess(1, 0));
            G_CUDA(cudaSetDevice(1));
            G_CUDA(cudaDeviceEnablePeerAccess(0, 0));
        }
        printf("# GPU 0 <-> 1 peer access %s (performance rank %d)\n",
               r->p2p ? "yes, enabled" : "NO (cudaMemcpyPeer staged through the host)", perf);
    }
    return 0;
}

/* --mirror device: can this UCX (with b->tls) move CUDA memory? */
static int probe_ucx_cuda(const bench_t *b, int *yes_p)
{
    duet_xfer_config_t cfg;
    duet_xfer_t *x;
    memset(&cfg, 0, sizeof(cfg));
    cfg.role = DUET_XFER_PREFILL;
    cfg.tp = 1;
    cfg.kv_heads = G_HEADS;
    cfg.dtype = DUET_DTYPE_BF16;
    cfg.layout = (duet_kv_layout_t){.n_layers = G_LAYERS,
                                    .n_pages = 1,
                                    .page_size = G_PAGE,
                                    .n_kv_heads = G_HEADS,
                                    .head_dim = G_HEAD_DIM,
                                    .elem_size = G_ELEM};
    cfg.model_fingerprint = 1;
    cfg.tls = b->tls;
    DUET_TESTKIT_OK(duet_xfer_create(&cfg, &x));
    *yes_p = duet_xfer_supports_cuda_memory(x);
    duet_xfer_destroy(x);
    return 0;
}

static int bench_baseline(void *arg)
{
    const bench_t *b = arg;
    base_t r;
    size_t max = (size_t)max_pages(b) * G_PAGE * G_TOKEN_BYTES;
    void *host = NULL, *d0 = NULL, *d0b = NULL, *d1 = NULL;
    cudaStream_t s = NULL;
    memset(&r, 0, sizeof(r));
    if (b->device) {
        if (probe_ucx_cuda(b, &r.ucx_cuda))
            return 1;
        if (!r.ucx_cuda) {
            /* nothing to measure: say so to the parent */
            DUET_TESTKIT_CHECK(duet_testkit_chan_send(b->fd_d, &r, sizeof(r)) == 0, "channel");
            return 0;
        }
    }
    if (b->cuda) {
        if (describe_gpus(&r))
            return 1;
        DUET_TESTKIT_CHECK(r.n_dev >= 1, "no GPU (--no-cuda runs without one)");
        G_CUDA(cudaSetDevice(0));
        G_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        G_CUDA(cudaMallocHost(&host, max));
        G_CUDA(cudaMalloc(&d0, max));
        G_CUDA(cudaMalloc(&d0b, max));
        memset(host, 0x3c, max);
        G_CUDA(cudaMemset(d0, 0x3c, max));
        if (r.n_dev >= 2) {
            G_CUDA(cudaSetDevice(1));
            G_CUDA(cudaMalloc(&d1, max));
            G_CUDA(cudaSetDevice(0));
        }
    } else {
        r.n_dev = 2; /* both variants run on host memory */
        printf("# --no-cuda: host memory for device memory, memcpy for every copy\n");
        host = duet_aligned_alloc(4096, max);
        d0 = duet_aligned_alloc(4096, max);
        d0b = duet_aligned_alloc(4096, max);
        d1 = duet_aligned_alloc(4096, max);
        DUET_TESTKIT_CHECK(host && d0 && d0b && d1, "out of memory");
        memset(host, 0x3c, max);
        memset(d0, 0x3c, max);
        memset(d0b, 0, max);
        memset(d1, 0, max);
    }
    printf("# copies, one of each size, median of %d (GB/s): pinned host<->GPU 0, GPU 0 -> GPU 1 "
           "(cudaMemcpyPeer), GPU 0 -> GPU 0\n",
           b->rounds);
    printf("%-7s %6s %7s %9s %9s %9s %9s\n", "# copy", "tokens", "MiB", "d2h", "h2d", "peer",
           "d2d");
    for (int i = 0; i < b->n_tokens; i++) {
        size_t bytes = (size_t)((b->tokens[i] + G_PAGE - 1) / G_PAGE) * G_PAGE * G_TOKEN_BYTES;
        if (time_copy(b, C_D2H, host, d0, bytes, s, &r.d2h[i]) ||
            time_copy(b, C_H2D, d0b, host, bytes, s, &r.h2d[i]) ||
            time_copy(b, C_D2D, d0b, d0, bytes, s, &r.d2d[i]) ||
            (d1 != NULL && time_copy(b, C_PEER, d1, d0, bytes, s, &r.peer[i])))
            return 1;
        printf("%-7s %6d %7.0f %9.2f %9.2f %9.2f %9.2f\n", "copy", b->tokens[i], bytes / 1048576.0,
               r.d2h[i], r.h2d[i], r.peer[i], r.d2d[i]);
    }
    fflush(stdout);
    if (b->cuda) {
        cudaFreeHost(host);
        cudaFree(d0);
        cudaFree(d0b);
        cudaFree(d1);
        cudaStreamDestroy(s);
    } else {
        duet_aligned_free(host);
        duet_aligned_free(d0);
        duet_aligned_free(d0b);
        duet_aligned_free(d1);
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_send(b->fd_d, &r, sizeof(r)) == 0, "channel");
    return 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

static int parse_ints(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 20)
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return *s ? -1 : n;
}

/* affine: the GPU of rank `me`'s first peer in the plan (`peer_dev`, n_peer
 * ranks) that no earlier rank of its own side (taken[0..me)) holds, else
 * of its first peer; by_decode: `me` is a decode rank and its peers are
 * its senders, else a prefill rank and its peers its receivers. */
static int affine_gpu(const int *peer_dev, int n_peer, const int *taken, int me,
                      const duet_slice_plan_t *plan, bool by_decode)
{
    int first = -1;
    for (int k = 0; k < n_peer; k++) {
        bool peer = by_decode ? duet_slice_plan_sender_mask(plan, me) >> k & 1u
                              : duet_slice_plan_sender_mask(plan, k) >> me & 1u;
        bool free = true;
        if (!peer)
            continue;
        if (first < 0)
            first = peer_dev[k];
        for (int t = 0; t < me; t++)
            free = free && taken[t] != peer_dev[k];
        if (free)
            return peer_dev[k];
    }
    return first;
}

/* spread: prefill rank i on GPU i mod n, decode on the last D GPUs;
 * same: everything on GPU 0;
 * affine: where P != D, the side with more ranks as spread, and each rank of
 * the other on the GPU of its first peer in the plan (P > D: decode rank j
 * on its first sender's GPU; P < D: prefill rank i on its first receiver's),
 * so a share of every rank's KV never crosses a link; where P == D, spread. */
static int place(bench_t *b, int n_dev)
{
    bool same = strcmp(b->variant, "same") == 0;
    bool affine = strcmp(b->variant, "affine") == 0 && b->P != b->D;
    duet_slice_plan_t *plan;
    for (int i = 0; i < b->P; i++)
        b->pdev[i] = same ? 0 : i % n_dev;
    for (int j = 0; j < b->D; j++)
        b->ddev[j] = same ? 0 : (((n_dev - b->D) % n_dev + n_dev) % n_dev + j) % n_dev;
    /* as node/link.c decides it from the Bootstrap reply */
    if (duet_slice_plan_create(b->P, b->D, G_HEADS, &plan) != DUET_OK)
        return 1;
    if (affine && b->P > b->D) {
        for (int j = 0; j < b->D; j++)
            b->ddev[j] = affine_gpu(b->pdev, b->P, b->ddev, j, plan, true);
    } else if (affine) {
        for (int j = 0; j < b->D; j++)
            b->ddev[j] = j % n_dev;
        for (int i = 0; i < b->P; i++)
            b->pdev[i] = affine_gpu(b->ddev, b->D, b->pdev, i, plan, false);
    }
    b->shares_gpu = false;
    for (int j = 0; j < b->D; j++)
        for (int i = 0; i < b->P; i++)
            if ((duet_slice_plan_sender_mask(plan, j) >> i & 1u) && b->pdev[i] == b->ddev[j])
                b->shares_gpu = true;
    duet_slice_plan_destroy(plan);
    return 0;
}

static int run_baseline(bench_t *b)
{
    int fds[2], rc;
    pid_t pid;
    void *msg = NULL;
    uint32_t len = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
        return 1;
    b->fd_d = fds[1];
    pid = duet_testkit_spawn("baseline", bench_baseline, b, &fds[0], 1);
    if (duet_testkit_chan_recv(fds[0], &msg, &len, 300000) == 0 && len == sizeof(b->base))
        memcpy(&b->base, msg, sizeof(b->base));
    else
        len = 0;
    duet_free(msg);
    if (duet_testkit_wait_all(&pid, 1, duet_deadline_in_ms(60000), &rc) != 0 || len == 0) {
        fprintf(stderr, "baseline copies failed (exit %d)\n", rc);
        rc = 1;
    }
    close(fds[0]);
    close(fds[1]);
    return rc;
}

int main(int argc, char **argv)
{
    char plans_buf[128] = "1x1,1x2,2x1", variants_buf[64] = "spread,same";
    const char *pool_desc;
    bench_t b;
    int bad = 0, usage = 0;
    bool done_set = false;
    memset(&b, 0, sizeof(b));
    b.cuda = true;
    b.tls = NULL; /* G_TLS, or G_TLS_DEVICE with --mirror device */
    b.rounds = 5;
    b.corrupt_put = -1;
    b.progress = 8;
    b.progress_auto = true;
    b.n_tokens = parse_ints("512,1024,2048,4096,8192", b.tokens, G_MAX_SIZES);
    for (int i = 1; i < argc && !usage; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--no-cuda") == 0) {
            b.cuda = false;
            continue;
        }
        if (strcmp(argv[i], "--checksum") == 0) {
            b.checksum = true;
            continue;
        }
        if (v == NULL)
            usage = 1;
        else if (strcmp(argv[i], "--plans") == 0)
            snprintf(plans_buf, sizeof(plans_buf), "%s", v);
        else if (strcmp(argv[i], "--variants") == 0)
            snprintf(variants_buf, sizeof(variants_buf), "%s", v);
        else if (strcmp(argv[i], "--tokens") == 0)
            b.n_tokens = parse_ints(v, b.tokens, G_MAX_SIZES);
        else if (strcmp(argv[i], "--rounds") == 0)
            b.rounds = atoi(v);
        else if (strcmp(argv[i], "--corrupt-put") == 0)
            b.corrupt_put = atol(v);
        else if (strcmp(argv[i], "--tls") == 0)
            b.tls = v;
        else if (strcmp(argv[i], "--progress") == 0) {
            b.progress_auto = strcmp(v, "auto") == 0;
            b.progress = b.progress_auto ? 8 : strcmp(v, "off") == 0 ? 0 : atoi(v);
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "ucx-alloc") == 0)
            b.registered = b.device = false;
        else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "registered") == 0) {
            b.registered = true;
            b.device = false;
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "device") == 0) {
            b.registered = false;
            b.device = true;
        } else if (strcmp(argv[i], "--layer-done") == 0 && strcmp(v, "event") == 0) {
            b.event_done = done_set = true;
            b.signal = false;
        } else if (strcmp(argv[i], "--layer-done") == 0 && strcmp(v, "signal") == 0) {
            b.event_done = b.signal = done_set = true;
        } else if (strcmp(argv[i], "--layer-done") == 0 && strcmp(v, "hostfn") == 0) {
            b.event_done = false;
            done_set = true;
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "packed") == 0) {
            b.registered = false;
            b.device = b.packed = true;
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "auto") == 0) {
            b.registered = false;
            b.device = b.auto_pack = true;
            if (!done_set)
                b.event_done = b.signal = true;
        } else
            usage = 1;
        i++;
    }
    if (!usage && b.event_done && !b.cuda) {
        fprintf(stderr, "--layer-done event needs CUDA streams: not with --no-cuda\n");
        usage = 1;
    }
    if (!usage && b.device && !b.cuda) {
        fprintf(stderr, "--mirror device needs CUDA device memory: not with --no-cuda\n");
        usage = 1;
    }
    if (usage || b.n_tokens <= 0 || b.rounds < 1 || b.rounds > G_MAX_ROUNDS || b.progress < 0 ||
        b.progress > G_LAYERS) {
        fprintf(stderr,
                "usage: %s [--plans 1x1,1x2,2x1] [--tokens 512,...,8192] [--variants spread,same] "
                "[--rounds 5] [--tls sm,self] [--mirror ucx-alloc|registered|device|packed|auto] "
                "[--layer-done hostfn|event|signal] [--no-cuda] "
                "[--corrupt-put N] [--checksum] [--progress auto|N|off]\n",
                argv[0]);
        return 2;
    }
    if (b.tls == NULL)
        b.tls = b.device ? G_TLS_DEVICE : G_TLS;
    pool_desc = b.device       ? "pool device (registered with UCX, no mirror)"
                : b.registered ? "mirror registered"
                               : "mirror ucx-alloc";
    duet_log_set_level(DUET_LOG_LEVEL_ERROR);
    duet_log_init_from_env();
    signal(SIGPIPE, SIG_IGN);
    printf("# Llama-3-8B KV (32 layers, 8 KV heads, head_dim 128, page 16, bf16, 128 KiB/token); "
           "UCX_TLS %s; %d CPUs; %s; checksums %s\n",
           b.tls, duet_cpu_count(), pool_desc,
           !b.checksum ? "off"
           : b.device  ? "on (CRC32C on the GPU: kv_crc)"
                       : "on (CRC32C on the CPU)");
    if (run_baseline(&b))
        return 1;
    if (b.device && !b.base.ucx_cuda) {
        printf("# --mirror device: this UCX build has no CUDA transports (UCX_TLS %s): "
               "nothing measured\n",
               b.tls);
        return 0;
    }
    if (b.device)
        printf("# device-direct: e2e: first layer's host function queued on prefill (no export "
               "copy) -> every decode rank notified (no import copy); export: the host functions "
               "ran, import 0; medians of %d after a warm-up;\n"
               "# put: one put of the same bytes device pool -> device pool + flush; model: put, "
               "the path with nothing but its puts;\n",
               b.rounds);
    else
        printf("# e2e: first device->host copy issued on prefill -> last host->device copy landed "
               "on decode; export/puts/import: the stages in turn; medians of %d after a warm-up;\n"
               "# put: one host put of the same bytes mirror -> mirror + flush; model: "
               "1/(1/min(d2h, put) + 1/h2d), the staged path with perfect overlap;\n",
               b.rounds);
    printf("# ref: cudaMemcpyPeer GPU 0 -> 1 (spread, affine) or device -> device on GPU 0 (same), "
           "same size; every destination byte verified after every transfer; launch: when the "
           "last prefill rank had queued its layers (--layer-done event)\n");
    if (b.packed || b.auto_pack) {
        if (b.progress > 0)
            printf("# packed: progress every %d layers%s, decode unpacks what landed as it comes; "
                   "import: the end -> the last unpack landed\n",
                   b.progress,
                   b.progress_auto ? " (auto: from 512 MiB of KV where a decode rank shares a "
                                     "sender's GPU)"
                                   : "");
        else
            printf("# packed: progress off, decode unpacks every layer after the end\n");
    }
    printf("%-7s %2s %2s %6s %7s %9s %9s %8s %9s %9s %9s %9s %8s %7s %9s\n", "# var", "P", "D",
           "tokens", "MiB", "e2e_GB/s", "export_ms", "puts_ms", "import_ms", "put_GB/s", "model",
           "ref", "e2e/ref", "puts", "launch_ms");
    for (char *vsave = NULL, *var = strtok_r(variants_buf, ",", &vsave); var != NULL;
         var = strtok_r(NULL, ",", &vsave)) {
        char plans[128];
        if (strcmp(var, "spread") != 0 && strcmp(var, "same") != 0 &&
            strcmp(var, "affine") != 0) {
            fprintf(stderr, "unknown variant '%s'\n", var);
            return 2;
        }
        if (strcmp(var, "same") != 0 && b.base.n_dev < 2) {
            printf("# %s: skipped, %d GPU\n", var, b.base.n_dev);
            continue;
        }
        b.variant = var;
        snprintf(plans, sizeof(plans), "%s", plans_buf);
        for (char *psave = NULL, *pl = strtok_r(plans, ",", &psave); pl != NULL;
             pl = strtok_r(NULL, ",", &psave)) {
            int fds[2], rc[2];
            pid_t pids[2];
            if (sscanf(pl, "%dx%d", &b.P, &b.D) != 2 || b.P < 1 || b.D < 1 || b.P > G_MAX_TP ||
                b.D > G_MAX_TP || G_HEADS % b.P || G_HEADS % b.D) {
                fprintf(stderr, "bad plan '%s' (P and D must divide %d)\n", pl, G_HEADS);
                return 2;
            }
            if (b.auto_pack)
                b.packed = b.P != b.D;
            if (place(&b, b.base.n_dev))
                return 1;
            if (b.packed && b.progress > 0)
                printf("# %s %dx%d: progress every %d layers%s\n", var, b.P, b.D, b.progress,
                       !b.progress_auto || !b.shares_gpu
                           ? ""
                           : " from 512 MiB of KV (a decode rank shares a sender's GPU)");
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
                return 1;
            b.fd_p = fds[0];
            b.fd_d = fds[1];
            pids[0] = duet_testkit_spawn("prefill", bench_prefill, &b, &fds[1], 1);
            pids[1] = duet_testkit_spawn("decode", bench_decode, &b, &fds[0], 1);
            if (duet_testkit_wait_all(pids, 2, duet_deadline_in_ms(600000), rc) != 0) {
                fprintf(stderr, "%s %s: prefill exit %d, decode exit %d\n", var, pl, rc[0], rc[1]);
                bad++;
            }
            close(fds[0]);
            close(fds[1]);
        }
    }
    printf("# %s\n", bad ? "FAILED" : "all transfers verified");
    return bad ? 1 : 0;
}
