/* A duet_rpc server for the Python interop test: grpc.health.v1.Health plus
 * raw-bytes echo methods.  Prints "port N" once serving, then obeys one
 * command per stdin line, answering each on stdout:
 *   set SERVICE STATUS   STATUS: SERVING | NOT_SERVING | UNKNOWN  -> "ok"
 *   clear SERVICE                                                 -> "ok"
 *   watchers                                                      -> "watchers N"
 *   quit (or EOF)        shut down (2 s grace)                    -> "bye"
 * SERVICE "-" stands for the overall service "". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rpc.h"

/* Unary: echoes the request. */
static void echo_unary(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    (void)arg;
    duet_rpc_call_reply(call, req, len);
}

/* Server streaming: the request is a decimal count n; replies "0".."n-1". */
static void echo_count(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    char buf[32];
    (void)arg;
    if (len == 0 || len >= sizeof(buf)) {
        duet_rpc_call_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "want a decimal count");
        return;
    }
    memcpy(buf, req, len);
    buf[len] = '\0';
    long n = strtol(buf, NULL, 10);
    if (n < 0 || n > 100000) {
        duet_rpc_call_fail(call, GRPC_STATUS_OUT_OF_RANGE, "count not in 0..100000");
        return;
    }
    /* Runs on a CQ thread, so it may not wait: a queue as long as the count
     * keeps every write accepted (see stream_queue_limit below). */
    for (long i = 0; i < n; i++) {
        int k = snprintf(buf, sizeof(buf), "%ld", i);
        if (duet_rpc_call_write(call, buf, (size_t)k) != DUET_OK)
            break;
    }
    duet_rpc_call_finish(call, GRPC_STATUS_OK, NULL);
}

static int parse_status(const char *s, duet_rpc_health_status_t *out)
{
    if (strcmp(s, "SERVING") == 0)
        *out = DUET_RPC_HEALTH_SERVING;
    else if (strcmp(s, "NOT_SERVING") == 0)
        *out = DUET_RPC_HEALTH_NOT_SERVING;
    else if (strcmp(s, "UNKNOWN") == 0)
        *out = DUET_RPC_HEALTH_UNKNOWN;
    else
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    duet_rpc_server_config_t cfg;
    duet_rpc_server_t *srv;
    duet_rpc_health_t *health;
    char line[512];

    duet_log_init_from_env();
    duet_log_set_component("health-server");
    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = argc > 1 ? argv[1] : "127.0.0.1:0";
    cfg.shutdown_grace_ms = 2000;
    cfg.stream_queue_limit = 100000;
    if (duet_rpc_server_create(&cfg, &srv) != DUET_OK) {
        fprintf(stderr, "health-server: %s\n", duet_error_msg());
        return 1;
    }
    if (duet_rpc_health_create(srv, DUET_RPC_HEALTH_SERVING, &health) != DUET_OK ||
        duet_rpc_server_add_method(srv, "/duet.test.Echo/Unary", DUET_RPC_UNARY, echo_unary,
                                   NULL) != DUET_OK ||
        duet_rpc_server_add_method(srv, "/duet.test.Echo/Count", DUET_RPC_SERVER_STREAMING,
                                   echo_count, NULL) != DUET_OK ||
        duet_rpc_server_start(srv) != DUET_OK) {
        fprintf(stderr, "health-server: %s\n", duet_error_msg());
        duet_rpc_server_destroy(srv);
        return 1;
    }
    printf("port %d\n", duet_rpc_server_port(srv));
    fflush(stdout);

    while (fgets(line, sizeof(line), stdin)) {
        char cmd[32] = "", service[300] = "", status[32] = "";
        duet_rpc_health_status_t st;
        int n = sscanf(line, "%31s %299s %31s", cmd, service, status);
        const char *svc = strcmp(service, "-") == 0 ? "" : service;
        if (n >= 1 && strcmp(cmd, "quit") == 0)
            break;
        if (n == 3 && strcmp(cmd, "set") == 0 && parse_status(status, &st) == 0 &&
            duet_rpc_health_set(health, svc, st) == DUET_OK)
            printf("ok\n");
        else if (n == 2 && strcmp(cmd, "clear") == 0 &&
                 duet_rpc_health_clear(health, svc) == DUET_OK)
            printf("ok\n");
        else if (n == 1 && strcmp(cmd, "watchers") == 0)
            printf("watchers %zu\n", duet_rpc_health_watchers(health));
        else
            printf("error %s", line);
        fflush(stdout);
    }
    duet_rpc_server_destroy(srv);
    duet_rpc_health_destroy(health);
    printf("bye\n");
    fflush(stdout);
    return 0;
}
