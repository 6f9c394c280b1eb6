/* What the GPU benchmarks share (bench_gpu, bench_attention): the
 * comma-separated integer lists of their options and the HBM copy
 * bandwidth every roofline is measured against. */
#ifndef DUET_BENCH_GPU_BENCH_H
#define DUET_BENCH_GPU_BENCH_H

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

/* out[0..) = the integers of "a,b,c" (at most max); their count */
static inline int duet_bench_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (c == NULL)
            break;
        s = c + 1;
    }
    return n;
}

/* GB/s of a device-to-device copy of 1 GiB, bytes read + written; 0 when
 * the device memory is not there */
static inline double duet_bench_copy_bandwidth(void)
{
    size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    float ms = 0;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return 0;
    }
    cudaMemset(a, 1, bytes);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; i++)
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 20; i++)
        cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * (double)bytes * 20 / (ms / 1e3) / 1e9;
}

#endif
