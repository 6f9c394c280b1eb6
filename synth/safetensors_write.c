/* safetensors writer: header built by hand (names are escaped), data
 * streamed straight to a temp file next to the target, renamed at the end. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"

struct duet_st_writer {
    char *path;
    char *tmp;
    int fd;
    uint64_t total;   /* data bytes the header promises */
    uint64_t written; /* data bytes appended so far */
};

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} duet__st_sbuf_t;

static void duet__st_sbuf_put(duet__st_sbuf_t *sb, const char *s, size_t n)
{
    if (sb->failed)
        return;
    if (sb->len + n + 1 > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 4096;
        while (cap < sb->len + n + 1)
            cap *= 2;
        char *b = duet_realloc(sb->buf, cap);
        if (b == NULL) {
            sb->failed = 1;
            return;
        }
        sb->buf = b;
        sb->cap = cap;
    }
    memcpy(sb->buf + sb->len, s, n);
    sb->len += n;
    sb->buf[sb->len] = '\0';
}

static void duet__st_sbuf_printf(duet__st_sbuf_t *sb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void duet__st_sbuf_printf(duet__st_sbuf_t *sb, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        sb->failed = 1;
        return;
    }
    duet__st_sbuf_put(sb, tmp, (size_t)n);
}

static void duet__st_sbuf_json_str(duet__st_sbuf_t *sb, const char *s)
{
    duet__st_sbuf_put(sb, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char esc[2] = {'\\', (char)*c};
            duet__st_sbuf_put(sb, esc, 2);
        } else if (*c < 0x20) {
            duet__st_sbuf_printf(sb, "\\u%04x", *c);
        } else {
            duet__st_sbuf_put(sb, (const char *)c, 1);
        }
    }
    duet__st_sbuf_put(sb, "\"", 1);
}

static int duet__st_cmp_strp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static duet_status_t duet__st_write_check(const char *path, const duet_st_write_tensor_t *tensors,
                                          size_t n)
{
    const char **names;

    for (size_t i = 0; i < n; i++) {
        const duet_st_write_tensor_t *t = &tensors[i];
        if (t->name == NULL || t->name[0] == '\0' || strcmp(t->name, "__metadata__") == 0)
            return duet_error(DUET_ERR_INVALID, "%s: tensor %zu: bad name", path, i);
        if (duet_dtype_size(t->dtype) == 0)
            return duet_error(DUET_ERR_INVALID, "%s: tensor %s: bad dtype %d", path, t->name,
                              (int)t->dtype);
        if (t->ndim < 0 || t->ndim > DUET_ST_MAX_DIMS)
            return duet_error(DUET_ERR_INVALID, "%s: tensor %s: %d dimensions", path, t->name,
                              t->ndim);
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || t->shape[d] > ((int64_t)1 << 40))
                return duet_error(DUET_ERR_INVALID, "%s: tensor %s: shape[%d] = %lld", path,
                                  t->name, d, (long long)t->shape[d]);
        }
    }
    names = DUET_NEW_ARRAY(const char *, n);
    if (names == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    for (size_t i = 0; i < n; i++)
        names[i] = tensors[i].name;
    qsort(names, n, sizeof(*names), duet__st_cmp_strp);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            duet_status_t st =
                duet_error(DUET_ERR_INVALID, "%s: tensor %s: given twice", path, names[i]);
            duet_free(names);
            return st;
        }
    }
    duet_free(names);
    return DUET_OK;
}

static size_t duet__st_nbytes(const duet_st_write_tensor_t *t)
{
    size_t count = 1;
    for (int d = 0; d < t->ndim; d++)
        count *= (size_t)t->shape[d];
    return count * duet_dtype_size(t->dtype);
}

/* The padded header, length prefix included. */
static duet_status_t duet__st_header(const char *path, const duet_st_write_tensor_t *tensors,
                                     size_t n, duet__st_sbuf_t *sb, uint64_t *total_p)
{
    uint64_t off = 0, hlen;

    duet__st_sbuf_put(sb, "\0\0\0\0\0\0\0\0", 8);
    duet__st_sbuf_printf(sb, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        const duet_st_write_tensor_t *t = &tensors[i];
        uint64_t nb = duet__st_nbytes(t);
        duet__st_sbuf_put(sb, ",", 1);
        duet__st_sbuf_json_str(sb, t->name);
        duet__st_sbuf_printf(sb, ":{\"dtype\":\"%s\",\"shape\":[", duet_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            duet__st_sbuf_printf(sb, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        duet__st_sbuf_printf(sb, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                             (unsigned long long)(off + nb));
        off += nb;
    }
    duet__st_sbuf_put(sb, "}", 1);
    while (sb->len % 8 != 0)
        duet__st_sbuf_put(sb, " ", 1);
    if (sb->failed)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for the header", path);
    hlen = sb->len - 8;
    for (int i = 0; i < 8; i++)
        sb->buf[i] = (char)(hlen >> (8 * i));
    *total_p = off;
    return DUET_OK;
}

static duet_status_t duet__st_write_all(duet_st_writer_t *w, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(w->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return duet_error(DUET_ERR_IO, "%s: write: %s", w->tmp, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
    }
    return DUET_OK;
}

duet_status_t duet_st_writer_create(const char *path, const duet_st_write_tensor_t *tensors,
                                    size_t n, duet_st_writer_t **writer_p)
{
    duet__st_sbuf_t sb = {0};
    duet_st_writer_t *w;
    size_t plen = strlen(path);
    duet_status_t st;

    if ((st = duet__st_write_check(path, tensors, n)) != DUET_OK)
        return st;
    w = DUET_NEW(duet_st_writer_t);
    if (w == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    w->fd = -1;
    w->path = duet_strdup(path);
    w->tmp = duet_malloc(plen + sizeof(".tmp.XXXXXX"));
    if (w->path == NULL || w->tmp == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
        goto err_free_writer;
    }
    memcpy(w->tmp, path, plen);
    memcpy(w->tmp + plen, ".tmp.XXXXXX", sizeof(".tmp.XXXXXX"));
    if ((st = duet__st_header(path, tensors, n, &sb, &w->total)) != DUET_OK)
        goto err_free_header;
    w->fd = mkstemp(w->tmp);
    if (w->fd < 0) {
        st = duet_error(DUET_ERR_IO, "%s: %s", w->tmp, strerror(errno));
        goto err_free_header;
    }
    if (fchmod(w->fd, 0644) != 0) {
        st = duet_error(DUET_ERR_IO, "%s: chmod: %s", w->tmp, strerror(errno));
        goto err_unlink;
    }
    if ((st = duet__st_write_all(w, sb.buf, sb.len)) != DUET_OK)
        goto err_unlink;
    duet_free(sb.buf);
    *writer_p = w;
    return DUET_OK;

err_unlink:
    close(w->fd);
    unlink(w->tmp);
err_free_header:
    duet_free(sb.buf);
err_free_writer:
    duet_free(w->tmp);
    duet_free(w->path);
    duet_free(w);
    return st;
}

duet_status_t duet_st_writer_append(duet_st_writer_t *w, const void *data, size_t nbytes)
{
    if (nbytes > w->total - w->written)
        return duet_error(DUET_ERR_INVALID, "%s: %llu bytes appended beyond the %llu declared",
                          w->path, (unsigned long long)(w->written + nbytes),
                          (unsigned long long)w->total);
    duet_status_t st = duet__st_write_all(w, data, nbytes);
    if (st == DUET_OK)
        w->written += nbytes;
    return st;
}

static void duet__st_writer_free(duet_st_writer_t *w)
{
    duet_free(w->tmp);
    duet_free(w->path);
    duet_free(w);
}

void duet_st_writer_abort(duet_st_writer_t *w)
{
    if (w == NULL)
        return;
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->tmp);
    duet__st_writer_free(w);
}

duet_status_t duet_st_writer_finish(duet_st_writer_t *w)
{
    duet_status_t st;

    if (w == NULL)
        return duet_error(DUET_ERR_INVALID, "safetensors writer: NULL");
    if (w->written != w->total) {
        st = duet_error(DUET_ERR_INVALID, "%s: %llu data bytes written, the header declares %llu",
                        w->path, (unsigned long long)w->written, (unsigned long long)w->total);
        duet_st_writer_abort(w);
        return st;
    }
    if (close(w->fd) != 0) {
        w->fd = -1;
        st = duet_error(DUET_ERR_IO, "%s: close: %s", w->tmp, strerror(errno));
        duet_st_writer_abort(w);
        return st;
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        st = duet_error(DUET_ERR_IO, "%s: rename from %s: %s", w->path, w->tmp, strerror(errno));
        duet_st_writer_abort(w);
        return st;
    }
    duet__st_writer_free(w);
    return DUET_OK;
}

duet_status_t duet_st_write_file(const char *path, const duet_st_write_tensor_t *tensors, size_t n)
{
    duet_st_writer_t *w;
    duet_status_t st = duet_st_writer_create(path, tensors, n, &w);

    if (st != DUET_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        size_t nb = duet__st_nbytes(&tensors[i]);
        if (nb > 0 && tensors[i].data == NULL) {
            st = duet_error(DUET_ERR_INVALID, "%s: tensor %s: no data", path, tensors[i].name);
            goto err_abort;
        }
        if ((st = duet_st_writer_append(w, tensors[i].data, nb)) != DUET_OK)
            goto err_abort;
    }
    return duet_st_writer_finish(w);

err_abort:
    duet_st_writer_abort(w);
    return st;
}
