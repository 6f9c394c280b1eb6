/* Named fault points (fault.h).  The table below is every point the
 * product has; a spec naming anything else is refused, so a typo in a test
 * fails loudly instead of testing nothing. */
#include "common/fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

extern char **environ;

/* The switches fault.h replaced; a test still setting one tests nothing. */
static void duet__fault_warn_stale(void)
{
    for (char **e = environ; e != NULL && *e != NULL; e++)
        if (strncmp(*e, "DUET_FAULT_", 11) == 0)
            DUET_LOG_WARN("fault: %.*s is not read: arm fault points with "
                          "DUET_FAULTS=name=value,... (common/fault.h)",
                          (int)strcspn(*e, "="), *e);
}

#if DUET_FAULT_INJECTION

typedef struct {
    const char *name;
    const char *doc;
} duet__fault_point_t;

static const duet__fault_point_t duet__fault_points[] = {
    {"comm.fail_after", "the last rank of every host comm group fails its collective N+1 "
                        "(engine/comm_host.c)"},
    {"decode.kv_copy_fail", "1: a remote prefill's KV copy (unpack or import) fails once the "
                            "first token went out (decode/)"},
    {"decode.step_delay_ms", "every decode step takes at least this long (decode/)"},
    {"prefill.delay_ms", "every prefill batch is held this long before it is computed "
                         "(prefill/sched.c)"},
    {"prefill.chunk_delay_ms", "a chunked packed transfer waits this long before each chunk "
                               "after the first (prefill/chunks.c)"},
    {"xfer.corrupt_put", "each transfer rank corrupts what its N-th put delivers "
                         "(duet_xfer_debug_corrupt_put)"},
};

#define DUET__FAULT_N ((int)(sizeof(duet__fault_points) / sizeof(duet__fault_points[0])))

/* Spec parsing: the env variable's entries, checked all before any is used. */
typedef struct {
    int point;
    long value;
} duet__fault_entry_t;

static int duet__fault_find(const char *name, size_t len)
{
    for (int i = 0; i < DUET__FAULT_N; i++)
        if (strlen(duet__fault_points[i].name) == len &&
            memcmp(duet__fault_points[i].name, name, len) == 0)
            return i;
    return -1;
}

/* Parse spec into out (room for DUET__FAULT_N entries; a point named twice
 * keeps its last value).  Returns the count, or -1 with the error set. */
static int duet__fault_parse(const char *spec, duet__fault_entry_t *out)
{
    int n = 0;
    const char *p = spec;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t name_len = eq != NULL ? (size_t)(eq - p) : len;
        long value = 1; /* a bare name arms the point with 1 */
        int point;
        if (len == 0) {
            p += end != NULL ? 1 : 0;
            continue;
        }
        point = duet__fault_find(p, name_len);
        if (point < 0) {
            duet_error(DUET_ERR_INVALID, "DUET_FAULTS: unknown fault point \"%.*s\"", (int)name_len,
                       p);
            return -1;
        }
        if (eq != NULL) {
            char buf[32], *tail;
            size_t vlen = len - name_len - 1;
            if (vlen == 0 || vlen >= sizeof(buf)) {
                duet_error(DUET_ERR_INVALID, "DUET_FAULTS: %s: bad value",
                           duet__fault_points[point].name);
                return -1;
            }
            memcpy(buf, eq + 1, vlen);
            buf[vlen] = '\0';
            errno = 0;
            value = strtol(buf, &tail, 10);
            if (errno != 0 || *tail != '\0') {
                duet_error(DUET_ERR_INVALID, "DUET_FAULTS: %s: bad value \"%s\"",
                           duet__fault_points[point].name, buf);
                return -1;
            }
        }
        int k = 0;
        while (k < n && out[k].point != point)
            k++;
        out[k] = (duet__fault_entry_t){point, value};
        if (k == n)
            n++;
        p += len + (end != NULL ? 1 : 0);
    }
    return n;
}

static atomic_long duet__fault_value[DUET__FAULT_N];
static atomic_bool duet__fault_armed[DUET__FAULT_N];
static pthread_once_t duet__fault_once = PTHREAD_ONCE_INIT;
static duet_status_t duet__fault_env_status;
static char duet__fault_env_error[256];

static void duet__fault_env_load(void)
{
    const char *spec = getenv("DUET_FAULTS");
    duet__fault_warn_stale();
    if (spec == NULL)
        return;
    duet__fault_entry_t e[DUET__FAULT_N];
    int n = duet__fault_parse(spec, e);
    if (n < 0) {
        duet__fault_env_status = DUET_ERR_INVALID;
        snprintf(duet__fault_env_error, sizeof(duet__fault_env_error), "%s", duet_error_msg());
        DUET_LOG_ERROR("fault: %s (no fault point armed)", duet__fault_env_error);
        return;
    }
    for (int i = 0; i < n; i++) {
        atomic_store(&duet__fault_value[e[i].point], e[i].value);
        atomic_store(&duet__fault_armed[e[i].point], true);
        DUET_LOG_WARN("fault: %s=%ld armed (DUET_FAULTS): %s", duet__fault_points[e[i].point].name,
                      e[i].value, duet__fault_points[e[i].point].doc);
    }
}

static void duet__fault_env(void)
{
    pthread_once(&duet__fault_once, duet__fault_env_load);
}

duet_status_t duet_fault_init_from_env(void)
{
    duet__fault_env();
    if (duet__fault_env_status != DUET_OK)
        return duet_error(duet__fault_env_status, "%s", duet__fault_env_error);
    return DUET_OK;
}

static int duet__fault_point(const char *name)
{
    duet__fault_env();
    return duet__fault_find(name, strlen(name));
}

long duet_fault_value(const char *name, long unset)
{
    int i = duet__fault_point(name);
    if (i < 0 || !atomic_load_explicit(&duet__fault_armed[i], memory_order_acquire))
        return unset;
    return atomic_load_explicit(&duet__fault_value[i], memory_order_relaxed);
}

bool duet_fault(const char *name)
{
    return duet_fault_value(name, 0) != 0;
}

duet_status_t duet_fault_arm(const char *name, long value)
{
    int i = duet__fault_point(name);
    if (i < 0)
        return duet_error(DUET_ERR_NOT_FOUND, "unknown fault point \"%s\"", name);
    atomic_store(&duet__fault_value[i], value);
    atomic_store_explicit(&duet__fault_armed[i], true, memory_order_release);
    return DUET_OK;
}

duet_status_t duet_fault_disarm(const char *name)
{
    int i = duet__fault_point(name);
    if (i < 0)
        return duet_error(DUET_ERR_NOT_FOUND, "unknown fault point \"%s\"", name);
    atomic_store(&duet__fault_armed[i], false);
    return DUET_OK;
}

duet_status_t duet_fault_load(const char *spec)
{
    duet__fault_entry_t e[DUET__FAULT_N];
    int n = duet__fault_parse(spec, e);
    if (n < 0)
        return DUET_ERR_INVALID;
    for (int i = 0; i < n; i++)
        duet_fault_arm(duet__fault_points[e[i].point].name, e[i].value);
    return DUET_OK;
}

void duet_fault_reset(void)
{
    duet__fault_env();
    for (int i = 0; i < DUET__FAULT_N; i++)
        atomic_store(&duet__fault_armed[i], false);
}

void duet_fault_count_init(duet_fault_count_t *c, const char *name)
{
    atomic_init(&c->at, -1);
    long n = duet_fault_value(name, -1);
    if (n >= 0)
        atomic_store(&c->at, n);
}

#else /* compiled out */

duet_status_t duet_fault_load(const char *spec)
{
    if (*spec == '\0')
        return DUET_OK;
    return duet_error(DUET_ERR_UNSUPPORTED,
                      "fault injection is compiled out (DUET_FAULT_INJECTION=OFF)");
}

static pthread_once_t duet__fault_once = PTHREAD_ONCE_INIT;

static void duet__fault_env_check(void)
{
    duet__fault_warn_stale();
    if (getenv("DUET_FAULTS") != NULL)
        DUET_LOG_WARN("fault: DUET_FAULTS ignored: fault injection is compiled out of this build "
                      "(DUET_FAULT_INJECTION=OFF)");
}

duet_status_t duet_fault_init_from_env(void)
{
    pthread_once(&duet__fault_once, duet__fault_env_check);
    return DUET_OK;
}

#endif
