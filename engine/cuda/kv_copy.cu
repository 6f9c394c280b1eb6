/* Batched copies inside the KV pool (kv/copy.h): the pack and unpack steps
 * of a packed KV transfer (transfer/xfer_pack.h).
 *
 *   for plane p in [plane0, plane0 + n_planes), copy i in [0, n):
 *     S = base + c[i].src + p * (c[i].src_step ? c[i].src_step : plane_bytes)
 *     D = base + c[i].dst + p * (c[i].dst_step ? c[i].dst_step : plane_bytes)
 *     D[0 .. c[i].len) = S[0 .. c[i].len)
 *
 * A plane is one (layer, K|V) of kv/layout.h, so plane 2l is layer l's K
 * and 2l + 1 its V.  Block (i, p) copies descriptor i in plane p (grid x =
 * copies, grid y = planes).  Ranges of one list never overlap, so blocks
 * need no ordering among themselves.
 *
 * Bandwidth: a typical descriptor is one head's slice of one page
 * (page_size * head_dim * 2 = 4 KiB for 16 x 128 bf16), thousands per
 * launch, so the grid alone fills the GPU; each thread keeps DUET__KVC_ILP
 * 16-byte loads in flight before storing.  Copies whose source and
 * destination share their offset modulo 16 (every page- or head-aligned
 * copy) move in 16-byte vectors with at most 15 bytes of head and tail done
 * bytewise; others move in 2-byte elements when everything is even (bf16
 * data), else byte by byte.  The host side (kv_copy_host.c) splits long
 * copies into pieces of at most DUET__CUDA_KVC_PIECE bytes so one long
 * descriptor does not leave the GPU to a single block.
 *
 * With a signal (cuda_kernels.h) the launch also tells the host it is
 * done: a pack on the copy stream then needs no event for its done
 * (kv_done.c), one driver call less per layer and rank, and the
 * completion thread polls host memory instead of the driver. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__KVC_THREADS 128
#define DUET__KVC_ILP     4

static __device__ __forceinline__ void duet__kvc_bytes(unsigned char *d, const unsigned char *s,
                                                       uint64_t len)
{
    for (uint64_t i = threadIdx.x; i < len; i += blockDim.x)
        d[i] = s[i];
}

/* The launch's last block to finish writes the signal (cuda_kernels.h):
 * each block fences its stores device-wide before it counts itself, so the
 * block that counts last knows every store is visible, then publishes to
 * the host. */
static __device__ __forceinline__ void duet__kvc_signal(unsigned *ctr, unsigned long long *word,
                                                        unsigned long long seq)
{
    __threadfence(); /* each thread's stores, device-wide */
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    unsigned blocks = gridDim.x * gridDim.y;
    if (atomicAdd(ctr, 1u) == blocks - 1u) {
        *ctr = 0;
        __threadfence_system();
        *(volatile unsigned long long *)word = seq;
    }
}

static __global__ void __launch_bounds__(DUET__KVC_THREADS)
    duet__kv_copy_kernel(unsigned char *base, uint64_t plane_bytes, int plane0,
                         const duet_kv_copy_t *__restrict__ copies, unsigned *ctr,
                         unsigned long long *word, unsigned long long seq)
{
    const duet_kv_copy_t c = copies[blockIdx.x];
    uint64_t p = (uint64_t)(plane0 + (int)blockIdx.y);
    const unsigned char *s = base + c.src + p * (c.src_step != 0 ? c.src_step : plane_bytes);
    unsigned char *d = base + c.dst + p * (c.dst_step != 0 ? c.dst_step : plane_bytes);
    uint64_t len = c.len;
    uintptr_t ms = (uintptr_t)s & 15u, md = (uintptr_t)d & 15u;

    if (ms == md) {
        uint64_t head = ms != 0 ? 16u - ms : 0;
        if (head > len)
            head = len;
        if (threadIdx.x < head)
            d[threadIdx.x] = s[threadIdx.x];
        uint64_t nv = (len - head) / 16u;
        const uint4 *sv = reinterpret_cast<const uint4 *>(s + head);
        uint4 *dv = reinterpret_cast<uint4 *>(d + head);
        const uint64_t step = (uint64_t)blockDim.x * DUET__KVC_ILP;
        for (uint64_t i0 = threadIdx.x; i0 < nv; i0 += step) {
            uint4 v[DUET__KVC_ILP];
#pragma unroll
            for (int u = 0; u < DUET__KVC_ILP; u++) {
                uint64_t i = i0 + (uint64_t)u * blockDim.x;
                if (i < nv)
                    v[u] = sv[i];
            }
#pragma unroll
            for (int u = 0; u < DUET__KVC_ILP; u++) {
                uint64_t i = i0 + (uint64_t)u * blockDim.x;
                if (i < nv)
                    dv[i] = v[u];
            }
        }
        uint64_t done = head + nv * 16u;
        if (threadIdx.x < len - done)
            d[done + threadIdx.x] = s[done + threadIdx.x];
    } else if (((ms | md | len) & 1u) == 0) {
        const uint16_t *s2 = reinterpret_cast<const uint16_t *>(s);
        uint16_t *d2 = reinterpret_cast<uint16_t *>(d);
        for (uint64_t i = threadIdx.x; i < len / 2u; i += blockDim.x)
            d2[i] = s2[i];
    } else {
        duet__kvc_bytes(d, s, len);
    }
    if (word != NULL)
        duet__kvc_signal(ctr, word, seq);
}

extern "C" duet_status_t duet__cuda_kv_copy(cudaStream_t s, void *base, size_t plane_bytes,
                                            int plane0, int n_planes, const duet_kv_copy_t *copies,
                                            int n, const duet__cuda_signal_t *sig)
{
    if (n <= 0 || n_planes <= 0)
        return DUET_OK;
    if (n_planes > 65535)
        return duet_error(DUET_ERR_INVALID, "cuda kv_copy: %d planes in one launch (max 65535)",
                          n_planes);
    dim3 grid((unsigned)n, (unsigned)n_planes);
    duet__kv_copy_kernel<<<grid, DUET__KVC_THREADS, 0, s>>>(
        (unsigned char *)base, (uint64_t)plane_bytes, plane0, copies, sig ? sig->ctr : NULL,
        sig ? sig->word : NULL, sig ? sig->seq : 0);
    return DUET__CUDA_LAUNCHED("kv_copy");
}
