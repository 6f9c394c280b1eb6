/* Monotonic time and deadlines. */
#ifndef DUET_COMMON_CLOCK_H
#define DUET_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

#define DUET_NS_PER_MS 1000000LL
#define DUET_NS_PER_S  1000000000LL

/* CLOCK_MONOTONIC in nanoseconds. */
static inline int64_t duet_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * DUET_NS_PER_S + ts.tv_nsec;
}

/* A deadline `ms` from now; ms < 0 means no deadline (INT64_MAX). */
static inline int64_t duet_deadline_in_ms(int64_t ms)
{
    return ms < 0 ? INT64_MAX : duet_now_ns() + ms * DUET_NS_PER_MS;
}

/* Absolute CLOCK_MONOTONIC timespec for pthread_cond_timedwait on a
 * condition variable created with duet_cond_init_monotonic(). */
static inline struct timespec duet_deadline_timespec(int64_t deadline_ns)
{
    struct timespec ts;
    if (deadline_ns == INT64_MAX)
        deadline_ns = duet_now_ns() + 3600LL * DUET_NS_PER_S;
    ts.tv_sec = (time_t)(deadline_ns / DUET_NS_PER_S);
    ts.tv_nsec = (long)(deadline_ns % DUET_NS_PER_S);
    return ts;
}

#endif
