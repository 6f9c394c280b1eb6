/* The cuda backend (duet_backend_cuda in engine/backend.h): what other
 * modules may use beyond the ops table.  Built only with DUET_HAVE_CUDA.
 *
 * Design (details in the files named):
 *  - dtypes: weights, activations (act_dtype) and the KV cache (kv_dtype)
 *    are bf16; f32 / f16 checkpoints are rounded to bf16 at load.  Every
 *    kernel computes in float32 and rounds once on store; the residual
 *    stream is bf16 as in Hugging Face's bf16 Llama.  The collectives
 *    (all-reduce of o_proj / down_proj) are bf16 sums in NCCL.
 *  - GEMMs: y = x W^T with float32 accumulation; cuBLASLt "TN" with a plan
 *    cache (gemm.c), and for decode-sized batches (n <= 4 tokens) a
 *    bandwidth-bound skinny GEMV kernel (gemv.cu).  DUET_CUDA_GEMV=0 sends
 *    every n to cuBLASLt.
 *  - attention: prefill (some sequence brings >= 8 new tokens, head_dim 64
 *    or 128) runs a pipelined FlashAttention-2 style tensor-core kernel
 *    (mma.sync, cp.async, ldmatrix; attention_prefill_fa.cu),
 *    DUET_CUDA_ATTN=mma|wmma the older ones (attention_prefill.cu); decode and other head sizes run a per-token
 *    kernel that splits long contexts across blocks and merges the partial
 *    softmaxes (attention_decode.cu).  Both read K/V through the page
 *    table of the HND pool.
 *  - sampling: greedy rows are reduced to (max, id) on the device
 *    (argmax.cu, ops->argmax_rows), so a decode step moves ids, not logits,
 *    to the host; other rows go through rows_to_host_f32.
 *  - streams: one non-blocking stream per rank carries every op, in issue
 *    order, collectives included, so no op needs a cross-stream event.
 *    ops->sync and downloads wait on the host by polling an event and call
 *    the comm backend's watch, so a stuck collective becomes
 *    DUET_ERR_TIMEOUT instead of a hang (comm_nccl.c).
 *  - graphs: batch_prepare uploads the batch description with one copy
 *    into device buffers that keep their addresses; a decode batch of n
 *    tokens (one per sequence) runs eagerly once, is recorded the second
 *    time (embed + every layer, NCCL collectives included) and replayed
 *    from then on (batch.c).  DUET_CUDA_GRAPHS=0 turns graphs off; they are
 *    also off while the engine has a per-layer hook (on_layer).
 *  - KV completion per layer: an event recorded right after rope_kv_store
 *    of the layer.  With the cuda backend the engine's on_layer hook runs
 *    when layer l's work is enqueued, not finished: the export of the
 *    layer's pages (ops->kv_export_layer, kv_mirror.c) makes its copy
 *    stream wait on that event.  The export's and pack's dones run on a
 *    per-rank completion thread once an event recorded after the layer's
 *    copies completed (kv_done.c), not as host functions on the stream. */
#ifndef DUET_ENGINE_CUDA_BACKEND_CUDA_H
#define DUET_ENGINE_CUDA_BACKEND_CUDA_H

#include <stdint.h>

#include "engine/backend.h"

/* Usable CUDA devices; 0 when there is no driver or no device (tests skip
 * on 0).  Thread-safe. */
int duet_cuda_device_count(void);

/* The rank's compute stream (cudaStream_t) and device ordinal. */
void *duet_cuda_rank_stream(duet_backend_rank_t *r);
int duet_cuda_rank_device(const duet_backend_rank_t *r);

#endif
