#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int duet__log_level = DUET_LOG_LEVEL_INFO;
static const char *_Atomic duet__log_component = "duet";

static const char *const duet__level_names[] = {"error", "warn", "info", "debug", "trace"};

int duet_log_level_parse(const char *s)
{
    for (int i = 0; i < (int)(sizeof(duet__level_names) / sizeof(duet__level_names[0])); i++) {
        if (s != NULL && strcasecmp(s, duet__level_names[i]) == 0)
            return i;
    }
    return -1;
}

void duet_log_set_level(duet_log_level_t level)
{
    atomic_store(&duet__log_level, (int)level);
}

void duet_log_init_from_env(void)
{
    int lvl = duet_log_level_parse(getenv("DUET_LOG_LEVEL"));
    if (lvl >= 0)
        duet_log_set_level((duet_log_level_t)lvl);
}

int duet_log_enabled(duet_log_level_t level)
{
    return (int)level <= atomic_load_explicit(&duet__log_level, memory_order_relaxed);
}

void duet_log_set_component(const char *component)
{
    atomic_store(&duet__log_component, component);
}

void duet_log_write(duet_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    size_t n;
    va_list ap;
    const char *base = strrchr(file, '/');

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(buf + n, sizeof(buf) - n, ".%03ldZ %-5s %s: ", ts.tv_nsec / 1000000L,
                          duet__level_names[level], atomic_load(&duet__log_component));
    va_start(ap, fmt);
    if (n < sizeof(buf))
        n += (size_t)vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
    va_end(ap);
    if (level == DUET_LOG_LEVEL_DEBUG || level == DUET_LOG_LEVEL_TRACE) {
        if (n < sizeof(buf))
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, " (%s:%d)", base ? base + 1 : file,
                                  line);
    }
    if (n >= sizeof(buf) - 1)
        n = sizeof(buf) - 2;
    buf[n++] = '\n';
    /* one write(2) per line keeps lines whole across threads */
    ssize_t w = write(STDERR_FILENO, buf, n);
    (void)w;
}
