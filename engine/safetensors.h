/* Memory-mapped safetensors checkpoints, single file or sharded
 * (model.safetensors.index.json).
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
 * then the data region; offsets are relative to the data region.  Every
 * offset, size and dtype is validated at open: a truncated file, a bad
 * header, overlapping or out-of-bounds tensors are DUET_ERR_FORMAT naming the
 * file (and tensor). */
#ifndef DUET_ENGINE_SAFETENSORS_H
#define DUET_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "engine/dtype.h"

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
 * or the shards listed in DIR/model.safetensors.index.json (each shard must
 * hold exactly the tensors the index maps to it).  Free with
 * duet_st_close(). */
duet_status_t duet_st_open_dir(const char *dir, duet_st_set_t **set_p);

/* Open one file. */
duet_status_t duet_st_open_file(const char *path, duet_st_set_t **set_p);

void duet_st_close(duet_st_set_t *set);

/* NULL when absent. The pointer is valid until duet_st_close(). */
const duet_st_tensor_t *duet_st_find(const duet_st_set_t *set, const char *name);

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

/* Write tensors to path (atomically: temp file + rename). */
duet_status_t duet_st_write_file(const char *path, const duet_st_write_tensor_t *tensors,
                                 size_t n);

#endif
