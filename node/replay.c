/* Grants taken once (node/replay.h). */
#include "node/replay.h"

#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "node/grant.h"

typedef struct {
    uint64_t id_hash; /* of the decode instance id */
    uint64_t transfer_id;
    uint64_t until_ms; /* 0: never used */
} duet__replay_entry_t;

struct duet_node_replay {
    pthread_mutex_t lock;
    duet__replay_entry_t *e; /* [cap] */
    size_t cap;              /* a power of two */
    size_t used;             /* slots ever filled since the last rebuild */
};

static uint64_t duet__replay_hash_id(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s != '\0'; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static size_t duet__replay_slot(const duet_node_replay_t *t, uint64_t id_hash, uint64_t transfer)
{
    uint64_t x = id_hash ^ (transfer * 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (size_t)x & (t->cap - 1);
}

duet_node_replay_t *duet_node_replay_create(size_t capacity)
{
    duet_node_replay_t *t = DUET_NEW(duet_node_replay_t);
    size_t cap = 64;

    if (t == NULL)
        return NULL;
    while (cap < capacity && cap < ((size_t)1 << 30))
        cap <<= 1;
    t->e = DUET_NEW_ARRAY(duet__replay_entry_t, cap);
    if (t->e == NULL) {
        duet_free(t);
        return NULL;
    }
    t->cap = cap;
    pthread_mutex_init(&t->lock, NULL);
    return t;
}

void duet_node_replay_destroy(duet_node_replay_t *t)
{
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->lock);
    duet_free(t->e);
    duet_free(t);
}

/* lock held: drop the expired entries (probe chains shorten again) */
static void duet__replay_rebuild(duet_node_replay_t *t, uint64_t now_ms)
{
    size_t live = 0;
    /* compact the live entries to the front, then re-insert them */
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i].until_ms > now_ms)
            t->e[live++] = t->e[i];
    duet__replay_entry_t *tmp = DUET_NEW_ARRAY(duet__replay_entry_t, live > 0 ? live : 1);
    if (tmp == NULL)
        return; /* keep the table as it is: still correct, only slower */
    memcpy(tmp, t->e, live * sizeof(*tmp));
    memset(t->e, 0, t->cap * sizeof(*t->e));
    for (size_t k = 0; k < live; k++) {
        size_t i = duet__replay_slot(t, tmp[k].id_hash, tmp[k].transfer_id);
        while (t->e[i].until_ms != 0)
            i = (i + 1) & (t->cap - 1);
        t->e[i] = tmp[k];
    }
    t->used = live;
    duet_free(tmp);
}

duet_status_t duet_node_replay_take(duet_node_replay_t *t, const char *decode_id,
                                    uint64_t transfer_id, uint64_t expiry_ms, uint64_t now_ms)
{
    uint64_t h = duet__replay_hash_id(decode_id != NULL ? decode_id : "");
    uint64_t until = expiry_ms + DUET_NODE_GRANT_SKEW_MS;
    duet_status_t st = DUET_OK;

    if (until <= now_ms)
        until = now_ms + 1; /* the grant check refuses it anyway */
    pthread_mutex_lock(&t->lock);
    if (t->used >= t->cap / 2 + t->cap / 4)
        duet__replay_rebuild(t, now_ms);
    size_t i = duet__replay_slot(t, h, transfer_id), free_slot = t->cap;
    for (;;) {
        duet__replay_entry_t *e = &t->e[i];
        if (e->until_ms == 0)
            break;
        if (e->id_hash == h && e->transfer_id == transfer_id) {
            if (e->until_ms > now_ms) {
                st = duet_error(DUET_ERR_INVALID,
                                "page grant for transfer %llu already used (a replay): a grant "
                                "is served once",
                                (unsigned long long)transfer_id);
                goto out;
            }
            free_slot = i; /* ours, expired: reuse it */
            break;
        }
        if (e->until_ms <= now_ms && free_slot == t->cap)
            free_slot = i;
        i = (i + 1) & (t->cap - 1);
    }
    if (free_slot == t->cap) {
        if (t->used >= t->cap / 2 + t->cap / 4) {
            st = duet_error(DUET_ERR_EXHAUSTED, "too many page grants in flight (%zu): retry later",
                            t->used);
            goto out;
        }
        free_slot = i;
        t->used++;
    }
    t->e[free_slot] = (duet__replay_entry_t){h, transfer_id, until};
out:
    pthread_mutex_unlock(&t->lock);
    return st;
}

size_t duet_node_replay_live(duet_node_replay_t *t, uint64_t now_ms)
{
    size_t n = 0;
    if (t == NULL)
        return 0;
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->cap; i++)
        n += t->e[i].until_ms > now_ms;
    pthread_mutex_unlock(&t->lock);
    return n;
}
