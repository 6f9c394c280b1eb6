/* A daemon's engine with its KV pools owned by the transfer layer: the
 * pools are allocated by UCX (duet_xfer_pool_alloc) so that shared-memory
 * puts into them are one-sided, and the transfer context is configured from
 * the engine's layout and the model's fingerprint.
 *
 * Packed transfers (DUET_KV_TRANSFER_PACK=auto|on|off): a decode with
 * `pack` set stages each request's KV in consecutive pages and asks prefill
 * for a packed send (one put per layer, K|V and slice-plan run instead of
 * one per page and head run).  auto (default): on for device pools put
 * directly (ucx-cuda-direct), where each transport operation has a fixed
 * cost (cuda_ipc, RDMA); off on host pools, where shared-memory puts are
 * plain copies and packing would add two more; on: wherever the path allows
 * (not through the host mirror).  Where packing can run each rank's pool
 * has a staging arena of `stage_pages` units after its planes (the cluster
 * config; auto: n_pages / 4), extra memory of that many KV pages.
 *
 * Unpacking as layers land (DUET_KV_TRANSFER_PROGRESS=auto|off|N): a decode
 * taking packed transfers asks prefill to flush and announce every N
 * layers it put, and unpacks the layers announced by all senders of a rank
 * while the rest is in flight (duet_engine_kv_copy_ranks_layers without a
 * wait); the last chunk is unpacked once the transfer completed.  auto:
 * every quarter of the layers (rounded up); where a decode rank shares its
 * GPU with one of the prefill ranks that send to it (two processes time-
 * slicing one GPU: the early unpacks then wait for the sender's context),
 * only for requests whose KV is large enough to gain
 * (duet_xfer_pack_progress_pays; measured, docs/performance-gpu-transfer.md).  N: every N layers,
 * every packed request; off: one unpack at the end. */
#ifndef DUET_NODE_KV_ENGINE_H
#define DUET_NODE_KV_ENGINE_H

#include "common/cluster.h"
#include "engine/engine.h"
#include "kv/heads.h"
#include "transfer/xfer.h"

/* Which engine rank computes a transfer rank's checksums. */
typedef struct {
    duet_engine_t *engine;
    int rank;
} duet_kv_crc_ctx_t;

typedef struct {
    duet_engine_t *engine;
    duet_xfer_t *xfer;
    duet_model_config_t model_cfg;
    uint64_t fingerprint;
    int tp;
    int kv_heads;         /* total KV heads of the model */
    const char *path;     /* how KV moves: "ucx-host" */
    bool pack;            /* decode asks for packed transfers (transfer/xfer_pack.h) */
    int stage_units;      /* staging arena after each rank's pool (0: none) */
    int progress_layers;  /* packed: layers per progress message decode asks for (0: none) */
    bool progress_auto;   /* ... only for requests large enough (duet_xfer_pack_progress_pays)
                             where a rank shares its GPU with a peer's (duet_node_link_t) */
    char gpu[DUET_TP_MAX][48]; /* each rank's device (duet_engine_device_id; "" on cpu) */
    char ucx_version[16]; /* the UCX library loaded, "major.minor" (Info) */
    duet_kv_crc_ctx_t crc[DUET_TP_MAX]; /* the checksum hook's argument per rank (device pools) */
} duet_kv_engine_t;

typedef struct {
    duet_xfer_role_t role;
    const duet_cluster_config_t *cluster;
    const duet_instance_config_t *self;
    duet_xfer_peer_error_cb_t on_peer_error;
    void *cb_arg;
    /* per-layer hook for streaming transfers (engine/engine.h on_layer) */
    void (*on_layer)(void *ud, int rank, int layer, bool last_chunk);
    void *layer_ud;
} duet_kv_engine_opts_t;

duet_status_t duet_kv_engine_create(const duet_kv_engine_opts_t *opts, duet_kv_engine_t *ke);
/* Engine first (its ranks stop touching the pools), then the transfer
 * context (which unmaps them). */
void duet_kv_engine_destroy(duet_kv_engine_t *ke);

/* One descriptor per rank, for Bootstrap.  blobs[i] are duet_malloc'd. */
duet_status_t duet_kv_engine_descriptors(duet_kv_engine_t *ke, void **blobs, size_t *lens);

#endif
