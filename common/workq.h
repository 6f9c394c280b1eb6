/* A single worker thread running queued tasks in order: where daemons do
 * blocking work (connecting transfer peers, bootstrap calls) off the gRPC
 * and progress threads.  Thread-safe. */
#ifndef DUET_COMMON_WORKQ_H
#define DUET_COMMON_WORKQ_H

#include "common/status.h"

typedef struct duet_workq duet_workq_t;
typedef void (*duet_workq_fn)(void *arg);

duet_status_t duet_workq_create(const char *name, duet_workq_t **wq_p);
/* Queue fn(arg).  DUET_ERR_SHUTDOWN once destroy has begun (fn not run). */
duet_status_t duet_workq_post(duet_workq_t *wq, duet_workq_fn fn, void *arg);
/* Runs the tasks already queued, then joins the thread.  NULL is fine. */
void duet_workq_destroy(duet_workq_t *wq);

#endif
