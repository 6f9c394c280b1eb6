#include "common/daemon.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

static void duet__usage(const char *prog, duet_role_t role)
{
    printf("usage: %s --config FILE --name NAME [--KEY VALUE ...]\n"
           "  --config FILE      the cluster config (JSON)\n"
           "  --name NAME        this %s instance's entry in the config\n"
           "  --model DIR        override the config's model directory\n"
           "  --check-config     validate the config and exit\n"
           "  --log-level LEVEL  error, warn, info, debug or trace\n"
           "  --auth-KEY VALUE   override an auth key (--auth-ca, --auth-cert, --auth-key,\n"
           "                     --auth-secret-file, --auth-server-name)\n"
           "  --KEY VALUE        override an instance key (e.g. --tp 2, --n-pages 512)\n\n",
           prog, duet_role_name(role));
    duet_cluster_describe(stdout);
}

uint64_t duet_random_u64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof(v), 0) == (ssize_t)sizeof(v))
        return v;
    return (uint64_t)duet_now_ns() ^ ((uint64_t)getpid() << 32);
}

duet_status_t duet_daemon_args_parse(int argc, char **argv, duet_role_t role,
                                     duet_daemon_args_t *args_p)
{
    const char *config = NULL, *name = NULL, *model = NULL;
    duet_daemon_args_t a;
    duet_status_t st;
    duet_role_t found_role;

    memset(&a, 0, sizeof(a));
    /* first pass: the flags that are not instance keys */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
            duet__usage(argv[0], role);
            return DUET_ERR_CANCELLED;
        }
        if (strcmp(f, "--check-config") == 0) {
            a.check_config = true;
            continue;
        }
        if (strncmp(f, "--", 2) != 0)
            return duet_error(DUET_ERR_CONFIG, "unexpected argument '%s'", f);
        if (i + 1 >= argc)
            return duet_error(DUET_ERR_CONFIG, "%s: needs a value", f);
        if (strcmp(f, "--config") == 0)
            config = argv[i + 1];
        else if (strcmp(f, "--name") == 0)
            name = argv[i + 1];
        else if (strcmp(f, "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(f, "--log-level") == 0) {
            int lvl = duet_log_level_parse(argv[i + 1]);
            if (lvl < 0)
                return duet_error(DUET_ERR_CONFIG, "--log-level: '%s' is not error, warn, "
                                                   "info, debug or trace", argv[i + 1]);
            duet_log_set_level((duet_log_level_t)lvl);
        }
        i++;
    }
    if (config == NULL)
        return duet_error(DUET_ERR_CONFIG, "--config: required (the cluster config file)");
    if (name == NULL)
        return duet_error(DUET_ERR_CONFIG, "--name: required (this instance's name in %s)",
                          config);
    if ((st = duet_cluster_load(config, &a.cluster)) != DUET_OK)
        return st;
    a.self = duet_cluster_find(a.cluster, name, &found_role);
    if (a.self == NULL || found_role != role) {
        st = duet_error(DUET_ERR_CONFIG, "--name: %s has no %s instance named '%s'", config,
                        duet_role_name(role), name);
        goto err;
    }
    a.role = role;
    if (model != NULL) {
        char *m = duet_strdup(model);
        if (m == NULL) {
            st = duet_error(DUET_ERR_NO_MEMORY, "no memory");
            goto err;
        }
        duet_free(a.cluster->model);
        a.cluster->model = m;
    }
    /* second pass: instance overrides */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        char key[64];
        if (strcmp(f, "--check-config") == 0)
            continue;
        if (strncmp(f, "--auth-", 7) == 0) {
            snprintf(key, sizeof(key), "%s", f + 7);
            for (char *p = key; *p; p++) {
                if (*p == '-')
                    *p = '_';
            }
            st = duet_cluster_auth_set(a.cluster, key, argv[i + 1]);
            if (st == DUET_ERR_NOT_FOUND)
                st = duet_error(DUET_ERR_CONFIG, "%s: unknown flag (not an auth key)", f);
            if (st != DUET_OK)
                goto err;
            i++;
            continue;
        }
        if (strcmp(f, "--config") == 0 || strcmp(f, "--name") == 0 ||
            strcmp(f, "--model") == 0 || strcmp(f, "--log-level") == 0) {
            i++;
            continue;
        }
        snprintf(key, sizeof(key), "%s", f + 2);
        for (char *p = key; *p; p++) {
            if (*p == '-')
                *p = '_';
        }
        if (strcmp(key, "name") == 0) {
            st = duet_error(DUET_ERR_CONFIG, "%s: cannot be overridden", f);
            goto err;
        }
        st = duet_cluster_instance_set(a.self, key, argv[i + 1]);
        if (st == DUET_ERR_NOT_FOUND) {
            st = duet_error(DUET_ERR_CONFIG, "%s: unknown flag (not an instance key)", f);
            goto err;
        }
        if (st != DUET_OK) {
            st = duet_error_wrap(st, "%s: ", f);
            goto err;
        }
        i++;
    }
    {
        char path[160];
        snprintf(path, sizeof(path), "%s[%s]", duet_role_name(role), name);
        if ((st = duet_cluster_instance_check(a.self, duet_role_name(role), path)) != DUET_OK)
            goto err;
    }
    if (a.self->listen == NULL || a.self->listen[0] == '\0') {
        st = duet_error(DUET_ERR_CONFIG, "%s[%s]: needs listen or address to serve on",
                        duet_role_name(role), name);
        goto err;
    }
    snprintf(a.instance_id, sizeof(a.instance_id), "%.20s-%016llx", name,
             (unsigned long long)duet_random_u64());
    *args_p = a;
    return DUET_OK;

err:
    duet_cluster_free(a.cluster);
    return st;
}

void duet_daemon_args_cleanup(duet_daemon_args_t *args)
{
    duet_cluster_free(args->cluster);
    args->cluster = NULL;
    args->self = NULL;
}

void duet_daemon_signals_block(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int duet_daemon_signal_wait(int64_t timeout_ms)
{
    sigset_t set;
    siginfo_t info;
    int sig;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (timeout_ms < 0) {
        do {
            sig = sigwaitinfo(&set, &info);
        } while (sig < 0 && errno == EINTR);
        return sig < 0 ? 0 : sig;
    }
    struct timespec ts = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
    sig = sigtimedwait(&set, &info, &ts);
    return sig < 0 ? 0 : sig;
}
