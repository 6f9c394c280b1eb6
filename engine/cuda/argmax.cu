/* Greedy sampling on the device: per row, max_j x[j] and the lowest j that
 * holds it (the host's duet_sample greedy rule), NaN counted as -inf.  One
 * block per row. */
#include <math.h>

#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

static __device__ __forceinline__ void duet__better(float &v, int &i, float v2, int i2)
{
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

static __global__ void duet__argmax_kernel(float *max_out, int32_t *idx_out, const duet_bf16 *src,
                                           int d, size_t ld)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    const duet_bf16 *x = src + (size_t)blockIdx.x * ld;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = duet__bf2f(x[j]);
        if (v != v)
            v = -INFINITY;
        duet__better(best, bi, v, j);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        duet__better(best, bi, v2, i2);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, best, o);
            int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            duet__better(best, bi, v2, i2);
        }
        if (lane == 0) {
            max_out[blockIdx.x] = best;
            /* a row of -inf/NaN only: index 0, like the host */
            idx_out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
        }
    }
}

extern "C" duet_status_t duet__cuda_argmax_rows(cudaStream_t s, float *max_out, int32_t *idx_out,
                                                const void *src, int n, int d, size_t ld)
{
    if (n <= 0)
        return DUET_OK;
    duet__argmax_kernel<<<n, 1024, 0, s>>>(max_out, idx_out, (const duet_bf16 *)src, d, ld);
    return DUET__CUDA_LAUNCHED("argmax_rows");
}
