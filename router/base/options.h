/* The router's start-up options (duet_router_create): what main() took from
 * the command line.  Plain data; the daemon context (job/ctx.h) keeps a
 * copy. */
#ifndef DUET_ROUTER_BASE_OPTIONS_H
#define DUET_ROUTER_BASE_OPTIONS_H

typedef struct {
    const char *config_path;
    const char *name;      /* router.name override, NULL = config */
    const char *http_addr; /* override, NULL = config; "" = off */
    const char *grpc_addr; /* override, NULL = config; "" = off */
    const char *policy;    /* override, NULL = config */
    int http_threads;      /* libmicrohttpd worker threads (default 2) */
    int grpc_threads;      /* gRPC server CQ threads (default 2) */
    int client_threads;    /* gRPC client CQ threads (default 2) */
    int keepalive_ms;      /* SSE keepalive comment period (default 2000) */
    int disc_grace_ms;     /* failing DNS keeps a group's workers (0: 3 intervals) */
    /* overrides of the config's auth keys and router.https_*, NULL = config */
    const char *auth_ca, *auth_cert, *auth_key, *auth_secret_file, *auth_server_name;
    const char *https_cert, *https_key;
} duet_router_options_t;

#endif
