#include "node/kv_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "engine/backend.h"
#include "engine/tp.h"
#include "transfer/xfer_pack.h"

static duet_status_t duet__kv_alloc(void *ud, int rank, size_t bytes, void **base_p)
{
    duet_kv_engine_t *ke = ud;
    return duet_xfer_pool_alloc(duet_xfer_rank(ke->xfer, rank), bytes, base_p);
}

static void duet__kv_free(void *ud, int rank, void *base)
{
    /* the pool belongs to the transfer rank and goes with duet_xfer_destroy */
}

static duet_status_t duet__kv_register(void *ud, int rank, void *base, size_t bytes)
{
    duet_kv_engine_t *ke = ud;
    return duet_xfer_pool_register_device(duet_xfer_rank(ke->xfer, rank), base, bytes);
}

static void duet__kv_unregister(void *ud, int rank, void *base)
{
    duet_kv_engine_t *ke = ud;
    duet_xfer_pool_unregister(duet_xfer_rank(ke->xfer, rank));
}

typedef struct {
    duet_engine_t *engine;
    int rank;
} duet__bind_t;

/* The transfer's checksum hook on a device pool: the CRC where the pool
 * lives (duet_engine_kv_crc: a GPU kernel), on the rank's progress thread
 * (bound to the rank's GPU below). */
static duet_status_t duet__ke_crc_hook(void *ctx, const duet_crc32c_range_t *ranges, int n,
                                       uint32_t *crc_p)
{
    const duet_kv_crc_ctx_t *c = ctx;
    return duet_engine_kv_crc(c->engine, c->rank, ranges, n, crc_p);
}

static duet_status_t duet__bind(void *arg)
{
    duet__bind_t *b = arg;
    return duet_engine_thread_bind(b->engine, b->rank);
}

/* Device pools: put straight from and into device memory, or stage through
 * a pinned host mirror (DUET_KV_TRANSFER_PATH):
 *   auto (default)  direct with UCX >= 1.16 built with CUDA transports, whose
 *                   protocols put device memory with cuda_ipc; staged below
 *                   that: UCX 1.13 (with UCX_PROTO_ENABLE=y) moves device
 *                   memory correctly but by software emulation, measured at
 *                   0.7-1.0 GB/s against 5-8 GB/s staged (docs/performance-gpu-transfer.md)
 *   direct          direct whenever UCX can at all (start-up error if not)
 *   staged          always the mirror
 * Checksums work on either path: through the mirror the CPU reads what it
 * checks; on the direct path the GPU computes them (duet__ke_crc_hook).
 * Returns 1 for direct, 0 for staged (*why says why), -1 for a bad value
 * or a forced direct path this UCX cannot run (duet_error set). */
static int duet__device_path(const duet_kv_engine_opts_t *opts, duet_xfer_t *xfer, const char **why)
{
    const char *env = getenv("DUET_KV_TRANSFER_PATH");
    bool forced = env != NULL && strcmp(env, "direct") == 0;

    if (env != NULL && *env != '\0' && !forced && strcmp(env, "auto") != 0 &&
        strcmp(env, "staged") != 0) {
        duet_error(DUET_ERR_CONFIG, "DUET_KV_TRANSFER_PATH=%s: expected auto, direct or staged",
                   env);
        return -1;
    }
    if (env != NULL && strcmp(env, "staged") == 0) {
        *why = "DUET_KV_TRANSFER_PATH=staged";
        return 0;
    }
    if (!duet_xfer_device_puts(xfer, why)) {
        if (forced) {
            duet_error(DUET_ERR_CONFIG, "DUET_KV_TRANSFER_PATH=direct: %s", *why);
            return -1;
        }
        return 0;
    }
    if (!forced && duet_xfer_ucx_version() < 116) {
        *why = "this UCX (< 1.16) emulates puts of device memory in software, slower than "
               "staging; DUET_KV_TRANSFER_PATH=direct forces it";
        return 0;
    }
    return 1;
}

/* DUET_KV_TRANSFER_PROGRESS (see kv_engine.h). */
static duet_status_t duet__progress_mode(duet_kv_engine_t *ke, int n_layers)
{
    const char *env = getenv("DUET_KV_TRANSFER_PROGRESS");
    char *end = NULL;
    long v;

    ke->progress_auto = false;
    if (env == NULL || *env == '\0' || strcmp(env, "auto") == 0) {
        ke->progress_layers = (n_layers + 3) / 4;
        ke->progress_auto = true;
        return DUET_OK;
    }
    if (strcmp(env, "off") == 0) {
        ke->progress_layers = 0;
        return DUET_OK;
    }
    v = strtol(env, &end, 10);
    if (end == env || *end != '\0' || v < 1 || v > n_layers)
        return duet_error(DUET_ERR_CONFIG,
                          "DUET_KV_TRANSFER_PROGRESS=%s: expected auto, off or a layer count "
                          "1..%d",
                          env, n_layers);
    ke->progress_layers = (int)v;
    return DUET_OK;
}

/* DUET_KV_TRANSFER_PACK (see kv_engine.h). */
static duet_status_t duet__pack_mode(duet_kv_engine_t *ke)
{
    const char *env = getenv("DUET_KV_TRANSFER_PACK");
    bool mirrored = duet_engine_kv_mirrored(ke->engine);

    if (env == NULL || *env == '\0' || strcmp(env, "auto") == 0) {
        ke->pack = duet_engine_kv_registered(ke->engine);
        return DUET_OK;
    }
    if (strcmp(env, "off") == 0) {
        ke->pack = false;
        return DUET_OK;
    }
    if (strcmp(env, "on") != 0)
        return duet_error(DUET_ERR_CONFIG, "DUET_KV_TRANSFER_PACK=%s: expected auto, on or off",
                          env);
    if (mirrored)
        return duet_error(DUET_ERR_CONFIG,
                          "DUET_KV_TRANSFER_PACK=on: the transfer path %s moves KV through the "
                          "host mirror, which packing cannot use (DUET_KV_TRANSFER_PATH=direct)",
                          ke->path);
    ke->pack = true;
    return DUET_OK;
}

duet_status_t duet_kv_engine_create(const duet_kv_engine_opts_t *opts, duet_kv_engine_t *ke)
{
    const duet_instance_config_t *self = opts->self;
    const duet_backend_ops_t *ops;
    duet_model_t *model;
    duet_shard_t s0;
    duet_status_t st;

    memset(ke, 0, sizeof(*ke));
    ops = duet_backend_find(self->backend);
    if (ops == NULL)
        return DUET_ERR_CONFIG;
    /* the transfer context needs the layout and the fingerprint before the
     * engine allocates its pools from it */
    if ((st = duet_model_open(opts->cluster->model, &model)) != DUET_OK)
        return st;
    ke->model_cfg = model->cfg;
    ke->fingerprint = model->fingerprint;
    duet_model_close(model);
    /* the context every limit of the daemon uses (kv.max_context) */
    if ((st = duet_cluster_context(opts->cluster, ke->model_cfg.max_pos, &ke->model_cfg.max_pos)) !=
        DUET_OK)
        return st;
    if ((st = duet_tp_check(&ke->model_cfg, self->tp)) != DUET_OK)
        return st;
    duet_shard_init(&ke->model_cfg, self->tp, 0, &s0);
    ke->tp = self->tp;
    ke->kv_heads = ke->model_cfg.n_kv_heads;

    duet_xfer_config_t xc = {
        .role = opts->role,
        .tp = self->tp,
        .kv_heads = ke->kv_heads,
        .dtype = ops->kv_dtype,
        .layout =
            {
                .n_layers = ke->model_cfg.n_layers,
                .n_pages = self->n_pages,
                .page_size = opts->cluster->page_size,
                .n_kv_heads = s0.n_kv_heads,
                .head_dim = ke->model_cfg.head_dim,
                .elem_size = (int)duet_dtype_size(ops->kv_dtype),
            },
        .model_fingerprint = ke->fingerprint,
        .on_peer_error = opts->on_peer_error,
        .cb_arg = opts->cb_arg,
    };
    if ((st = duet_xfer_create(&xc, &ke->xfer)) != DUET_OK)
        return st;

    duet_engine_opts_t eo;
    duet_engine_opts_default(&eo);
    eo.model_dir = opts->cluster->model;
    eo.backend = self->backend;
    eo.tp = self->tp;
    eo.threads = self->threads;
    eo.devices = self->n_devices > 0 ? self->devices : NULL;
    eo.page_size = opts->cluster->page_size;
    eo.n_pages = self->n_pages;
    eo.max_batch_tokens = self->max_batch_tokens;
    eo.max_seqs = self->max_seqs < self->max_batch_tokens ? self->max_seqs : self->max_batch_tokens;
    eo.kv_alloc = duet__kv_alloc;
    eo.kv_free = duet__kv_free;
    eo.kv_ud = ke;
    const char *why = "";
    if (ops->kv_import != NULL) {
        int direct = duet__device_path(opts, ke->xfer, &why);
        if (direct < 0) {
            st = duet_error_wrap(DUET_ERR_CONFIG, "kv: ");
            duet_xfer_destroy(ke->xfer);
            ke->xfer = NULL;
            return st;
        }
        if (direct) {
            eo.kv_register = duet__kv_register;
            eo.kv_unregister = duet__kv_unregister;
        }
    }
    eo.on_layer = opts->on_layer;
    eo.layer_ud = opts->layer_ud;
    /* the staging arena, where packing can run: device pools put directly
     * (auto), or wherever DUET_KV_TRANSFER_PACK=on */
    const char *pack_env = getenv("DUET_KV_TRANSFER_PACK");
    bool pack_on = pack_env != NULL && strcmp(pack_env, "on") == 0;
    bool pack_auto = pack_env == NULL || *pack_env == '\0' || strcmp(pack_env, "auto") == 0;
    if (pack_on || (pack_auto && eo.kv_register != NULL)) {
        int units = self->stage_pages >= 0 ? self->stage_pages : self->n_pages / 4;
        eo.kv_extra_bytes =
            (size_t)(units > 0 ? units : 1) * duet_xfer_stage_unit_bytes(&xc.layout);
    }
    if ((st = duet_engine_create(&eo, &ke->engine)) != DUET_OK) {
        duet_xfer_destroy(ke->xfer);
        ke->xfer = NULL;
        return st;
    }
    if (duet_engine_kv_registered(ke->engine)) {
        /* device pools registered with UCX: puts from device memory into the
         * peer's device pool (cuda_ipc on one host), layer by layer.  UCX's
         * CUDA transports use the context current on the thread that drives
         * them: each rank's progress thread gets its rank's GPU. */
        for (int r = 0; r < ke->tp; r++) {
            duet__bind_t b = {ke->engine, r};
            if ((st = duet_xfer_rank_run(duet_xfer_rank(ke->xfer, r), duet__bind, &b)) != DUET_OK) {
                duet_kv_engine_destroy(ke);
                return duet_error_wrap(st, "kv: transfer thread of rank %d: ", r);
            }
            /* transfer.checksum: the GPU computes the CRC of its pool */
            ke->crc[r] = (duet_kv_crc_ctx_t){ke->engine, r};
            duet_xfer_rank_set_checksum(duet_xfer_rank(ke->xfer, r), duet__ke_crc_hook,
                                        &ke->crc[r]);
        }
        ke->path = "ucx-cuda-direct";
        DUET_LOG_INFO("kv: pools in %s device memory; transfer path %s (%s; puts between device "
                      "pools, no host copies; checksums %s)",
                      ops->name, ke->path, why,
                      opts->cluster->transfer_checksum ? "on, computed on the GPU" : "off");
    } else if (duet_engine_kv_mirrored(ke->engine)) {
        /* device pools: KV goes through the pinned host mirror, layer by
         * layer */
        ke->path = "staged-pinned-host";
        DUET_LOG_INFO("kv: pools in %s device memory; UCX CUDA memory support: %s; transfer "
                      "path %s (%s; per-layer device<->host copies around the puts)",
                      ops->name, duet_xfer_supports_cuda_memory(ke->xfer) ? "yes" : "no", ke->path,
                      why);
    } else {
        ke->path = "ucx-host";
    }
    snprintf(ke->ucx_version, sizeof(ke->ucx_version), "%d.%d", duet_xfer_ucx_version() / 100,
             duet_xfer_ucx_version() % 100);
    for (int r = 0; r < ke->tp; r++) {
        if ((st = duet_engine_device_id(ke->engine, r, ke->gpu[r], sizeof(ke->gpu[r]))) !=
            DUET_OK) {
            duet_kv_engine_destroy(ke);
            return st;
        }
    }
    if ((st = duet__pack_mode(ke)) != DUET_OK) {
        duet_kv_engine_destroy(ke);
        return st;
    }
    if (!duet_engine_kv_mirrored(ke->engine))
        ke->stage_units = duet_xfer_stage_units(&xc.layout, duet_engine_kv_pool_bytes(ke->engine));
    ke->pack = ke->pack && ke->stage_units > 0;
    if ((st = duet__progress_mode(ke, xc.layout.n_layers)) != DUET_OK) {
        duet_kv_engine_destroy(ke);
        return st;
    }
    if (!ke->pack)
        ke->progress_layers = 0;
    DUET_LOG_INFO("kv: %d ranks, pools %s, %d pages of %d tokens, transfer path %s, packed %s "
                  "(%d staging units, progress every %d layers%s), ucx %s",
                  ke->tp, duet_xfer_pool_kind(duet_xfer_rank(ke->xfer, 0)), self->n_pages,
                  opts->cluster->page_size, ke->path, ke->pack ? "on" : "off", ke->stage_units,
                  ke->progress_layers, ke->progress_auto ? " from 512 MiB of KV" : "",
                  ke->ucx_version);
    return DUET_OK;
}

void duet_kv_engine_destroy(duet_kv_engine_t *ke)
{
    duet_engine_destroy(ke->engine);
    ke->engine = NULL;
    duet_xfer_destroy(ke->xfer);
    ke->xfer = NULL;
}

duet_status_t duet_kv_engine_descriptors(duet_kv_engine_t *ke, void **blobs, size_t *lens)
{
    for (int r = 0; r < ke->tp; r++) {
        duet_status_t st = duet_xfer_desc_pack(duet_xfer_rank(ke->xfer, r), &blobs[r], &lens[r]);
        if (st != DUET_OK) {
            for (int q = 0; q < r; q++)
                duet_free(blobs[q]);
            return st;
        }
    }
    return DUET_OK;
}
