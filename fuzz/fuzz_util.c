/* Helpers shared by the harnesses (fuzz/fuzz.h). */
#include "fuzz/fuzz.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "tokenizer/tokenizer.h"

char *duet_fuzz_next(duet_fuzz_cut_t *c, uint8_t sep, size_t *len_p)
{
    if (c->p == NULL)
        return NULL;
    const uint8_t *end = memchr(c->p, sep, c->left);
    size_t n = end ? (size_t)(end - c->p) : c->left;
    char *s = malloc(n + 1);
    if (s == NULL)
        abort();
    memcpy(s, c->p, n);
    s[n] = '\0';
    if (end != NULL) {
        c->p = end + 1;
        c->left -= n + 1;
    } else {
        c->p = NULL;
        c->left = 0;
    }
    if (len_p != NULL)
        *len_p = n;
    return s;
}

static char duet__fuzz_scratch[512];

static int duet__fuzz_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void duet__fuzz_cleanup(void)
{
    if (duet__fuzz_scratch[0] != '\0')
        nftw(duet__fuzz_scratch, duet__fuzz_rm, 16, FTW_DEPTH | FTW_PHYS);
}

char *duet_fuzz_path(const char *rel)
{
    const char *tmp = getenv("TMPDIR");
    char path[512];

    snprintf(path, sizeof(path), "%s/duet-fuzz-%d", tmp && tmp[0] ? tmp : "/tmp", (int)getpid());
    if (duet__fuzz_scratch[0] == '\0') {
        snprintf(duet__fuzz_scratch, sizeof(duet__fuzz_scratch), "%s", path);
        atexit(duet__fuzz_cleanup);
    }
    mkdir(path, 0700);
    for (const char *s = rel; (s = strchr(s, '/')) != NULL; s++) {
        snprintf(path, sizeof(path), "%s/duet-fuzz-%d/%.*s", tmp && tmp[0] ? tmp : "/tmp",
                 (int)getpid(), (int)(s - rel), rel);
        mkdir(path, 0700);
    }
    snprintf(path, sizeof(path), "%s/duet-fuzz-%d/%s", tmp && tmp[0] ? tmp : "/tmp", (int)getpid(),
             rel);
    char *out = strdup(path);
    if (out == NULL)
        abort();
    return out;
}

void duet_fuzz_write(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || (size > 0 && write(fd, data, size) != (ssize_t)size)) {
        perror(path);
        abort();
    }
    close(fd);
}

struct duet_tokenizer *duet_fuzz_tokenizer(const char *rel_dir)
{
    char dir[512];
    duet_tokenizer_t *tok = NULL;

    snprintf(dir, sizeof(dir), "%s/%s", DUET_FUZZ_SOURCE_DIR, rel_dir);
    if (duet_tokenizer_load(dir, &tok) != DUET_OK) {
        fprintf(stderr, "fuzz: cannot load the tokenizer in %s\n", dir);
        abort();
    }
    return tok;
}

void duet_fuzz_quiet(void)
{
    duet_log_set_level(DUET_LOG_LEVEL_ERROR);
    if (getenv("DUET_FUZZ_VERBOSE") != NULL)
        duet_log_set_level(DUET_LOG_LEVEL_DEBUG);
}
