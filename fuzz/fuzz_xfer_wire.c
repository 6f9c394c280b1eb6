/* The transfer wire formats (transfer/xfer_wire.h): the peer descriptor a
 * daemon receives at bootstrap and the notification / acknowledgement a
 * transfer peer sends.  Both come from the network.
 *
 * Input: byte 0 picks the target; the rest is the blob.  For descriptors,
 * bit 1 of byte 0 first rewrites the length field and the CRC so that the
 * fuzzer gets past the checksum into the field checks.  Whatever decodes
 * must encode back to the same bytes and pass its own checks. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "fuzz/fuzz.h"
#include "transfer/xfer_crc32c.h"
#include "transfer/xfer_wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    return 0;
}

static void duet__fuzz_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void duet__fuzz_desc(const uint8_t *data, size_t size, bool fix)
{
    uint8_t *b = malloc(size ? size : 1);
    duet__desc_t d;
    void *blob = NULL;
    size_t len = 0;

    if (b == NULL)
        abort();
    memcpy(b, data, size);
    if (fix && size >= DUET__DESC_FIXED + 4) {
        duet__fuzz_put_u32(b + 8, (uint32_t)size);
        duet__fuzz_put_u32(b + size - 4, duet__crc32c(0, b, size - 4));
    }
    if (duet__desc_decode(b, size, &d) == DUET_OK) {
        /* decoded fields stay inside the blob and re-encode exactly */
        if ((const uint8_t *)d.rkey < b || (const uint8_t *)d.addr + d.addr_len > b + size)
            abort();
        if (duet__desc_check_info(&d.info, "fuzz") != DUET_OK)
            abort();
        if (duet__desc_encode(&d, &blob, &len) != DUET_OK)
            abort();
        if (len != size || memcmp(blob, b, size) != 0) {
            fprintf(stderr, "descriptor does not re-encode to the same bytes\n");
            abort();
        }
        duet_xfer_desc_info_t other = d.info;
        other.role = d.info.role == DUET_XFER_PREFILL ? DUET_XFER_DECODE : DUET_XFER_PREFILL;
        if (duet__desc_check_peer(&other, &d.info) != DUET_OK)
            abort();
        duet_free(blob);
    }
    free(b);
}

static void duet__fuzz_msg(const uint8_t *data, size_t size)
{
    duet__msg_t m;
    uint8_t out[DUET__MSG_BYTES];

    if (duet__msg_decode(data, size, &m) != DUET_OK)
        return;
    duet__msg_encode(&m, out);
    if (memcmp(out, data, DUET__MSG_BYTES) != 0) {
        fprintf(stderr, "notification does not re-encode to the same bytes\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    data++;
    size--;
    if (sel & 1)
        duet__fuzz_msg(data, size);
    else
        duet__fuzz_desc(data, size, (sel & 2) != 0);
    return 0;
}
