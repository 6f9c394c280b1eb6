/* ops->kv_crc on the GPU: a KV transfer's checksum (transfer/xfer.h,
 * duet_xfer_rank_set_checksum) where the pool lives, called from the
 * transfer layer's progress thread.
 *
 * The ranges are planned into pieces on the host (duet_crc32c_plan:
 * touching ranges merged, pieces sized so that the whole GPU has about
 * one per resident block, 16 KiB to 1 MiB), copied to the device from a
 * pinned buffer, and reduced by kv_crc.cu into one word, which comes back
 * in a 4-byte copy: one launch and one wait per call, on a stream of the
 * checksum's own (never the rank's streams: this runs beside the rank's
 * thread, and the bytes it reads are complete -- the caller's contract).
 * The tables (22.5 KiB) are built once per process and uploaded once per
 * rank. */
#include "engine/cuda/cuda_internal.h"

#include <limits.h>
#include <pthread.h>

#include "common/log.h"

static duet_crc32c_par_tables_t duet__crc_tables;
static pthread_once_t duet__crc_once = PTHREAD_ONCE_INIT;

static void duet__crc_tables_build(void)
{
    duet_crc32c_par_tables_init(&duet__crc_tables);
}

void duet__cuda_kv_crc_cleanup(duet_backend_rank_t *r)
{
    duet__cuda_crc_t *c = &r->crc;
    if (c->stream != NULL) {
        cudaStreamSynchronize(c->stream);
        cudaStreamDestroy(c->stream);
    }
    cudaFree(c->tabs);
    cudaFree(c->dev);
    cudaFree(c->acc_d);
    cudaFreeHost(c->host);
    cudaFreeHost(c->acc_h);
    memset(c, 0, sizeof(*c));
}

static duet_status_t duet__crc_start(duet_backend_rank_t *r)
{
    duet__cuda_crc_t *c = &r->crc;
    pthread_once(&duet__crc_once, duet__crc_tables_build);
    DUET__CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    DUET__CUDA_TRY(cudaMalloc((void **)&c->tabs, sizeof(duet__crc_tables)));
    DUET__CUDA_TRY(
        cudaMemcpy(c->tabs, &duet__crc_tables, sizeof(duet__crc_tables), cudaMemcpyHostToDevice));
    DUET__CUDA_TRY(cudaMalloc((void **)&c->acc_d, sizeof(uint32_t)));
    DUET__CUDA_TRY(cudaMallocHost((void **)&c->acc_h, sizeof(uint32_t)));
    c->blocks = duet__cuda_kv_crc_blocks_per_sm() * (r->sm_count > 0 ? r->sm_count : 1);
    c->ready = true;
    return DUET_OK;
}

/* Room for m pieces in both buffers. */
static duet_status_t duet__crc_reserve(duet__cuda_crc_t *c, size_t m)
{
    size_t cap = c->cap * 2 > m ? c->cap * 2 : m;
    if (m <= c->cap)
        return DUET_OK;
    if (cap < 4096)
        cap = 4096;
    cudaFreeHost(c->host);
    cudaFree(c->dev);
    c->host = NULL;
    c->dev = NULL;
    c->cap = 0;
    DUET__CUDA_TRY(cudaMallocHost((void **)&c->host, cap * sizeof(duet_crc32c_piece_t)));
    DUET__CUDA_TRY(cudaMalloc((void **)&c->dev, cap * sizeof(duet_crc32c_piece_t)));
    c->cap = cap;
    return DUET_OK;
}

duet_status_t duet__cuda_kv_crc_op(duet_backend_rank_t *r, const duet_crc32c_range_t *ranges, int n,
                                   uint32_t *crc_p)
{
    duet__cuda_crc_t *c = &r->crc;
    uint64_t total = 0, piece;
    duet_status_t st;
    size_t m;

    if (r->kv_base == NULL)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: kv crc without a pool", r->rank);
    for (int i = 0; i < n; i++)
        total += ranges[i].len;
    if (total == 0) {
        *crc_p = 0;
        return DUET_OK;
    }
    if (total >= ((uint64_t)1 << (8 * DUET_CRC32C_PAR_DIGITS)) - 2 * DUET_CRC32C_PAR_STRIDE)
        return duet_error(DUET_ERR_INVALID, "cuda rank %d: kv crc of %llu bytes (too many)",
                          r->rank, (unsigned long long)total);
    DUET__CUDA_TRY(cudaSetDevice(r->device));
    if (!c->ready && (st = duet__crc_start(r)) != DUET_OK) {
        duet__cuda_kv_crc_cleanup(r);
        return duet_error_wrap(st, "cuda rank %d: kv crc: ", r->rank);
    }
    /* about one piece per resident block, a multiple of a round */
    piece = (total / (uint64_t)c->blocks + DUET_CRC32C_PAR_STRIDE - 1) / DUET_CRC32C_PAR_STRIDE *
            DUET_CRC32C_PAR_STRIDE;
    piece = piece < (16u << 10) ? (16u << 10) : piece > (1u << 20) ? (1u << 20) : piece;
    m = duet_crc32c_plan(ranges, n, piece, c->host, c->cap, &total);
    if (m > c->cap) {
        if ((st = duet__crc_reserve(c, m)) != DUET_OK)
            return st;
        duet_crc32c_plan(ranges, n, piece, c->host, c->cap, &total);
    }
    if (m > INT_MAX)
        return duet_error(DUET_ERR_INVALID, "cuda rank %d: kv crc of %zu pieces", r->rank, m);
    DUET__CUDA_TRY(cudaMemcpyAsync(c->dev, c->host, m * sizeof(duet_crc32c_piece_t),
                                   cudaMemcpyHostToDevice, c->stream));
    DUET__CUDA_TRY(cudaMemsetAsync(c->acc_d, 0, sizeof(uint32_t), c->stream));
    st = duet__cuda_kv_crc(c->stream, r->kv_base, c->dev, (int)m, c->tabs, c->acc_d, c->blocks);
    if (st == DUET_OK) {
        cudaError_t e = cudaMemcpyAsync(c->acc_h, c->acc_d, sizeof(uint32_t),
                                        cudaMemcpyDeviceToHost, c->stream);
        if (e != cudaSuccess)
            st = duet__cuda_check(e, "cudaMemcpyAsync", __FILE__, __LINE__);
    }
    /* the buffers are reused by the next call: wait for this one either way */
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (st != DUET_OK)
        return st;
    if (e != cudaSuccess)
        return duet__cuda_check(e, "kv crc", __FILE__, __LINE__);
    *crc_p = duet_crc32c_par_finish(*c->acc_h, total);
    return DUET_OK;
}
