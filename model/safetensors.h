/* Memory-mapped safetensors checkpoints, single file or sharded
 * (model.safetensors.index.json).
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
 * then the data region; offsets are relative to the data region.  Every
 * offset, size and dtype is validated at open: a truncated file, a bad
 * header, overlapping or out-of-bounds tensors are DUET_ERR_FORMAT naming the
 * file (and tensor); a missing file is DUET_ERR_NOT_FOUND; a valid
 * safetensors dtype duet does not handle (F64, I8, F8_E5M2, ...)
 * DUET_ERR_UNSUPPORTED; F8_E4M3 (FP8 checkpoints' weights) is read.
 * Gaps between tensors are accepted.  Tensor data is only as aligned as the
 * file makes it (the data region starts 8-byte aligned in files written by
 * Hugging Face or duet_st_write_file). */
#ifndef DUET_MODEL_SAFETENSORS_H
#define DUET_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/dtype.h"

#define DUET_ST_MAX_DIMS 4

typedef struct {
    const char *name;
    const char *file; /* path of the file holding it */
    duet_dtype_t dtype;
    int ndim;
    int64_t shape[DUET_ST_MAX_DIMS];
    const void *data; /* inside the read-only mapping */
    size_t nbytes;
} duet_st_tensor_t;

typedef struct duet_st_set duet_st_set_t;

/* Open every safetensors file of a model directory: DIR/model.safetensors,
 * or (when that is absent, as transformers decides) the shards listed in
 * DIR/model.safetensors.index.json `weight_map`.  Each shard is mapped once
 * and must hold exactly the tensors the index maps to it; a tensor in two
 * files, or listed but absent, is DUET_ERR_FORMAT.  Free with
 * duet_st_close(). */
duet_status_t duet_st_open_dir(const char *dir, duet_st_set_t **set_p);

/* Open one file. */
duet_status_t duet_st_open_file(const char *path, duet_st_set_t **set_p);

void duet_st_close(duet_st_set_t *set);

/* NULL when absent (binary search).  The pointer is valid until
 * duet_st_close().  A set is immutable once open: safe to share. */
const duet_st_tensor_t *duet_st_find(const duet_st_set_t *set, const char *name);

/* All tensors of all files, sorted by name; duet_st_at is NULL past the
 * end. */
size_t duet_st_count(const duet_st_set_t *set);
const duet_st_tensor_t *duet_st_at(const duet_st_set_t *set, size_t i);

/* Writer, for duet mkmodel and tests. */
typedef struct {
    const char *name;
    duet_dtype_t dtype;
    int ndim;
    int64_t shape[DUET_ST_MAX_DIMS];
    const void *data; /* nbytes = prod(shape) * dtype size */
} duet_st_write_tensor_t;

/* Write tensors to path (atomically: temp file + rename).  Tensors are laid
 * out in the given order with no gaps; the header is padded with spaces to
 * a multiple of 8 bytes.  Bad names (empty, duplicate, "__metadata__"),
 * dtypes or shapes are DUET_ERR_INVALID; I/O failures DUET_ERR_IO naming
 * the path.  Not durable against power loss (no fsync). */
duet_status_t duet_st_write_file(const char *path, const duet_st_write_tensor_t *tensors,
                                 size_t n);

/* Streaming writer, for checkpoints too large to hold in memory: create
 * with the tensor list (the .data fields are ignored), then append every
 * tensor's bytes in list order (in pieces of any size), then finish, which
 * checks the byte count and renames the temp file into place.  abort
 * removes the temp file.  finish and abort free the writer (both accept
 * NULL).  One thread at a time. */
typedef struct duet_st_writer duet_st_writer_t;

duet_status_t duet_st_writer_create(const char *path, const duet_st_write_tensor_t *tensors,
                                    size_t n, duet_st_writer_t **writer_p);
duet_status_t duet_st_writer_append(duet_st_writer_t *writer, const void *data, size_t nbytes);
duet_status_t duet_st_writer_finish(duet_st_writer_t *writer);
void duet_st_writer_abort(duet_st_writer_t *writer);

#endif
