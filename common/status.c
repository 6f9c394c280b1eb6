#include "common/status.h"

#include <stdio.h>
#include <string.h>

#define DUET_ERROR_MSG_MAX 512

static _Thread_local char duet__errmsg[DUET_ERROR_MSG_MAX];

const char *duet_status_str(duet_status_t st)
{
    switch (st) {
#define DUET__STATUS_CASE(name, value, text)                                                       \
    case name:                                                                                     \
        return text;
        DUET_STATUS_MAP(DUET__STATUS_CASE)
#undef DUET__STATUS_CASE
    }
    return "unknown status";
}

const char *duet_status_name(duet_status_t st)
{
    switch (st) {
#define DUET__STATUS_CASE(name, value, text)                                                       \
    case name:                                                                                     \
        return #name;
        DUET_STATUS_MAP(DUET__STATUS_CASE)
#undef DUET__STATUS_CASE
    }
    return "DUET_ERR_UNKNOWN";
}

duet_status_t duet_verror(duet_status_t st, const char *fmt, va_list ap)
{
    vsnprintf(duet__errmsg, sizeof(duet__errmsg), fmt, ap);
    return st;
}

duet_status_t duet_error(duet_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    duet_verror(st, fmt, ap);
    va_end(ap);
    return st;
}

duet_status_t duet_error_wrap(duet_status_t st, const char *fmt, ...)
{
    char old[DUET_ERROR_MSG_MAX];
    size_t n, m;
    va_list ap;

    memcpy(old, duet__errmsg, sizeof(old));
    va_start(ap, fmt);
    n = (size_t)vsnprintf(duet__errmsg, sizeof(duet__errmsg), fmt, ap);
    va_end(ap);
    if (n >= sizeof(duet__errmsg) - 1)
        return st;
    m = strnlen(old, sizeof(old) - 1);
    if (m > sizeof(duet__errmsg) - 1 - n)
        m = sizeof(duet__errmsg) - 1 - n;
    memcpy(duet__errmsg + n, old, m);
    duet__errmsg[n + m] = '\0';
    return st;
}

const char *duet_error_msg(void)
{
    return duet__errmsg[0] ? duet__errmsg : "no detail";
}

void duet_error_clear(void)
{
    duet__errmsg[0] = '\0';
}
