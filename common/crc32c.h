/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * transferred KV bytes (transfer/xfer.h "Checksums").  Byte-serial on the
 * host: the SSE4.2 crc32 instruction when the CPU has it, a slicing-by-8
 * table otherwise; both give the same value.  The shift/combine arithmetic
 * and the GPU's parallel form share common/crc32c_math.h.  Pure and
 * thread-safe. */
#ifndef DUET_COMMON_CRC32C_H
#define DUET_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#include "common/crc32c_math.h"

/* Extend crc (0 to start) over n bytes.  crc32c("123456789") == 0xE3069283. */
uint32_t duet_crc32c(uint32_t crc, const void *buf, size_t n);

/* The portable table version, for tests that compare the two paths. */
uint32_t duet_crc32c_sw(uint32_t crc, const void *buf, size_t n);

/* A byte range [off, off + len) of a buffer (a KV pool): the CRC of a list
 * of ranges is that of their bytes concatenated in list order. */
typedef struct {
    uint64_t off, len;
} duet_crc32c_range_t;

/* The CRC of ranges[0..n) of the host buffer at base. */
uint32_t duet_crc32c_ranges(const void *base, const duet_crc32c_range_t *ranges, int n);

/* A piece of the parallel CRC (common/crc32c_math.h): bytes [off, off +
 * len) followed by `after` more bytes of the stream. */
typedef struct {
    uint64_t off, len, after;
} duet_crc32c_piece_t;

/* Cut ranges[0..n) into pieces of at most piece_max bytes (a multiple of
 * 16; touching ranges are merged first, empty ones dropped), in stream
 * order, into out[0..cap).  Returns the number of pieces the list needs
 * (write more room and call again when it exceeds cap); *total_p gets the
 * stream's length. */
size_t duet_crc32c_plan(const duet_crc32c_range_t *ranges, int n, uint64_t piece_max,
                        duet_crc32c_piece_t *out, size_t cap, uint64_t *total_p);

#endif
