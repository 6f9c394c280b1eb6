/* One daemon's transfer engine in a child process: create it, give every
 * rank a pool, swap descriptors with the other side, connect. */
#include "testkit/testkit.h"

#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "transfer/xfer_pack.h"

int duet_testkit_side_start(duet_testkit_side_t *sd)
{
    duet_xfer_config_t cfg;
    int h0, nh;
    sd->alloc_live0 = duet_alloc_live();
    duet_kv_heads_owned(sd->kv_heads, sd->tp, 0, &h0, &nh);
    sd->layout.n_kv_heads = nh;
    memset(&cfg, 0, sizeof(cfg));
    cfg.role = sd->role;
    cfg.tp = sd->tp;
    cfg.kv_heads = sd->kv_heads;
    cfg.dtype = sd->dtype;
    cfg.layout = sd->layout;
    cfg.model_fingerprint = sd->fingerprint;
    cfg.tls = sd->tls;
    cfg.early_ttl_ms = sd->early_ttl_ms;
    DUET_TESTKIT_OK(duet_xfer_create(&cfg, &sd->x));
    for (int r = 0; r < sd->tp && !sd->no_pools; r++) {
        size_t bytes = duet_kv_total_bytes(&sd->layout) +
                       (size_t)sd->stage_units * duet_xfer_stage_unit_bytes(&sd->layout);
        void *base;
        if (sd->registered) {
            sd->owned[r] = base = duet_aligned_alloc(4096, bytes);
            DUET_TESTKIT_CHECK(base != NULL, "out of memory");
            DUET_TESTKIT_OK(duet_xfer_pool_register(duet_xfer_rank(sd->x, r), base, bytes));
        } else {
            DUET_TESTKIT_OK(duet_xfer_pool_alloc(duet_xfer_rank(sd->x, r), bytes, &base));
        }
        sd->base[r] = base;
    }
    return 0;
}

int duet_testkit_side_connect(duet_testkit_side_t *sd, int fd)
{
    void *blobs[DUET_TP_MAX];
    uint32_t lens[DUET_TP_MAX];
    for (int r = 0; r < sd->tp; r++) {
        void *blob;
        size_t len;
        DUET_TESTKIT_OK(duet_xfer_desc_pack(duet_xfer_rank(sd->x, r), &blob, &len));
        DUET_TESTKIT_CHECK(duet_testkit_chan_send(fd, blob, (uint32_t)len) == 0,
                           "sending descriptor %d", r);
        duet_free(blob);
    }
    for (int q = 0; q < sd->remote_tp; q++)
        DUET_TESTKIT_CHECK(duet_testkit_chan_recv(fd, &blobs[q], &lens[q], 20000) == 0,
                           "receiving descriptor %d", q);
    for (int r = 0; r < sd->tp; r++)
        for (int q = 0; q < sd->remote_tp; q++) {
            duet_xfer_desc_info_t info;
            DUET_TESTKIT_OK(duet_xfer_desc_peek(blobs[q], lens[q], &info));
            DUET_TESTKIT_CHECK(info.rank == q, "descriptor %d names rank %d", q, info.rank);
            DUET_TESTKIT_OK(duet_xfer_peer_connect(duet_xfer_rank(sd->x, r), blobs[q], lens[q],
                                                   duet_deadline_in_ms(15000), &sd->peers[r][q]));
        }
    for (int q = 0; q < sd->remote_tp; q++)
        duet_free(blobs[q]);
    return 0;
}

int duet_testkit_side_stop(duet_testkit_side_t *sd)
{
    duet_xfer_destroy(sd->x);
    sd->x = NULL;
    for (int r = 0; r < sd->tp; r++) {
        duet_aligned_free(sd->owned[r]);
        sd->owned[r] = NULL;
    }
    DUET_TESTKIT_CHECK(duet_alloc_live() == sd->alloc_live0, "%ld blocks leaked",
                       duet_alloc_live() - sd->alloc_live0);
    return 0;
}
