/* A u64 -> pointer hash map (open addressing, linear probing, backward-shift
 * deletion) for the per-rank request tables.  Values are never NULL.  Not
 * thread-safe: each map belongs to one rank's progress thread. */
#ifndef DUET_TRANSFER_XFER_MAP_H
#define DUET_TRANSFER_XFER_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct {
    uint64_t key;
    void *val; /* NULL: empty slot */
} duet__map_slot_t;

typedef struct {
    duet__map_slot_t *slots;
    size_t cap; /* power of two, or 0 before the first insert */
    size_t n;
} duet__map_t;

void duet__map_init(duet__map_t *m);
void duet__map_cleanup(duet__map_t *m);
void *duet__map_get(const duet__map_t *m, uint64_t key);
/* DUET_ERR_INVALID if the key is present, DUET_ERR_NO_MEMORY when growing fails. */
duet_status_t duet__map_put(duet__map_t *m, uint64_t key, void *val);
/* Returns the removed value or NULL. */
void *duet__map_del(duet__map_t *m, uint64_t key);

/* Iterate: for (size_t i = 0; duet__map_next(m, &i, &val);) -- do not
 * insert while iterating; deleting the current entry requires restarting. */
int duet__map_next(const duet__map_t *m, size_t *iter, void **val_p);

#endif
