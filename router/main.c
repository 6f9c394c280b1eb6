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
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "common/log.h"
#include "router/fleet/policy.h"
#include "router/router.h"

static void duet__usage(FILE *f)
{
    char policies[128];
    duet_router_policy_list(policies, sizeof(policies), " | ", " | ");
    fprintf(f,
            "usage: duet-router --config FILE [options]\n"
            "  --config FILE        cluster config (JSON); the router section and the\n"
            "                       prefill/decode instance lists are used\n"
            "  --name NAME          router name (default: router.name)\n"
            "  --http HOST:PORT     HTTP listen address (\"\" = off; default router.http)\n"
            "  --grpc HOST:PORT     gRPC listen address (\"\" = off; default router.grpc)\n"
            "  --policy P           %s (default router.policy)\n"
            "  --check-config       validate the config and the model, then exit 0 or 1\n"
            "  --http-threads N     libmicrohttpd threads (default 2)\n"
            "  --grpc-threads N     gRPC server threads (default 2)\n"
            "  --client-threads N   gRPC client threads (default 2)\n"
            "  --keepalive-ms N     SSE keepalive comment period (default 2000)\n"
            "  --grace-ms N         SIGTERM grace for in-flight requests (default 30000)\n"
            "  --discovery-grace-ms N  keep a discover group's workers this long while\n"
            "                       its DNS lookups fail (default 3 health intervals)\n"
            "  --log-level L        error|warn|info|debug|trace (or DUET_LOG_LEVEL)\n"
            "  --https-cert FILE    PEM certificate chain: HTTPS (default router.https_cert)\n"
            "  --https-key FILE     its private key (default router.https_key)\n"
            "  --auth-ca FILE, --auth-cert FILE, --auth-key FILE, --auth-secret-file FILE,\n"
            "  --auth-server-name NAME\n"
            "                       cluster authentication (default: the auth section;\n"
            "                       docs/security.md)\n"
            "  --help-config        describe every cluster config key\n",
            policies);
}

static int duet__int_arg(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "duet-router: %s: '%s' is not an integer in %ld..%ld\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    enum {
        O_CONFIG = 256,
        O_NAME,
        O_HTTP,
        O_GRPC,
        O_POLICY,
        O_CHECK,
        O_HTTP_THR,
        O_GRPC_THR,
        O_CLI_THR,
        O_KEEPALIVE,
        O_GRACE,
        O_DISC_GRACE,
        O_LOG,
        O_HELP,
        O_HELP_CONFIG,
        O_HTTPS_CERT,
        O_HTTPS_KEY,
        O_AUTH_CA,
        O_AUTH_CERT,
        O_AUTH_KEY,
        O_AUTH_SECRET,
        O_AUTH_NAME
    };
    static const struct option opts[] = {
        {"config", required_argument, NULL, O_CONFIG},
        {"name", required_argument, NULL, O_NAME},
        {"http", required_argument, NULL, O_HTTP},
        {"grpc", required_argument, NULL, O_GRPC},
        {"policy", required_argument, NULL, O_POLICY},
        {"check-config", no_argument, NULL, O_CHECK},
        {"http-threads", required_argument, NULL, O_HTTP_THR},
        {"grpc-threads", required_argument, NULL, O_GRPC_THR},
        {"client-threads", required_argument, NULL, O_CLI_THR},
        {"keepalive-ms", required_argument, NULL, O_KEEPALIVE},
        {"grace-ms", required_argument, NULL, O_GRACE},
        {"discovery-grace-ms", required_argument, NULL, O_DISC_GRACE},
        {"log-level", required_argument, NULL, O_LOG},
        {"help", no_argument, NULL, O_HELP},
        {"help-config", no_argument, NULL, O_HELP_CONFIG},
        {"https-cert", required_argument, NULL, O_HTTPS_CERT},
        {"https-key", required_argument, NULL, O_HTTPS_KEY},
        {"auth-ca", required_argument, NULL, O_AUTH_CA},
        {"auth-cert", required_argument, NULL, O_AUTH_CERT},
        {"auth-key", required_argument, NULL, O_AUTH_KEY},
        {"auth-secret-file", required_argument, NULL, O_AUTH_SECRET},
        {"auth-server-name", required_argument, NULL, O_AUTH_NAME},
        {NULL, 0, NULL, 0},
    };
    duet_router_options_t opt;
    duet_router_t *rt = NULL;
    bool check = false;
    long grace_ms = 30000, v;
    sigset_t sigs;
    int c, sig;

    duet_log_init_from_env();
    duet_log_set_component("router");
    duet_router_options_init(&opt);
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_CONFIG:
            opt.config_path = optarg;
            break;
        case O_NAME:
            opt.name = optarg;
            break;
        case O_HTTP:
            opt.http_addr = optarg;
            break;
        case O_GRPC:
            opt.grpc_addr = optarg;
            break;
        case O_POLICY:
            opt.policy = optarg;
            break;
        case O_CHECK:
            check = true;
            break;
        case O_HTTP_THR:
            if (duet__int_arg("--http-threads", optarg, 1, 64, &v))
                return 2;
            opt.http_threads = (int)v;
            break;
        case O_GRPC_THR:
            if (duet__int_arg("--grpc-threads", optarg, 1, 64, &v))
                return 2;
            opt.grpc_threads = (int)v;
            break;
        case O_CLI_THR:
            if (duet__int_arg("--client-threads", optarg, 1, 64, &v))
                return 2;
            opt.client_threads = (int)v;
            break;
        case O_KEEPALIVE:
            if (duet__int_arg("--keepalive-ms", optarg, 50, 3600000, &v))
                return 2;
            opt.keepalive_ms = (int)v;
            break;
        case O_GRACE:
            if (duet__int_arg("--grace-ms", optarg, 0, 86400000, &grace_ms))
                return 2;
            break;
        case O_DISC_GRACE:
            if (duet__int_arg("--discovery-grace-ms", optarg, 1, 86400000, &v))
                return 2;
            opt.disc_grace_ms = (int)v;
            break;
        case O_LOG: {
            int lvl = duet_log_level_parse(optarg);
            if (lvl < 0) {
                fprintf(stderr, "duet-router: --log-level: '%s' is not a level\n", optarg);
                return 2;
            }
            duet_log_set_level((duet_log_level_t)lvl);
            break;
        }
        case O_HTTPS_CERT:
            opt.https_cert = optarg;
            break;
        case O_HTTPS_KEY:
            opt.https_key = optarg;
            break;
        case O_AUTH_CA:
            opt.auth_ca = optarg;
            break;
        case O_AUTH_CERT:
            opt.auth_cert = optarg;
            break;
        case O_AUTH_KEY:
            opt.auth_key = optarg;
            break;
        case O_AUTH_SECRET:
            opt.auth_secret_file = optarg;
            break;
        case O_AUTH_NAME:
            opt.auth_server_name = optarg;
            break;
        case O_HELP:
            duet__usage(stdout);
            return 0;
        case O_HELP_CONFIG:
            duet_cluster_describe(stdout);
            return 0;
        default:
            duet__usage(stderr);
            return 2;
        }
    }
    if (optind < argc || opt.config_path == NULL) {
        fprintf(stderr, "duet-router: %s\n",
                opt.config_path ? "unexpected arguments" : "--config FILE is required");
        duet__usage(stderr);
        return 2;
    }
    if (duet_router_create(&opt, &rt) != DUET_OK) {
        fprintf(stderr, "duet-router: %s: %s\n", opt.config_path, duet_error_msg());
        return 1;
    }
    if (check) {
        printf("duet-router: %s: ok\n", opt.config_path);
        duet_router_destroy(rt);
        return 0;
    }
    /* every thread inherits this mask: signals are taken by sigwait below */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
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
