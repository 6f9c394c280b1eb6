/* CSPRNG values (common/random.h) from libcrypto's DRBG. */
#include "common/random.h"

#include <limits.h>

#include <openssl/err.h>
#include <openssl/rand.h>

duet_status_t duet_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len > 0) {
        int n = len > INT_MAX ? INT_MAX : (int)len;
        if (RAND_bytes(p, n) != 1) {
            char why[128];
            ERR_error_string_n(ERR_get_error(), why, sizeof(why));
            return duet_error(DUET_ERR_IO, "RAND_bytes: %s", why);
        }
        p += n;
        len -= (size_t)n;
    }
    return DUET_OK;
}

duet_status_t duet_random_id(char out[DUET_RANDOM_ID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t b[DUET_RANDOM_ID_LEN / 2];
    duet_status_t st = duet_random_bytes(b, sizeof(b));
    if (st != DUET_OK)
        return st;
    for (size_t i = 0; i < sizeof(b); i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[DUET_RANDOM_ID_LEN] = '\0';
    return DUET_OK;
}

duet_status_t duet_random_nonzero_u64(uint64_t *out_p)
{
    uint64_t v = 0;
    while (v == 0) {
        duet_status_t st = duet_random_bytes(&v, sizeof(v));
        if (st != DUET_OK)
            return st;
    }
    *out_p = v;
    return DUET_OK;
}
