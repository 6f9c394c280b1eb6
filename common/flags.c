#include "common/flags.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define DUET__FLAGS_COL      24 /* the help text's column */
#define DUET__FLAGS_NAME_MAX 128

static const duet_flag_t *duet__flags_find(const duet_flag_t *flags, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (flags[i].type != DUET_FLAG_HEADING && strcmp(flags[i].name, name) == 0)
            return &flags[i];
    }
    return NULL;
}

static bool duet__flags_takes_value(duet_flag_type_t t)
{
    return t != DUET_FLAG_TRUE && t != DUET_FLAG_FALSE && t != DUET_FLAG_STOP;
}

/* An integer: decimal digits, or a number with an integral value ("1e3"). */
static bool duet__flags_integer(const char *s, double lo, double hi, long long *v_p)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0) {
        errno = 0;
        double d = strtod(s, &end);
        if (end == s || *end != '\0' || errno != 0 || !(fabs(d) <= 9007199254740992.0) ||
            d != floor(d))
            return false;
        v = (long long)d;
    }
    if (!((double)v >= lo && (double)v <= hi))
        return false;
    *v_p = v;
    return true;
}

static duet_status_t duet__flags_choice(const duet_flag_t *f, const char *flag, const char *value)
{
    char list[256];
    size_t len = 0;
    int n = 0;

    for (int i = 0; f->choices[i] != NULL; i++) {
        if (strcmp(f->choices[i], value) == 0) {
            *(int *)f->dest = i;
            return DUET_OK;
        }
        n++;
    }
    list[0] = '\0';
    for (int i = 0; i < n && len < sizeof(list); i++) {
        const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
        int w = snprintf(list + len, sizeof(list) - len, "%s%s", sep, f->choices[i]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    return duet_error(DUET_ERR_CONFIG, "%s %s: expected %s", flag, value, list);
}

static duet_status_t duet__flags_set(const duet_flag_t *f, const char *flag, const char *value)
{
    long long iv;
    double dv;
    char *end = NULL;

    switch (f->type) {
    case DUET_FLAG_STRING:
        *(const char **)f->dest = value;
        return DUET_OK;
    case DUET_FLAG_INT:
    case DUET_FLAG_INT64: {
        double lo = f->min, hi = f->max;
        if (f->type == DUET_FLAG_INT) {
            lo = fmax(lo, (double)INT32_MIN);
            hi = fmin(hi, (double)INT32_MAX);
        }
        if (!duet__flags_integer(value, lo, hi, &iv))
            return duet_error(DUET_ERR_CONFIG, "%s %s: expected an integer in [%.0f, %.0f]", flag,
                              value, lo, hi);
        if (f->type == DUET_FLAG_INT)
            *(int *)f->dest = (int)iv;
        else
            *(int64_t *)f->dest = (int64_t)iv;
        return DUET_OK;
    }
    case DUET_FLAG_DOUBLE:
        errno = 0;
        dv = strtod(value, &end);
        if (end == value || *end != '\0' || errno != 0 || !(dv >= f->min) || !(dv <= f->max))
            return duet_error(DUET_ERR_CONFIG, "%s %s: expected a number in [%g, %g]", flag, value,
                              f->min, f->max);
        *(double *)f->dest = dv;
        return DUET_OK;
    case DUET_FLAG_CHOICE:
        return duet__flags_choice(f, flag, value);
    case DUET_FLAG_TRUE:
    case DUET_FLAG_STOP:
        *(bool *)f->dest = true;
        return DUET_OK;
    case DUET_FLAG_FALSE:
        *(bool *)f->dest = false;
        return DUET_OK;
    case DUET_FLAG_FUNC:
        return f->fn(f->dest, flag, value);
    case DUET_FLAG_HEADING:
        break;
    }
    return duet_error(DUET_ERR_INTERNAL, "%s: bad flag table entry", flag);
}

duet_status_t duet_flags_parse(const duet_flag_t *flags, size_t n, int argc, char *const *argv,
                               duet_flags_other_fn other, void *ud)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq, *value = NULL;
        char name[DUET__FLAGS_NAME_MAX], flag[DUET__FLAGS_NAME_MAX + 2];
        size_t len;
        duet_status_t st;

        if (strcmp(a, "--") == 0) {
            if (i + 1 < argc)
                return duet_error(DUET_ERR_CONFIG, "unexpected argument '%s'", argv[i + 1]);
            break;
        }
        if (strcmp(a, "-h") == 0 && duet__flags_find(flags, n, "help") != NULL)
            a = "--help";
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0' || a[2] == '=')
            return duet_error(DUET_ERR_CONFIG, "unexpected argument '%s'", a);
        eq = strchr(a + 2, '=');
        len = eq != NULL ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (len >= sizeof(name))
            return duet_error(DUET_ERR_CONFIG, "%.*s...: unknown flag", 40, a);
        memcpy(name, a + 2, len);
        name[len] = '\0';
        snprintf(flag, sizeof(flag), "--%s", name);

        const duet_flag_t *f = duet__flags_find(flags, n, name);
        bool takes = f == NULL || duet__flags_takes_value(f->type);
        if (f == NULL && other == NULL)
            return duet_error(DUET_ERR_CONFIG, "%s: unknown flag", flag);
        if (!takes && eq != NULL)
            return duet_error(DUET_ERR_CONFIG, "%s: takes no value", flag);
        if (takes) {
            if (eq != NULL) {
                value = eq + 1;
            } else {
                if (i + 1 >= argc)
                    return duet_error(DUET_ERR_CONFIG, "%s: needs a value", flag);
                value = argv[++i];
            }
        }
        if (f == NULL) {
            st = other(ud, name, value);
            if (st == DUET_ERR_NOT_FOUND)
                return duet_error(DUET_ERR_CONFIG, "%s: unknown flag", flag);
        } else {
            st = duet__flags_set(f, flag, value);
        }
        if (st != DUET_OK)
            return st;
        if (f != NULL && f->type == DUET_FLAG_STOP)
            return DUET_OK;
    }
    return DUET_OK;
}

void duet_flags_help(FILE *f, const duet_flag_t *flags, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const duet_flag_t *fl = &flags[i];
        const char *h = fl->help != NULL ? fl->help : "";
        int w;

        if (fl->type == DUET_FLAG_HEADING) {
            fprintf(f, "%s\n", h);
            continue;
        }
        w = fprintf(f, "  --%s%s%s", fl->name, fl->arg != NULL ? " " : "",
                    fl->arg != NULL ? fl->arg : "");
        if (*h == '\0') {
            fputc('\n', f);
            continue;
        }
        if (w < 0 || w >= DUET__FLAGS_COL - 1) { /* no room: the help on the next line */
            fputc('\n', f);
            w = 0;
        }
        /* each line of the help in the column */
        for (;;) {
            const char *nl = strchr(h, '\n');
            int len = nl != NULL ? (int)(nl - h) : (int)strlen(h);
            fprintf(f, "%*s%.*s\n", DUET__FLAGS_COL - w, "", len, h);
            if (nl == NULL)
                break;
            h = nl + 1;
            w = 0;
        }
    }
}

duet_status_t duet_flag_log_level(void *dest, const char *flag, const char *value)
{
    int lvl = duet_log_level_parse(value);

    (void)dest;
    if (lvl < 0)
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected error, warn, info, debug or trace",
                          flag, value);
    duet_log_set_level((duet_log_level_t)lvl);
    return DUET_OK;
}

duet_status_t duet_flag_seed(void *dest, const char *flag, const char *value)
{
    duet_flag_seed_t *s = dest;
    char *end = NULL;
    unsigned long long v;

    errno = 0;
    v = strtoull(value, &end, 0);
    if (errno != 0 || end == value || *end != '\0' || value[0] == '-')
        return duet_error(DUET_ERR_CONFIG, "%s %s: expected a non-negative integer", flag, value);
    s->value = (uint64_t)v;
    s->set = true;
    return DUET_OK;
}
