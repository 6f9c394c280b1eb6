/* duet status codes and the per-thread error detail.
 *
 * Every fallible function returns duet_status_t: 0 is success, negative is an
 * error.  The code says what kind of failure it was; the detail (file, tensor,
 * config key, rank...) goes into a per-thread message set with duet_error(),
 * in the manner of errno/dlerror: the code travels through return values, the
 * message is read by whoever reports the failure. */
#ifndef DUET_COMMON_STATUS_H
#define DUET_COMMON_STATUS_H

#include <stdarg.h>

/* X(name, value, text) */
#define DUET_STATUS_MAP(X)                                                                         \
    X(DUET_OK, 0, "ok")                                                                            \
    X(DUET_ERR_INVALID, -1, "invalid argument")                                                    \
    X(DUET_ERR_NO_MEMORY, -2, "out of memory")                                                     \
    X(DUET_ERR_IO, -3, "i/o error")                                                                \
    X(DUET_ERR_FORMAT, -4, "malformed data")                                                       \
    X(DUET_ERR_NOT_FOUND, -5, "not found")                                                         \
    X(DUET_ERR_UNSUPPORTED, -6, "unsupported")                                                     \
    X(DUET_ERR_TIMEOUT, -7, "deadline exceeded")                                                   \
    X(DUET_ERR_CANCELLED, -8, "cancelled")                                                         \
    X(DUET_ERR_PEER, -9, "peer failure")                                                           \
    X(DUET_ERR_MISMATCH, -10, "mismatch")                                                          \
    X(DUET_ERR_EXHAUSTED, -11, "resource exhausted")                                               \
    X(DUET_ERR_CONFIG, -12, "configuration error")                                                 \
    X(DUET_ERR_SHUTDOWN, -13, "shutting down")                                                     \
    X(DUET_ERR_TOO_LONG, -14, "input too long")                                                    \
    X(DUET_ERR_INTERNAL, -15, "internal error")

typedef enum {
#define DUET__STATUS_ENUM(name, value, text) name = value,
    DUET_STATUS_MAP(DUET__STATUS_ENUM)
#undef DUET__STATUS_ENUM
} duet_status_t;

/* Short static text for a status ("deadline exceeded"); never NULL. */
const char *duet_status_str(duet_status_t st);

/* Stable identifier of a status ("DUET_ERR_TIMEOUT"); never NULL. */
const char *duet_status_name(duet_status_t st);

/* Set this thread's error detail and return st, so failures read
 * `return duet_error(DUET_ERR_FORMAT, "%s: bad header", path);`. */
duet_status_t duet_error(duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
duet_status_t duet_verror(duet_status_t st, const char *fmt, va_list ap);

/* This thread's last error detail, or the status text if none was set since
 * duet_error_clear().  Valid until the thread's next duet_error(). */
const char *duet_error_msg(void);
void duet_error_clear(void);

/* Prefix the current detail with more context: "model.safetensors: " + old. */
duet_status_t duet_error_wrap(duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
