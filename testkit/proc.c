/* Children with a deadline, failure reports that name the child, and
 * length-prefixed messages over socketpairs. */
#include "testkit/testkit.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"

/* The name this process was spawned under: set once, right after fork. */
static char duet__who[32] = "parent";

void duet_testkit_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "[%s pid %d] FAIL: ", duet__who, (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

pid_t duet_testkit_spawn(const char *name, duet_testkit_child_cb fn, void *arg,
                         const int *close_fds, int n_close)
{
    pid_t pid;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        int rc;
        /* The test runner's crash handlers would resume the parent's test
         * loop inside the child: crash plainly instead. */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        signal(SIGILL, SIG_DFL);
        signal(SIGFPE, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        for (int i = 0; i < n_close; i++)
            if (close_fds[i] >= 0)
                close(close_fds[i]);
        snprintf(duet__who, sizeof(duet__who), "%s", name);
        rc = fn(arg);
        fflush(NULL);
        exit(rc == 0 ? 0 : 1);
    }
    return pid;
}

int duet_testkit_wait_all(const pid_t *pids, int n, int64_t deadline_ns, int *rc_out)
{
    int left = n, bad = 0;
    int done[DUET_TESTKIT_MAX_CHILD] = {0};
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            int status;
            if (done[i])
                continue;
            pid_t w = waitpid(pids[i], &status, WNOHANG);
            if (w == pids[i]) {
                done[i] = 1;
                left--;
                rc_out[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
        }
        if (left == 0)
            break;
        if (duet_now_ns() > deadline_ns) {
            for (int i = 0; i < n; i++) {
                if (done[i])
                    continue;
                fprintf(stderr, "[parent] child %d (pid %d) hung: killing it\n", i, (int)pids[i]);
                kill(pids[i], SIGKILL);
                waitpid(pids[i], NULL, 0);
                rc_out[i] = -1;
            }
            break;
        }
        usleep(2000);
    }
    for (int i = 0; i < n; i++)
        bad += rc_out[i] != 0;
    return bad;
}

/* Move all n bytes before the deadline: 0, or -1 on EOF, error or timeout. */
static int duet__io(int fd, void *buf, size_t n, int writing, int64_t deadline_ns)
{
    size_t off = 0;
    while (off < n) {
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        int64_t left = (deadline_ns - duet_now_ns()) / DUET_NS_PER_MS;
        ssize_t k;
        if (left <= 0)
            return -1;
        if (poll(&pfd, 1, (int)(left > 1000 ? 1000 : left)) <= 0)
            continue;
        k = writing ? write(fd, (char *)buf + off, n - off) : read(fd, (char *)buf + off, n - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        off += (size_t)k;
    }
    return 0;
}

int duet_testkit_chan_send(int fd, const void *buf, uint32_t len)
{
    int64_t dl = duet_deadline_in_ms(10000);
    if (duet__io(fd, &len, sizeof(len), 1, dl) != 0 ||
        (len && duet__io(fd, (void *)buf, len, 1, dl)))
        return -1;
    return 0;
}

int duet_testkit_chan_recv(int fd, void **buf_p, uint32_t *len_p, int timeout_ms)
{
    int64_t dl = duet_deadline_in_ms(timeout_ms);
    uint32_t len;
    char *buf;
    if (duet__io(fd, &len, sizeof(len), 0, dl) != 0 || len > (1u << 24))
        return -1;
    buf = duet_malloc((size_t)len + 1);
    if (buf == NULL || (len && duet__io(fd, buf, len, 0, dl) != 0)) {
        duet_free(buf);
        return -1;
    }
    buf[len] = '\0';
    *buf_p = buf;
    *len_p = len;
    return 0;
}

int duet_testkit_chan_say(int fd, const char *word)
{
    return duet_testkit_chan_send(fd, word, (uint32_t)strlen(word));
}

int duet_testkit_chan_expect(int fd, const char *word, int timeout_ms)
{
    void *buf;
    uint32_t len;
    int ok;
    if (duet_testkit_chan_recv(fd, &buf, &len, timeout_ms) != 0) {
        duet_testkit_fail("channel: no '%s' within %d ms", word, timeout_ms);
        return -1;
    }
    ok = len == strlen(word) && memcmp(buf, word, len) == 0;
    if (!ok)
        duet_testkit_fail("channel: got '%s', expected '%s'", (char *)buf, word);
    duet_free(buf);
    return ok ? 0 : -1;
}
