/* NCCL comm backend (engine/comm.h) for the cuda backend's TP ranks.
 * Built only with DUET_HAVE_CUDA; the declarations are always visible.
 *
 * One communicator per daemon TP group: the group takes one
 * ncclGetUniqueId at creation; each rank thread then creates its comm
 * after its cuda backend rank exists (device current), with
 * ncclCommInitRankConfig in non-blocking mode.  Collectives are enqueued on
 * the rank's compute stream (so they order with the ops and can be
 * recorded into the decode graph); broadcast of a host buffer is staged
 * through device memory.
 *
 * Deadlines (DESIGN §3 rule 7): nothing here blocks on a peer without one.
 * Init and every enqueue poll ncclCommGetAsyncError until done, and while
 * the rank's thread waits for its stream (ops->sync, downloads) the backend
 * calls this comm's watch: after timeout_ms without completion, on an NCCL
 * error, or once another rank aborted the group, the comm calls
 * ncclCommAbort (which ends kernels stuck waiting for a peer) and the wait
 * returns DUET_ERR_TIMEOUT / DUET_ERR_PEER naming the rank and the last
 * collective.  Aborting the group makes every rank's next poll abort too. */
#ifndef DUET_ENGINE_COMM_NCCL_H
#define DUET_ENGINE_COMM_NCCL_H

#include "common/status.h"
#include "engine/backend.h"
#include "engine/comm.h"

typedef struct duet_comm_nccl_group duet_comm_nccl_group_t;

/* ncclGetUniqueId for a group of size ranks; timeout_ms bounds init and
 * every collective.  Sets NCCL_RUNTIME_CONNECT=0 in the environment unless
 * the user set it (connections at init, none while a graph is recorded). */
duet_status_t duet_comm_nccl_group_create(int size, int timeout_ms, duet_comm_nccl_group_t **grp_p);
/* After every rank's comm was destroyed.  NULL is fine. */
void duet_comm_nccl_group_destroy(duet_comm_nccl_group_t *grp);
/* Make every rank's pending and future waits fail with st (a rank failed
 * before or during init).  Thread-safe. */
void duet_comm_nccl_group_abort(duet_comm_nccl_group_t *grp, duet_status_t st, const char *why);

/* On the rank's thread, after br (a cuda backend rank) was created: joins
 * the group as rank (blocks until every rank joined, the deadline passes or
 * the group is aborted).  Destroy the comm (ops->destroy) before br. */
duet_status_t duet_comm_nccl_create(duet_comm_nccl_group_t *grp, int rank, duet_backend_rank_t *br,
                                    duet_comm_t **comm_p);

#endif
