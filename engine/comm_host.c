/* Host comm backend: TP rank threads of one process.
 *
 * Collectives publish each rank's buffer pointer, meet at a barrier, read
 * each other's buffers, and meet again.  All-reduce splits the vector into
 * size chunks; rank r sums chunk r over ranks 0..size-1 in that fixed order
 * into a shared scratch, so every rank ends with bitwise-identical sums.
 * Every rank also publishes (op, size); a mismatch is reported instead of
 * computed on (DESIGN §3 rule 1).
 *
 * Fault injection (tests only, common/fault.h): comm.fail_after=N makes the last
 * rank of every group fail its collective number N+1 (counted from 1 on
 * that rank), as a rank error does: it aborts the group, so every rank's
 * collective returns DUET_ERR_INTERNAL naming the injected fault. */
#include "engine/comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/sync.h"

#define DUET_COMM_SPIN_ITERS 20000

typedef struct {
    const char *op;
    size_t size;
    const void *buf;
} duet__slot_t;

struct duet_comm_host_group {
    int size;
    int timeout_ms;
    bool spin;
    float *scratch;
    size_t scratch_bytes;
    duet__slot_t *slots;         /* [size] */
    _Atomic uint64_t *arrived;   /* [size]: generation + 1 the rank last arrived at */
    atomic_int count;
    _Atomic uint64_t gen;
    atomic_int aborted;          /* duet_status_t, 0 when healthy */
    long fault_after;            /* fault comm.fail_after, -1 when unset */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    char abort_msg[256];
};

typedef struct {
    duet_comm_t base;
    duet_comm_host_group_t *grp;
    uint64_t n_ops;
} duet__host_comm_t;

static const duet_comm_ops_t duet__host_ops;

static duet_status_t duet__aborted_error(duet__host_comm_t *c, const char *op)
{
    duet_comm_host_group_t *g = c->grp;
    char msg[256];
    pthread_mutex_lock(&g->lock);
    snprintf(msg, sizeof(msg), "%s", g->abort_msg);
    pthread_mutex_unlock(&g->lock);
    return duet_error((duet_status_t)atomic_load(&g->aborted), "comm rank %d %s: %s",
                      c->base.rank, op, msg);
}

static void duet__abort(duet_comm_host_group_t *g, duet_status_t st, const char *msg)
{
    pthread_mutex_lock(&g->lock);
    if (atomic_load(&g->aborted) == 0) {
        snprintf(g->abort_msg, sizeof(g->abort_msg), "%s", msg);
        atomic_store(&g->aborted, (int)st);
    }
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static duet_status_t duet__host_barrier(duet__host_comm_t *c, const char *op)
{
    duet_comm_host_group_t *g = c->grp;
    int rank = c->base.rank;
    uint64_t my_gen;

    if (atomic_load(&g->aborted) != 0)
        return duet__aborted_error(c, op);
    my_gen = atomic_load(&g->gen);
    atomic_store(&g->arrived[rank], my_gen + 1);
    if (atomic_fetch_add(&g->count, 1) == g->size - 1) {
        atomic_store(&g->count, 0);
        pthread_mutex_lock(&g->lock);
        atomic_store(&g->gen, my_gen + 1);
        pthread_cond_broadcast(&g->cond);
        pthread_mutex_unlock(&g->lock);
        return DUET_OK;
    }
    if (g->spin) {
        for (int i = 0; i < DUET_COMM_SPIN_ITERS; i++) {
            if (atomic_load_explicit(&g->gen, memory_order_acquire) != my_gen)
                return DUET_OK;
            __builtin_ia32_pause();
        }
    }

    int64_t deadline = duet_now_ns() + (int64_t)g->timeout_ms * DUET_NS_PER_MS;
    struct timespec ts = duet_deadline_timespec(deadline);
    pthread_mutex_lock(&g->lock);
    while (atomic_load(&g->gen) == my_gen && atomic_load(&g->aborted) == 0) {
        int rc = pthread_cond_timedwait(&g->cond, &g->lock, &ts);
        if (rc == ETIMEDOUT && atomic_load(&g->gen) == my_gen && atomic_load(&g->aborted) == 0) {
            char missing[128] = "";
            size_t n = 0;
            for (int r = 0; r < g->size; r++) {
                if (atomic_load(&g->arrived[r]) != my_gen + 1 && n < sizeof(missing) - 8)
                    n += (size_t)snprintf(missing + n, sizeof(missing) - n, "%s%d",
                                          n ? "," : "", r);
            }
            snprintf(g->abort_msg, sizeof(g->abort_msg),
                     "%s timed out after %d ms on rank %d waiting for rank(s) %s", op,
                     g->timeout_ms, rank, missing);
            atomic_store(&g->aborted, DUET_ERR_TIMEOUT);
            pthread_cond_broadcast(&g->cond);
            DUET_LOG_ERROR("comm: %s", g->abort_msg);
            break;
        }
    }
    bool passed = atomic_load(&g->gen) != my_gen;
    pthread_mutex_unlock(&g->lock);
    return passed ? DUET_OK : duet__aborted_error(c, op);
}

/* Publish (op, size, buf), meet, and check that every rank called the same
 * collective with the same size. */
static duet_status_t duet__enter(duet__host_comm_t *c, const char *op, size_t size,
                                 const void *buf)
{
    duet_comm_host_group_t *g = c->grp;
    duet_status_t st;

    g->slots[c->base.rank] = (duet__slot_t){op, size, buf};
    c->n_ops++;
    if (DUET_FAULT_INJECTION && g->fault_after >= 0 && c->base.rank == g->size - 1 &&
        c->n_ops > (uint64_t)g->fault_after) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "rank %d failed its collective %llu (fault injection: "
                 "comm.fail_after=%ld)",
                 c->base.rank, (unsigned long long)c->n_ops, g->fault_after);
        duet__abort(g, DUET_ERR_INTERNAL, msg);
        return duet__aborted_error(c, op);
    }
    st = duet__host_barrier(c, op);
    if (st != DUET_OK)
        return st;
    for (int r = 0; r < g->size; r++) {
        if (strcmp(g->slots[r].op, g->slots[0].op) != 0 || g->slots[r].size != g->slots[0].size) {
            char msg[256];
            snprintf(msg, sizeof(msg),
                     "collective mismatch: rank 0 called %s(%zu), rank %d called %s(%zu)",
                     g->slots[0].op, g->slots[0].size, r, g->slots[r].op, g->slots[r].size);
            duet__abort(g, DUET_ERR_INTERNAL, msg);
            return duet__aborted_error(c, op);
        }
    }
    return DUET_OK;
}

static duet_status_t duet__host_all_reduce_sum(duet_comm_t *base, void *buf, size_t count,
                                               duet_dtype_t dtype)
{
    duet__host_comm_t *c = (duet__host_comm_t *)base;
    duet_comm_host_group_t *g = c->grp;
    duet_status_t st;
    long begin, end;

    if (dtype != DUET_DTYPE_F32)
        return duet_error(DUET_ERR_UNSUPPORTED, "comm host: all_reduce of %s",
                          duet_dtype_name(dtype));
    if (count * sizeof(float) > g->scratch_bytes)
        return duet_error(DUET_ERR_INVALID, "comm host: all_reduce of %zu floats exceeds %zu bytes",
                          count, g->scratch_bytes);
    st = duet__enter(c, "all_reduce", count, buf);
    if (st != DUET_OK)
        return st;
    begin = (long)(count * (size_t)base->rank / (size_t)g->size);
    end = (long)(count * (size_t)(base->rank + 1) / (size_t)g->size);
    {
        const float *s0 = g->slots[0].buf;
        for (long i = begin; i < end; i++)
            g->scratch[i] = s0[i];
        for (int r = 1; r < g->size; r++) {
            const float *sr = g->slots[r].buf;
            for (long i = begin; i < end; i++)
                g->scratch[i] += sr[i];
        }
    }
    st = duet__host_barrier(c, "all_reduce");
    if (st != DUET_OK)
        return st;
    memcpy(buf, g->scratch, count * sizeof(float));
    return DUET_OK;
}

static duet_status_t duet__host_all_gather(duet_comm_t *base, const void *send, void *recv,
                                           size_t bytes)
{
    duet__host_comm_t *c = (duet__host_comm_t *)base;
    duet_comm_host_group_t *g = c->grp;
    duet_status_t st = duet__enter(c, "all_gather", bytes, send);
    if (st != DUET_OK)
        return st;
    for (int r = 0; r < g->size; r++)
        memcpy((char *)recv + (size_t)r * bytes, g->slots[r].buf, bytes);
    return duet__host_barrier(c, "all_gather");
}

static duet_status_t duet__host_broadcast(duet_comm_t *base, void *buf, size_t bytes, int root)
{
    duet__host_comm_t *c = (duet__host_comm_t *)base;
    duet_comm_host_group_t *g = c->grp;
    duet_status_t st = duet__enter(c, "broadcast", bytes, buf);
    if (st != DUET_OK)
        return st;
    if (base->rank != root)
        memcpy(buf, g->slots[root].buf, bytes);
    return duet__host_barrier(c, "broadcast");
}

static duet_status_t duet__barrier_op(duet_comm_t *base)
{
    duet__host_comm_t *c = (duet__host_comm_t *)base;
    /* the second meeting keeps a fast rank from republishing its slot
     * while a slow one still checks this one */
    duet_status_t st = duet__enter(c, "barrier", 0, NULL);
    return st != DUET_OK ? st : duet__host_barrier(c, "barrier");
}

static void duet__host_abort_op(duet_comm_t *base, duet_status_t st, const char *why)
{
    duet__host_comm_t *c = (duet__host_comm_t *)base;
    char msg[256];
    snprintf(msg, sizeof(msg), "aborted by rank %d: %s", base->rank, why);
    duet__abort(c->grp, st, msg);
}

static void duet__host_destroy(duet_comm_t *base)
{
    duet_free(base);
}

static const duet_comm_ops_t duet__host_ops = {
    .name = "host",
    .all_reduce_sum = duet__host_all_reduce_sum,
    .all_gather = duet__host_all_gather,
    .broadcast = duet__host_broadcast,
    .barrier = duet__barrier_op,
    .abort = duet__host_abort_op,
    .destroy = duet__host_destroy,
};

duet_status_t duet_comm_host_group_create(int size, size_t scratch_bytes, int timeout_ms,
                                          duet_comm_host_group_t **grp_p)
{
    duet_comm_host_group_t *g;

    if (size < 1 || timeout_ms <= 0)
        return duet_error(DUET_ERR_INVALID, "comm host: size %d timeout %d ms", size, timeout_ms);
    g = DUET_NEW(duet_comm_host_group_t);
    if (g == NULL)
        goto err;
    g->slots = DUET_NEW_ARRAY(duet__slot_t, (size_t)size);
    if (g->slots == NULL)
        goto err_free_group;
    g->arrived = duet_calloc((size_t)size, sizeof(*g->arrived));
    if (g->arrived == NULL)
        goto err_free_slots;
    g->scratch = duet_aligned_alloc(64, scratch_bytes ? scratch_bytes : 64);
    if (g->scratch == NULL)
        goto err_free_arrived;
    if (duet_cond_init_monotonic(&g->cond) != 0)
        goto err_free_scratch;
    pthread_mutex_init(&g->lock, NULL);
    g->size = size;
    g->timeout_ms = timeout_ms;
    g->scratch_bytes = scratch_bytes;
    g->spin = false;
    g->fault_after = duet_fault_value("comm.fail_after", -1);
    if (g->fault_after >= 0)
        DUET_LOG_WARN("comm: fault injection: rank %d fails its collective %ld",
                      size - 1, g->fault_after + 1);
    *grp_p = g;
    return DUET_OK;

err_free_scratch:
    duet_aligned_free(g->scratch);
err_free_arrived:
    duet_free((void *)g->arrived);
err_free_slots:
    duet_free(g->slots);
err_free_group:
    duet_free(g);
err:
    return duet_error(DUET_ERR_NO_MEMORY, "comm host: no memory for a group of %d", size);
}

void duet_comm_host_group_set_spin(duet_comm_host_group_t *grp, bool spin)
{
    grp->spin = spin;
}

void duet_comm_host_group_destroy(duet_comm_host_group_t *grp)
{
    if (grp == NULL)
        return;
    pthread_cond_destroy(&grp->cond);
    pthread_mutex_destroy(&grp->lock);
    duet_aligned_free(grp->scratch);
    duet_free((void *)grp->arrived);
    duet_free(grp->slots);
    duet_free(grp);
}

duet_status_t duet_comm_host_create(duet_comm_host_group_t *grp, int rank, duet_comm_t **comm_p)
{
    duet__host_comm_t *c;
    if (rank < 0 || rank >= grp->size)
        return duet_error(DUET_ERR_INVALID, "comm host: rank %d of %d", rank, grp->size);
    c = DUET_NEW(duet__host_comm_t);
    if (c == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "comm host: no memory");
    c->base.ops = &duet__host_ops;
    c->base.rank = rank;
    c->base.size = grp->size;
    c->grp = grp;
    *comm_p = &c->base;
    return DUET_OK;
}
