/* Logging: one line per event to stderr, "ts level component: message".
 * Messages are lowercase, key value style.  Thread-safe (one write per line).
 * The level is process-wide, set once at start-up from --log-level or the
 * DUET_LOG_LEVEL environment variable. */
#ifndef DUET_COMMON_LOG_H
#define DUET_COMMON_LOG_H

typedef enum {
    DUET_LOG_LEVEL_ERROR = 0,
    DUET_LOG_LEVEL_WARN = 1,
    DUET_LOG_LEVEL_INFO = 2,
    DUET_LOG_LEVEL_DEBUG = 3,
    DUET_LOG_LEVEL_TRACE = 4,
} duet_log_level_t;

/* Parse "error|warn|info|debug|trace"; returns -1 when unknown. */
int duet_log_level_parse(const char *s);
void duet_log_set_level(duet_log_level_t level);
/* Reads DUET_LOG_LEVEL; keeps the current level when unset or invalid. */
void duet_log_init_from_env(void);
int duet_log_enabled(duet_log_level_t level);
/* Name printed after the level, e.g. "decode"; the string is not copied. */
void duet_log_set_component(const char *component);

void duet_log_write(duet_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define DUET__LOG(lvl, ...)                                                                        \
    do {                                                                                           \
        if (duet_log_enabled(lvl))                                                                 \
            duet_log_write(lvl, __FILE__, __LINE__, __VA_ARGS__);                                  \
    } while (0)

#define DUET_LOG_ERROR(...) DUET__LOG(DUET_LOG_LEVEL_ERROR, __VA_ARGS__)
#define DUET_LOG_WARN(...)  DUET__LOG(DUET_LOG_LEVEL_WARN, __VA_ARGS__)
#define DUET_LOG_INFO(...)  DUET__LOG(DUET_LOG_LEVEL_INFO, __VA_ARGS__)
#define DUET_LOG_DEBUG(...) DUET__LOG(DUET_LOG_LEVEL_DEBUG, __VA_ARGS__)
#define DUET_LOG_TRACE(...) DUET__LOG(DUET_LOG_LEVEL_TRACE, __VA_ARGS__)

#endif
