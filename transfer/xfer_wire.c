#include "transfer/xfer_wire.h"

#include <inttypes.h>
#include <string.h>

#include "common/alloc.h"
#include "kv/heads.h"
#include "transfer/xfer_crc32c.h"

/* ---- little-endian cursor ---------------------------------------------- */

static void duet__put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void duet__wire_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void duet__wire_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t duet__get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t duet__get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t duet__get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

const char *duet__role_name(duet_xfer_role_t role)
{
    switch (role) {
    case DUET_XFER_PREFILL:
        return "prefill";
    case DUET_XFER_DECODE:
        return "decode";
    }
    return "unknown-role";
}

/* ---- descriptor ---------------------------------------------------------- */

duet_status_t duet__desc_check_info(const duet_xfer_desc_info_t *in, const char *what)
{
    const duet_kv_layout_t *l = &in->layout;
    size_t total;
    int h0, nh;

    if (in->role != DUET_XFER_PREFILL && in->role != DUET_XFER_DECODE)
        return duet_error(DUET_ERR_FORMAT, "%s: role %d unknown", what, (int)in->role);
    if (in->tp < 1 || in->tp > DUET_TP_MAX)
        return duet_error(DUET_ERR_FORMAT, "%s: tp %d out of range 1..%d", what, in->tp,
                          DUET_TP_MAX);
    if (in->rank < 0 || in->rank >= in->tp)
        return duet_error(DUET_ERR_FORMAT, "%s: rank %d out of range for tp %d", what, in->rank,
                          in->tp);
    if (in->kv_heads < 1 || (in->kv_heads >= in->tp && in->kv_heads % in->tp != 0) ||
        (in->kv_heads < in->tp && in->tp % in->kv_heads != 0))
        return duet_error(DUET_ERR_FORMAT, "%s: %d kv heads cannot be sharded over tp %d", what,
                          in->kv_heads, in->tp);
    if (duet_dtype_size(in->dtype) == 0 || in->dtype == DUET_DTYPE_I32 ||
        in->dtype == DUET_DTYPE_I64 || in->dtype == DUET_DTYPE_F8_E4M3)
        return duet_error(DUET_ERR_FORMAT, "%s: dtype %d is not a KV type", what, (int)in->dtype);
    if ((size_t)l->elem_size != duet_dtype_size(in->dtype))
        return duet_error(DUET_ERR_FORMAT, "%s: elem_size %d does not match dtype %s", what,
                          l->elem_size, duet_dtype_name(in->dtype));
    if (l->n_layers < 1 || l->n_layers > 4096 || l->n_pages < 1 || l->page_size < 1 ||
        l->page_size > 65536 || l->head_dim < 1 || l->head_dim > 65536)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: layout out of range (layers %d, pages %d, page_size %d, "
                          "head_dim %d)",
                          what, l->n_layers, l->n_pages, l->page_size, l->head_dim);
    duet_kv_heads_owned(in->kv_heads, in->tp, in->rank, &h0, &nh);
    if (l->n_kv_heads != nh)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: %d local kv heads, but %d kv heads over tp %d give %d per rank",
                          what, l->n_kv_heads, in->kv_heads, in->tp, nh);
    total = (size_t)l->page_size * (size_t)l->head_dim;
    if (__builtin_mul_overflow(total, (size_t)l->elem_size, &total) ||
        __builtin_mul_overflow(total, (size_t)l->n_kv_heads, &total) ||
        __builtin_mul_overflow(total, (size_t)l->n_pages, &total) ||
        __builtin_mul_overflow(total, (size_t)l->n_layers * 2u, &total))
        return duet_error(DUET_ERR_FORMAT, "%s: pool size overflows", what);
    if (in->pool_bytes < total)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: pool of %" PRIu64 " bytes is smaller than the "
                          "layout's %zu",
                          what, in->pool_bytes, total);
    return DUET_OK;
}

duet_status_t duet__desc_encode(const duet__desc_t *d, void **blob_p, size_t *len_p)
{
    const duet_xfer_desc_info_t *in = &d->info;
    const duet_kv_layout_t *l = &in->layout;
    size_t len = DUET__DESC_FIXED + d->rkey_len + d->addr_len + 4u;
    uint8_t *b;

    if (d->rkey_len == 0 || d->rkey_len >= DUET__DESC_BLOB_MAX || d->addr_len == 0 ||
        d->addr_len >= DUET__DESC_BLOB_MAX)
        return duet_error(DUET_ERR_INTERNAL, "descriptor: rkey %u / address %u bytes", d->rkey_len,
                          d->addr_len);
    b = duet_malloc(len);
    if (b == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "descriptor: %zu bytes", len);
    duet__wire_put_u32(b + 0, DUET__DESC_MAGIC);
    duet__put_u16(b + 4, DUET_XFER_DESC_VERSION);
    duet__put_u16(b + 6, in->pool_device ? DUET__DESC_F_DEVICE : 0); /* flags */
    duet__wire_put_u32(b + 8, (uint32_t)len);
    b[12] = (uint8_t)in->role;
    b[13] = (uint8_t)in->dtype;
    duet__put_u16(b + 14, (uint16_t)in->rank);
    duet__put_u16(b + 16, (uint16_t)in->tp);
    duet__put_u16(b + 18, (uint16_t)in->kv_heads);
    duet__wire_put_u32(b + 20, (uint32_t)l->n_layers);
    duet__wire_put_u32(b + 24, (uint32_t)l->n_pages);
    duet__wire_put_u32(b + 28, (uint32_t)l->page_size);
    duet__wire_put_u32(b + 32, (uint32_t)l->n_kv_heads);
    duet__wire_put_u32(b + 36, (uint32_t)l->head_dim);
    duet__wire_put_u32(b + 40, (uint32_t)l->elem_size);
    duet__wire_put_u64(b + 44, in->model_fingerprint);
    duet__wire_put_u64(b + 52, in->instance);
    duet__wire_put_u64(b + 60, in->host_id);
    duet__wire_put_u64(b + 68, d->pool_base);
    duet__wire_put_u64(b + 76, in->pool_bytes);
    duet__wire_put_u32(b + 84, d->rkey_len);
    duet__wire_put_u32(b + 88, d->addr_len);
    memcpy(b + DUET__DESC_FIXED, d->rkey, d->rkey_len);
    memcpy(b + DUET__DESC_FIXED + d->rkey_len, d->addr, d->addr_len);
    duet__wire_put_u32(b + len - 4, duet__crc32c(0, b, len - 4));
    *blob_p = b;
    *len_p = len;
    return DUET_OK;
}

/* A u32 layout field into an int, refusing values that do not fit. */
static int duet__desc_field(const uint8_t *b, size_t off, int *out)
{
    uint32_t v = duet__get_u32(b + off);
    if (v > INT32_MAX)
        return 0;
    *out = (int)v;
    return 1;
}

duet_status_t duet__desc_decode(const void *blob, size_t len, duet__desc_t *d_p)
{
    const uint8_t *b = blob;
    duet__desc_t d;
    uint32_t total, version;
    duet_kv_layout_t *l = &d.info.layout;
    duet_status_t st;

    if (blob == NULL || len < 8)
        return duet_error(DUET_ERR_FORMAT, "peer descriptor: truncated (%zu bytes)", len);
    if (duet__get_u32(b) != DUET__DESC_MAGIC)
        return duet_error(DUET_ERR_FORMAT, "peer descriptor: not a duet transfer descriptor");
    version = duet__get_u16(b + 4);
    if (version != DUET_XFER_DESC_VERSION)
        return duet_error(DUET_ERR_UNSUPPORTED,
                          "peer descriptor: descriptor version %u unsupported (this build "
                          "speaks %d)",
                          version, DUET_XFER_DESC_VERSION);
    if (len < DUET__DESC_FIXED + 4)
        return duet_error(DUET_ERR_FORMAT, "peer descriptor: truncated (%zu bytes)", len);
    total = duet__get_u32(b + 8);
    if (total != len)
        return duet_error(DUET_ERR_FORMAT,
                          "peer descriptor: truncated or padded (says %u bytes, %zu received)",
                          total, len);
    if (duet__get_u32(b + len - 4) != duet__crc32c(0, b, len - 4))
        return duet_error(DUET_ERR_FORMAT, "peer descriptor: checksum mismatch (corrupted)");
    if ((duet__get_u16(b + 6) & ~DUET__DESC_F_DEVICE) != 0)
        return duet_error(DUET_ERR_FORMAT, "peer descriptor: unknown flags 0x%x",
                          duet__get_u16(b + 6));

    memset(&d, 0, sizeof(d));
    d.info.pool_device = (duet__get_u16(b + 6) & DUET__DESC_F_DEVICE) != 0;
    d.info.role = (duet_xfer_role_t)b[12];
    d.info.dtype = (duet_dtype_t)b[13];
    d.info.rank = duet__get_u16(b + 14);
    d.info.tp = duet__get_u16(b + 16);
    d.info.kv_heads = duet__get_u16(b + 18);
    if (!duet__desc_field(b, 20, &l->n_layers) || !duet__desc_field(b, 24, &l->n_pages) ||
        !duet__desc_field(b, 28, &l->page_size) || !duet__desc_field(b, 32, &l->n_kv_heads) ||
        !duet__desc_field(b, 36, &l->head_dim) || !duet__desc_field(b, 40, &l->elem_size))
        return duet_error(DUET_ERR_FORMAT, "peer descriptor: layout field out of range");
    d.info.model_fingerprint = duet__get_u64(b + 44);
    d.info.instance = duet__get_u64(b + 52);
    d.info.host_id = duet__get_u64(b + 60);
    d.pool_base = duet__get_u64(b + 68);
    d.info.pool_bytes = duet__get_u64(b + 76);
    d.rkey_len = duet__get_u32(b + 84);
    d.addr_len = duet__get_u32(b + 88);
    if (d.rkey_len == 0 || d.rkey_len >= DUET__DESC_BLOB_MAX || d.addr_len == 0 ||
        d.addr_len >= DUET__DESC_BLOB_MAX ||
        (size_t)DUET__DESC_FIXED + d.rkey_len + d.addr_len + 4u != len)
        return duet_error(DUET_ERR_FORMAT,
                          "peer descriptor: rkey %u and address %u bytes do not fit %zu bytes",
                          d.rkey_len, d.addr_len, len);
    if (d.pool_base + d.info.pool_bytes < d.pool_base)
        return duet_error(DUET_ERR_FORMAT, "peer descriptor: pool range wraps around");
    st = duet__desc_check_info(&d.info, "peer descriptor");
    if (st != DUET_OK)
        return st;
    d.rkey = b + DUET__DESC_FIXED;
    d.addr = b + DUET__DESC_FIXED + d.rkey_len;
    *d_p = d;
    return DUET_OK;
}

duet_status_t duet__desc_check_peer(const duet_xfer_desc_info_t *local,
                                    const duet_xfer_desc_info_t *remote)
{
    const duet_kv_layout_t *ll = &local->layout, *rl = &remote->layout;
    const char *role = duet__role_name(remote->role);
    int rank = remote->rank;

    if (remote->role == local->role)
        return duet_error(DUET_ERR_MISMATCH, "peer %s rank %d: same role as this daemon", role,
                          rank);
    if (remote->model_fingerprint != local->model_fingerprint)
        return duet_error(DUET_ERR_MISMATCH,
                          "peer %s rank %d: model fingerprint differs (%016" PRIx64
                          " != %016" PRIx64 ")",
                          role, rank, remote->model_fingerprint, local->model_fingerprint);
    if (remote->dtype != local->dtype)
        return duet_error(DUET_ERR_MISMATCH, "peer %s rank %d: dtype %s != %s", role, rank,
                          duet_dtype_name(remote->dtype), duet_dtype_name(local->dtype));
    if (rl->n_layers != ll->n_layers)
        return duet_error(DUET_ERR_MISMATCH, "peer %s rank %d: layers %d != %d", role, rank,
                          rl->n_layers, ll->n_layers);
    if (rl->page_size != ll->page_size)
        return duet_error(DUET_ERR_MISMATCH, "peer %s rank %d: page_size %d != %d", role, rank,
                          rl->page_size, ll->page_size);
    if (rl->head_dim != ll->head_dim)
        return duet_error(DUET_ERR_MISMATCH, "peer %s rank %d: head_dim %d != %d", role, rank,
                          rl->head_dim, ll->head_dim);
    if (remote->kv_heads != local->kv_heads)
        return duet_error(DUET_ERR_MISMATCH, "peer %s rank %d: kv_heads %d != %d", role, rank,
                          remote->kv_heads, local->kv_heads);
    if (rl->elem_size != ll->elem_size)
        return duet_error(DUET_ERR_MISMATCH, "peer %s rank %d: elem_size %d != %d", role, rank,
                          rl->elem_size, ll->elem_size);
    if (remote->pool_device != local->pool_device)
        return duet_error(DUET_ERR_MISMATCH,
                          "peer %s rank %d: KV pool in %s memory, this daemon's in %s memory (both "
                          "sides must run the same KV transfer path: same UCX build and "
                          "DUET_KV_TRANSFER_PATH)",
                          role, rank, remote->pool_device ? "device" : "host",
                          local->pool_device ? "device" : "host");
    return DUET_OK;
}

/* ---- notification message ------------------------------------------------ */

void duet__msg_encode(const duet__msg_t *m, uint8_t out[DUET__MSG_BYTES])
{
    duet__wire_put_u32(out + 0, DUET__MSG_MAGIC);
    duet__put_u16(out + 4, 1);
    duet__put_u16(out + 6, (uint16_t)m->kind);
    duet__wire_put_u64(out + 8, m->transfer_id);
    duet__wire_put_u64(out + 16, m->from_instance);
    duet__wire_put_u64(out + 24, m->to_instance);
    duet__put_u16(out + 32, (uint16_t)m->src_rank);
    duet__put_u16(out + 34, (uint16_t)m->dst_rank);
    duet__wire_put_u32(out + 36, (uint32_t)(int32_t)m->status);
    duet__wire_put_u32(out + 40,
                       (m->has_crc ? DUET__MSG_F_CRC : 0u) |
                           (m->packed ? DUET__MSG_F_PACKED | DUET__MSG_F_PAGE_MAJOR : 0u));
    duet__wire_put_u32(out + 44, m->crc);
    duet__wire_put_u64(out + 48, m->bytes);
    duet__wire_put_u64(out + 56, (uint64_t)m->first_token);
}

duet_status_t duet__msg_decode(const void *buf, size_t len, duet__msg_t *m_p)
{
    const uint8_t *b = buf;
    duet__msg_t m;
    uint32_t flags;

    if (buf == NULL || len != DUET__MSG_BYTES)
        return duet_error(DUET_ERR_FORMAT, "notification: %zu bytes, expected %u", len,
                          DUET__MSG_BYTES);
    if (duet__get_u32(b) != DUET__MSG_MAGIC || duet__get_u16(b + 4) != 1)
        return duet_error(DUET_ERR_FORMAT, "notification: bad magic or version %u",
                          duet__get_u16(b + 4));
    memset(&m, 0, sizeof(m));
    m.kind = duet__get_u16(b + 6);
    if (m.kind != DUET__MSG_NOTIFY && m.kind != DUET__MSG_ACK && m.kind != DUET__MSG_PROGRESS)
        return duet_error(DUET_ERR_FORMAT, "notification: kind %d unknown", m.kind);
    m.transfer_id = duet__get_u64(b + 8);
    m.from_instance = duet__get_u64(b + 16);
    m.to_instance = duet__get_u64(b + 24);
    m.src_rank = duet__get_u16(b + 32);
    m.dst_rank = duet__get_u16(b + 34);
    m.status = (duet_status_t)(int32_t)duet__get_u32(b + 36);
    if (m.src_rank >= DUET_TP_MAX || m.dst_rank >= DUET_TP_MAX)
        return duet_error(DUET_ERR_FORMAT, "notification: rank %d/%d out of range", m.src_rank,
                          m.dst_rank);
    if (m.status != DUET_OK && strcmp(duet_status_name(m.status), "DUET_ERR_UNKNOWN") == 0)
        return duet_error(DUET_ERR_FORMAT, "notification: status %d unknown", (int)m.status);
    flags = duet__get_u32(b + 40);
    if (flags & ~(DUET__MSG_F_CRC | DUET__MSG_F_PACKED | DUET__MSG_F_PAGE_MAJOR))
        return duet_error(DUET_ERR_FORMAT, "notification: unknown flags 0x%x", flags);
    if (!(flags & DUET__MSG_F_PACKED) != !(flags & DUET__MSG_F_PAGE_MAJOR))
        return duet_error(DUET_ERR_FORMAT, "notification: flags 0x%x: %s", flags,
                          (flags & DUET__MSG_F_PACKED)
                              ? "a packed slice staged head-major, by an older build "
                                "(upgrade prefill and decode together)"
                              : "page-major staging on a slice that is not packed");
    m.has_crc = (flags & DUET__MSG_F_CRC) != 0;
    m.packed = (flags & DUET__MSG_F_PACKED) != 0;
    m.crc = duet__get_u32(b + 44);
    m.bytes = duet__get_u64(b + 48);
    m.first_token = (int64_t)duet__get_u64(b + 56);
    if (m.kind == DUET__MSG_PROGRESS &&
        (!m.packed || m.status != DUET_OK || m.has_crc || m.bytes == 0 || m.bytes > INT32_MAX))
        return duet_error(DUET_ERR_FORMAT,
                          "progress message: flags 0x%x, status %d, %" PRIu64 " layers", flags,
                          (int)m.status, m.bytes);
    *m_p = m;
    return DUET_OK;
}
