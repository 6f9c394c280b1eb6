/* JSON helpers over cJSON and the declarative config table.
 *
 * A config section is described by a table of duet_cfg_field_t (name, type,
 * offset into the target struct, default, range, doc), in the manner of
 * Valkey's config table.  duet_cfg_parse() validates a JSON object against
 * the table once: unknown keys, wrong types and out-of-range values are
 * DUET_ERR_CONFIG with a message naming the full key path
 * ("prefill[1].tp: 3 is out of range 1..8"). */
#ifndef DUET_COMMON_JSON_H
#define DUET_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "common/status.h"

/* Read and parse a JSON file.  On failure the message names the file and,
 * for syntax errors, the line and column. Free with cJSON_Delete. */
duet_status_t duet_json_load_file(const char *path, cJSON **root_p);

/* Parse a JSON text of len bytes; errors name `what` and the position. */
duet_status_t duet_json_parse(const char *text, size_t len, const char *what, cJSON **root_p);

/* Read a whole file into a NUL-terminated buffer (free with duet_free).
 * Only a regular file: a FIFO, device or directory is DUET_ERR_IO naming
 * the path and its type, without blocking. */
duet_status_t duet_file_read(const char *path, char **data_p, size_t *len_p);

typedef enum {
    DUET_CFG_INT,    /* int */
    DUET_CFG_I64,    /* int64_t */
    DUET_CFG_DOUBLE, /* double */
    DUET_CFG_BOOL,   /* bool */
    DUET_CFG_STRING, /* char *, owned (duet_strdup); freed by duet_cfg_free */
    DUET_CFG_CUSTOM, /* parsed by .parse */
} duet_cfg_type_t;

typedef struct duet_cfg_field duet_cfg_field_t;

/* Custom parser: item is the JSON value, field points into the target
 * struct, path is the full key path for messages. */
typedef duet_status_t (*duet_cfg_parse_cb)(const cJSON *item, void *field, const char *path);

struct duet_cfg_field {
    const char *name;
    duet_cfg_type_t type;
    size_t offset;
    double min;      /* numeric range, inclusive */
    double max;
    double def_num;  /* numeric/bool default */
    const char *def_str; /* string default (may be NULL) */
    const char *doc;
    duet_cfg_parse_cb parse;
};

#define DUET_CFG_F_INT(st, fld, lo, hi, def, doc)                                                  \
    {#fld, DUET_CFG_INT, offsetof(st, fld), (lo), (hi), (def), NULL, (doc), NULL}
#define DUET_CFG_F_I64(st, fld, lo, hi, def, doc)                                                  \
    {#fld, DUET_CFG_I64, offsetof(st, fld), (lo), (hi), (def), NULL, (doc), NULL}
#define DUET_CFG_F_DOUBLE(st, fld, lo, hi, def, doc)                                               \
    {#fld, DUET_CFG_DOUBLE, offsetof(st, fld), (lo), (hi), (def), NULL, (doc), NULL}
#define DUET_CFG_F_BOOL(st, fld, def, doc)                                                         \
    {#fld, DUET_CFG_BOOL, offsetof(st, fld), 0, 1, (def), NULL, (doc), NULL}
#define DUET_CFG_F_STRING(st, fld, def, doc)                                                       \
    {#fld, DUET_CFG_STRING, offsetof(st, fld), 0, 0, 0, (def), (doc), NULL}
#define DUET_CFG_F_CUSTOM(st, fld, cb, doc)                                                        \
    {#fld, DUET_CFG_CUSTOM, offsetof(st, fld), 0, 0, 0, NULL, (doc), (cb)}

/* Store every field's default into obj (strings are duplicated). */
duet_status_t duet_cfg_defaults(const duet_cfg_field_t *fields, size_t n, void *obj);

/* Validate `json` (must be an object) against the table and store the
 * values into obj over the defaults already there.  `path` prefixes key
 * names in messages ("" for the top level). */
duet_status_t duet_cfg_parse(const cJSON *json, const char *path, const duet_cfg_field_t *fields,
                             size_t n, void *obj);

/* Set one field from a string, as given on a command line (--tp 4).
 * Unknown names are DUET_ERR_NOT_FOUND. */
duet_status_t duet_cfg_set_str(const duet_cfg_field_t *fields, size_t n, void *obj,
                               const char *name, const char *value);

/* Print one line per field: prefix + name, type, default, range (integer
 * fields' numbers as integers) and doc, as --help shows them. */
void duet_cfg_describe(FILE *out, const char *prefix, const duet_cfg_field_t *fields, size_t n);

/* Free the STRING fields of obj. */
void duet_cfg_free(const duet_cfg_field_t *fields, size_t n, void *obj);

/* Typed getters for ad-hoc JSON (model config.json...).  Missing key:
 * DUET_ERR_NOT_FOUND without touching *out; wrong type: DUET_ERR_FORMAT
 * naming `what` and the key. */
duet_status_t duet_json_get_int(const cJSON *obj, const char *key, const char *what, int64_t *out);
duet_status_t duet_json_get_double(const cJSON *obj, const char *key, const char *what,
                                   double *out);
duet_status_t duet_json_get_bool(const cJSON *obj, const char *key, const char *what, bool *out);
/* Returned string points into obj. */
duet_status_t duet_json_get_string(const cJSON *obj, const char *key, const char *what,
                                   const char **out);

#endif
