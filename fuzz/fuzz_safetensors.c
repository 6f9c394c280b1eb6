/* The safetensors reader (model/safetensors.h) on arbitrary files: the
 * header length, the JSON header, dtypes, shapes and data offsets.
 *
 * Input: byte 0 bit 0 clear: the rest is one file (duet_st_open_file).
 * Set: a sharded directory: bytes 1-2 (little-endian) are the length L of
 * model.safetensors.index.json, the next L bytes are it, and the rest is
 * the shard "s.safetensors" (duet_st_open_dir).  Every tensor an open set
 * reports must lie inside its file: its first and last bytes are read.
 * Bit 1 set (and bit 0 clear): the FP8 loader's path -- bytes 1-2 are the
 * length L of config.json (a quantization_config, model/quant.h), the next
 * L bytes are it, and the rest is model.safetensors; duet_model_open binds
 * the weights, F8_E4M3 ones with their weight_scale tensors, whose values
 * it reads: an opened model's scales are read too. */
#include <string.h>

#include "engine/model.h"
#include "fuzz/fuzz.h"
#include "model/safetensors.h"

static char *duet__fuzz_single, *duet__fuzz_dir, *duet__fuzz_index, *duet__fuzz_shard;
static char *duet__fuzz_mdir, *duet__fuzz_mconfig, *duet__fuzz_mweights;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    duet__fuzz_single = duet_fuzz_path("single/model.safetensors");
    duet__fuzz_index = duet_fuzz_path("sharded/model.safetensors.index.json");
    duet__fuzz_shard = duet_fuzz_path("sharded/s.safetensors");
    duet__fuzz_dir = duet_fuzz_path("sharded");
    duet__fuzz_mconfig = duet_fuzz_path("fp8/config.json");
    duet__fuzz_mweights = duet_fuzz_path("fp8/model.safetensors");
    duet__fuzz_mdir = duet_fuzz_path("fp8");
    return 0;
}

static volatile unsigned char duet__fuzz_sink;

static void duet__fuzz_walk(const duet_st_set_t *set)
{
    size_t n = duet_st_count(set);
    for (size_t i = 0; i < n; i++) {
        const duet_st_tensor_t *t = duet_st_at(set, i);
        if (t == NULL || duet_st_find(set, t->name) != t)
            abort();
        if (t->nbytes > 0) {
            duet__fuzz_sink ^= ((const unsigned char *)t->data)[0];
            duet__fuzz_sink ^= ((const unsigned char *)t->data)[t->nbytes - 1];
        }
    }
    if (duet_st_at(set, n) != NULL)
        abort();
}

/* Every bound linear weight and scale of an opened model, first and last
 * bytes. */
static void duet__fuzz_model(const duet_model_t *m)
{
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const duet_layer_weights_t *w = &m->layers[l];
        const duet_st_tensor_t *ts[] = {w->wq,         w->wk,          w->wv,       w->wo,
                                        w->w_gate,     w->w_up,        w->w_down,   w->wq_scale,
                                        w->wk_scale,   w->wv_scale,    w->wo_scale, w->w_gate_scale,
                                        w->w_up_scale, w->w_down_scale};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
            if (ts[i] == NULL || ts[i]->nbytes == 0)
                continue;
            if (i >= 7 && ts[i - 7]->dtype != DUET_DTYPE_F8_E4M3)
                abort(); /* a scale only for an FP8 weight */
            duet__fuzz_sink ^= ((const unsigned char *)ts[i]->data)[0];
            duet__fuzz_sink ^= ((const unsigned char *)ts[i]->data)[ts[i]->nbytes - 1];
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    duet_st_set_t *set = NULL;
    duet_status_t st;

    if (size < 1)
        return 0;
    if ((data[0] & 3) == 2) {
        duet_model_t *m = NULL;
        if (size < 3)
            return 0;
        size_t clen = (size_t)data[1] | (size_t)data[2] << 8;
        if (clen > size - 3)
            clen = size - 3;
        duet_fuzz_write(duet__fuzz_mconfig, data + 3, clen);
        duet_fuzz_write(duet__fuzz_mweights, data + 3 + clen, size - 3 - clen);
        if (duet_model_open(duet__fuzz_mdir, &m) == DUET_OK) {
            duet__fuzz_model(m);
            duet_model_close(m);
        }
        return 0;
    }
    if ((data[0] & 1) == 0) {
        duet_fuzz_write(duet__fuzz_single, data + 1, size - 1);
        st = duet_st_open_file(duet__fuzz_single, &set);
    } else {
        if (size < 3)
            return 0;
        size_t ilen = (size_t)data[1] | (size_t)data[2] << 8;
        if (ilen > size - 3)
            ilen = size - 3;
        duet_fuzz_write(duet__fuzz_index, data + 3, ilen);
        duet_fuzz_write(duet__fuzz_shard, data + 3 + ilen, size - 3 - ilen);
        st = duet_st_open_dir(duet__fuzz_dir, &set);
    }
    if (st == DUET_OK) {
        duet__fuzz_walk(set);
        duet_st_close(set);
    }
    return 0;
}
