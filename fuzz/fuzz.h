/* Shared by the libFuzzer harnesses (fuzz/fuzz_NAME.c): the repository's data
 * directory (compiled in), quiet logs, and small input helpers. */
#ifndef DUET_FUZZ_FUZZ_H
#define DUET_FUZZ_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef DUET_FUZZ_SOURCE_DIR
#error "DUET_FUZZ_SOURCE_DIR must name the source tree (fuzz/CMakeLists.txt sets it)"
#endif

/* Every harness's entry point (libFuzzer). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* An input cut into pieces at a separator byte, as a cursor. */
typedef struct {
    const uint8_t *p;
    size_t left;
} duet_fuzz_cut_t;

/* The next piece up to sep (or the rest) as a NUL-terminated malloc'd copy;
 * *len_p its length.  NULL when nothing is left. */
char *duet_fuzz_next(duet_fuzz_cut_t *c, uint8_t sep, size_t *len_p);

/* "<TMPDIR or /tmp>/duet-fuzz-<pid>/rel" with its directories made (the
 * process's scratch space; malloc'd, made once at start-up). */
char *duet_fuzz_path(const char *rel);
/* Replace the file at path with data. */
void duet_fuzz_write(const char *path, const void *data, size_t size);

/* Load a tokenizer directory's files below DUET_FUZZ_SOURCE_DIR, aborting
 * when it cannot (a broken fixture is not a finding). */
struct duet_tokenizer;
struct duet_tokenizer *duet_fuzz_tokenizer(const char *rel_dir);

/* Silence duet's logs (findings are crashes, not messages). */
void duet_fuzz_quiet(void);

#endif
