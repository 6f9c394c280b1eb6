/* transfer/xfer pure parts: descriptor encode/decode/validation (including
 * truncated and corrupted blobs), the notification message (and the
 * progress message of packed sends), CRC32C, the request-id map and the
 * put coalescing over every slice plan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "kv/heads.h"
#include "transfer/slice_plan.h"
#include "transfer/xfer_crc32c.h"
#include "transfer/xfer_map.h"
#include "transfer/xfer_segs.h"
#include "transfer/xfer_wire.h"

static duet__desc_t sample_desc(void)
{
    static const unsigned char rkey[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    static const unsigned char addr[] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6,
                                         0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac};
    duet__desc_t d;
    memset(&d, 0, sizeof(d));
    d.info.role = DUET_XFER_DECODE;
    d.info.rank = 1;
    d.info.tp = 2;
    d.info.kv_heads = 8;
    d.info.dtype = DUET_DTYPE_BF16;
    d.info.layout.n_layers = 32;
    d.info.layout.n_pages = 100;
    d.info.layout.page_size = 16;
    d.info.layout.n_kv_heads = 4;
    d.info.layout.head_dim = 128;
    d.info.layout.elem_size = 2;
    d.info.model_fingerprint = 0x0123456789abcdefULL;
    d.info.instance = 0xfeedfacecafebeefULL;
    d.info.pool_bytes = duet_kv_total_bytes(&d.info.layout);
    d.pool_base = 0x7f0000001000ULL;
    d.rkey = rkey;
    d.rkey_len = sizeof(rkey);
    d.addr = addr;
    d.addr_len = sizeof(addr);
    return d;
}

static void test_desc_roundtrip(void **state)
{
    duet__desc_t d = sample_desc(), e;
    void *blob;
    size_t len;
    (void)state;
    assert_int_equal(duet__desc_encode(&d, &blob, &len), DUET_OK);
    assert_int_equal(len, DUET__DESC_FIXED + d.rkey_len + d.addr_len + 4);
    assert_int_equal(duet__desc_decode(blob, len, &e), DUET_OK);
    assert_memory_equal(&e.info, &d.info, sizeof(d.info));
    assert_true(e.pool_base == d.pool_base);
    assert_int_equal(e.rkey_len, d.rkey_len);
    assert_memory_equal(e.rkey, d.rkey, d.rkey_len);
    assert_int_equal(e.addr_len, d.addr_len);
    assert_memory_equal(e.addr, d.addr, d.addr_len);
    assert_false(e.info.pool_device);
    duet_free(blob);

    /* a device pool travels as a flag */
    d.info.pool_device = true;
    assert_int_equal(duet__desc_encode(&d, &blob, &len), DUET_OK);
    assert_int_equal(duet__desc_decode(blob, len, &e), DUET_OK);
    assert_true(e.info.pool_device);
    assert_memory_equal(&e.info, &d.info, sizeof(d.info));
    duet_free(blob);
}

/* Every truncation, every single-bit flip and random garbage: an error, never
 * a crash (ASan watches), never a silently different descriptor. */
static void test_desc_hostile(void **state)
{
    duet__desc_t d = sample_desc(), e;
    unsigned char *blob, *copy;
    size_t len;
    (void)state;
    assert_int_equal(duet__desc_encode(&d, (void **)&blob, &len), DUET_OK);
    assert_int_not_equal(duet__desc_decode(NULL, 0, &e), DUET_OK);
    for (size_t n = 0; n < len; n++) {
        copy = malloc(n ? n : 1); /* exact size: ASan catches any read past it */
        memcpy(copy, blob, n);
        assert_int_not_equal(duet__desc_decode(copy, n, &e), DUET_OK);
        free(copy);
    }
    copy = malloc(len);
    for (size_t bit = 0; bit < len * 8; bit++) {
        memcpy(copy, blob, len);
        copy[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        assert_int_not_equal(duet__desc_decode(copy, len, &e), DUET_OK);
    }
    srand(7);
    for (int k = 0; k < 2000; k++) {
        for (size_t i = 0; i < len; i++)
            copy[i] = (unsigned char)rand();
        if (k % 2) /* plausible header, garbage body */
            memcpy(copy, blob, 12);
        assert_int_not_equal(duet__desc_decode(copy, len, &e), DUET_OK);
    }
    free(copy);
    duet_free(blob);
}

static void test_desc_messages(void **state)
{
    duet__desc_t d = sample_desc(), e;
    unsigned char *blob;
    size_t len;
    (void)state;
    assert_int_equal(duet__desc_encode(&d, (void **)&blob, &len), DUET_OK);

    blob[4] = 2; /* version; the checksum is not even looked at */
    assert_int_equal(duet__desc_decode(blob, len, &e), DUET_ERR_UNSUPPORTED);
    assert_non_null(strstr(duet_error_msg(), "descriptor version 2 unsupported"));
    blob[4] = 1;
    assert_int_equal(duet__desc_decode(blob, len - 1, &e), DUET_ERR_FORMAT);
    blob[0] ^= 1;
    assert_int_equal(duet__desc_decode(blob, len, &e), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "not a duet transfer descriptor"));
    blob[0] ^= 1;
    blob[len / 2] ^= 1;
    assert_int_equal(duet__desc_decode(blob, len, &e), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "checksum"));
    duet_free(blob);

    /* Self-inconsistent but well-formed: refused with the reason. */
    d.info.layout.n_kv_heads = 3;
    assert_int_equal(duet__desc_encode(&d, (void **)&blob, &len), DUET_OK);
    assert_int_equal(duet__desc_decode(blob, len, &e), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "3 local kv heads"));
    duet_free(blob);
    d = sample_desc();
    d.info.pool_bytes -= 1;
    assert_int_equal(duet__desc_encode(&d, (void **)&blob, &len), DUET_OK);
    assert_int_equal(duet__desc_decode(blob, len, &e), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "smaller than the layout"));
    duet_free(blob);
}

static void test_desc_mismatch(void **state)
{
    duet__desc_t d = sample_desc();
    duet_xfer_desc_info_t local = d.info, remote;
    (void)state;
    local.role = DUET_XFER_PREFILL;
    local.rank = 0;
    local.tp = 1;
    local.layout.n_kv_heads = 8;
    assert_int_equal(duet__desc_check_peer(&local, &d.info), DUET_OK);

    remote = d.info;
    remote.role = DUET_XFER_PREFILL;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_non_null(strstr(duet_error_msg(), "same role"));

    remote = d.info;
    remote.model_fingerprint ^= 1;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_non_null(strstr(duet_error_msg(), "peer decode rank 1: model fingerprint differs"));

    remote = d.info;
    remote.layout.head_dim = 64;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_string_equal(duet_error_msg(), "peer decode rank 1: head_dim 64 != 128");

    remote = d.info;
    remote.layout.page_size = 32;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_string_equal(duet_error_msg(), "peer decode rank 1: page_size 32 != 16");

    remote = d.info;
    remote.layout.n_layers = 16;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_string_equal(duet_error_msg(), "peer decode rank 1: layers 16 != 32");

    remote = d.info;
    remote.dtype = DUET_DTYPE_F16;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_string_equal(duet_error_msg(), "peer decode rank 1: dtype F16 != BF16");

    remote = d.info;
    remote.kv_heads = 4;
    remote.layout.n_kv_heads = 2;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_string_equal(duet_error_msg(), "peer decode rank 1: kv_heads 4 != 8");

    /* one side puts between device pools, the other stages through host
     * memory: refused, naming both */
    remote = d.info;
    remote.pool_device = true;
    assert_int_equal(duet__desc_check_peer(&local, &remote), DUET_ERR_MISMATCH);
    assert_non_null(strstr(duet_error_msg(),
                           "peer decode rank 1: KV pool in device memory, this daemon's in host "
                           "memory"));
}

static void test_msg(void **state)
{
    duet__msg_t m, n;
    uint8_t buf[DUET__MSG_BYTES];
    (void)state;
    memset(&m, 0, sizeof(m));
    m.kind = DUET__MSG_NOTIFY;
    m.transfer_id = 0x1122334455667788ULL;
    m.from_instance = 7;
    m.to_instance = 9;
    m.src_rank = 3;
    m.dst_rank = 5;
    m.status = DUET_ERR_CANCELLED;
    m.has_crc = 1;
    m.crc = 0xdeadbeef;
    m.bytes = 1ULL << 40;
    m.first_token = -1;
    duet__msg_encode(&m, buf);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
    assert_memory_equal(&m, &n, sizeof(m));
    assert_int_not_equal(duet__msg_decode(buf, sizeof(buf) - 1, &n), DUET_OK);
    for (size_t byte = 0; byte < 8; byte++) { /* magic, version, kind */
        buf[byte] ^= 0x40;
        assert_int_not_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
        buf[byte] ^= 0x40;
    }
    buf[36] = 0x77; /* a status nobody defined */
    assert_int_not_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);

    /* the packed bit travels in flags (bit 1) with the page-major bit (2);
     * bits above them are refused */
    m.packed = 1;
    m.has_crc = 0;
    duet__msg_encode(&m, buf);
    assert_int_equal(buf[40], DUET__MSG_F_PACKED | DUET__MSG_F_PAGE_MAJOR);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
    assert_memory_equal(&m, &n, sizeof(m));
    buf[40] = DUET__MSG_F_PACKED; /* a sender that staged head-major */
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "staged head-major, by an older build"));
    m.packed = 0;
    duet__msg_encode(&m, buf);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
    assert_int_equal(n.packed, 0);
    buf[40] = DUET__MSG_F_PAGE_MAJOR;
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "page-major staging on a slice that is not packed"));
    buf[40] = 0x8;
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "unknown flags 0x8"));
}

/* A progress message (kind 3): the layers landed in `bytes`, packed and
 * page-major, status 0, no checksum; anything else is refused as
 * malformed, naming what is wrong. */
static void test_msg_progress(void **state)
{
    duet__msg_t m, n;
    uint8_t buf[DUET__MSG_BYTES];
    (void)state;
    memset(&m, 0, sizeof(m));
    m.kind = DUET__MSG_PROGRESS;
    m.transfer_id = 77;
    m.from_instance = 5;
    m.to_instance = 6;
    m.src_rank = 1;
    m.dst_rank = 3;
    m.packed = 1;
    m.bytes = 5;
    duet__msg_encode(&m, buf);
    assert_int_equal(buf[40], DUET__MSG_F_PACKED | DUET__MSG_F_PAGE_MAJOR);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
    assert_memory_equal(&m, &n, sizeof(m));
    assert_int_equal(n.kind, DUET__MSG_PROGRESS);
    assert_int_equal(n.bytes, 5);
    m.bytes = 1; /* the least, and INT32_MAX the most, a receiver can be told */
    duet__msg_encode(&m, buf);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
    m.bytes = INT32_MAX;
    duet__msg_encode(&m, buf);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);

    /* not packed: a per-page slice has no staging to announce */
    m.bytes = 5;
    m.packed = 0;
    duet__msg_encode(&m, buf);
    duet_error_clear();
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "progress message: flags 0x0, status 0, 5 layers"));
    /* a failure status: only the final notification reports one */
    m.packed = 1;
    m.status = DUET_ERR_CANCELLED;
    duet__msg_encode(&m, buf);
    duet_error_clear();
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "progress message: flags 0x6, status"));
    /* a checksum: only the final notification carries one */
    m.status = DUET_OK;
    m.has_crc = 1;
    m.crc = 0x1234;
    duet__msg_encode(&m, buf);
    duet_error_clear();
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "progress message: flags 0x7, status 0"));
    /* no layers, or more than a layer count can be */
    m.has_crc = 0;
    m.crc = 0;
    m.bytes = 0;
    duet__msg_encode(&m, buf);
    duet_error_clear();
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "progress message: flags 0x6, status 0, 0 layers"));
    m.bytes = (uint64_t)INT32_MAX + 1;
    duet__msg_encode(&m, buf);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    /* the same fields are fine on a notification (a per-page one, a zero
     * byte count) and on an acknowledgement: the rules are progress's */
    m.kind = DUET__MSG_NOTIFY;
    m.packed = 0;
    m.bytes = 0;
    duet__msg_encode(&m, buf);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
    m.kind = DUET__MSG_ACK;
    m.status = DUET_ERR_CANCELLED;
    duet__msg_encode(&m, buf);
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_OK);
    /* kind 4 is nobody's */
    buf[6] = 4;
    assert_int_equal(duet__msg_decode(buf, sizeof(buf), &n), DUET_ERR_FORMAT);
    assert_non_null(strstr(duet_error_msg(), "kind 4 unknown"));
}

static void test_crc32c(void **state)
{
    unsigned char buf[4099];
    (void)state;
    assert_int_equal(duet__crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(duet__crc32c_sw(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(duet__crc32c(0, "", 0), 0);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(i * 131 + 7);
    /* Any split and any alignment give the same value on both paths. */
    for (size_t off = 0; off < 9; off++)
        for (size_t cut = 0; cut < 40; cut += 3) {
            size_t n = sizeof(buf) - off;
            uint32_t whole = duet__crc32c_sw(0, buf + off, n);
            uint32_t parts =
                duet__crc32c(duet__crc32c(0, buf + off, cut), buf + off + cut, n - cut);
            assert_int_equal(whole, parts);
        }
}

static void test_map(void **state)
{
    duet__map_t m;
    uint64_t keys[3000];
    (void)state;
    duet__map_init(&m);
    srand(3);
    for (int i = 0; i < 3000; i++) {
        keys[i] = ((uint64_t)rand() << 32) ^ (uint64_t)rand() ^ (uint64_t)i;
        assert_int_equal(duet__map_put(&m, keys[i], &keys[i]), DUET_OK);
    }
    assert_int_equal(duet__map_put(&m, keys[5], &keys[5]), DUET_ERR_INVALID);
    for (int i = 0; i < 3000; i += 2)
        assert_ptr_equal(duet__map_del(&m, keys[i]), &keys[i]);
    for (int i = 0; i < 3000; i++)
        assert_ptr_equal(duet__map_get(&m, keys[i]), i % 2 ? &keys[i] : NULL);
    assert_int_equal(m.n, 1500);
    size_t it = 0, seen = 0;
    void *v;
    while (duet__map_next(&m, &it, &v))
        seen++;
    assert_int_equal(seen, 1500);
    assert_null(duet__map_del(&m, 12345));
    duet__map_cleanup(&m);
}

/* For every plan: the coalesced puts of all senders cover every destination
 * byte of the listed pages exactly once, each from the right source bytes,
 * and nothing else.  Checked by simulation on byte-tagged pools. */
static void check_plan_cover(int P, int D, int H, int page_size, const int32_t *sp,
                             const int32_t *dp, int n)
{
    duet_slice_plan_t *plan;
    duet_kv_layout_t sl = {2, 24, page_size, 0, 2, 4}, dl = sl;
    int h0;
    assert_int_equal(duet_slice_plan_create(P, D, H, &plan), DUET_OK);
    duet_kv_heads_owned(H, P, 0, &h0, &sl.n_kv_heads);
    duet_kv_heads_owned(H, D, 0, &h0, &dl.n_kv_heads);
    size_t dbytes = duet_kv_total_bytes(&dl), hb = duet_kv_head_bytes(&sl);
    for (int d = 0; d < D; d++) {
        unsigned char *hits = calloc(dbytes, 1);
        uint32_t *tag = calloc(dbytes / 4, 4); /* source (rank, offset) that wrote each word */
        int dh0, dn;
        duet_kv_heads_owned(H, D, d, &dh0, &dn);
        for (int s = 0; s < P; s++) {
            const duet_slice_run_t *runs;
            int nr = duet_slice_plan_src_runs(plan, s, &runs), k0 = 0, k1;
            while (k0 < nr && runs[k0].dst_rank != d)
                k0++;
            for (k1 = k0; k1 < nr && runs[k1].dst_rank == d; k1++)
                ;
            uint64_t puts = 0;
            for (int l = 0; l < sl.n_layers; l++)
                for (int kv = 0; kv < 2; kv++)
                    for (int k = k0; k < k1; k++)
                        for (int i = 0; i < n;) {
                            duet__seg_t seg;
                            duet__seg_at(&sl, &dl, &runs[k], l, kv, sp, dp, n, i, &seg);
                            for (size_t b = 0; b < seg.len; b++)
                                hits[seg.dst_off + b]++;
                            for (size_t w = 0; w < seg.len / 4; w++)
                                tag[seg.dst_off / 4 + w] =
                                    ((uint32_t)s << 24) | (uint32_t)(seg.src_off / 4 + w);
                            i += seg.n_pages;
                            puts++;
                        }
            assert_true(puts == duet__seg_count(&sl, &dl, runs + k0, k1 - k0, sp, dp, n));
        }
        /* Expected: each listed page i, each local head h of d, all layers. */
        for (int l = 0; l < dl.n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int pg = 0; pg < dl.n_pages; pg++) {
                    int idx = -1;
                    for (int i = 0; i < n; i++)
                        if (dp[i] == pg)
                            idx = i;
                    for (int h = 0; h < dl.n_kv_heads; h++) {
                        size_t off = duet_kv_offset(&dl, l, kv, pg, h);
                        const duet_slice_run_t *runs;
                        int nr = duet_slice_plan_dst_runs(plan, d, &runs), src = -1, sh = -1;
                        for (int k = 0; k < nr; k++)
                            if (h >= runs[k].dst_head && h < runs[k].dst_head + runs[k].n_heads) {
                                src = runs[k].src_rank;
                                sh = runs[k].src_head + h - runs[k].dst_head;
                            }
                        for (size_t b = 0; b < hb; b++) {
                            if (idx < 0) {
                                assert_int_equal(hits[off + b], 0);
                                continue;
                            }
                            assert_int_equal(hits[off + b], 1);
                            if (b % 4 == 0) {
                                size_t so = duet_kv_offset(&sl, l, kv, sp[idx], sh) + b;
                                assert_int_equal(tag[(off + b) / 4],
                                                 ((uint32_t)src << 24) | (uint32_t)(so / 4));
                            }
                        }
                    }
                }
        free(hits);
        free(tag);
    }
    duet_slice_plan_destroy(plan);
}

static void test_segs_cover(void **state)
{
    static const int plans[][3] = {{1, 1, 4}, {2, 1, 4}, {1, 2, 4}, {2, 4, 2}, {4, 2, 2},
                                   {3, 2, 6}, {8, 1, 2}, {1, 8, 2}, {2, 2, 4}, {4, 4, 8}};
    const int32_t sp[] = {3, 4, 5, 9, 10, 0, 1, 2, 20, 21, 22, 23};
    const int32_t dp[] = {7, 8, 9, 10, 2, 3, 11, 12, 13, 0, 1, 5};
    const int32_t seq[] = {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    (void)state;
    for (size_t k = 0; k < sizeof(plans) / sizeof(plans[0]); k++)
        for (int ps = 1; ps <= 4; ps += 3) {
            check_plan_cover(plans[k][0], plans[k][1], plans[k][2], ps, sp, dp, 12);
            check_plan_cover(plans[k][0], plans[k][1], plans[k][2], ps, seq, seq, 12);
        }
}

static void test_segs_coalesce(void **state)
{
    /* Full head coverage on both sides and consecutive pages: one put per
     * (layer, K|V) plane. */
    duet_kv_layout_t l = {4, 64, 16, 8, 128, 2};
    duet_slice_run_t all = {0, 0, 0, 0, 8}, half = {0, 0, 4, 0, 4};
    duet_kv_layout_t half_l = l;
    int32_t seq[32], gap[32];
    (void)state;
    half_l.n_kv_heads = 4;
    for (int i = 0; i < 32; i++) {
        seq[i] = i;
        gap[i] = i < 16 ? i : i + 1;
    }
    assert_true(duet__seg_count(&l, &l, &all, 1, seq, seq, 32) == 4 * 2);
    assert_true(duet__seg_count(&l, &l, &all, 1, seq, gap, 32) == 4 * 2 * 2);
    /* Half the source heads into all of a decode rank's: one put per page. */
    assert_true(duet__seg_count(&l, &half_l, &half, 1, seq, seq, 32) == 4 * 2 * 32);
    assert_true(duet__seg_bytes(&l, &all, 1, 32) == 4ull * 2 * 32 * 8 * 16 * 128 * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_desc_roundtrip),
        cmocka_unit_test(test_desc_hostile),
        cmocka_unit_test(test_desc_messages),
        cmocka_unit_test(test_desc_mismatch),
        cmocka_unit_test(test_msg),
        cmocka_unit_test(test_msg_progress),
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_map),
        cmocka_unit_test(test_segs_cover),
        cmocka_unit_test(test_segs_coalesce),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
