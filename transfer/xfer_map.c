#include "transfer/xfer_map.h"

#include "common/alloc.h"

static size_t duet__map_hash(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

void duet__map_init(duet__map_t *m)
{
    m->slots = NULL;
    m->cap = 0;
    m->n = 0;
}

void duet__map_cleanup(duet__map_t *m)
{
    duet_free(m->slots);
    duet__map_init(m);
}

void *duet__map_get(const duet__map_t *m, uint64_t key)
{
    if (m->cap == 0)
        return NULL;
    for (size_t i = duet__map_hash(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].val == NULL)
            return NULL;
        if (m->slots[i].key == key)
            return m->slots[i].val;
    }
}

static void duet__map_insert(duet__map_slot_t *slots, size_t cap, uint64_t key, void *val)
{
    size_t i = duet__map_hash(key, cap);
    while (slots[i].val != NULL)
        i = (i + 1) & (cap - 1);
    slots[i].key = key;
    slots[i].val = val;
}

duet_status_t duet__map_put(duet__map_t *m, uint64_t key, void *val)
{
    if (duet__map_get(m, key) != NULL)
        return DUET_ERR_INVALID;
    if ((m->n + 1) * 4 > m->cap * 3) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        duet__map_slot_t *slots = DUET_NEW_ARRAY(duet__map_slot_t, cap);
        if (slots == NULL)
            return DUET_ERR_NO_MEMORY;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].val != NULL)
                duet__map_insert(slots, cap, m->slots[i].key, m->slots[i].val);
        duet_free(m->slots);
        m->slots = slots;
        m->cap = cap;
    }
    duet__map_insert(m->slots, m->cap, key, val);
    m->n++;
    return DUET_OK;
}

void *duet__map_del(duet__map_t *m, uint64_t key)
{
    size_t i, j, mask = m->cap - 1;
    void *val;
    if (m->cap == 0)
        return NULL;
    for (i = duet__map_hash(key, m->cap);; i = (i + 1) & mask) {
        if (m->slots[i].val == NULL)
            return NULL;
        if (m->slots[i].key == key)
            break;
    }
    val = m->slots[i].val;
    /* Backward shift: pull later members of the probe chain into the hole
     * unless their home slot lies cyclically in (hole, j]. */
    for (j = (i + 1) & mask; m->slots[j].val != NULL; j = (j + 1) & mask) {
        size_t home = duet__map_hash(m->slots[j].key, m->cap);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].val = NULL;
    m->n--;
    return val;
}

int duet__map_next(const duet__map_t *m, size_t *iter, void **val_p)
{
    for (; *iter < m->cap; (*iter)++) {
        if (m->slots[*iter].val != NULL) {
            *val_p = m->slots[(*iter)++].val;
            return 1;
        }
    }
    return 0;
}
