/* The inference engine of one daemon: a model sharded over TP rank threads,
 * a paged KV pool per rank, and the forward step (DESIGN §2, §3).
 *
 * One caller (the daemon's scheduler, or duet generate) drives it: every
 * batch is decided by that caller and handed identically to every rank
 * thread.  Page ids are chosen by the caller (kv/pool.h) and mean
 * the same pages on every rank.  Not thread-safe: one duet_engine_forward()
 * at a time. */
#ifndef DUET_ENGINE_ENGINE_H
#define DUET_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/crc32c.h"
#include "common/status.h"
#include "kv/copy.h"
#include "kv/layout.h"
#include "engine/model.h"
#include "engine/sampling.h"

typedef struct duet_engine duet_engine_t;
struct duet_backend_ops;

typedef struct {
    const char *model_dir;
    const char *backend; /* "cpu" (default) or "cuda" */
    /* An ops table (engine/backend.h) used instead of the named backend:
     * tests wrap the cpu backend to observe the engine's calls. */
    const struct duet_backend_ops *backend_ops;
    int tp;               /* default 1 */
    int threads;          /* cpu workers per rank; 0 = cpus / tp, at least 1 */
    const int *devices;   /* cuda: device of each rank; NULL = 0..tp-1 */
    int page_size;        /* tokens per KV page; default 16 */
    int n_pages;          /* KV pages (ids shared by all ranks); > 0 */
    int max_batch_tokens; /* tokens per forward chunk; default 2048 */
    int max_seqs;         /* sequences per forward chunk; default 256 */
    int comm_timeout_ms;  /* deadline of every collective; default 60000 */
    /* Where each rank's KV pool lives (the transfer layer registers it for
     * one-sided puts).  NULL: the backend allocates. kv_alloc is called
     * from the rank's thread. */
    duet_status_t (*kv_alloc)(void *ud, int rank, size_t bytes, void **base_p);
    void (*kv_free)(void *ud, int rank, void *base);
    /* A device pool (cuda) without a host mirror: when set, the backend's
     * device pool is passed here right after it is allocated (the transfer
     * layer registers device memory for direct puts) and kv_alloc is not
     * called; kv_unregister runs before the pool is freed. */
    duet_status_t (*kv_register)(void *ud, int rank, void *base, size_t bytes);
    void (*kv_unregister)(void *ud, int rank, void *base);
    void *kv_ud;
    /* Bytes each rank's pool has after its planes (the transfer's staging
     * arena, transfer/xfer_pack.h): allocated and registered with the
     * planes, reached by copies with a step (kv/copy.h) and by kv_crc. */
    size_t kv_extra_bytes;
    /* Optional: called on each rank's thread once layer `layer`'s KV of the
     * current chunk is stored (a later layer may still be computing), with
     * last_chunk set on the final chunk of a forward call -- then every
     * token of the call has that layer's KV.  The KV-transfer path streams
     * layer l while l+1 computes.  The backend's work for the layer is
     * complete when this runs (cpu: synchronous; cuda: see its backend).
     * Keep it short: it is on the critical path. */
    void (*on_layer)(void *ud, int rank, int layer, bool last_chunk);
    void *layer_ud;
} duet_engine_opts_t;

void duet_engine_opts_default(duet_engine_opts_t *o);

/* Load the model, check the TP sharding (DUET_ERR_CONFIG naming the rule),
 * start the rank threads, load each rank's shard, allocate KV pools. */
duet_status_t duet_engine_create(const duet_engine_opts_t *opts, duet_engine_t **e_p);
/* Stops and joins the rank threads and frees everything.  NULL is fine. */
void duet_engine_destroy(duet_engine_t *e);

const duet_model_t *duet_engine_model(const duet_engine_t *e);
/* The layout of each rank's KV pool (local heads of rank 0; all ranks
 * have the same count). */
const duet_kv_layout_t *duet_engine_kv_layout(const duet_engine_t *e);

/* ---- KV in device memory --------------------------------------------
 * With a backend whose pool is device memory (cuda), kv_alloc provides a
 * host *mirror* of the pool instead (same layout and page ids) and the KV
 * moves through it: */

/* True when the pool is device memory with a host mirror. */
bool duet_engine_kv_mirrored(const duet_engine_t *e);
/* Make the calling thread use rank's device (a no-op on the cpu backend). */
duet_status_t duet_engine_thread_bind(duet_engine_t *e, int rank);
/* Rank's device, named uniquely on the host and the same in every process
 * (cuda: "GPU-<uuid>"), into buf[cap]; "" where the backend has no devices
 * (cpu).  Two daemons' ranks on one GPU have the same name. */
duet_status_t duet_engine_device_id(duet_engine_t *e, int rank, char *buf, size_t cap);
/* True when the pool is device memory handed to opts.kv_register: exports
 * only order the hook's done() after the layer's KV store, imports are
 * no-ops (the KV lands in the pool itself). */
bool duet_engine_kv_registered(const duet_engine_t *e);
/* From the on_layer hook (rank thread): copy layer's KV of pages[0..n) to
 * the mirror after it was stored, then done(arg) on a driver thread (no
 * blocking, no engine calls).  Without a mirror, done runs at once. */
duet_status_t duet_engine_kv_export_layer(duet_engine_t *e, int rank, int layer,
                                          const int32_t *pages, int n, void (*done)(void *arg),
                                          void *arg);
/* The caller's thread: wait until every export and kv_copy_layer landed
 * and its done ran -- with a mirror, a registered device pool or neither.
 * A sender ends its transfer only after this returned. */
duet_status_t duet_engine_kv_export_sync(duet_engine_t *e);
/* The caller's thread: copy pages[0..n) (every layer) from the mirror into
 * each rank's pool; a no-op without a mirror. */
duet_status_t duet_engine_kv_import(duet_engine_t *e, const int32_t *pages, int n);

/* ---- Packed transfers (transfer/xfer_pack.h) ----------------------
 * Copies inside each rank's pool (kv/copy.h lists: byte offsets within a
 * (layer, K|V) plane, applied to K and V), run by the backend where the
 * pool lives (cpu: memcpy; cuda: a kernel).  Every entry is checked
 * against the plane size first: DUET_ERR_INVALID naming the entry, and
 * nothing is copied.  Ranges of one list must not overlap. */

/* From the on_layer hook of `layer` on rank `rank`'s thread: apply
 * copies[0..n) to that layer's K and V planes of the rank's pool, ordered
 * after the layer's KV store (prefill's pack), then done(arg): on the cpu
 * backend before this returns; with cuda on a driver thread once the
 * copies landed (no blocking, no engine calls there).  copies is read
 * during the call only; several calls per layer (one per request of the
 * batch) are fine.  duet_engine_kv_export_sync waits for every done.  On
 * failure done never runs. */
duet_status_t duet_engine_kv_copy_layer(duet_engine_t *e, int rank, int layer,
                                        const duet_kv_copy_t *copies, int n,
                                        void (*done)(void *arg), void *arg);
/* The caller's thread: apply copies[0..n) to every layer of every rank's
 * pool (page ids are shared by the ranks, so one list serves all), ordered
 * after every forward and copy issued before; returns once they landed
 * (decode's unpack). */
duet_status_t duet_engine_kv_copy(duet_engine_t *e, const duet_kv_copy_t *copies, int n);
/* duet_engine_kv_copy with rank r's own list copies[r][0..n[r]) (decode's
 * unpack: each rank's staging is laid out by the runs it receives). */
duet_status_t duet_engine_kv_copy_ranks(duet_engine_t *e, const duet_kv_copy_t *const *copies,
                                        const int *n);
/* duet_engine_kv_copy_ranks over layers [l0, l1) (decode unpacking a
 * packed transfer chunk by chunk as its layers land).  wait = false returns
 * once the copies are queued (cuda: on each rank's compute stream, so the
 * rank's later forwards and copies are ordered after them; cpu: copied
 * before it returns); a later call with wait = true (also with empty
 * lists) returns once everything queued before it landed.  Until then the
 * caller keeps the staging and the pages as they are. */
duet_status_t duet_engine_kv_copy_ranks_layers(duet_engine_t *e,
                                               const duet_kv_copy_t *const *copies, const int *n,
                                               int l0, int l1, bool wait);

/* Bytes of each rank's pool: its planes and opts.kv_extra_bytes. */
uint64_t duet_engine_kv_pool_bytes(const duet_engine_t *e);

/* CRC32C (common/crc32c.h) of rank's pool bytes ranges[0..n)
 * concatenated in order (offsets from the pool's start), computed where
 * the pool lives (cuda: a parallel kernel; cpu: the host) -- a KV
 * transfer's checksum (transfer/xfer.h duet_xfer_rank_set_checksum).  Any
 * thread but the rank's own, one call per rank at a time; not ordered
 * after queued forwards or copies: only for bytes nothing writes any more.
 * DUET_ERR_INVALID for a bad rank or a range outside the pool (naming it);
 * DUET_ERR_UNSUPPORTED when the backend has no kv_crc. */
duet_status_t duet_engine_kv_crc(duet_engine_t *e, int rank, const duet_crc32c_range_t *ranges,
                                 int n, uint32_t *crc_p);

/* One sequence of a forward step. */
typedef struct {
    const int32_t *tokens; /* [n_tokens] new tokens */
    int n_tokens;          /* >= 1 */
    int start_pos;         /* tokens of this sequence already in the KV */
    const int32_t *pages;  /* page table covering start_pos + n_tokens */
    int n_pages;
    bool sample; /* sample the token that follows the last new one */
    duet_sampling_t sampling;
    uint64_t sample_index; /* output index of that token (counter-based rng) */
    float *logits;         /* optional: logits of the last token [vocab], or */
    bool all_logits;       /* of every new token [n_tokens][vocab] */
} duet_engine_seq_t;

/* sampled[i] when the row's logits were not finite (NaN or inf: broken
 * weights): the caller fails that request; the engine stays usable.  CPU
 * backend: any non-finite logit; a device argmax (cuda, greedy rows): a
 * non-finite maximum (all NaN, or an inf); the host sampling path: any. */
#define DUET_ENGINE_NONFINITE (-2)

/* Run the model over the new tokens of n_seqs sequences: write their KV at
 * positions start_pos.., fill the requested logits, and put the sampled
 * next token of sequence i into sampled[i] (-1 when not sampled,
 * DUET_ENGINE_NONFINITE when its logits were not finite).  Inputs
 * are validated first (token ids, context length -> DUET_ERR_TOO_LONG, page
 * coverage); batches over max_batch_tokens / max_seqs run as several
 * chunks.  A failure inside a rank (deadline, memory) leaves the engine
 * failed: every later call returns the same error. */
duet_status_t duet_engine_forward(duet_engine_t *e, const duet_engine_seq_t *seqs, int n_seqs,
                                  int32_t *sampled);

#endif
