/* The cuda backend's kv_crc (kv_crc.cu + kv_crc_host.c): a KV transfer's
 * CRC32C computed on the GPU, which must equal the host's byte-serial CRC
 * (common/crc32c.h) of the same bytes -- a sender may compute one way and
 * the receiver the other.  Every check prints a PASS or FAIL line.
 *  - a 1 GiB pool of random bytes (Llama-3-8B-shaped, 520 pages), mirrored
 *    on the host: single ranges of every head/tail alignment from 0 bytes
 *    to 150 MiB, at the pool's end too; random lists of up to 2000 ranges
 *    (tiny, empty, touching, unaligned); the checksum order of an
 *    8192-token request's slice (layer, K|V, page, run) over scattered and
 *    consecutive pages; after a device byte changes, the CRC changes with
 *    it (nothing cached);
 *  - a timing report (not an assertion): one 256 MiB range and the
 *    8192-token request's 1 GiB slice list, GB/s of the whole call
 *    (planning, upload, kernel, 4-byte copy back), next to the host CRC. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "engine/backend.h"

#ifdef DUET_HAVE_CUDA
#include <cuda_runtime.h>

#include "common/clock.h"
#include "tests/gpu/cuda_test_util.h"

#define OPS duet_backend_cuda

static int failures;

static void report(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s kv_crc: ", ok ? "PASS" : "FAIL");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    failures += !ok;
}

typedef struct {
    duet_backend_rank_t *r;
    duet_kv_layout_t kv;
    void *pool;          /* device */
    unsigned char *host; /* the same bytes */
    size_t bytes;
} rank_t;

static uint64_t rng = 0x2545F4914F6CDD1DULL;

static uint64_t rnd(uint64_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return n ? rng % n : rng;
}

static const duet_kv_layout_t kv8b = {.n_layers = 32,
                                      .n_pages = 520,
                                      .page_size = 16,
                                      .n_kv_heads = 8,
                                      .head_dim = 128,
                                      .elem_size = 2};

static void rank_open(rank_t *k)
{
    duet_backend_rank_opts_t o = {.rank = 0, .tp = 1, .threads = 1, .device = 0, .kv_layout = kv8b};
    memset(k, 0, sizeof(*k));
    k->kv = kv8b;
    k->bytes = duet_kv_total_bytes(&kv8b);
    assert_int_equal(OPS.rank_create(&o, &k->r), DUET_OK);
    k->pool = OPS.alloc(k->r, k->bytes);
    assert_non_null(k->pool);
    OPS.kv_attach(k->r, k->pool);
    k->host = duet_aligned_alloc(4096, k->bytes);
    assert_non_null(k->host);
    for (size_t i = 0; i < k->bytes; i += 8) {
        uint64_t w = rnd(0);
        memcpy(k->host + i, &w, 8);
    }
    assert_int_equal(cudaMemcpy(k->pool, k->host, k->bytes, cudaMemcpyHostToDevice), cudaSuccess);
}

static void rank_close(rank_t *k)
{
    OPS.free(k->r, k->pool);
    OPS.rank_destroy(k->r);
    duet_aligned_free(k->host);
}

/* GPU vs host over one list; true when equal. */
static bool same(rank_t *k, const duet_crc32c_range_t *r, int n, const char *what)
{
    uint32_t gpu = 0xdeadbeefu, host = duet_crc32c_ranges(k->host, r, n);
    duet_status_t st = OPS.kv_crc(k->r, r, n, &gpu);
    if (st != DUET_OK || gpu != host) {
        report(false, "%s: gpu %08x (%s), host %08x", what, gpu,
               st != DUET_OK ? duet_error_msg() : "ok", host);
        return false;
    }
    return true;
}

/* The checksum order of one pair's per-page slice (transfer/xfer_segs.h):
 * layer, K|V, page, runs (two runs of 4 heads: a TP 2 -> 2 pair sends all
 * 8 heads as two runs to one receiver in this shape). */
static int slice_list(const duet_kv_layout_t *l, const int32_t *pages, int np,
                      duet_crc32c_range_t *out)
{
    uint64_t hb = duet_kv_head_bytes(l);
    int n = 0;
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < np; i++)
                for (int run = 0; run < 2; run++)
                    out[n++] = (duet_crc32c_range_t){
                        duet_kv_offset(l, layer, kv, pages[i], 4 * run), 4 * hb};
    return n;
}

static void test_against_host(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    failures = 0;
    rank_t k;
    rank_open(&k);
    static const uint64_t lens[] = {0,
                                    1,
                                    2,
                                    3,
                                    15,
                                    16,
                                    17,
                                    255,
                                    4095,
                                    4096,
                                    4097,
                                    65537,
                                    1u << 20,
                                    (1u << 20) + 3,
                                    (100u << 20) + 7,
                                    150u << 20};
    static const uint64_t offs[] = {0, 1, 7, 8, 15, 4099, 12345};
    int bad = 0, cases = 0;
    char what[128];
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        for (size_t j = 0; j < sizeof(offs) / sizeof(offs[0]); j++) {
            duet_crc32c_range_t r = {offs[j] * 997 % (k.bytes - lens[i] - 16), lens[i]};
            snprintf(what, sizeof(what), "one range of %llu bytes at %llu",
                     (unsigned long long)r.len, (unsigned long long)r.off);
            bad += !same(&k, &r, 1, what);
            cases++;
        }
    /* at the very end of the pool */
    for (uint64_t len = 1; len < 40; len += 3) {
        duet_crc32c_range_t r = {k.bytes - len, len};
        bad += !same(&k, &r, 1, "a range ending at the pool's end");
        cases++;
    }
    report(bad == 0, "%d single ranges (0 B .. 150 MiB, every alignment) equal the host CRC",
           cases);

    /* random lists */
    duet_crc32c_range_t *list = duet_malloc(70000 * sizeof(*list));
    assert_non_null(list);
    bad = 0;
    for (int it = 0; it < 60; it++) {
        int n = 1 + (int)rnd(it % 3 == 0 ? 2000 : 40);
        for (int i = 0; i < n; i++) {
            uint64_t len = rnd(4) == 0 ? rnd(20) : rnd(it % 2 ? 100000 : 3000);
            list[i].off = i > 0 && rnd(4) == 0 ? list[i - 1].off + list[i - 1].len
                                               : rnd(k.bytes - 2 * 100000);
            list[i].len = len;
        }
        snprintf(what, sizeof(what), "random list %d (%d ranges)", it, n);
        bad += !same(&k, list, n, what);
    }
    report(bad == 0, "60 random lists (1..2000 ranges; tiny, empty, touching) equal the host CRC");

    /* an 8192-token request's slice in checksum order */
    int32_t pages[512];
    for (int i = 0; i < 512; i++)
        pages[i] = (int32_t)((i * 263) % 512); /* scattered */
    int n = slice_list(&k.kv, pages, 512, list);
    report(same(&k, list, n, "scattered pages"),
           "an 8192-token slice over scattered pages (%d ranges of 64 KiB, 1 GiB)", n);
    for (int i = 0; i < 512; i++)
        pages[i] = i + 3;
    n = slice_list(&k.kv, pages, 512, list);
    report(same(&k, list, n, "consecutive pages"),
           "an 8192-token slice over consecutive pages (merged into whole planes)");

    /* the device bytes change, so does the CRC (nothing cached) */
    uint32_t before = 0, after = 0;
    assert_int_equal(OPS.kv_crc(k.r, list, n, &before), DUET_OK);
    unsigned char flip = (unsigned char)(k.host[list[n / 2].off + 77] ^ 0x20);
    k.host[list[n / 2].off + 77] = flip;
    assert_int_equal(
        cudaMemcpy((char *)k.pool + list[n / 2].off + 77, &flip, 1, cudaMemcpyHostToDevice),
        cudaSuccess);
    assert_int_equal(OPS.kv_crc(k.r, list, n, &after), DUET_OK);
    report(before != after && same(&k, list, n, "after a flip"),
           "one flipped device byte changes the CRC (%08x -> %08x), equal to the host's", before,
           after);
    duet_free(list);
    rank_close(&k);
    assert_int_equal(failures, 0);
}

static double median3(double a, double b, double c)
{
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

/* GB/s of the whole call, median of 3 after a warm-up */
static double rate(rank_t *k, const duet_crc32c_range_t *r, int n, uint64_t bytes, uint32_t *crc)
{
    double t[3];
    assert_int_equal(OPS.kv_crc(k->r, r, n, crc), DUET_OK);
    for (int i = 0; i < 3; i++) {
        int64_t t0 = duet_now_ns();
        assert_int_equal(OPS.kv_crc(k->r, r, n, crc), DUET_OK);
        t[i] = (double)(duet_now_ns() - t0) / 1e9;
    }
    return (double)bytes / median3(t[0], t[1], t[2]) / 1e9;
}

static void test_timing_report(void **state)
{
    (void)state;
    DUET_TEST_NEED_GPU();
    failures = 0;
    rank_t k;
    rank_open(&k);
    struct cudaDeviceProp p;
    assert_int_equal(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    duet_crc32c_range_t one = {4096, 256u << 20};
    uint32_t crc = 0;
    double big = rate(&k, &one, 1, one.len, &crc);
    report(crc == duet_crc32c_ranges(k.host, &one, 1), "256 MiB timed range: CRC right");

    duet_crc32c_range_t *list = duet_malloc(70000 * sizeof(*list));
    int32_t pages[512];
    assert_non_null(list);
    for (int i = 0; i < 512; i++)
        pages[i] = (int32_t)((i * 263) % 512);
    int n = slice_list(&k.kv, pages, 512, list);
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += list[i].len;
    double slice = rate(&k, list, n, bytes, &crc);
    report(crc == duet_crc32c_ranges(k.host, list, n), "8192-token timed slice: CRC right");

    int64_t t0 = duet_now_ns();
    uint32_t h = duet_crc32c_ranges(k.host, &one, 1);
    double host = (double)one.len / ((double)(duet_now_ns() - t0) / 1e9) / 1e9;
    (void)h;
    fprintf(stderr,
            "INFO kv_crc on %s: %.0f GB/s for one 256 MiB range, %.0f GB/s for an 8192-token "
            "slice (%d ranges of 64 KiB over scattered pages, %.2f GB); whole calls (plan, "
            "upload, kernel, 4-byte copy back), median of 3; the host CRC (SSE4.2, one thread) "
            "%.1f GB/s\n",
            p.name, big, slice, n, (double)bytes / 1e9, host);
    duet_free(list);
    rank_close(&k);
    assert_int_equal(failures, 0);
}
#else
static void test_against_host(void **state)
{
    (void)state;
    skip();
}

static void test_timing_report(void **state)
{
    (void)state;
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_host),
        cmocka_unit_test(test_timing_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
