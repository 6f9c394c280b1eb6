/* Model files that are not regular files (issue 13): a FIFO in place of
 * model.safetensors, config.json, tokenizer.json or tokenizer_config.json
 * used to block the loader forever (open() of a FIFO waits for a writer).
 * Each loader must now refuse it at once with an error naming the file.
 * An alarm turns a hang into a failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/json.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json",
                                    "tokenizer_config.json"};

/* A copy of stories260K (symlinks) in a fresh directory, `fifo` replaced by
 * a FIFO. */
static void make_dir(char *dir, size_t cap, const char *fifo)
{
    const char *src = getenv("DUET_SOURCE_DIR");
    char from[1024], to[1024];

    if (src == NULL)
        fail_msg("DUET_SOURCE_DIR is not set (run through ctest)");
    snprintf(dir, cap, "/tmp/duet_input_files_XXXXXX");
    assert_non_null(mkdtemp(dir));
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(to, sizeof(to), "%s/%s", dir, files[i]);
        if (strcmp(files[i], fifo) == 0) {
            assert_int_equal(mkfifo(to, 0600), 0);
            continue;
        }
        snprintf(from, sizeof(from), "%s/models/stories260K/%s", src, files[i]);
        assert_int_equal(symlink(from, to), 0);
    }
}

static void remove_dir(const char *dir)
{
    char p[1024];
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void expect_refused(duet_status_t st, const char *file)
{
    if (st == DUET_OK)
        fail_msg("%s as a FIFO: accepted", file);
    if (strstr(duet_error_msg(), file) == NULL || strstr(duet_error_msg(), "a FIFO") == NULL)
        fail_msg("%s as a FIFO: '%s' does not name the file and its type", file, duet_error_msg());
}

static void test_fifo_safetensors(void **state)
{
    char dir[256];
    duet_st_set_t *set = NULL;
    (void)state;

    make_dir(dir, sizeof(dir), "model.safetensors");
    alarm(20);
    expect_refused(duet_st_open_dir(dir, &set), "model.safetensors");
    alarm(0);
    assert_null(set);
    remove_dir(dir);
}

static void test_fifo_config(void **state)
{
    char dir[256];
    duet_model_config_t cfg;
    (void)state;

    make_dir(dir, sizeof(dir), "config.json");
    alarm(20);
    expect_refused(duet_model_config_load(dir, &cfg), "config.json");
    alarm(0);
    remove_dir(dir);
}

static void test_fifo_tokenizer(void **state)
{
    char dir[256];
    duet_tokenizer_t *tok = NULL;
    (void)state;

    make_dir(dir, sizeof(dir), "tokenizer.json");
    alarm(20);
    expect_refused(duet_tokenizer_load(dir, &tok), "tokenizer.json");
    alarm(0);
    remove_dir(dir);
    make_dir(dir, sizeof(dir), "tokenizer_config.json");
    alarm(20);
    expect_refused(duet_tokenizer_load(dir, &tok), "tokenizer_config.json");
    alarm(0);
    remove_dir(dir);
    /* the regular files still load */
    make_dir(dir, sizeof(dir), "none");
    assert_int_equal(duet_tokenizer_load(dir, &tok), DUET_OK);
    duet_tokenizer_destroy(tok);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_safetensors),
        cmocka_unit_test(test_fifo_config),
        cmocka_unit_test(test_fifo_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
