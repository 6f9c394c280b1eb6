/* Collectives among the TP ranks of one daemon (DESIGN §2, §3 rules 1, 2, 7).
 *
 * Every rank calls the same collectives in the same order with the same
 * sizes.  Each call has a deadline: a rank that does not arrive turns into
 * DUET_ERR_TIMEOUT naming the op and the missing ranks, never a hang.  A
 * rank that fails aborts the group so the others return promptly.
 *
 * Backends: `host` (rank threads of one process: shared memory, fixed
 * reduction order, bitwise-identical results on every rank) and `nccl`. */
#ifndef DUET_ENGINE_COMM_H
#define DUET_ENGINE_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/dtype.h"

typedef struct duet_comm duet_comm_t;

typedef struct duet_comm_ops {
    const char *name;
    /* buf[count] (backend memory of dtype) = sum over ranks */
    duet_status_t (*all_reduce_sum)(duet_comm_t *c, void *buf, size_t count, duet_dtype_t dtype);
    /* recv[size][bytes] = every rank's send[bytes], in rank order */
    duet_status_t (*all_gather)(duet_comm_t *c, const void *send, void *recv, size_t bytes);
    /* buf[bytes] on every rank = root's buf */
    duet_status_t (*broadcast)(duet_comm_t *c, void *buf, size_t bytes, int root);
    duet_status_t (*barrier)(duet_comm_t *c);
    /* Make every rank's pending and future collectives fail with st. */
    void (*abort)(duet_comm_t *c, duet_status_t st, const char *why);
    void (*destroy)(duet_comm_t *c);
} duet_comm_ops_t;

/* Backends embed this as their first member (zero-initialised). */
struct duet_comm {
    const duet_comm_ops_t *ops;
    int rank;
    int size;
    /* Collectives this rank issued to the backend (the calls below; the
     * size-1 shortcuts issue none).  Only the rank's thread touches it:
     * tests count what a forward step costs. */
    uint64_t n_issued;
};

static inline duet_status_t duet_comm_all_reduce_sum(duet_comm_t *c, void *buf, size_t count,
                                                     duet_dtype_t dtype)
{
    if (c->size == 1)
        return DUET_OK;
    c->n_issued++;
    return c->ops->all_reduce_sum(c, buf, count, dtype);
}

static inline duet_status_t duet_comm_all_gather(duet_comm_t *c, const void *send, void *recv,
                                                 size_t bytes)
{
    c->n_issued++;
    return c->ops->all_gather(c, send, recv, bytes);
}

static inline duet_status_t duet_comm_broadcast(duet_comm_t *c, void *buf, size_t bytes, int root)
{
    if (c->size == 1)
        return DUET_OK;
    c->n_issued++;
    return c->ops->broadcast(c, buf, bytes, root);
}

static inline duet_status_t duet_comm_barrier(duet_comm_t *c)
{
    if (c->size == 1)
        return DUET_OK;
    c->n_issued++;
    return c->ops->barrier(c);
}

/* Host backend.  The group is shared by the rank threads; each thread uses
 * its own duet_comm_t.  scratch_bytes bounds the largest all-reduce (in
 * bytes of float32 data).  timeout_ms applies to every collective. */
typedef struct duet_comm_host_group duet_comm_host_group_t;

duet_status_t duet_comm_host_group_create(int size, size_t scratch_bytes, int timeout_ms,
                                          duet_comm_host_group_t **grp_p);
void duet_comm_host_group_destroy(duet_comm_host_group_t *grp);
/* Allow short spinning in collectives (only when every rank thread has a
 * core of its own). Default off. */
void duet_comm_host_group_set_spin(duet_comm_host_group_t *grp, bool spin);
/* Destroy the per-rank comms (ops->destroy) before the group. */
duet_status_t duet_comm_host_create(duet_comm_host_group_t *grp, int rank, duet_comm_t **comm_p);

#endif
