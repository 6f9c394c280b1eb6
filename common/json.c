#include "common/json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"

duet_status_t duet_file_read(const char *path, char **data_p, size_t *len_p)
{
    /* O_NONBLOCK: a FIFO in place of the file must not block the open */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    char *data = NULL;
    struct stat sb;
    size_t size, got = 0;

    if (fd < 0)
        return duet_error(DUET_ERR_IO, "%s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return duet_error(DUET_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return duet_error(DUET_ERR_IO, "%s: not a regular file (%s)", path,
                          S_ISFIFO(sb.st_mode)  ? "a FIFO"
                          : S_ISDIR(sb.st_mode) ? "a directory"
                                                : "a device or socket");
    }
    size = (size_t)sb.st_size;
    data = duet_malloc(size + 1);
    if (data == NULL) {
        close(fd);
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for %zu bytes", path, size);
    }
    while (got < size) {
        ssize_t n = read(fd, data + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            duet_free(data);
            close(fd);
            return duet_error(DUET_ERR_IO, "%s: short read%s%s", path, n < 0 ? ": " : "",
                              n < 0 ? strerror(errno) : "");
        }
        got += (size_t)n;
    }
    close(fd);
    data[size] = '\0';
    *data_p = data;
    if (len_p != NULL)
        *len_p = size;
    return DUET_OK;
}

duet_status_t duet_json_parse(const char *text, size_t len, const char *what, cJSON **root_p)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);

    if (root == NULL) {
        size_t off = (end != NULL && end >= text) ? (size_t)(end - text) : 0;
        int line = 1, col = 1;
        for (size_t i = 0; i < off && i < len; i++) {
            if (text[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        return duet_error(DUET_ERR_FORMAT, "%s: invalid JSON at line %d column %d", what, line,
                          col);
    }
    *root_p = root;
    return DUET_OK;
}

duet_status_t duet_json_load_file(const char *path, cJSON **root_p)
{
    char *text;
    size_t len;
    duet_status_t st = duet_file_read(path, &text, &len);
    if (st != DUET_OK)
        return st;
    st = duet_json_parse(text, len, path, root_p);
    duet_free(text);
    return st;
}

static void duet__join(char *buf, size_t size, const char *path, const char *key)
{
    if (path == NULL || path[0] == '\0')
        snprintf(buf, size, "%s", key);
    else
        snprintf(buf, size, "%s.%s", path, key);
}

duet_status_t duet_cfg_defaults(const duet_cfg_field_t *fields, size_t n, void *obj)
{
    for (size_t i = 0; i < n; i++) {
        char *p = (char *)obj + fields[i].offset;
        switch (fields[i].type) {
        case DUET_CFG_INT:
            *(int *)p = (int)fields[i].def_num;
            break;
        case DUET_CFG_I64:
            *(int64_t *)p = (int64_t)fields[i].def_num;
            break;
        case DUET_CFG_DOUBLE:
            *(double *)p = fields[i].def_num;
            break;
        case DUET_CFG_BOOL:
            *(bool *)p = fields[i].def_num != 0;
            break;
        case DUET_CFG_STRING: {
            char **sp = (char **)p;
            *sp = NULL;
            if (fields[i].def_str != NULL && (*sp = duet_strdup(fields[i].def_str)) == NULL)
                return duet_error(DUET_ERR_NO_MEMORY, "config defaults: no memory");
            break;
        }
        case DUET_CFG_CUSTOM:
            break;
        }
    }
    return DUET_OK;
}

/* v as the field's type reads: an integer field's whole values in full
 * ("1048576", not %g's "1.04858e+06"), anything else as %g. */
static const char *duet__cfg_num_str(const duet_cfg_field_t *f, double v, char *buf, size_t cap)
{
    bool integral = f->type == DUET_CFG_INT || f->type == DUET_CFG_I64;
    if (integral && v == floor(v) && fabs(v) < 1e18)
        snprintf(buf, cap, "%lld", (long long)v);
    else
        snprintf(buf, cap, "%g", v);
    return buf;
}

static duet_status_t duet__cfg_number(const duet_cfg_field_t *f, double v, const char *key,
                                      void *p)
{
    char vs[32], lo[32], hi[32];
    if (f->type == DUET_CFG_INT || f->type == DUET_CFG_I64) {
        if (v != floor(v))
            return duet_error(DUET_ERR_CONFIG, "%s: %g is not an integer", key, v);
    }
    if (f->min < f->max && (v < f->min || v > f->max))
        return duet_error(DUET_ERR_CONFIG, "%s: %s is out of range %s..%s", key,
                          duet__cfg_num_str(f, v, vs, sizeof(vs)),
                          duet__cfg_num_str(f, f->min, lo, sizeof(lo)),
                          duet__cfg_num_str(f, f->max, hi, sizeof(hi)));
    switch (f->type) {
    case DUET_CFG_INT:
        *(int *)p = (int)v;
        break;
    case DUET_CFG_I64:
        *(int64_t *)p = (int64_t)v;
        break;
    default:
        *(double *)p = v;
        break;
    }
    return DUET_OK;
}

static duet_status_t duet__cfg_set_json(const duet_cfg_field_t *f, const cJSON *item,
                                        const char *key, void *obj)
{
    char *p = (char *)obj + f->offset;

    switch (f->type) {
    case DUET_CFG_INT:
    case DUET_CFG_I64:
    case DUET_CFG_DOUBLE:
        if (!cJSON_IsNumber(item))
            return duet_error(DUET_ERR_CONFIG, "%s: expected a number", key);
        return duet__cfg_number(f, item->valuedouble, key, p);
    case DUET_CFG_BOOL:
        if (!cJSON_IsBool(item))
            return duet_error(DUET_ERR_CONFIG, "%s: expected true or false", key);
        *(bool *)p = cJSON_IsTrue(item);
        return DUET_OK;
    case DUET_CFG_STRING: {
        char *s;
        if (!cJSON_IsString(item))
            return duet_error(DUET_ERR_CONFIG, "%s: expected a string", key);
        if ((s = duet_strdup(item->valuestring)) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", key);
        duet_free(*(char **)p);
        *(char **)p = s;
        return DUET_OK;
    }
    case DUET_CFG_CUSTOM:
        return f->parse(item, p, key);
    }
    return duet_error(DUET_ERR_INTERNAL, "%s: bad field type", key);
}

duet_status_t duet_cfg_parse(const cJSON *json, const char *path, const duet_cfg_field_t *fields,
                             size_t n, void *obj)
{
    char key[256];
    const cJSON *item;

    if (!cJSON_IsObject(json))
        return duet_error(DUET_ERR_CONFIG, "%s: expected an object",
                          path && path[0] ? path : "config");
    cJSON_ArrayForEach(item, json)
    {
        size_t i;
        duet__join(key, sizeof(key), path, item->string ? item->string : "?");
        for (i = 0; i < n; i++) {
            if (strcmp(fields[i].name, item->string) == 0)
                break;
        }
        if (i == n)
            return duet_error(DUET_ERR_CONFIG, "%s: unknown key", key);
        duet_status_t st = duet__cfg_set_json(&fields[i], item, key, obj);
        if (st != DUET_OK)
            return st;
    }
    return DUET_OK;
}

duet_status_t duet_cfg_set_str(const duet_cfg_field_t *fields, size_t n, void *obj,
                               const char *name, const char *value)
{
    for (size_t i = 0; i < n; i++) {
        const duet_cfg_field_t *f = &fields[i];
        char *p = (char *)obj + f->offset;
        char *end = NULL;
        if (strcmp(f->name, name) != 0)
            continue;
        switch (f->type) {
        case DUET_CFG_INT:
        case DUET_CFG_I64:
        case DUET_CFG_DOUBLE: {
            errno = 0;
            double v = strtod(value, &end);
            if (errno != 0 || end == value || *end != '\0')
                return duet_error(DUET_ERR_CONFIG, "%s: '%s' is not a number", name, value);
            return duet__cfg_number(f, v, name, p);
        }
        case DUET_CFG_BOOL:
            if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
                *(bool *)p = true;
            else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
                *(bool *)p = false;
            else
                return duet_error(DUET_ERR_CONFIG, "%s: '%s' is not true or false", name, value);
            return DUET_OK;
        case DUET_CFG_STRING: {
            char *s = duet_strdup(value);
            if (s == NULL)
                return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", name);
            duet_free(*(char **)p);
            *(char **)p = s;
            return DUET_OK;
        }
        case DUET_CFG_CUSTOM: {
            cJSON *item = cJSON_Parse(value);
            if (item == NULL)
                item = cJSON_CreateString(value);
            if (item == NULL)
                return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", name);
            duet_status_t st = f->parse(item, p, name);
            cJSON_Delete(item);
            return st;
        }
        }
    }
    return duet_error(DUET_ERR_NOT_FOUND, "%s: unknown setting", name);
}

void duet_cfg_free(const duet_cfg_field_t *fields, size_t n, void *obj)
{
    for (size_t i = 0; i < n; i++) {
        if (fields[i].type == DUET_CFG_STRING) {
            char **sp = (char **)((char *)obj + fields[i].offset);
            duet_free(*sp);
            *sp = NULL;
        }
    }
}

void duet_cfg_describe(FILE *out, const char *prefix, const duet_cfg_field_t *fields, size_t n)
{
    static const char *const types[] = {"int", "int", "number", "bool", "string", "list"};
    for (size_t i = 0; i < n; i++) {
        const duet_cfg_field_t *f = &fields[i];
        char a[32], b[32];
        fprintf(out, "  %s%-22s %-7s", prefix, f->name, types[f->type]);
        if (f->type == DUET_CFG_STRING)
            fprintf(out, " default %-14s", f->def_str ? f->def_str : "(none)");
        else if (f->type != DUET_CFG_CUSTOM)
            fprintf(out, " default %-14s", duet__cfg_num_str(f, f->def_num, a, sizeof(a)));
        else
            fprintf(out, " %-22s", "");
        if (f->min < f->max && f->type != DUET_CFG_BOOL)
            fprintf(out, " [%s..%s]", duet__cfg_num_str(f, f->min, a, sizeof(a)),
                    duet__cfg_num_str(f, f->max, b, sizeof(b)));
        fprintf(out, "  %s\n", f->doc);
    }
}

static const cJSON *duet__get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

duet_status_t duet_json_get_int(const cJSON *obj, const char *key, const char *what, int64_t *out)
{
    const cJSON *it = duet__get(obj, key);
    if (it == NULL || cJSON_IsNull(it))
        return DUET_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        fabs(it->valuedouble) > 9007199254740992.0)
        return duet_error(DUET_ERR_FORMAT, "%s: %s: expected an integer", what, key);
    *out = (int64_t)it->valuedouble;
    return DUET_OK;
}

duet_status_t duet_json_get_double(const cJSON *obj, const char *key, const char *what,
                                   double *out)
{
    const cJSON *it = duet__get(obj, key);
    if (it == NULL || cJSON_IsNull(it))
        return DUET_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(it))
        return duet_error(DUET_ERR_FORMAT, "%s: %s: expected a number", what, key);
    *out = it->valuedouble;
    return DUET_OK;
}

duet_status_t duet_json_get_bool(const cJSON *obj, const char *key, const char *what, bool *out)
{
    const cJSON *it = duet__get(obj, key);
    if (it == NULL || cJSON_IsNull(it))
        return DUET_ERR_NOT_FOUND;
    if (!cJSON_IsBool(it))
        return duet_error(DUET_ERR_FORMAT, "%s: %s: expected true or false", what, key);
    *out = cJSON_IsTrue(it);
    return DUET_OK;
}

duet_status_t duet_json_get_string(const cJSON *obj, const char *key, const char *what,
                                   const char **out)
{
    const cJSON *it = duet__get(obj, key);
    if (it == NULL || cJSON_IsNull(it))
        return DUET_ERR_NOT_FOUND;
    if (!cJSON_IsString(it))
        return duet_error(DUET_ERR_FORMAT, "%s: %s: expected a string", what, key);
    *out = it->valuestring;
    return DUET_OK;
}
