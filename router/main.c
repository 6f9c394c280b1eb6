/* duet-router: the daemon's command line, signals and lifecycle.
 *
 *   duet-router --config FILE [--name router] [--http host:port]
 *               [--grpc host:port] [--policy P] [--check-config] ...
 *
 * Instances may be static (`address`) or discover groups (`discover:
 * "name:port"`, resolved every health interval: workers.h). --check-config
 * validates both kinds without resolving anything.
 *
 * SIGINT/SIGTERM: stop accepting, let in-flight requests finish within the
 * grace period (--grace-ms), cancel what is left, exit 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "common/daemon.h"
#include "common/flags.h"
#include "common/log.h"
#include "router/fleet/policy.h"
#include "router/router.h"

static const char *const duet__router_usage =
    "usage: duet-router --config FILE [options]   (flags: --KEY VALUE or --KEY=VALUE)";

static void duet__usage(FILE *f, const duet_flag_t *flags, size_t n)
{
    fprintf(f, "%s\n", duet__router_usage);
    duet_flags_help(f, flags, n);
}

int main(int argc, char **argv)
{
    duet_router_options_t opt;
    duet_router_t *rt = NULL;
    bool check = false, help = false, help_config = false;
    int grace_ms = 30000;
    char policy_help[160], policies[128];
    sigset_t sigs;
    int sig;

    duet_log_init_from_env();
    duet_log_set_component("router");
    duet_router_options_init(&opt);
    duet_router_policy_list(policies, sizeof(policies), " | ", " | ");
    snprintf(policy_help, sizeof(policy_help), "%s\n(default router.policy)", policies);
    const duet_flag_t flags[] = {
        {"config", DUET_FLAG_STRING, &opt.config_path, .arg = "FILE",
         .help = "cluster config (JSON); the router section and the\n"
                 "prefill/decode instance lists are used"},
        {"name", DUET_FLAG_STRING, &opt.name, .arg = "NAME",
         .help = "router name (default: router.name)"},
        {"http", DUET_FLAG_STRING, &opt.http_addr, .arg = "HOST:PORT",
         .help = "HTTP listen address (\"\" = off; default router.http)"},
        {"grpc", DUET_FLAG_STRING, &opt.grpc_addr, .arg = "HOST:PORT",
         .help = "gRPC listen address (\"\" = off; default router.grpc)"},
        {"policy", DUET_FLAG_STRING, &opt.policy, .arg = "P", .help = policy_help},
        {"check-config", DUET_FLAG_TRUE, &check,
         .help = "validate the config and the model, then exit 0 or 1"},
        {"http-threads", DUET_FLAG_INT, &opt.http_threads, 1, 64, .arg = "N",
         .help = "libmicrohttpd threads (default 2)"},
        {"grpc-threads", DUET_FLAG_INT, &opt.grpc_threads, 1, 64, .arg = "N",
         .help = "gRPC server threads (default 2)"},
        {"client-threads", DUET_FLAG_INT, &opt.client_threads, 1, 64, .arg = "N",
         .help = "gRPC client threads (default 2)"},
        {"keepalive-ms", DUET_FLAG_INT, &opt.keepalive_ms, 50, 3600000, .arg = "N",
         .help = "SSE keepalive comment period (default 2000)"},
        {"grace-ms", DUET_FLAG_INT, &grace_ms, 0, 86400000, .arg = "N",
         .help = "SIGTERM grace for in-flight requests (default 30000)"},
        {"discovery-grace-ms", DUET_FLAG_INT, &opt.disc_grace_ms, 1, 86400000, .arg = "N",
         .help = "keep a discover group's workers this long while\n"
                 "its DNS lookups fail (default 3 health intervals)"},
        {"log-level", DUET_FLAG_FUNC, NULL, .fn = duet_flag_log_level, .arg = "L",
         .help = "error|warn|info|debug|trace (or DUET_LOG_LEVEL)"},
        {"https-cert", DUET_FLAG_STRING, &opt.https_cert, .arg = "FILE",
         .help = "PEM certificate chain: HTTPS (default router.https_cert)"},
        {"https-key", DUET_FLAG_STRING, &opt.https_key, .arg = "FILE",
         .help = "its private key (default router.https_key)"},
        {"auth-ca", DUET_FLAG_STRING, &opt.auth_ca, .arg = "FILE",
         .help = "auth.ca; these five override the auth section's\n"
                 "keys (docs/security.md)"},
        {"auth-cert", DUET_FLAG_STRING, &opt.auth_cert, .arg = "FILE", .help = "auth.cert"},
        {"auth-key", DUET_FLAG_STRING, &opt.auth_key, .arg = "FILE", .help = "auth.key"},
        {"auth-secret-file", DUET_FLAG_STRING, &opt.auth_secret_file, .arg = "FILE",
         .help = "auth.secret_file"},
        {"auth-server-name", DUET_FLAG_STRING, &opt.auth_server_name, .arg = "NAME",
         .help = "auth.server_name"},
        {"help", DUET_FLAG_STOP, &help, .help = "this help"},
        {"help-config", DUET_FLAG_STOP, &help_config,
         .help = "describe every cluster config key"},
    };
    if (duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, NULL, NULL) != DUET_OK) {
        fprintf(stderr, "duet-router: %s\n", duet_error_msg());
        duet__usage(stderr, flags, DUET_FLAGS_N(flags));
        return 2;
    }
    if (help) {
        duet__usage(stdout, flags, DUET_FLAGS_N(flags));
        return 0;
    }
    if (help_config) {
        duet_cluster_describe(stdout);
        return 0;
    }
    if (opt.config_path == NULL) {
        fprintf(stderr, "duet-router: --config FILE is required\n");
        duet__usage(stderr, flags, DUET_FLAGS_N(flags));
        return 2;
    }
    /* before any thread starts, so every thread inherits the mask: SIGINT
     * and SIGTERM are taken by sigwait below (a handler is installed too:
     * as a container's PID 1 a SIG_DFL SIGTERM would be dropped,
     * common/daemon.h) */
    duet_daemon_signals_block();
    if (duet_router_create(&opt, &rt) != DUET_OK) {
        fprintf(stderr, "duet-router: %s: %s\n", opt.config_path, duet_error_msg());
        return 1;
    }
    if (check) {
        printf("duet-router: %s: ok\n", opt.config_path);
        duet_router_destroy(rt);
        return 0;
    }
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    if (duet_router_start(rt) != DUET_OK) {
        fprintf(stderr, "duet-router: %s\n", duet_error_msg());
        duet_router_destroy(rt);
        return 1;
    }
    printf("duet-router: listening http %d grpc %d\n", duet_router_http_port(rt),
           duet_router_grpc_port(rt));
    fflush(stdout);
    sigwait(&sigs, &sig);
    DUET_LOG_INFO("%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    duet_router_drain(rt, grace_ms);
    duet_router_destroy(rt);
    DUET_LOG_INFO("stopped");
    return 0;
}
