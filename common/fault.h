/* Named fault points: the failure-injecting allocator's pattern
 * (common/alloc.h) for the rest of the failures tests need to provoke.
 *
 * A fault point is a name from the table in fault.c ("decode.kv_copy_fail",
 * "prefill.delay_ms", ...) with an integer value.  Product code asks
 *
 *     if (duet_fault("decode.kv_copy_fail")) ...
 *     long ms = duet_fault_value("prefill.delay_ms", 0);
 *
 * Tests arm points in-process (duet_fault_arm) or, for a spawned daemon,
 * through the environment, read once at the first query:
 *
 *     DUET_FAULTS="prefill.delay_ms=1500,comm.fail_after=3"
 *
 * A hot path that must fire on the n-th event of one object (the n-th put of
 * a transfer rank) keeps a duet_fault_count_t in that object; it is armed
 * from the point's value when the object is made, or by the object's own
 * debug call, and costs one relaxed load per event while disarmed.
 *
 * Compiled in when DUET_FAULT_INJECTION is 1 (CMake option
 * DUET_FAULT_INJECTION, ON by default: Debug, sanitizer, CI and test
 * builds).  The release build (scripts/build.sh, the Docker images) sets it
 * OFF: every query below is then a constant false / the caller's default,
 * which the compiler removes with the code it guards, DUET_FAULTS is ignored
 * (with a warning) and arming answers DUET_ERR_UNSUPPORTED.
 *
 * Thread-safe. */
#ifndef DUET_COMMON_FAULT_H
#define DUET_COMMON_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>

#include "common/status.h"

#ifndef DUET_FAULT_INJECTION
#define DUET_FAULT_INJECTION 0
#endif

/* The n-th event from arming fires once (0 = the next); -1: disarmed. */
typedef struct {
    atomic_long at;
} duet_fault_count_t;

#if DUET_FAULT_INJECTION

/* True when the point is armed with a value other than 0. */
bool duet_fault(const char *name);

/* The point's value, or `unset` when it is not armed. */
long duet_fault_value(const char *name, long unset);

/* Tests: arm a point with value (any value, 0 included, counts as armed for
 * duet_fault_value), or disarm it.  DUET_ERR_NOT_FOUND for a name not in
 * the table. */
duet_status_t duet_fault_arm(const char *name, long value);
duet_status_t duet_fault_disarm(const char *name);

/* Tests: arm the points of a DUET_FAULTS-style spec ("a=1,b=2"; "" arms
 * nothing).  DUET_ERR_INVALID for a malformed entry or an unknown name, in
 * which case no point of the spec is armed. */
duet_status_t duet_fault_load(const char *spec);

/* Disarm every point (the environment is not read again). */
void duet_fault_reset(void);

/* Read DUET_FAULTS if it has not been read yet (the first query does it
 * too) and return how that went: the daemons call it at start so a
 * malformed spec stops them instead of being ignored.  Logs each armed
 * point once as a warning. */
duet_status_t duet_fault_init_from_env(void);

/* The counter's initial state: armed with the point's value, if the point
 * is armed, else disarmed. */
void duet_fault_count_init(duet_fault_count_t *c, const char *name);

static inline duet_status_t duet_fault_count_arm(duet_fault_count_t *c, long n)
{
    atomic_store(&c->at, n < 0 ? -1 : n);
    return DUET_OK;
}

/* One event: true for the event the counter was armed for. */
static inline bool duet_fault_count_hit(duet_fault_count_t *c)
{
    if (atomic_load_explicit(&c->at, memory_order_relaxed) < 0)
        return false;
    return atomic_fetch_sub_explicit(&c->at, 1, memory_order_relaxed) == 0;
}

#else /* compiled out: constants */

static inline bool duet_fault(const char *name)
{
    (void)name;
    return false;
}

static inline long duet_fault_value(const char *name, long unset)
{
    (void)name;
    return unset;
}

static inline duet_status_t duet_fault_arm(const char *name, long value)
{
    (void)value;
    return duet_error(DUET_ERR_UNSUPPORTED,
                      "fault %s: fault injection is compiled out (DUET_FAULT_INJECTION=OFF)", name);
}

static inline duet_status_t duet_fault_disarm(const char *name)
{
    (void)name;
    return DUET_OK;
}

duet_status_t duet_fault_load(const char *spec);

static inline void duet_fault_reset(void)
{
}

duet_status_t duet_fault_init_from_env(void);

static inline void duet_fault_count_init(duet_fault_count_t *c, const char *name)
{
    (void)name;
    atomic_init(&c->at, -1);
}

static inline duet_status_t duet_fault_count_arm(duet_fault_count_t *c, long n)
{
    (void)c;
    if (n < 0)
        return DUET_OK;
    return duet_error(DUET_ERR_UNSUPPORTED,
                      "fault injection is compiled out (DUET_FAULT_INJECTION=OFF)");
}

static inline bool duet_fault_count_hit(duet_fault_count_t *c)
{
    (void)c;
    return false;
}

#endif

#endif
