/* Row gather: out[i][:] = in[rows[i]][:].  The row indices travel in the
 * launch itself (at most DUET__CUDA_GATHER_MAX per launch), so no upload
 * is needed and a recorded launch carries its own indices. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

typedef struct {
    int32_t r[DUET__CUDA_GATHER_MAX];
} duet__rows_t;

static __global__ void duet__gather_kernel(duet_bf16 *out, const duet_bf16 *in, duet__rows_t rows,
                                           int d, bool vec)
{
    duet__pdl_trigger(); /* a GEMV may follow (cuda_device.cuh) */
    const duet_bf16 *src = in + (size_t)rows.r[blockIdx.x] * (size_t)d;
    duet_bf16 *dst = out + (size_t)blockIdx.x * (size_t)d;
    if (vec) {
        for (int i = threadIdx.x * 8; i < d; i += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(dst + i) = *reinterpret_cast<const uint4 *>(src + i);
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            dst[i] = src[i];
    }
}

extern "C" duet_status_t duet__cuda_gather_rows(cudaStream_t s, void *out, const void *in,
                                                const int32_t *rows, int n_rows, int d)
{
    bool vec = d % 8 == 0 && duet__aligned16(out) && duet__aligned16(in);
    for (int i0 = 0; i0 < n_rows; i0 += DUET__CUDA_GATHER_MAX) {
        int cnt = n_rows - i0 < DUET__CUDA_GATHER_MAX ? n_rows - i0 : DUET__CUDA_GATHER_MAX;
        duet__rows_t r;
        for (int i = 0; i < cnt; i++)
            r.r[i] = rows[i0 + i];
        duet__gather_kernel<<<cnt, 128, 0, s>>>((duet_bf16 *)out + (size_t)i0 * (size_t)d,
                                                (const duet_bf16 *)in, r, d, vec);
        duet_status_t st = DUET__CUDA_LAUNCHED("gather_rows");
        if (st != DUET_OK)
            return st;
    }
    return DUET_OK;
}
