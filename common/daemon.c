#include "common/daemon.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/random.h"

static void duet__usage(const char *prog, duet_role_t role, const duet_flag_t *flags, size_t n)
{
    printf("usage: %s --config FILE --name NAME [--KEY VALUE ...]   (a %s daemon)\n", prog,
           duet_role_name(role));
    duet_flags_help(stdout, flags, n);
    printf("  --auth-KEY VALUE      override an auth key (--auth-ca, --auth-cert, --auth-key,\n"
           "                        --auth-secret-file, --auth-server-name, --auth-clients,\n"
           "                        --auth-insecure)\n"
           "  --KEY VALUE           override an instance key (e.g. --tp 2, --n-pages 512)\n"
           "Flags take --KEY VALUE or --KEY=VALUE.\n\n");
    duet_cluster_describe(stdout);
}

/* The first pass takes every flag: the config is not loaded yet. */
static duet_status_t duet__daemon_defer(void *ud, const char *name, const char *value)
{
    (void)ud;
    (void)name;
    (void)value;
    return DUET_OK;
}

/* --auth-KEY / --KEY (with '-' or '_') on the loaded config. */
static duet_status_t duet__daemon_override(void *ud, const char *name, const char *value)
{
    duet_daemon_args_t *a = ud;
    bool auth = strncmp(name, "auth-", 5) == 0;
    char key[64];
    duet_status_t st;

    snprintf(key, sizeof(key), "%s", auth ? name + 5 : name);
    for (char *p = key; *p; p++) {
        if (*p == '-')
            *p = '_';
    }
    st = auth ? duet_cluster_auth_set(a->cluster, key, value)
              : duet_cluster_instance_set(a->self, key, value);
    if (st == DUET_ERR_NOT_FOUND)
        return duet_error(DUET_ERR_CONFIG, "--%s: unknown flag (not an %s key)", name,
                          auth ? "auth" : "instance");
    if (st != DUET_OK && !auth)
        return duet_error_wrap(st, "--%s: ", name);
    return st;
}

uint64_t duet_random_u64(void)
{
    uint64_t v;
    if (duet_random_bytes(&v, sizeof(v)) == DUET_OK)
        return v;
    return (uint64_t)duet_now_ns() ^ ((uint64_t)getpid() << 32);
}

duet_status_t duet_daemon_args_parse(int argc, char **argv, duet_role_t role,
                                     duet_daemon_args_t *args_p)
{
    const char *config = NULL, *name = NULL, *model = NULL;
    bool help = false;
    duet_daemon_args_t a;
    duet_status_t st;
    duet_role_t found_role;

    memset(&a, 0, sizeof(a));
    /* the flags every daemon has; the others are instance or auth keys
     * (duet__daemon_override) */
    const duet_flag_t flags[] = {
        {"config", DUET_FLAG_STRING, &config, .arg = "FILE", .help = "the cluster config (JSON)"},
        {"name", DUET_FLAG_STRING, &name, .arg = "NAME",
         .help = "this instance's entry in the config"},
        {"model", DUET_FLAG_STRING, &model, .arg = "DIR",
         .help = "override the config's model directory"},
        {"check-config", DUET_FLAG_TRUE, &a.check_config, .help = "validate the config and exit"},
        {"log-level", DUET_FLAG_FUNC, NULL, .fn = duet_flag_log_level, .arg = "LEVEL",
         .help = "error, warn, info, debug or trace"},
        {"help", DUET_FLAG_STOP, &help, .help = "this help (also -h)"},
    };
    /* first pass: the daemon's own flags; the others need the loaded config */
    st = duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, duet__daemon_defer, NULL);
    if (st != DUET_OK)
        return st;
    if (help) {
        duet__usage(argv[0], role, flags, DUET_FLAGS_N(flags));
        return DUET_ERR_CANCELLED;
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
    /* second pass: the instance and auth overrides, in order (the daemon's
     * own flags are set again to the same values) */
    st = duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, duet__daemon_override, &a);
    if (st != DUET_OK)
        goto err;
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

static void duet__signal_noop(int sig)
{
    (void)sig;
}

void duet_daemon_signals_block(void)
{
    sigset_t set;
    struct sigaction sa;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* A handler, never run (the signals stay blocked; sigwait takes them):
     * as PID 1 of a container's PID namespace (podman, Kubernetes without
     * an init) the kernel drops a signal whose disposition is SIG_DFL, and
     * `podman kube down`'s SIGTERM was lost: no drain, the process killed
     * at the end of the grace period with its streams (docs/deploy.md) */
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = duet__signal_noop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
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
