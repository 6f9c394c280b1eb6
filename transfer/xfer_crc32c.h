/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * transferred KV bytes.  Uses the SSE4.2 crc32 instruction when the CPU has
 * it, a slicing-by-8 table otherwise; both give the same value.  Pure and
 * thread-safe. */
#ifndef DUET_TRANSFER_XFER_CRC32C_H
#define DUET_TRANSFER_XFER_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over n bytes.  crc32c("123456789") == 0xE3069283. */
uint32_t duet__crc32c(uint32_t crc, const void *buf, size_t n);

/* The portable table version, for tests that compare the two paths. */
uint32_t duet__crc32c_sw(uint32_t crc, const void *buf, size_t n);

#endif
