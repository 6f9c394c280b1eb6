/* ops->kv_copy on the GPU: the pack and unpack steps of a packed KV
 * transfer (transfer/xfer_pack.h), one kv_copy.cu launch per call.
 *
 * The caller's list is host memory that is only valid during the call,
 * and the pack runs from the on_layer hook, where the rank thread must not
 * wait for the device (it queues layer l + 1 while l computes).  So the
 * list goes through a ring (duet__cuda_kvc_ring_t): copied into a pinned
 * host region, then cudaMemcpyAsync'd to the same region of a device ring
 * on the stream that runs the kernel, and an event recorded after the
 * kernel keeps both regions reserved until it completed.  A pageable
 * cudaMemcpyAsync or cudaMallocAsync + cudaFreeAsync would do the same
 * with less code, but a pageable copy may synchronize with its stream --
 * that is, wait on the host for the layer's KV store.  The ring waits on
 * the host only when it wraps onto a launch that has not finished (rare:
 * it grows to the largest list seen, and 64 launches stay in flight).
 *
 * Pack (done != NULL): on the copy stream, after cudaStreamWaitEvent on
 * the layer's "KV stored" event, exactly like the mirror export
 * (kv_mirror.c); the rank's completion thread runs done once the kernel
 * signalled it finished (kv_done.c; an event recorded after it where
 * signals are off).  Unpack
 * (done == NULL): on the compute stream, after the copy stream's work so
 * far, so the next forward is ordered after it; the call waits
 * (kv_copy_queue: the same launch without the wait, decode unpacking a
 * transfer's layers as they land). */
#include "engine/cuda/cuda_internal.h"

#include <limits.h>

#include "common/alloc.h"
#include "common/log.h"

static duet_status_t duet__slot_wait(duet_backend_rank_t *r, int i)
{
    duet__cuda_kvc_ring_t *g = &r->kvc;
    if (g->slot[i].live) {
        g->slot[i].live = false;
        DUET__CUDA_TRY(g->slot[i].seq != 0 ? duet__cuda_signal_wait(r, g->slot[i].seq)
                                           : cudaEventSynchronize(g->slot[i].ev));
    }
    return DUET_OK;
}

/* Entries [*begin_p, *begin_p + m) of the ring, free for the caller; the
 * slot g->next is free too. */
static duet_status_t duet__ring_reserve(duet_backend_rank_t *r, size_t m, size_t *begin_p)
{
    duet__cuda_kvc_ring_t *g = &r->kvc;
    duet_status_t st;

    if (m > g->cap) {
        size_t cap = g->cap * 2 > m ? g->cap * 2 : m;
        if (cap < 65536) /* 16 layers' packs of an 8K-token request, 8 heads */
            cap = 65536;
        for (int i = 0; i < DUET__CUDA_KVC_SLOTS; i++) {
            if ((st = duet__slot_wait(r, i)) != DUET_OK)
                return st;
        }
        cudaFreeHost(g->host);
        cudaFree(g->dev);
        g->host = NULL;
        g->dev = NULL;
        g->cap = 0;
        g->head = 0;
        DUET__CUDA_TRY(cudaMallocHost((void **)&g->host, cap * sizeof(duet_kv_copy_t)));
        DUET__CUDA_TRY(cudaMalloc((void **)&g->dev, cap * sizeof(duet_kv_copy_t)));
        g->cap = cap;
    }
    if (g->head + m > g->cap)
        g->head = 0;
    for (int i = 0; i < DUET__CUDA_KVC_SLOTS; i++) {
        if (g->slot[i].live && g->slot[i].begin < g->head + m && g->head < g->slot[i].end &&
            (st = duet__slot_wait(r, i)) != DUET_OK)
            return st;
    }
    if ((st = duet__slot_wait(r, g->next)) != DUET_OK)
        return st;
    if (g->slot[g->next].ev == NULL)
        DUET__CUDA_TRY(cudaEventCreateWithFlags(&g->slot[g->next].ev, cudaEventDisableTiming));
    *begin_p = g->head;
    return DUET_OK;
}

size_t duet__cuda_kv_copy_pieces(const duet_kv_copy_t *copies, int n)
{
    size_t m = 0;
    for (int i = 0; i < n; i++)
        m += (size_t)((copies[i].len + DUET__CUDA_KVC_PIECE - 1) / DUET__CUDA_KVC_PIECE);
    return m;
}

void duet__cuda_kv_copy_split(const duet_kv_copy_t *copies, int n, duet_kv_copy_t *out)
{
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        for (uint64_t off = 0; off < copies[i].len; off += DUET__CUDA_KVC_PIECE) {
            uint64_t len = copies[i].len - off;
            out[k++] = (duet_kv_copy_t){copies[i].src + off, copies[i].dst + off,
                                        len < DUET__CUDA_KVC_PIECE ? len : DUET__CUDA_KVC_PIECE,
                                        copies[i].src_step, copies[i].dst_step};
        }
    }
}

/* The list to the device and the kernel over layers [l0, l1), on s.  With
 * seq_p (the copy stream), the launch is signalled where signals are on
 * and *seq_p is its signal, which the ring's entries wait on too; else
 * (and with nothing to copy) *seq_p is 0 and an event recorded after the
 * launch keeps the entries. */
static duet_status_t duet__issue(duet_backend_rank_t *r, cudaStream_t s, int l0, int l1,
                                 const duet_kv_copy_t *copies, int n, uint64_t *seq_p)
{
    duet__cuda_kvc_ring_t *g = &r->kvc;
    size_t m = duet__cuda_kv_copy_pieces(copies, n), begin = 0;
    duet__cuda_signal_t signal, *sig = NULL;
    duet_status_t st;

    if (seq_p != NULL)
        *seq_p = 0;
    if (m == 0)
        return DUET_OK;
    if (m > INT_MAX)
        return duet_error(DUET_ERR_INVALID, "cuda rank %d: kv copy of %zu pieces", r->rank, m);
    if ((st = duet__ring_reserve(r, m, &begin)) != DUET_OK)
        return st;
    duet__cuda_kv_copy_split(copies, n, g->host + begin);
    DUET__CUDA_TRY(cudaMemcpyAsync(g->dev + begin, g->host + begin, m * sizeof(duet_kv_copy_t),
                                   cudaMemcpyHostToDevice, s));
    if (seq_p != NULL && duet__cuda_signal_next(r, &signal))
        sig = &signal;
    st = duet__cuda_kv_copy(s, r->kv_base, duet_kv_plane_bytes(&r->kv), 2 * l0, 2 * (l1 - l0),
                            g->dev + begin, (int)m, sig);
    /* the copy above may be queued even if the launch failed: the entries
     * stay reserved until the stream passed this point */
    uint64_t seq = sig != NULL && st == DUET_OK ? sig->seq : 0;
    cudaError_t e = seq != 0 ? cudaSuccess : cudaEventRecord(g->slot[g->next].ev, s);
    g->slot[g->next].seq = seq;
    if (e != cudaSuccess) {
        cudaStreamSynchronize(s);
        return st != DUET_OK ? st : duet__cuda_check(e, "cudaEventRecord", __FILE__, __LINE__);
    }
    g->slot[g->next].begin = begin;
    g->slot[g->next].end = begin + m;
    g->slot[g->next].live = true;
    g->next = (g->next + 1) % DUET__CUDA_KVC_SLOTS;
    g->head = begin + m;
    if (seq_p != NULL)
        *seq_p = seq;
    return st;
}

/* The unpack's launch: on the compute stream, after the rank's earlier
 * packs and exports as well as its compute. */
static duet_status_t duet__unpack_issue(duet_backend_rank_t *r, int l0, int l1,
                                        const duet_kv_copy_t *copies, int n)
{
    DUET__CUDA_TRY(cudaEventRecord(r->ev_copy, r->copy_stream));
    DUET__CUDA_TRY(cudaStreamWaitEvent(r->stream, r->ev_copy, 0));
    return duet__issue(r, r->stream, l0, l1, copies, n, NULL);
}

duet_status_t duet__cuda_kv_copy_queue(duet_backend_rank_t *r, int l0, int l1,
                                       const duet_kv_copy_t *copies, int n)
{
    duet_status_t st;
    if (r->kv_base == NULL)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: kv copy without a pool", r->rank);
    if (l0 < 0 || l1 > r->kv.n_layers || l0 > l1)
        return duet_error(DUET_ERR_INVALID, "cuda rank %d: kv copy of layers [%d, %d) of %d",
                          r->rank, l0, l1, r->kv.n_layers);
    if (r->capturing)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: kv copy while recording a graph",
                          r->rank);
    if ((st = duet__cuda_copy_stream(r)) != DUET_OK)
        return st;
    return duet__unpack_issue(r, l0, l1, copies, n);
}

duet_status_t duet__cuda_kv_copy_op(duet_backend_rank_t *r, int l0, int l1,
                                    const duet_kv_copy_t *copies, int n, void (*done)(void *arg),
                                    void *arg)
{
    duet_status_t st;

    if (r->kv_base == NULL)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: kv copy without a pool", r->rank);
    if (l0 < 0 || l1 > r->kv.n_layers || l0 > l1 || (done != NULL && l1 != l0 + 1))
        return duet_error(DUET_ERR_INVALID, "cuda rank %d: kv copy of layers [%d, %d) of %d%s",
                          r->rank, l0, l1, r->kv.n_layers, done != NULL ? " after a store" : "");
    if (r->capturing)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: kv copy while recording a graph",
                          r->rank);
    if ((st = duet__cuda_copy_stream(r)) != DUET_OK)
        return st;
    if (done == NULL) {
        if ((st = duet__unpack_issue(r, l0, l1, copies, n)) != DUET_OK)
            return st;
        return duet__cuda_wait(r, "kv copy");
    }
    /* the layer's KV store was queued before this hook ran: the copy
     * stream waits for it on the device, the rank thread goes on */
    DUET__CUDA_TRY(cudaStreamWaitEvent(r->copy_stream, r->ev_kv[l0], 0));
    uint64_t seq;
    if ((st = duet__issue(r, r->copy_stream, l0, l1, copies, n, &seq)) != DUET_OK)
        return st;
    /* the kernel's signal is the done's, or (no signals, nothing to copy)
     * an event after the layer's store */
    return seq != 0 ? duet__cuda_queue_done(r, seq, l0, done, arg)
                    : duet__cuda_launch_done(r, r->copy_stream, l0, done, arg);
}

void duet__cuda_kv_copy_cleanup(duet_backend_rank_t *r)
{
    duet__cuda_kvc_ring_t *g = &r->kvc;
    /* signalled slots ran on the copy stream, synchronized before this */
    for (int i = 0; i < DUET__CUDA_KVC_SLOTS; i++) {
        if (g->slot[i].live && g->slot[i].seq == 0 &&
            cudaEventSynchronize(g->slot[i].ev) != cudaSuccess)
            DUET_LOG_WARN("cuda rank %d: kv copy failed before shutdown: %s", r->rank,
                          cudaGetErrorString(cudaGetLastError()));
        if (g->slot[i].ev != NULL)
            cudaEventDestroy(g->slot[i].ev);
    }
    cudaFreeHost(g->host);
    cudaFree(g->dev);
    memset(g, 0, sizeof(*g));
}
