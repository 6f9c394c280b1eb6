/* The batch description on the device, and CUDA graphs of the decode step.
 *
 * batch_prepare packs the description into one pinned staging buffer laid
 * out exactly like its device copy (header, tokens, positions, slots,
 * seq_of, q_start, ctx_len, prefill tiles, page table; each section at a
 * fixed offset for the current capacities) and uploads it with a single
 * copy.  The page-table row stride is in the header, so kernels read it
 * from memory and a recorded graph stays valid as contexts grow.  When a
 * capacity grows the buffers move, and every recorded graph is dropped.
 *
 * Graphs: a decode batch (every sequence has one new token) of n tokens
 * runs eagerly the first time, is recorded the second time (stream
 * capture of embed + every layer, NCCL collectives included) and replayed
 * from then on; the logits, sampling and broadcast stay eager.  Everything
 * a recorded launch reads is at a fixed address: the batch buffers, the
 * weights, the activations, the KV pool, the attention scratch (sized once
 * for any decode batch) and the cuBLASLt workspace.  If recording fails,
 * nothing ran: step_end asks the caller to run the layers again eagerly
 * and that batch size is never recorded again. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "engine/cuda/cuda_internal.h"

#define DUET__SEEN_FAILED 255

static size_t duet__round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static size_t duet__layout(duet_backend_rank_t *r)
{
    size_t o = 16; /* header */
    r->off_tokens = o;
    o += duet__round16((size_t)r->cap_tokens);
    r->off_positions = o;
    o += duet__round16((size_t)r->cap_tokens);
    r->off_slots = o;
    o += duet__round16((size_t)r->cap_tokens);
    r->off_seq_of = o;
    o += duet__round16((size_t)r->cap_tokens);
    r->off_q_start = o;
    o += duet__round16((size_t)r->cap_seqs + 1);
    r->off_ctx_len = o;
    o += duet__round16((size_t)r->cap_seqs);
    r->off_tiles = o;
    o += duet__round16(2u * (size_t)r->cap_tiles);
    r->off_table = o;
    o += duet__round16((size_t)r->cap_table);
    return o * sizeof(int32_t);
}

static int duet__grow(int have, int need, int floor)
{
    int c = have > floor ? have : floor;
    while (c < need)
        c *= 2;
    return c;
}

static duet_status_t duet__meta_reserve(duet_backend_rank_t *r, int tokens, int seqs, int tiles,
                                        int table)
{
    if (r->meta_d != NULL && tokens <= r->cap_tokens && seqs <= r->cap_seqs &&
        tiles <= r->cap_tiles && table <= r->cap_table)
        return DUET_OK;
    if (r->capturing)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: batch buffers grow while recording",
                          r->rank);
    /* queued kernels may still read the old buffers; recorded graphs do */
    DUET__CUDA_TRY(cudaStreamSynchronize(r->stream));
    duet__cuda_graphs_reset(r);
    cudaFree(r->meta_d);
    cudaFreeHost(r->meta_h);
    r->meta_d = NULL;
    r->meta_h = NULL;
    r->meta_pending = false;
    r->cap_tokens = duet__grow(r->cap_tokens, tokens, 256);
    r->cap_seqs = duet__grow(r->cap_seqs, seqs, 64);
    r->cap_tiles = duet__grow(r->cap_tiles, tiles, 128);
    r->cap_table = duet__grow(r->cap_table, table, 4096);
    r->meta_bytes = duet__layout(r);
    DUET__CUDA_TRY(cudaMallocHost((void **)&r->meta_h, r->meta_bytes));
    DUET__CUDA_TRY(cudaMalloc(&r->meta_d, r->meta_bytes));
    const int32_t *d = r->meta_d;
    r->bd = (duet__cuda_batch_t){
        .hdr = d,
        .tokens = d + r->off_tokens,
        .positions = d + r->off_positions,
        .slots = d + r->off_slots,
        .seq_of = d + r->off_seq_of,
        .q_start = d + r->off_q_start,
        .ctx_len = d + r->off_ctx_len,
        .tiles = d + r->off_tiles,
        .page_table = d + r->off_table,
    };
    return DUET_OK;
}

duet_status_t duet__cuda_op_batch_prepare(duet_backend_rank_t *r, const duet_batch_desc_t *b)
{
    int ps = r->kv.page_size, pstride = 1, max_q = 0, n_tiles = 0;
    duet_status_t st;

    if (b->n_tokens < 1 || b->n_seqs < 1 || b->q_start[0] != 0 ||
        b->q_start[b->n_seqs] != b->n_tokens)
        return duet_error(DUET_ERR_INVALID, "cuda batch: %d tokens in %d sequences", b->n_tokens,
                          b->n_seqs);
    for (int s = 0; s < b->n_seqs; s++) {
        int q = b->q_start[s + 1] - b->q_start[s];
        int np = (b->ctx_len[s] + ps - 1) / ps;
        if (q < 1 || b->ctx_len[s] < q)
            return duet_error(DUET_ERR_INVALID, "cuda batch: sequence %d has %d new of %d tokens",
                              s, q, b->ctx_len[s]);
        for (int i = 0; i < np; i++) {
            int32_t pg = b->page_table[(size_t)s * (size_t)b->page_stride + (size_t)i];
            if (pg < 0 || pg >= r->kv.n_pages)
                return duet_error(DUET_ERR_INVALID, "cuda batch: sequence %d page %d out of range",
                                  s, pg);
        }
        pstride = np > pstride ? np : pstride;
        max_q = q > max_q ? q : max_q;
        n_tiles += (q + DUET__CUDA_ATTN_TILE - 1) / DUET__CUDA_ATTN_TILE;
    }
    for (int t = 0; t < b->n_tokens; t++) {
        if (r->vocab > 0 && (b->tokens[t] < 0 || b->tokens[t] >= r->vocab))
            return duet_error(DUET_ERR_INVALID, "token id %d out of range 0..%d", b->tokens[t],
                              r->vocab - 1);
    }
    if ((st = duet__meta_reserve(r, b->n_tokens, b->n_seqs, n_tiles, b->n_seqs * pstride)) !=
        DUET_OK)
        return st;
    if (r->meta_pending) {
        DUET__CUDA_TRY(cudaEventSynchronize(r->ev_meta));
        r->meta_pending = false;
    }

    int32_t *h = r->meta_h;
    h[0] = b->n_tokens;
    h[1] = b->n_seqs;
    h[2] = pstride;
    memcpy(h + r->off_tokens, b->tokens, (size_t)b->n_tokens * sizeof(int32_t));
    memcpy(h + r->off_positions, b->positions, (size_t)b->n_tokens * sizeof(int32_t));
    memcpy(h + r->off_slots, b->slots, (size_t)b->n_tokens * sizeof(int32_t));
    memcpy(h + r->off_q_start, b->q_start, (size_t)(b->n_seqs + 1) * sizeof(int32_t));
    memcpy(h + r->off_ctx_len, b->ctx_len, (size_t)b->n_seqs * sizeof(int32_t));
    int32_t *seq_of = h + r->off_seq_of, *tiles = h + r->off_tiles, *table = h + r->off_table;
    for (int s = 0, k = 0; s < b->n_seqs; s++) {
        int q = b->q_start[s + 1] - b->q_start[s];
        for (int t = b->q_start[s]; t < b->q_start[s + 1]; t++)
            seq_of[t] = s;
        for (int t0 = 0; t0 < q; t0 += DUET__CUDA_ATTN_TILE, k++) {
            tiles[2 * k] = s;
            tiles[2 * k + 1] = t0;
        }
        memcpy(table + (size_t)s * (size_t)pstride,
               b->page_table + (size_t)s * (size_t)b->page_stride,
               (size_t)((b->ctx_len[s] + ps - 1) / ps) * sizeof(int32_t));
    }
    size_t bytes = (r->off_table + (size_t)b->n_seqs * (size_t)pstride) * sizeof(int32_t);
    DUET__CUDA_TRY(cudaMemcpyAsync(r->meta_d, h, bytes, cudaMemcpyHostToDevice, r->stream));
    DUET__CUDA_TRY(cudaEventRecord(r->ev_meta, r->stream));
    r->meta_pending = true;
    r->hb = b;
    r->n_tokens = b->n_tokens;
    r->n_seqs = b->n_seqs;
    r->max_q = max_q;
    r->n_tiles = n_tiles;
    return DUET_OK;
}

void duet__cuda_graphs_reset(duet_backend_rank_t *r)
{
    if (r->capturing) { /* abandon a recording in progress (an abort mid-step) */
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(r->stream, &g);
        if (g != NULL)
            cudaGraphDestroy(g);
        cudaGetLastError();
        r->capturing = false;
    }
    for (int n = 0; n <= DUET__CUDA_GRAPH_MAX_N; n++) {
        if (r->graph[n] != NULL)
            cudaGraphExecDestroy(r->graph[n]);
        r->graph[n] = NULL;
        if (r->graph_seen[n] != DUET__SEEN_FAILED)
            r->graph_seen[n] = 0;
    }
}

duet_status_t duet__cuda_op_step_begin(duet_backend_rank_t *r, bool *replayed_p)
{
    int n = r->n_tokens;

    *replayed_p = false;
    if (!r->graphs_enabled || r->n_tokens != r->n_seqs || n > DUET__CUDA_GRAPH_MAX_N ||
        r->graph_seen[n] == DUET__SEEN_FAILED)
        return DUET_OK;
    if (r->graph[n] != NULL) {
        DUET__CUDA_TRY(cudaGraphLaunch(r->graph[n], r->stream));
        *replayed_p = true;
        return DUET_OK;
    }
    if (++r->graph_seen[n] < 2)
        return DUET_OK;
    DUET__CUDA_TRY(cudaStreamBeginCapture(r->stream, cudaStreamCaptureModeThreadLocal));
    r->capturing = true;
    r->capture_n = n;
    return DUET_OK;
}

duet_status_t duet__cuda_op_step_end(duet_backend_rank_t *r, duet_status_t st, bool *redo_p)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t e;
    int n = r->capture_n;

    *redo_p = false;
    if (!r->capturing)
        return st;
    e = cudaStreamEndCapture(r->stream, &g);
    r->capturing = false;
    if (st != DUET_OK) {
        if (g != NULL)
            cudaGraphDestroy(g);
        cudaGetLastError();
        return st;
    }
    if (e == cudaSuccess && g != NULL) {
        e = cudaGraphInstantiate(&x, g, 0);
        cudaGraphDestroy(g);
    } else if (e == cudaSuccess) {
        e = cudaErrorStreamCaptureInvalidated;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        DUET_LOG_WARN("cuda rank %d: recording the decode step of %d tokens failed (%s); it runs "
                      "without a graph",
                      r->rank, n, cudaGetErrorString(e));
        r->graph_seen[n] = DUET__SEEN_FAILED;
        *redo_p = true;
        return DUET_OK;
    }
    r->graph[n] = x;
    DUET__CUDA_TRY(cudaGraphLaunch(x, r->stream));
    return DUET_OK;
}
