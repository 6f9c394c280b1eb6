/* Copies inside one rank's KV pool, described once and applied to the K and
 * V planes of any layer: the pack and unpack steps of a packed KV transfer
 * (transfer/xfer_pack.h) are lists of these, executed by whoever owns the
 * pool's memory (the engine's backend: memcpy on the host, a kernel on the
 * GPU).  Offsets are bytes from the start of a (layer, K|V) plane
 * (kv/layout.h), so one list serves every plane; source and destination
 * ranges of one list never overlap. */
#ifndef DUET_KV_COPY_H
#define DUET_KV_COPY_H

#include <stdint.h>
#include <string.h>

#include "kv/layout.h"

typedef struct {
    uint64_t src; /* plane offset read */
    uint64_t dst; /* plane offset written */
    uint64_t len; /* bytes */
} duet_kv_copy_t;

/* Apply copies[0..n) to the K and V planes of `layer` of the pool at base
 * (host memory). */
static inline void duet_kv_copy_apply_host(const duet_kv_layout_t *l, void *base, int layer,
                                           const duet_kv_copy_t *copies, int n)
{
    for (int kv = 0; kv < 2; kv++) {
        unsigned char *plane = (unsigned char *)base + duet_kv_offset(l, layer, kv, 0, 0);
        for (int i = 0; i < n; i++)
            memcpy(plane + copies[i].dst, plane + copies[i].src, (size_t)copies[i].len);
    }
}

#endif
