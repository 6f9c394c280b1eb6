/* Copies inside one rank's KV pool, described once and applied to the K and
 * V planes of any layer: the pack and unpack steps of a packed KV transfer
 * (transfer/xfer_pack.h) are lists of these, executed by whoever owns the
 * pool's memory (the engine's backend: memcpy on the host, a kernel on the
 * GPU).  Applied to plane p (= 2 * layer + K|V, kv/layout.h), an entry
 * copies len bytes from  src + p * src_step  to  dst + p * dst_step,  bytes
 * from the pool's start; a step of 0 means the plane's size, so with both
 * steps 0 the offsets are plane offsets and one list serves every plane
 * (pages), while a nonzero step walks a region laid out otherwise (the
 * staging arena after the planes, transfer/xfer_pack.h).  Source and
 * destination ranges of one list never overlap. */
#ifndef DUET_KV_COPY_H
#define DUET_KV_COPY_H

#include <stdint.h>
#include <string.h>

#include "kv/layout.h"

typedef struct {
    uint64_t src;      /* offset read in plane 0 */
    uint64_t dst;      /* offset written in plane 0 */
    uint64_t len;      /* bytes */
    uint64_t src_step; /* from one plane to the next; 0: the plane's size */
    uint64_t dst_step;
} duet_kv_copy_t;

/* Byte offset, from the pool's start, of an entry's side (off, step) in
 * plane p of planes of plane_bytes bytes. */
static inline uint64_t duet_kv_copy_at(uint64_t off, uint64_t step, uint64_t plane_bytes, int p)
{
    return off + (uint64_t)p * (step != 0 ? step : plane_bytes);
}

/* Apply copies[0..n) to the K and V planes of `layer` of the pool at base
 * (host memory). */
static inline void duet_kv_copy_apply_host(const duet_kv_layout_t *l, void *base, int layer,
                                           const duet_kv_copy_t *copies, int n)
{
    uint64_t pb = duet_kv_plane_bytes(l);
    unsigned char *b = (unsigned char *)base;
    for (int p = 2 * layer; p < 2 * layer + 2; p++)
        for (int i = 0; i < n; i++)
            memcpy(b + duet_kv_copy_at(copies[i].dst, copies[i].dst_step, pb, p),
                   b + duet_kv_copy_at(copies[i].src, copies[i].src_step, pb, p),
                   (size_t)copies[i].len);
}

#endif
