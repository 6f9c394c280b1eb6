/* RoPE (HF rotate-half) on the q and k heads of qkv[n][(nq + 2 nkv) d],
 * then the k and v heads into the paged KV cache at each token's slot.
 * For i < d/2, a = pos * inv_freq[i] and m the attention factor (yarn;
 * 1 otherwise, which changes no bit):
 *   x'[i]       = x[i] m cos a - x[i + d/2] m sin a
 *   x'[i + d/2] = x[i + d/2] m cos a + x[i] m sin a
 * One block per token.  The cache gets the bf16-rounded rotated k that
 * stays in qkv, so both hold the same values. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

static __global__ void duet__rope_kv_kernel(duet_bf16 *qkv, const int32_t *positions,
                                            const int32_t *slots, const float *inv_freq, float attn,
                                            duet__cuda_kv_t kv, int layer, int nq, int nkv, int hd)
{
    extern __shared__ float cs[]; /* [half] cos, then [half] sin */
    const int half = hd / 2;
    const int t = blockIdx.x;
    duet_bf16 *row = qkv + (size_t)t * (size_t)(nq + 2 * nkv) * (size_t)hd;
    float pos = (float)positions[t];

    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        cs[i] = c * attn;
        cs[half + i] = s * attn;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < (nq + nkv) * half; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        duet_bf16 *x = row + (size_t)h * (size_t)hd;
        float x1 = duet__bf2f(x[i]), x2 = duet__bf2f(x[i + half]);
        float c = cs[i], s = cs[half + i];
        x[i] = duet__f2bf(x1 * c - x2 * s);
        x[i + half] = duet__f2bf(x2 * c + x1 * s);
    }
    __syncthreads();
    int slot = slots[t];
    int page = slot / kv.page_size, off = slot % kv.page_size;
    size_t plane = (size_t)kv.n_pages * (size_t)kv.n_kv_heads * (size_t)kv.page_size * (size_t)hd;
    duet_bf16 *kc = (duet_bf16 *)kv.base + plane * (size_t)(2 * layer);
    duet_bf16 *vc = kc + plane;
    for (int idx = threadIdx.x; idx < nkv * hd; idx += blockDim.x) {
        int h = idx / hd, d = idx % hd;
        size_t dst = (((size_t)page * (size_t)kv.n_kv_heads + (size_t)h) * (size_t)kv.page_size +
                      (size_t)off) *
                         (size_t)hd +
                     (size_t)d;
        kc[dst] = row[(size_t)(nq + h) * (size_t)hd + d];
        vc[dst] = row[(size_t)(nq + nkv + h) * (size_t)hd + d];
    }
}

extern "C" duet_status_t duet__cuda_rope_kv_store(cudaStream_t s, void *qkv, duet__cuda_batch_t b,
                                                  const float *inv_freq, float attn_factor,
                                                  duet__cuda_kv_t kv, int layer, int n, int nq,
                                                  int nkv, int head_dim)
{
    int work = (nq + nkv) * head_dim / 2;
    int threads = (work + 31) / 32 * 32;
    threads = threads < 64 ? 64 : (threads > 256 ? 256 : threads);
    if (n <= 0)
        return DUET_OK;
    duet__rope_kv_kernel<<<n, threads, (size_t)head_dim * sizeof(float), s>>>(
        (duet_bf16 *)qkv, b.positions, b.slots, inv_freq, attn_factor, kv, layer, nq, nkv,
        head_dim);
    return DUET__CUDA_LAUNCHED("rope_kv_store");
}
