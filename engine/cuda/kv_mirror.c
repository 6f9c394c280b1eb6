/* The KV pool's host mirror (engine/backend.h): page copies between device
 * memory and the pinned host mirror the transfer layer puts from and into.
 *
 * Export (prefill): on the copy stream, wait for the layer's "KV stored"
 * event (recorded by rope_kv_store on the compute stream), copy the
 * layer's K and V slices of the request's pages to the mirror, then queue
 * the caller's done() -- which posts that layer to the transfer layer --
 * to the rank's completion thread, which runs it once an event recorded
 * after the copies completed (kv_done.c).  Runs of consecutive page ids
 * are one copy each.
 * Import (decode): the same copies the other way, on the compute stream,
 * so the request's first decode step is ordered after them.
 *
 * A pool registered for direct device puts (UCX with CUDA transports) has
 * no mirror: the export then only runs done() after the layer's store, and
 * there is no import. */
#include "engine/cuda/cuda_internal.h"

#include "common/log.h"

duet_status_t duet__cuda_copy_stream(duet_backend_rank_t *r)
{
    if (r->copy_stream == NULL)
        DUET__CUDA_TRY(cudaStreamCreateWithFlags(&r->copy_stream, cudaStreamNonBlocking));
    if (r->ev_copy == NULL)
        DUET__CUDA_TRY(cudaEventCreateWithFlags(&r->ev_copy, cudaEventDisableTiming));
    return DUET_OK;
}

duet_status_t duet__cuda_host_register(duet_backend_rank_t *r, void *host, size_t bytes)
{
    DUET__CUDA_TRY(cudaSetDevice(r->device));
    cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        /* a UCX with CUDA transports pins host memory it maps (cuda_copy):
         * pinned already, and not ours to unpin.  The runtime keeps the
         * error for the next launch check unless it is read here. */
        (void)cudaGetLastError();
        r->host_pinned_elsewhere = host;
        return DUET_OK;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return duet__cuda_check(e, "cudaHostRegister", __FILE__, __LINE__);
    }
    return DUET_OK;
}

void duet__cuda_host_unregister(duet_backend_rank_t *r, void *host)
{
    if (host == r->host_pinned_elsewhere) {
        r->host_pinned_elsewhere = NULL;
        return;
    }
    if (cudaHostUnregister(host) != cudaSuccess) {
        DUET_LOG_WARN("cuda rank %d: cudaHostUnregister: %s", r->rank,
                      cudaGetErrorString(cudaGetLastError()));
    }
}

/* Copy layers [l0, l1) of pages[0..n) between the pool and host. */
static duet_status_t duet__copy_pages(duet_backend_rank_t *r, int l0, int l1, const int32_t *pages,
                                      int n, void *host, bool to_host, cudaStream_t stream)
{
    size_t page = duet_kv_page_bytes(&r->kv);
    for (int l = l0; l < l1; l++) {
        for (int kv = 0; kv < 2; kv++) {
            for (int i = 0; i < n;) {
                int run = 1;
                while (i + run < n && pages[i + run] == pages[i] + run)
                    run++;
                size_t off = duet_kv_offset(&r->kv, l, kv, pages[i], 0);
                char *d = (char *)r->kv_base + off, *h = (char *)host + off;
                DUET__CUDA_TRY(cudaMemcpyAsync(
                    to_host ? h : d, to_host ? d : h, (size_t)run * page,
                    to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream));
                i += run;
            }
        }
    }
    return DUET_OK;
}

duet_status_t duet__cuda_kv_export_layer(duet_backend_rank_t *r, int layer, const int32_t *pages,
                                         int n, void *host, void (*done)(void *arg), void *arg)
{
    duet_status_t st;

    if (layer < 0 || layer >= r->kv.n_layers)
        return duet_error(DUET_ERR_INVALID, "cuda rank %d: kv export of layer %d", r->rank, layer);
    if ((st = duet__cuda_copy_stream(r)) != DUET_OK)
        return st;
    /* the layer's KV store was queued before this hook ran */
    DUET__CUDA_TRY(cudaStreamWaitEvent(r->copy_stream, r->ev_kv[layer], 0));
    /* host NULL: a pool registered for direct device puts; only done() is
     * ordered after the store */
    if (host != NULL && (st = duet__copy_pages(r, layer, layer + 1, pages, n, host, true,
                                               r->copy_stream)) != DUET_OK)
        return st;
    return duet__cuda_launch_done(r, r->copy_stream, layer, done, arg);
}

duet_status_t duet__cuda_kv_export_sync(duet_backend_rank_t *r)
{
    cudaError_t e = r->copy_stream != NULL ? cudaStreamSynchronize(r->copy_stream) : cudaSuccess;
    /* the stream having drained means the events completed, not that the
     * completion thread ran their dones: wait for it too (also when the
     * stream failed: the thread has then skipped the failed layers' dones) */
    duet_status_t st = duet__cuda_done_drain(r);
    if (e != cudaSuccess)
        return duet__cuda_check(e, "cudaStreamSynchronize (kv export)", __FILE__, __LINE__);
    return st;
}

duet_status_t duet__cuda_kv_import(duet_backend_rank_t *r, const int32_t *pages, int n,
                                   const void *host)
{
    duet_status_t st =
        duet__copy_pages(r, 0, r->kv.n_layers, pages, n, (void *)host, false, r->stream);
    return st != DUET_OK ? st : duet__cuda_wait(r, "kv import");
}
