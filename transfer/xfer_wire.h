/* What the transfer engine puts on the wire, as pure functions: the peer
 * descriptor (exchanged through the control plane) and the notification /
 * acknowledgement message (a UCX active-message header).  Both are explicit
 * little-endian layouts, versioned, and decoded defensively: they come from
 * the network, so every length and range is checked and a malformed blob is
 * DUET_ERR_FORMAT, never a crash.
 *
 * Descriptor v1 (all integers little-endian):
 *   0  u32 magic "DXFD"     4  u16 version (1)     6  u16 flags (0)
 *   8  u32 total length including the trailing CRC
 *  12  u8 role  13 u8 dtype  14 u16 rank  16 u16 tp  18 u16 kv_heads (total)
 *  20  u32 n_layers  n_pages  page_size  n_kv_heads (local)  head_dim  elem_size
 *  44  u64 model fingerprint  52 u64 instance  60 u64 host id
 *  68  u64 pool base  76 u64 pool bytes  84 u32 rkey length  88 u32 worker address length
 *  92  rkey bytes, then worker address bytes
 *  end u32 CRC32C of everything before it
 * Magic and version stay at offsets 0 and 4 in every version, so a newer
 * blob is reported as an unsupported version rather than as garbage. */
#ifndef DUET_TRANSFER_XFER_WIRE_H
#define DUET_TRANSFER_XFER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "transfer/xfer.h"

#define DUET__DESC_MAGIC    0x44465844u /* "DXFD" */
#define DUET__DESC_FIXED    92u
#define DUET__DESC_BLOB_MAX 65536u /* rkey and address each stay below this */
#define DUET__DESC_F_DEVICE 0x1u   /* flags: the pool is device memory */
/* The transport gets a descriptor's rkey and worker address each copied
 * and followed by this many zero bytes (duet__desc_pad): UCX's parsers
 * take no length and read past the end of a malformed blob; padded alike,
 * they read the same bytes in the daemon and in the probe child that
 * tried them first (transfer/xfer_probe.c), not whatever followed. */
#define DUET__DESC_PAD ((size_t)64 << 10)

typedef struct {
    duet_xfer_desc_info_t info;
    uint64_t pool_base;
    const void *rkey; /* into the blob it was decoded from */
    uint32_t rkey_len;
    const void *addr;
    uint32_t addr_len;
} duet__desc_t;

/* Serialise d into a new duet_malloc'ed blob. */
duet_status_t duet__desc_encode(const duet__desc_t *d, void **blob_p, size_t *len_p);

/* Parse and self-check a blob; d_p's pointers point into blob. */
duet_status_t duet__desc_decode(const void *blob, size_t len, duet__desc_t *d_p);

/* Point d's rkey and address at padded copies (DUET__DESC_PAD), in one
 * new allocation *buf_p that the caller frees (xfer_probe.c). */
duet_status_t duet__desc_pad(duet__desc_t *d, void **buf_p);

/* Can `local` (this daemon's rank) talk to `remote`?  DUET_ERR_MISMATCH
 * naming the first differing field: "peer decode rank 1: head_dim 64 != 128"
 * (the peer's value first). */
duet_status_t duet__desc_check_peer(const duet_xfer_desc_info_t *local,
                                    const duet_xfer_desc_info_t *remote);

/* Self-consistency of a layout + sharding (shared by config and decode). */
duet_status_t duet__desc_check_info(const duet_xfer_desc_info_t *info, const char *what);

const char *duet__role_name(duet_xfer_role_t role);

/* Notification (prefill -> decode) and acknowledgement (decode -> prefill):
 *   0 u32 magic "DXNM"  4 u16 version (1)  6 u16 kind
 *   8 u64 request id   16 u64 sender instance  24 u64 receiver instance
 *  32 u16 src rank (prefill engine rank)  34 u16 dst rank (decode engine rank)
 *  36 i32 status  40 u32 flags (bit 0: crc valid, bit 1: packed slice,
 *                                bit 2: page-major staging)  44 u32 crc
 *  48 u64 bytes  56 i64 first token
 * Bit 1 came with packed transfers (transfer/xfer_pack.h).  A receiver
 * built before it refuses the flag as unknown and drops the message
 * (dropped_invalid; the sender times out): a packed slice is never taken
 * for pages.  Old senders never set it.  Bit 2 came when staging blocks
 * became page-major within a plane; a packed slice always carries it, and
 * a receiver refuses a packed slice without it (a sender that staged
 * head-major: its bytes would land in the wrong heads), as well as the bit
 * without bit 1; a receiver built before it drops the message as above.
 *
 * Progress (kind 3, prefill -> decode; a packed send with progress_layers):
 * the same header, status 0, flags packed | page-major, bytes = the layers
 * of the slice landed and flushed so far (1 .. layers - 1), crc and first
 * token 0.  A receiver built before it drops the message (dropped_invalid);
 * the decode daemon asks for progress only when it knows the kind. */
#define DUET__MSG_MAGIC        0x4d4e5844u /* "DXNM" */
#define DUET__MSG_BYTES        64u
#define DUET__MSG_F_CRC        0x1u
#define DUET__MSG_F_PACKED     0x2u
#define DUET__MSG_F_PAGE_MAJOR 0x4u

enum { DUET__MSG_NOTIFY = 1, DUET__MSG_ACK = 2, DUET__MSG_PROGRESS = 3 };

typedef struct {
    int kind;
    uint64_t transfer_id;
    uint64_t from_instance, to_instance;
    int src_rank, dst_rank;
    duet_status_t status;
    int has_crc;
    int packed; /* the slice went staging -> staging (a notification) */
    uint32_t crc;
    uint64_t bytes; /* a progress message: the layers landed */
    int64_t first_token;
} duet__msg_t;

void duet__msg_encode(const duet__msg_t *m, uint8_t out[DUET__MSG_BYTES]);
duet_status_t duet__msg_decode(const void *buf, size_t len, duet__msg_t *m_p);

#endif
