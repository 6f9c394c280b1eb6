/* safetensors reader: mmap every file, validate every header entry against
 * the file it describes, keep one name-sorted table for all files.
 *
 * Gaps between tensors in the data region are accepted (the format does not
 * need them, but they are harmless); overlaps are not.  Tensor data is not
 * aligned beyond what the file gives: the data region starts 8-byte aligned
 * when the writer padded the header as Hugging Face does. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/alloc.h"
#include "common/json.h"

#define DUET_ST_SINGLE_NAME "model.safetensors"
#define DUET_ST_INDEX_NAME  "model.safetensors.index.json"
/* The reference implementation refuses headers above 100 MB as well. */
#define DUET_ST_MAX_HEADER ((uint64_t)100 << 20)
/* Largest integer a JSON number (a double) holds exactly. */
#define DUET_ST_MAX_JSON_INT 9007199254740992.0

typedef struct {
    char *path;
    void *map;
    size_t size;
    char *names; /* this file's tensor names, NUL-separated */
} duet__st_file_t;

typedef struct {
    duet_st_tensor_t t;
    size_t file;    /* index into set->files */
    uint64_t begin; /* offset in the data region */
} duet__st_entry_t;

struct duet_st_set {
    duet__st_file_t *files;
    size_t n_files;
    duet__st_entry_t *entries; /* sorted by name once the set is open */
    size_t n;
};

typedef struct {
    const char *tensor;
    const char *shard;
} duet__st_pair_t;

static void duet__st_shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, size - off, "[");
    for (int i = 0; i < ndim && off < size; i++)
        off +=
            (size_t)snprintf(buf + off, size - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < size)
        snprintf(buf + off, size - off, "]");
}

/* A non-negative integer that a JSON number holds exactly. */
static int duet__st_json_uint(const cJSON *it, uint64_t *out)
{
    if (!cJSON_IsNumber(it))
        return 0;
    double v = it->valuedouble;
    if (!(v >= 0) || v != floor(v) || v > DUET_ST_MAX_JSON_INT)
        return 0;
    *out = (uint64_t)v;
    return 1;
}

static int duet__st_known_foreign_dtype(const char *s)
{
    static const char *const names[] = {"F64",     "I8",      "U8",      "I16",     "U16",
                                        "U32",     "U64",     "BOOL",    "F8_E5M2", "F4",
                                        "F6_E2M3", "F6_E3M2", "F8_E8M0", "C64"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(s, names[i]) == 0)
            return 1;
    }
    return 0;
}

static duet_status_t duet__st_entry_parse(const char *path, const char *name, const cJSON *item,
                                          uint64_t data_size, duet__st_entry_t *e)
{
    const cJSON *dtype, *shape, *offs, *dim;
    uint64_t begin, end, count = 1, need;
    size_t esz;
    int dt, ndim = 0;
    char sbuf[128];

    if (!cJSON_IsObject(item))
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: entry is not an object", path, name);
    dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (dtype == NULL)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: missing dtype", path, name);
    if (shape == NULL)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: missing shape", path, name);
    if (offs == NULL)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: missing data_offsets", path, name);
    if (!cJSON_IsString(dtype))
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: dtype is not a string", path, name);
    dt = duet_dtype_parse(dtype->valuestring);
    if (dt < 0 && duet__st_known_foreign_dtype(dtype->valuestring))
        return duet_error(
            DUET_ERR_UNSUPPORTED,
            "%s: tensor %s: dtype %s is not supported (F32, F16, BF16, I32, I64, F8_E4M3)", path,
            name, dtype->valuestring);
    if (dt < 0)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: unknown dtype \"%s\"", path, name,
                          dtype->valuestring);
    esz = duet_dtype_size((duet_dtype_t)dt);

    if (!cJSON_IsArray(shape))
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: shape is not an array", path, name);
    if (cJSON_GetArraySize(shape) > DUET_ST_MAX_DIMS)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: shape has %d dimensions, more than %d",
                          path, name, cJSON_GetArraySize(shape), DUET_ST_MAX_DIMS);
    cJSON_ArrayForEach(dim, shape)
    {
        uint64_t d;
        if (!duet__st_json_uint(dim, &d))
            return duet_error(DUET_ERR_FORMAT,
                              "%s: tensor %s: shape[%d] is not a non-negative integer", path, name,
                              ndim);
        if (d != 0 && count > UINT64_MAX / d)
            return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: shape overflows", path, name);
        count *= d;
        e->t.shape[ndim++] = (int64_t)d;
    }
    e->t.ndim = ndim;
    duet__st_shape_str(sbuf, sizeof(sbuf), ndim, e->t.shape);

    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !duet__st_json_uint(cJSON_GetArrayItem(offs, 0), &begin) ||
        !duet__st_json_uint(cJSON_GetArrayItem(offs, 1), &end))
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: data_offsets is not two non-negative integers", path,
                          name);
    if (end < begin)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: data_offsets [%llu, %llu] end before begin", path, name,
                          (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: data_offsets [%llu, %llu] exceed data size %llu", path,
                          name, (unsigned long long)begin, (unsigned long long)end,
                          (unsigned long long)data_size);
    if (count > UINT64_MAX / esz)
        return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: shape overflows", path, name);
    need = count * esz;
    if (end - begin != need)
        return duet_error(DUET_ERR_FORMAT,
                          "%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes, shape %s %s "
                          "needs %llu",
                          path, name, (unsigned long long)begin, (unsigned long long)end,
                          (unsigned long long)(end - begin), sbuf, dtype->valuestring,
                          (unsigned long long)need);
    e->t.dtype = (duet_dtype_t)dt;
    e->t.nbytes = (size_t)need;
    e->begin = begin;
    return DUET_OK;
}

static int duet__st_cmp_begin(const void *a, const void *b)
{
    const duet__st_entry_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->t.nbytes > y->t.nbytes) - (x->t.nbytes < y->t.nbytes);
}

static int duet__st_cmp_name(const void *a, const void *b)
{
    const duet__st_entry_t *x = a, *y = b;
    return strcmp(x->t.name, y->t.name);
}

/* Validate the header of set->files[fi] and append its tensors. */
static duet_status_t duet__st_file_parse(duet_st_set_t *set, size_t fi)
{
    duet__st_file_t *f = &set->files[fi];
    const unsigned char *p = f->map;
    const char *text, *end = NULL;
    const unsigned char *data;
    uint64_t hlen = 0, data_size;
    size_t count = 0, names_len = 0, first = set->n, off = 0;
    duet__st_entry_t *entries;
    const cJSON *item;
    cJSON *root;
    duet_status_t st = DUET_OK;

    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | p[i];
    if (hlen > f->size - 8)
        return duet_error(DUET_ERR_FORMAT, "%s: header length %llu exceeds the file size %zu",
                          f->path, (unsigned long long)hlen, f->size);
    if (hlen > DUET_ST_MAX_HEADER)
        return duet_error(DUET_ERR_FORMAT, "%s: header length %llu is above the %llu limit",
                          f->path, (unsigned long long)hlen,
                          (unsigned long long)DUET_ST_MAX_HEADER);
    text = (const char *)p + 8;
    data = p + 8 + hlen;
    data_size = f->size - 8 - hlen;
    root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    if (root == NULL) {
        size_t at = (end != NULL && end >= text) ? (size_t)(end - text) : 0;
        return duet_error(DUET_ERR_FORMAT, "%s: header is not valid JSON (near byte %zu)", f->path,
                          at);
    }
    for (const char *q = end; q < text + hlen; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            st = duet_error(DUET_ERR_FORMAT, "%s: header has data after the JSON object", f->path);
            goto err_free_json;
        }
    }
    if (!cJSON_IsObject(root)) {
        st = duet_error(DUET_ERR_FORMAT, "%s: header is not a JSON object", f->path);
        goto err_free_json;
    }
    cJSON_ArrayForEach(item, root)
    {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(item)) {
                st = duet_error(DUET_ERR_FORMAT, "%s: __metadata__ is not an object", f->path);
                goto err_free_json;
            }
            continue;
        }
        count++;
        names_len += strlen(item->string) + 1;
    }
    f->names = duet_malloc(names_len);
    entries = duet_realloc(set->entries, (set->n + count) * sizeof(*entries));
    if (f->names == NULL || entries == NULL) {
        if (entries != NULL)
            set->entries = entries;
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory for %zu tensors", f->path, count);
        goto err_free_json;
    }
    set->entries = entries;
    cJSON_ArrayForEach(item, root)
    {
        duet__st_entry_t *e = &set->entries[set->n];
        size_t len;
        if (strcmp(item->string, "__metadata__") == 0)
            continue;
        memset(e, 0, sizeof(*e));
        st = duet__st_entry_parse(f->path, item->string, item, data_size, e);
        if (st != DUET_OK)
            goto err_free_json;
        len = strlen(item->string) + 1;
        memcpy(f->names + off, item->string, len);
        e->t.name = f->names + off;
        off += len;
        e->t.file = f->path;
        e->t.data = data + e->begin;
        e->file = fi;
        set->n++;
    }
    cJSON_Delete(root);

    qsort(set->entries + first, count, sizeof(*entries), duet__st_cmp_begin);
    for (size_t i = first + 1; i < set->n; i++) {
        const duet__st_entry_t *a = &set->entries[i - 1], *b = &set->entries[i];
        if (a->t.nbytes > 0 && b->t.nbytes > 0 && b->begin < a->begin + a->t.nbytes)
            return duet_error(
                DUET_ERR_FORMAT, "%s: tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", f->path,
                a->t.name, (unsigned long long)a->begin,
                (unsigned long long)(a->begin + a->t.nbytes), b->t.name,
                (unsigned long long)b->begin, (unsigned long long)(b->begin + b->t.nbytes));
    }
    return DUET_OK;

err_free_json:
    cJSON_Delete(root);
    return st;
}

/* Map path and append its tensors to the set; on failure the file stays in
 * the set (if it got that far) and is released by duet_st_close(). */
static duet_status_t duet__st_file_add(duet_st_set_t *set, const char *path)
{
    duet__st_file_t *files, *f;
    struct stat sb;
    duet_status_t st;
    int fd;

    files = duet_realloc(set->files, (set->n_files + 1) * sizeof(*files));
    if (files == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    set->files = files;
    f = &files[set->n_files];
    memset(f, 0, sizeof(*f));
    if ((f->path = duet_strdup(path)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    /* O_NONBLOCK: a FIFO in place of the file must not block the open;
     * fstat below refuses anything but a regular file */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        st = duet_error(errno == ENOENT ? DUET_ERR_NOT_FOUND : DUET_ERR_IO, "%s: %s", path,
                        strerror(errno));
        goto err_free_path;
    }
    if (fstat(fd, &sb) != 0) {
        st = duet_error(DUET_ERR_IO, "%s: %s", path, strerror(errno));
        goto err_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = duet_error(DUET_ERR_FORMAT, "%s: not a regular file (%s)", path,
                        S_ISFIFO(sb.st_mode)  ? "a FIFO"
                        : S_ISDIR(sb.st_mode) ? "a directory"
                                              : "a device or socket");
        goto err_close;
    }
    if (sb.st_size < 8) {
        st = duet_error(DUET_ERR_FORMAT,
                        "%s: file is %lld bytes, shorter than the 8-byte header length", path,
                        (long long)sb.st_size);
        goto err_close;
    }
    f->size = (size_t)sb.st_size;
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st = duet_error(DUET_ERR_IO, "%s: mmap of %zu bytes: %s", path, f->size, strerror(errno));
        goto err_close;
    }
    close(fd);
    set->n_files++;
    return duet__st_file_parse(set, set->n_files - 1);

err_close:
    close(fd);
err_free_path:
    duet_free(f->path);
    return st;
}

/* Sort by name and refuse a name that appears twice. */
static duet_status_t duet__st_set_finish(duet_st_set_t *set)
{
    qsort(set->entries, set->n, sizeof(*set->entries), duet__st_cmp_name);
    for (size_t i = 1; i < set->n; i++) {
        const duet__st_entry_t *a = &set->entries[i - 1], *b = &set->entries[i];
        if (strcmp(a->t.name, b->t.name) != 0)
            continue;
        if (a->file == b->file)
            return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: listed twice in the header",
                              a->t.file, a->t.name);
        return duet_error(DUET_ERR_FORMAT, "tensor %s: present in both %s and %s", a->t.name,
                          a->t.file, b->t.file);
    }
    return DUET_OK;
}

duet_status_t duet_st_open_file(const char *path, duet_st_set_t **set_p)
{
    duet_st_set_t *set = DUET_NEW(duet_st_set_t);
    duet_status_t st;

    if (set == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    st = duet__st_file_add(set, path);
    if (st == DUET_OK)
        st = duet__st_set_finish(set);
    if (st != DUET_OK) {
        duet_st_close(set);
        return st;
    }
    *set_p = set;
    return DUET_OK;
}

static int duet__st_cmp_pair(const void *a, const void *b)
{
    return strcmp(((const duet__st_pair_t *)a)->tensor, ((const duet__st_pair_t *)b)->tensor);
}

static int duet__st_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static duet_status_t duet__st_join(char *buf, size_t size, const char *dir, const char *name)
{
    int n = snprintf(buf, size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= size)
        return duet_error(DUET_ERR_INVALID, "%s/%s: path too long", dir, name);
    return DUET_OK;
}

/* A shard name must stay inside the model directory. */
static int duet__st_shard_name_ok(const char *s)
{
    if (s[0] == '\0' || s[0] == '/')
        return 0;
    for (const char *c = s; *c; c++) {
        if ((c == s || c[-1] == '/') && c[0] == '.' && c[1] == '.' && (c[2] == '/' || !c[2]))
            return 0;
    }
    return 1;
}

/* Every (tensor, shard) pair of the index must be exactly the set's
 * content: shards[] (sorted) are the opened files in order. */
static duet_status_t duet__st_index_check(const duet_st_set_t *set, const char *index_path,
                                          const duet__st_pair_t *pairs, size_t n_pairs,
                                          const char **shards, size_t n_shards)
{
    for (size_t i = 0; i < n_pairs; i++) {
        const duet_st_tensor_t *t = duet_st_find(set, pairs[i].tensor);
        const char **sp =
            bsearch(&pairs[i].shard, shards, n_shards, sizeof(*shards), duet__st_cmp_str);
        size_t fi = (size_t)(sp - shards);
        if (t == NULL)
            return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: listed in %s but absent from it",
                              set->files[fi].path, pairs[i].tensor, index_path);
        if (((const duet__st_entry_t *)t)->file != fi)
            return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: %s maps it to %s", t->file, t->name,
                              index_path, pairs[i].shard);
    }
    if (set->n == n_pairs)
        return DUET_OK;
    for (size_t i = 0; i < set->n; i++) {
        duet__st_pair_t key = {set->entries[i].t.name, NULL};
        if (bsearch(&key, pairs, n_pairs, sizeof(*pairs), duet__st_cmp_pair) == NULL)
            return duet_error(DUET_ERR_FORMAT, "%s: tensor %s: not listed in %s",
                              set->entries[i].t.file, set->entries[i].t.name, index_path);
    }
    return duet_error(DUET_ERR_INTERNAL, "%s: tensor count mismatch", index_path);
}

static duet_status_t duet__st_open_index(const char *dir, const char *index_path,
                                         duet_st_set_t **set_p)
{
    char path[PATH_MAX];
    const cJSON *wm, *item;
    duet__st_pair_t *pairs;
    const char **shards;
    duet_st_set_t *set;
    size_t n = 0, n_shards = 0;
    cJSON *root;
    duet_status_t st = duet_json_load_file(index_path, &root);

    if (st != DUET_OK)
        return st;
    wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || wm->child == NULL) {
        st = duet_error(DUET_ERR_FORMAT, "%s: weight_map: missing, empty or not an object",
                        index_path);
        goto err_free_json;
    }
    cJSON_ArrayForEach(item, wm) n++;
    pairs = DUET_NEW_ARRAY(duet__st_pair_t, n);
    shards = DUET_NEW_ARRAY(const char *, n);
    set = DUET_NEW(duet_st_set_t);
    if (pairs == NULL || shards == NULL || set == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", index_path);
        goto err_free_arrays;
    }
    n = 0;
    cJSON_ArrayForEach(item, wm)
    {
        if (!cJSON_IsString(item) || !duet__st_shard_name_ok(item->valuestring)) {
            st = duet_error(DUET_ERR_FORMAT,
                            "%s: weight_map.%s: expected a file name inside the model directory",
                            index_path, item->string);
            goto err_free_arrays;
        }
        pairs[n].tensor = item->string;
        pairs[n].shard = item->valuestring;
        shards[n] = item->valuestring;
        n++;
    }
    qsort(pairs, n, sizeof(*pairs), duet__st_cmp_pair);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(pairs[i - 1].tensor, pairs[i].tensor) == 0) {
            st = duet_error(DUET_ERR_FORMAT, "%s: weight_map: tensor %s listed twice", index_path,
                            pairs[i].tensor);
            goto err_free_arrays;
        }
    }
    qsort(shards, n, sizeof(*shards), duet__st_cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (n_shards == 0 || strcmp(shards[n_shards - 1], shards[i]) != 0)
            shards[n_shards++] = shards[i];
    }
    for (size_t i = 0; i < n_shards; i++) {
        if ((st = duet__st_join(path, sizeof(path), dir, shards[i])) != DUET_OK)
            goto err_free_arrays;
        if ((st = duet__st_file_add(set, path)) != DUET_OK) {
            if (set->n_files == i) /* the shard itself could not be opened */
                duet_error_wrap(st, "%s: shard %s: ", index_path, shards[i]);
            goto err_free_arrays;
        }
    }
    if ((st = duet__st_set_finish(set)) != DUET_OK)
        goto err_free_arrays;
    if ((st = duet__st_index_check(set, index_path, pairs, n, shards, n_shards)) != DUET_OK)
        goto err_free_arrays;
    duet_free(shards);
    duet_free(pairs);
    cJSON_Delete(root);
    *set_p = set;
    return DUET_OK;

err_free_arrays:
    duet_st_close(set);
    duet_free(shards);
    duet_free(pairs);
err_free_json:
    cJSON_Delete(root);
    return st;
}

duet_status_t duet_st_open_dir(const char *dir, duet_st_set_t **set_p)
{
    char single[PATH_MAX], index[PATH_MAX];
    struct stat sb;
    duet_status_t st;

    if ((st = duet__st_join(single, sizeof(single), dir, DUET_ST_SINGLE_NAME)) != DUET_OK ||
        (st = duet__st_join(index, sizeof(index), dir, DUET_ST_INDEX_NAME)) != DUET_OK)
        return st;
    /* Same precedence as transformers: the single file wins. */
    if (stat(single, &sb) == 0)
        return duet_st_open_file(single, set_p);
    if (stat(index, &sb) == 0)
        return duet__st_open_index(dir, index, set_p);
    return duet_error(DUET_ERR_NOT_FOUND, "%s: no %s or %s", dir, DUET_ST_SINGLE_NAME,
                      DUET_ST_INDEX_NAME);
}

void duet_st_close(duet_st_set_t *set)
{
    if (set == NULL)
        return;
    for (size_t i = 0; i < set->n_files; i++) {
        if (set->files[i].map != NULL)
            munmap(set->files[i].map, set->files[i].size);
        duet_free(set->files[i].names);
        duet_free(set->files[i].path);
    }
    duet_free(set->files);
    duet_free(set->entries);
    duet_free(set);
}

const duet_st_tensor_t *duet_st_find(const duet_st_set_t *set, const char *name)
{
    size_t lo = 0, hi = set->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, set->entries[mid].t.name);
        if (c == 0)
            return &set->entries[mid].t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t duet_st_count(const duet_st_set_t *set)
{
    return set->n;
}

const duet_st_tensor_t *duet_st_at(const duet_st_set_t *set, size_t i)
{
    return i < set->n ? &set->entries[i].t : NULL;
}
