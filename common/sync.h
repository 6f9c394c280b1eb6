/* Small pthread helpers. */
#ifndef DUET_COMMON_SYNC_H
#define DUET_COMMON_SYNC_H

#include <pthread.h>

/* A condition variable whose timed waits use CLOCK_MONOTONIC, so deadlines
 * from duet_now_ns() apply.  Returns 0 or an errno value. */
int duet_cond_init_monotonic(pthread_cond_t *cond);

/* Name the calling thread (truncated to 15 bytes) for debuggers and top. */
void duet_thread_set_name(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Number of CPUs this process may run on (sched_getaffinity), at least 1. */
int duet_cpu_count(void);

#endif
