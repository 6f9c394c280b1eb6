/* Embedding lookup: out[t][:] = table[tokens[t]][:] (bf16 copy).
 * Token ids were range-checked on the host in batch_prepare; the kernel
 * still clamps so that a bad id can never read outside the table. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

static __global__ void duet__embed_kernel(duet_bf16 *out, const duet_bf16 *table, int vocab,
                                          const int32_t *tokens, int hidden, bool vec)
{
    int t = blockIdx.x;
    int id = tokens[t];
    id = id < 0 ? 0 : (id >= vocab ? vocab - 1 : id);
    const duet_bf16 *src = table + (size_t)id * (size_t)hidden;
    duet_bf16 *dst = out + (size_t)t * (size_t)hidden;
    if (vec) {
        for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(dst + i) = *reinterpret_cast<const uint4 *>(src + i);
    } else {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x)
            dst[i] = src[i];
    }
}

extern "C" duet_status_t duet__cuda_embed(cudaStream_t s, void *out, const void *table, int vocab,
                                          duet__cuda_batch_t b, int n, int hidden)
{
    bool vec = hidden % 8 == 0 && duet__aligned16(out) && duet__aligned16(table);
    if (n <= 0)
        return DUET_OK;
    duet__embed_kernel<<<n, 128, 0, s>>>((duet_bf16 *)out, (const duet_bf16 *)table, vocab,
                                         b.tokens, hidden, vec);
    return DUET__CUDA_LAUNCHED("embed");
}
