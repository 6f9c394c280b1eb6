/* KV page contents that say where each element belongs, so a page that
 * landed in the wrong place, or a head that went to the wrong rank, names
 * itself; and scattered page lists. */
#include "testkit/testkit.h"

#include <stdlib.h>
#include <string.h>

static uint32_t duet__hash(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* The element for (layer, kv, global head, token position, dim). */
static uint32_t duet__pattern(int layer, int kv, int gh, int64_t pos, int dim)
{
    uint64_t key = ((uint64_t)layer << 52) ^ ((uint64_t)kv << 51) ^ ((uint64_t)gh << 40) ^
                   ((uint64_t)(pos & 0xffffff) << 16) ^ (uint64_t)dim;
    return duet__hash(key);
}

static void duet__store(unsigned char *p, uint32_t v, int elem)
{
    for (int b = 0; b < elem; b++)
        p[b] = (unsigned char)(v >> (8 * (b & 3)));
}

void duet_testkit_fill_page(const duet_kv_layout_t *l, unsigned char *base, int head0, int page,
                            int64_t pos0)
{
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < l->n_kv_heads; h++) {
                unsigned char *p = base + duet_kv_offset(l, layer, kv, page, h);
                for (int t = 0; t < l->page_size; t++)
                    for (int d = 0; d < l->head_dim; d++, p += l->elem_size)
                        duet__store(p, duet__pattern(layer, kv, head0 + h, pos0 + t, d),
                                    l->elem_size);
            }
}

int duet_testkit_check_page(const duet_kv_layout_t *l, const unsigned char *base, int head0,
                            int page, int64_t pos0, const char *what)
{
    unsigned char want[8];
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < l->n_kv_heads; h++) {
                const unsigned char *p = base + duet_kv_offset(l, layer, kv, page, h);
                for (int t = 0; t < l->page_size; t++)
                    for (int d = 0; d < l->head_dim; d++, p += l->elem_size) {
                        duet__store(want, duet__pattern(layer, kv, head0 + h, pos0 + t, d),
                                    l->elem_size);
                        if (memcmp(p, want, (size_t)l->elem_size) != 0) {
                            duet_testkit_fail("%s: page %d layer %d %c head %d (global %d) token "
                                              "%lld dim %d is wrong",
                                              what, page, layer, kv ? 'V' : 'K', h, head0 + h,
                                              (long long)(pos0 + t), d);
                            return -1;
                        }
                    }
            }
    return 0;
}

int duet_testkit_page_is(const duet_kv_layout_t *l, const unsigned char *base, int page,
                         unsigned char byte)
{
    size_t n = duet_kv_page_bytes(l);
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++) {
            const unsigned char *p = base + duet_kv_offset(l, layer, kv, page, 0);
            for (size_t i = 0; i < n; i++)
                if (p[i] != byte)
                    return 0;
        }
    return 1;
}

void duet_testkit_pages(int32_t *out, int n, int pool, int block, uint64_t seed, int skip)
{
    int nb = pool / block, k = 0;
    int *order = malloc(sizeof(int) * (size_t)nb);
    for (int i = 0; i < nb; i++)
        order[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(duet__hash(seed + (uint64_t)i) % (uint32_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int b = skip; b < nb && k < n; b++)
        for (int i = 0; i < block && k < n; i++)
            out[k++] = order[b] * block + i;
    free(order);
}
