/* The parallel CRC32C of KV pool bytes (ops->kv_crc, kv_crc_host.c): a KV
 * transfer's checksum computed where the pool lives.  The arithmetic --
 * lanes of 16-byte vectors, the G tables, shifting by x^(8n) mod P -- is
 * common/crc32c_math.h, shared with the host (tests/unit/test_crc32c.c
 * emulates this kernel lane by lane on the CPU).
 *
 * One block (256 lanes) per piece at a time, blocks striding over the
 * pieces: each lane folds its vectors of the piece with 16 table lookups
 * per 16 bytes (the tables in shared memory, loaded once per block), the
 * lanes' shares are aligned with one multiplication each and xor-ed
 * (shuffles, then the block's warps), and lane 0 shifts the piece to its
 * place in the stream (x^(8 (after + 16 - pad)): digit tables, at most 4
 * multiplications).  Pieces combine by xor, so the order in which blocks
 * finish does not matter: each block xors its pieces into one word
 * (atomicXor), which the host reads back and finishes.
 *
 * Speed: a warp's load is 512 contiguous bytes; DUET__CRC_ILP loads are in
 * flight per lane before the lookups that depend on them.  The lookups
 * (random banks) bound it, not HBM: some 16 shared-memory wavefronts per
 * 512 bytes per warp. */
#include "engine/cuda/cuda_device.cuh"
#include "engine/cuda/cuda_kernels.h"

#define DUET__CRC_LANES DUET_CRC32C_PAR_LANES
#define DUET__CRC_ILP   4

/* Vector i of nv: zero the bytes before the piece (first vector) and after
 * it (last vector). */
static __device__ __forceinline__ uint4 duet__crc_edges(uint4 x, int64_t i, int64_t nv, uint32_t lo,
                                                        uint32_t pad)
{
    uint32_t a = i == 0 ? lo : 0u, b = i == nv - 1 ? 16u - pad : 16u;
    x.x = duet_crc32c_par_mask(x.x, 0, a, b);
    x.y = duet_crc32c_par_mask(x.y, 1, a, b);
    x.z = duet_crc32c_par_mask(x.z, 2, a, b);
    x.w = duet_crc32c_par_mask(x.w, 3, a, b);
    return x;
}

static __global__ void __launch_bounds__(DUET__CRC_LANES)
    duet__kv_crc_kernel(const unsigned char *__restrict__ base,
                        const duet_crc32c_piece_t *__restrict__ pieces, int n,
                        const duet_crc32c_par_tables_t *__restrict__ tabs, uint32_t *acc)
{
    __shared__ uint32_t g[DUET_CRC32C_PAR_VEC][256];
    __shared__ uint32_t dig[DUET_CRC32C_PAR_DIGITS][256];
    __shared__ uint32_t part[DUET__CRC_LANES / 32];
    const int t = (int)threadIdx.x;
    const int64_t B = DUET__CRC_LANES;
    uint32_t mine = 0; /* lane 0: this block's pieces, xor-ed */

    for (int i = t; i < DUET_CRC32C_PAR_VEC * 256; i += DUET__CRC_LANES)
        (&g[0][0])[i] = (&tabs->g[0][0])[i];
    for (int i = t; i < DUET_CRC32C_PAR_DIGITS * 256; i += DUET__CRC_LANES)
        (&dig[0][0])[i] = (&tabs->dig[0][0])[i];
    const uint32_t fwd = tabs->fwd[t];
    __syncthreads();

    for (int p = (int)blockIdx.x; p < n; p += (int)gridDim.x) {
        const duet_crc32c_piece_t pc = pieces[p];
        const uint64_t a0 = pc.off & ~(uint64_t)15, end = pc.off + pc.len;
        const uint64_t a1 = (end + 15) & ~(uint64_t)15;
        const int64_t nv = (int64_t)((a1 - a0) >> 4);
        const int64_t z = (nv + B - 1) / B * B - nv; /* leading zero vectors */
        const uint32_t lo = (uint32_t)(pc.off - a0), pad = (uint32_t)(a1 - end);
        const uint4 *v = reinterpret_cast<const uint4 *>(base + a0);
        uint32_t s = 0;
        int64_t i = t - z;
        if (i < 0)
            i += B; /* this lane's zero vector leaves s at 0 */
        for (; i < nv; i += B * DUET__CRC_ILP) {
            uint4 w[DUET__CRC_ILP];
#pragma unroll
            for (int u = 0; u < DUET__CRC_ILP; u++) {
                int64_t k = i + u * B;
                if (k < nv)
                    w[u] = v[k];
            }
#pragma unroll
            for (int u = 0; u < DUET__CRC_ILP; u++) {
                int64_t k = i + u * B;
                if (k < nv) {
                    uint4 x = w[u];
                    if (k == 0 || k == nv - 1)
                        x = duet__crc_edges(x, k, nv, lo, pad);
                    s = duet_crc32c_par_step(g, s, x.x, x.y, x.z, x.w);
                }
            }
        }
        uint32_t c = s != 0 ? duet_crc32c_mulmod(fwd, s) : 0u;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            c ^= __shfl_xor_sync(0xffffffffu, c, o);
        if ((t & 31) == 0)
            part[t >> 5] = c;
        __syncthreads();
        if (t == 0) {
            uint32_t x = 0;
            for (int k = 0; k < DUET__CRC_LANES / 32; k++)
                x ^= part[k];
            if (x != 0)
                mine ^= duet_crc32c_mulmod(duet_crc32c_par_xpow8(dig, pc.after + 16u - pad), x);
        }
        __syncthreads(); /* part[] is rewritten by the next piece */
    }
    if (t == 0 && mine != 0)
        atomicXor(acc, mine);
}

extern "C" duet_status_t duet__cuda_kv_crc(cudaStream_t s, const void *base,
                                           const duet_crc32c_piece_t *pieces, int n,
                                           const duet_crc32c_par_tables_t *tabs, uint32_t *acc,
                                           int blocks)
{
    if (n <= 0)
        return DUET_OK;
    if (blocks > n)
        blocks = n;
    unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks);
    duet__kv_crc_kernel<<<grid, DUET__CRC_LANES, 0, s>>>((const unsigned char *)base, pieces, n,
                                                         tabs, acc);
    return DUET__CUDA_LAUNCHED("kv_crc");
}

extern "C" int duet__cuda_kv_crc_blocks_per_sm(void)
{
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, duet__kv_crc_kernel, DUET__CRC_LANES,
                                                      0) != cudaSuccess) {
        cudaGetLastError();
        return 4;
    }
    return n > 0 ? n : 1;
}
