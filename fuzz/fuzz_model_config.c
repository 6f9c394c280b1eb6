/* config.json loading (model/model_config.h): the file as the daemons and
 * the router read it (duet_model_config_load on a directory).  What parses
 * must satisfy the invariants the engine relies on. */
#include <stdio.h>

#include "fuzz/fuzz.h"
#include "model/model_config.h"

static char *duet__fuzz_dir, *duet__fuzz_file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    duet__fuzz_file = duet_fuzz_path("model/config.json");
    duet__fuzz_dir = duet_fuzz_path("model");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    duet_model_config_t c;

    duet_fuzz_write(duet__fuzz_file, data, size);
    if (duet_model_config_load(duet__fuzz_dir, &c) != DUET_OK)
        return 0;
    if (c.hidden < 1 || c.n_layers < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.head_dim < 1 ||
        c.intermediate < 1 || c.vocab < 1 || c.max_pos < 1 || c.n_heads % c.n_kv_heads != 0 ||
        c.n_eos < 0 || c.n_eos > DUET_MAX_EOS_IDS || c.bos_id >= c.vocab || !(c.rope_theta > 0) ||
        !(c.rms_eps > 0)) {
        fprintf(stderr, "model config accepted with inconsistent fields\n");
        abort();
    }
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_ids[i] < 0 || c.eos_ids[i] >= c.vocab) {
            fprintf(stderr, "model config accepted an eos id outside the vocabulary\n");
            abort();
        }
    (void)duet_arch_name(c.arch);
    return 0;
}
