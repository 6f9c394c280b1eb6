/* bench_gpu_transfer (main.c says what it measures and how to run it):
 * what its files share.
 *
 *   main.c      options, GPU placement, the run of every plan and variant,
 *               the report's header
 *   side.c      one process's ranks: devices, pools and mirrors, streams,
 *               KV contents, the layer release paths (host function,
 *               event waiter, signal)
 *   prefill.c   the sending process: one request's stages timed, a row
 *               of the report per size
 *   decode.c    the receiving process: expectations, import, verification
 *   baseline.c  the copies that bound a transfer, measured in a process
 *               of their own */
#ifndef DUET_BENCH_GPU_TRANSFER_H
#define DUET_BENCH_GPU_TRANSFER_H

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

typedef struct {
    bool cuda;
    int dev;
    cudaStream_t s;
} gstream_t;

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

/* side.c: streams (CUDA, or memcpy with --no-cuda) */
int gs_copy(const gstream_t *s, void *dst, const void *src, size_t n, bool to_host);
int gs_host_fn(const gstream_t *s, cudaHostFn_t fn, void *arg);
int gs_sync(const gstream_t *s);
/* side.c: one process's ranks */
int max_pages(const bench_t *b); /* of the largest request */
int gside_start(gside_t *g, const bench_t *b, duet_xfer_role_t role, int fd);
int gside_stop(gside_t *g);
/* Queue the copies of layers [l0, l1) of pages[0..n) between rank r's
 * pool and its mirror (to_host: pool -> mirror). */
int copy_pages(gside_t *g, int r, int l0, int l1, const int32_t *pages, int n, bool to_host);
int clear_pages(gside_t *g, int r, int n);
/* --mirror packed: the request's (un)pack copy list on rank r, and a run
 * of planes [plane0, plane0 + n_planes) of it */
int upload_list(gside_t *g, int r, const duet_slice_plan_t *plan, const int32_t *pages, int n);
int run_list(gside_t *g, int r, int plane0, int n_planes);
int32_t *seq_pages(int n); /* 0, 1, ..., n-1 (duet_malloc) */

/* decode.c: layers per progress message for a request of n pages (0: off) */
int progress_of(const bench_t *b, int n);
/* prefill.c: the median of v[0..n) (sorts v) */
double median(double *v, int n);

/* prefill.c, decode.c, baseline.c: the processes' bodies
 * (duet_testkit_spawn) */
int bench_prefill(void *arg);
int bench_decode(void *arg);
int bench_baseline(void *arg);

#endif
