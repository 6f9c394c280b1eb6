/* NCCL comm backend: see engine/comm_nccl.h for the contract and the
 * deadline design.  Every function runs on the rank's own thread, except
 * duet_comm_nccl_group_abort (any thread: it only sets the group flag that
 * each rank's polls act on, so ncclCommAbort is always called by the
 * thread that owns the communicator). */
#include "engine/comm_nccl.h"

#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "engine/cuda/cuda_internal.h"

struct duet_comm_nccl_group {
    int size;
    int timeout_ms;
    ncclUniqueId id;
    atomic_int aborted; /* duet_status_t, 0 while healthy */
    pthread_mutex_t lock;
    char abort_msg[256];
};

typedef struct {
    duet_comm_t base;
    duet_comm_nccl_group_t *grp;
    duet_backend_rank_t *br;
    cudaStream_t stream;
    int device;
    ncclComm_t comm;
    bool comm_aborted;
    uint64_t n_ops;
    const char *last_op;
    size_t last_count;
    void *d_stage; /* device staging for broadcasts of host memory */
    void *h_stage; /* pinned */
    size_t stage_bytes;
    float *d_one; /* barrier */
} duet__nccl_comm_t;

static const duet_comm_ops_t duet__nccl_ops;

void duet_comm_nccl_group_abort(duet_comm_nccl_group_t *g, duet_status_t st, const char *why)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->lock);
    if (atomic_load(&g->aborted) == 0) {
        snprintf(g->abort_msg, sizeof(g->abort_msg), "%s", why);
        atomic_store(&g->aborted, st != DUET_OK ? (int)st : (int)DUET_ERR_PEER);
    }
    pthread_mutex_unlock(&g->lock);
}

/* Decode graphs that captured this communicator's collectives keep NCCL
 * "persistent" references to it, and ncclCommFinalize / ncclCommAbort wait
 * (without a deadline) until those graphs are gone: drop them first.  Runs
 * on the rank's thread, which owns the backend rank. */
static void duet__drop_graphs(duet__nccl_comm_t *c)
{
    if (c->br != NULL)
        duet__cuda_graphs_reset(c->br);
}

static void duet__abort_comm(duet__nccl_comm_t *c)
{
    if (c->comm != NULL && !c->comm_aborted) {
        cudaSetDevice(c->device);
        duet__drop_graphs(c);
        ncclCommAbort(c->comm);
        c->comm_aborted = true;
    }
}

/* The group was aborted (by this rank or another): abort this rank's
 * communicator too and report the group's reason. */
static duet_status_t duet__aborted(duet__nccl_comm_t *c, const char *op)
{
    duet_comm_nccl_group_t *g = c->grp;
    char msg[256];
    duet__abort_comm(c);
    pthread_mutex_lock(&g->lock);
    snprintf(msg, sizeof(msg), "%s", g->abort_msg);
    pthread_mutex_unlock(&g->lock);
    return duet_error((duet_status_t)atomic_load(&g->aborted), "comm nccl rank %d %s: %s",
                      c->base.rank, op, msg);
}

static duet_status_t duet__fail(duet__nccl_comm_t *c, duet_status_t st, const char *op,
                                const char *fmt_msg)
{
    char msg[256];
    snprintf(msg, sizeof(msg), "rank %d: %s", c->base.rank, fmt_msg);
    DUET_LOG_ERROR("comm nccl: %s: %s", op, msg);
    duet_comm_nccl_group_abort(c->grp, st, msg);
    return duet__aborted(c, op);
}

/* One poll: group abort, async NCCL error, deadline.  DUET_OK means "keep
 * waiting" (or done, for callers that check completion themselves). */
static duet_status_t duet__poll(duet__nccl_comm_t *c, int64_t waited_ns, const char *what,
                                ncclResult_t *state_p)
{
    ncclResult_t state = ncclSuccess, r;
    char msg[200];

    if (atomic_load(&c->grp->aborted) != 0)
        return duet__aborted(c, what);
    r = ncclCommGetAsyncError(c->comm, &state);
    if (r != ncclSuccess)
        state = r;
    if (state_p != NULL)
        *state_p = state;
    if (state != ncclSuccess && state != ncclInProgress) {
        snprintf(msg, sizeof(msg), "nccl error during %s (last collective %s #%llu): %s", what,
                 c->last_op ? c->last_op : "none", (unsigned long long)c->n_ops,
                 ncclGetErrorString(state));
        return duet__fail(c, DUET_ERR_PEER, what, msg);
    }
    if (waited_ns > (int64_t)c->grp->timeout_ms * DUET_NS_PER_MS) {
        snprintf(msg, sizeof(msg),
                 "%s not complete after %d ms (last collective %s #%llu of %zu elements); a "
                 "peer rank did not join",
                 what, c->grp->timeout_ms, c->last_op ? c->last_op : "none",
                 (unsigned long long)c->n_ops, c->last_count);
        return duet__fail(c, DUET_ERR_TIMEOUT, what, msg);
    }
    return DUET_OK;
}

static void duet__pause(unsigned *polls)
{
    if (++*polls < 1000) {
        sched_yield();
    } else {
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Until the communicator is no longer ncclInProgress (non-blocking init,
 * finalize, or an enqueue that returned ncclInProgress). */
static duet_status_t duet__wait_ready(duet__nccl_comm_t *c, const char *what)
{
    int64_t t0 = duet_now_ns();
    unsigned polls = 0;
    for (;;) {
        ncclResult_t state;
        duet_status_t st = duet__poll(c, duet_now_ns() - t0, what, &state);
        if (st != DUET_OK)
            return st;
        if (state == ncclSuccess)
            return DUET_OK;
        duet__pause(&polls);
    }
}

/* The backend's host waits call this (engine/cuda/cuda_internal.h). */
static duet_status_t duet__watch(void *ud, int64_t waited_ns, const char *what)
{
    return duet__poll(ud, waited_ns, what, NULL);
}

static duet_status_t duet__enqueued(duet__nccl_comm_t *c, ncclResult_t r, const char *op,
                                    size_t count)
{
    char msg[200];
    c->n_ops++;
    c->last_op = op;
    c->last_count = count;
    if (r == ncclSuccess)
        return DUET_OK;
    if (r == ncclInProgress)
        return duet__wait_ready(c, op);
    snprintf(msg, sizeof(msg), "%s #%llu: %s", op, (unsigned long long)c->n_ops,
             ncclGetErrorString(r));
    return duet__fail(c, DUET_ERR_PEER, op, msg);
}

static duet_status_t duet__check_live(duet__nccl_comm_t *c, const char *op)
{
    if (atomic_load(&c->grp->aborted) != 0 || c->comm_aborted)
        return duet__aborted(c, op);
    return DUET_OK;
}

static duet_status_t duet__nccl_all_reduce_sum(duet_comm_t *base, void *buf, size_t count,
                                               duet_dtype_t dtype)
{
    duet__nccl_comm_t *c = (duet__nccl_comm_t *)base;
    ncclDataType_t t;
    duet_status_t st;

    switch (dtype) {
    case DUET_DTYPE_BF16:
        t = ncclBfloat16;
        break;
    case DUET_DTYPE_F16:
        t = ncclFloat16;
        break;
    case DUET_DTYPE_F32:
        t = ncclFloat32;
        break;
    default:
        return duet_error(DUET_ERR_UNSUPPORTED, "comm nccl: all_reduce of dtype %d", (int)dtype);
    }
    if ((st = duet__check_live(c, "all_reduce")) != DUET_OK)
        return st;
    return duet__enqueued(c, ncclAllReduce(buf, buf, count, t, ncclSum, c->comm, c->stream),
                          "all_reduce", count);
}

static duet_status_t duet__nccl_all_gather(duet_comm_t *base, const void *send, void *recv,
                                           size_t bytes)
{
    duet__nccl_comm_t *c = (duet__nccl_comm_t *)base;
    duet_status_t st = duet__check_live(c, "all_gather");
    if (st != DUET_OK)
        return st;
    return duet__enqueued(c, ncclAllGather(send, recv, bytes, ncclChar, c->comm, c->stream),
                          "all_gather", bytes);
}

static bool duet__is_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static duet_status_t duet__nccl_broadcast(duet_comm_t *base, void *buf, size_t bytes, int root)
{
    duet__nccl_comm_t *c = (duet__nccl_comm_t *)base;
    duet_status_t st = duet__check_live(c, "broadcast");

    if (st != DUET_OK)
        return st;
    if (duet__is_device(buf))
        return duet__enqueued(c, ncclBroadcast(buf, buf, bytes, ncclChar, root, c->comm, c->stream),
                              "broadcast", bytes);
    /* host memory (the sampled ids): through pinned and device staging */
    if (bytes > c->stage_bytes) {
        size_t want = bytes < 4096 ? 4096 : bytes;
        cudaFree(c->d_stage);
        cudaFreeHost(c->h_stage);
        c->d_stage = c->h_stage = NULL;
        c->stage_bytes = 0;
        DUET__CUDA_TRY(cudaMalloc(&c->d_stage, want));
        DUET__CUDA_TRY(cudaMallocHost(&c->h_stage, want));
        c->stage_bytes = want;
    }
    if (base->rank == root) {
        memcpy(c->h_stage, buf, bytes);
        DUET__CUDA_TRY(
            cudaMemcpyAsync(c->d_stage, c->h_stage, bytes, cudaMemcpyHostToDevice, c->stream));
    }
    st = duet__enqueued(
        c, ncclBroadcast(c->d_stage, c->d_stage, bytes, ncclChar, root, c->comm, c->stream),
        "broadcast", bytes);
    if (st != DUET_OK)
        return st;
    if (base->rank != root) {
        DUET__CUDA_TRY(
            cudaMemcpyAsync(c->h_stage, c->d_stage, bytes, cudaMemcpyDeviceToHost, c->stream));
    }
    if ((st = duet__cuda_wait(c->br, "broadcast")) != DUET_OK)
        return st;
    if (base->rank != root)
        memcpy(buf, c->h_stage, bytes);
    return DUET_OK;
}

static duet_status_t duet__nccl_barrier(duet_comm_t *base)
{
    duet__nccl_comm_t *c = (duet__nccl_comm_t *)base;
    duet_status_t st = duet__check_live(c, "barrier");
    if (st != DUET_OK)
        return st;
    st = duet__enqueued(
        c, ncclAllReduce(c->d_one, c->d_one, 1, ncclFloat32, ncclSum, c->comm, c->stream),
        "barrier", 1);
    return st != DUET_OK ? st : duet__cuda_wait(c->br, "barrier");
}

static void duet__nccl_abort_op(duet_comm_t *base, duet_status_t st, const char *why)
{
    duet__nccl_comm_t *c = (duet__nccl_comm_t *)base;
    char msg[256];
    snprintf(msg, sizeof(msg), "aborted by rank %d: %s", base->rank, why);
    duet_comm_nccl_group_abort(c->grp, st, msg);
    duet__abort_comm(c);
}

static void duet__nccl_destroy(duet_comm_t *base)
{
    duet__nccl_comm_t *c = (duet__nccl_comm_t *)base;
    if (c == NULL)
        return;
    cudaSetDevice(c->device);
    if (c->br != NULL)
        duet__cuda_set_watch(c->br, NULL, NULL);
    if (c->comm != NULL && !c->comm_aborted) {
        /* finalize waits for peers' traffic: bounded like everything else */
        duet__drop_graphs(c);
        ncclResult_t r =
            atomic_load(&c->grp->aborted) != 0 ? ncclInternalError : ncclCommFinalize(c->comm);
        if ((r == ncclSuccess || r == ncclInProgress) && duet__wait_ready(c, "finalize") == DUET_OK)
            ncclCommDestroy(c->comm);
        else
            duet__abort_comm(c);
    }
    cudaFree(c->d_stage);
    cudaFreeHost(c->h_stage);
    cudaFree(c->d_one);
    cudaGetLastError();
    duet_free(c);
}

static const duet_comm_ops_t duet__nccl_ops = {
    .name = "nccl",
    .all_reduce_sum = duet__nccl_all_reduce_sum,
    .all_gather = duet__nccl_all_gather,
    .broadcast = duet__nccl_broadcast,
    .barrier = duet__nccl_barrier,
    .abort = duet__nccl_abort_op,
    .destroy = duet__nccl_destroy,
};

duet_status_t duet_comm_nccl_group_create(int size, int timeout_ms, duet_comm_nccl_group_t **grp_p)
{
    duet_comm_nccl_group_t *g;
    ncclResult_t r;

    if (size < 1 || timeout_ms <= 0)
        return duet_error(DUET_ERR_INVALID, "comm nccl: size %d timeout %d ms", size, timeout_ms);
    g = DUET_NEW(duet_comm_nccl_group_t);
    if (g == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "comm nccl: no memory");
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    if ((r = ncclGetUniqueId(&g->id)) != ncclSuccess) {
        duet_free(g);
        return duet_error(DUET_ERR_PEER, "comm nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    pthread_mutex_init(&g->lock, NULL);
    g->size = size;
    g->timeout_ms = timeout_ms;
    *grp_p = g;
    return DUET_OK;
}

void duet_comm_nccl_group_destroy(duet_comm_nccl_group_t *grp)
{
    if (grp == NULL)
        return;
    pthread_mutex_destroy(&grp->lock);
    duet_free(grp);
}

duet_status_t duet_comm_nccl_create(duet_comm_nccl_group_t *grp, int rank, duet_backend_rank_t *br,
                                    duet_comm_t **comm_p)
{
    duet__nccl_comm_t *c;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    int version = 0;
    ncclResult_t r;
    duet_status_t st;
    cudaError_t e;

    if (rank < 0 || rank >= grp->size)
        return duet_error(DUET_ERR_INVALID, "comm nccl: rank %d of %d", rank, grp->size);
    c = DUET_NEW(duet__nccl_comm_t);
    if (c == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "comm nccl: no memory");
    c->base.ops = &duet__nccl_ops;
    c->base.rank = rank;
    c->base.size = grp->size;
    c->grp = grp;
    c->br = br;
    c->stream = duet_cuda_rank_stream(br);
    c->device = duet_cuda_rank_device(br);
    if ((e = cudaSetDevice(c->device)) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->d_one, sizeof(float))) != cudaSuccess ||
        (e = cudaMemset(c->d_one, 0, sizeof(float))) != cudaSuccess) {
        st = duet__cuda_check(e, "comm nccl set-up", __FILE__, __LINE__);
        goto err_free;
    }
    /* a library older than the header (same ABI within 2.x) rejects a newer
     * config version: announce the library's */
    if (ncclGetVersion(&version) == ncclSuccess && version > 0 && (unsigned)version < cfg.version)
        cfg.version = (unsigned)version;
    cfg.blocking = 0;
    r = ncclCommInitRankConfig(&c->comm, grp->size, grp->id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        char msg[160];
        snprintf(msg, sizeof(msg), "ncclCommInitRankConfig on device %d: %s", c->device,
                 ncclGetErrorString(r));
        if (c->comm == NULL) {
            duet_comm_nccl_group_abort(grp, DUET_ERR_PEER, msg);
            st = duet_error(DUET_ERR_PEER, "comm nccl rank %d: %s", rank, msg);
            goto err_free;
        }
        st = duet__fail(c, DUET_ERR_PEER, "init", msg);
        goto err_free;
    }
    if ((st = duet__wait_ready(c, "init")) != DUET_OK)
        goto err_free;
    duet__cuda_set_watch(br, duet__watch, c);
    DUET_LOG_DEBUG("comm nccl: rank %d of %d on device %d ready", rank, grp->size, c->device);
    *comm_p = &c->base;
    return DUET_OK;

err_free:
    c->br = NULL;
    duet__abort_comm(c);
    c->comm = NULL;
    duet__nccl_destroy(&c->base);
    return st;
}
