/* CRC32C of transferred KV bytes: common/crc32c.h under the transfer
 * layer's names. */
#ifndef DUET_TRANSFER_XFER_CRC32C_H
#define DUET_TRANSFER_XFER_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#include "common/crc32c.h"

/* Extend crc (0 to start) over n bytes.  crc32c("123456789") == 0xE3069283. */
static inline uint32_t duet__crc32c(uint32_t crc, const void *buf, size_t n)
{
    return duet_crc32c(crc, buf, n);
}

/* The portable table version, for tests that compare the two paths. */
static inline uint32_t duet__crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
    return duet_crc32c_sw(crc, buf, n);
}

#endif
