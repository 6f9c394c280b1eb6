/* bench_rpc_tls: what gRPC's TLS costs one hop, without the rest of duet.
 *
 *   scripts/gen-auth.sh DIR && bench_rpc_tls DIR [--calls 2000] [--size 64] [--rounds 5]
 *
 * One process, two echo servers on 127.0.0.1 (common/rpc_server.c): A
 * without auth, B with mutual TLS + the secret from DIR (ca.pem, node.pem,
 * node.key, secret); a client for each.  Unary calls of --size bytes
 * alternate A, B one by one in blocks of 100; the process's CPU time
 * (client and server ends of the hop together) is summed per mode over the
 * blocks.  Per round: p50/p99 latency and CPU per call of each, B - A.
 * A unary call is one HTTP/2 write and one read at each end (request;
 * reply with its trailers), so B - A in CPU is the price of two TLS
 * records written and two read (docs/performance.md "The cost of
 * authentication"). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/rpc_auth.h"

#define DUET__BLOCK 100

static void duet__echo(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    (void)arg;
    duet_rpc_call_reply(call, req, len);
}

static int64_t duet__cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * DUET_NS_PER_S + ts.tv_nsec;
}

static int duet__cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double duet__pct(int64_t *v, size_t n, double p)
{
    qsort(v, n, sizeof(*v), duet__cmp);
    return n ? (double)v[(size_t)(p * (double)(n - 1) + 0.5)] / 1e3 : 0.0;
}

static int duet__server(duet_rpc_auth_t *auth, duet_rpc_server_t **srv_p, char *target, size_t cap)
{
    duet_rpc_server_config_t cfg;

    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = "127.0.0.1:0";
    cfg.auth = auth;
    if (duet_rpc_server_create(&cfg, srv_p) != DUET_OK ||
        duet_rpc_server_add_method(*srv_p, "/bench.B/Echo", DUET_RPC_UNARY, duet__echo, NULL) !=
            DUET_OK ||
        duet_rpc_server_start(*srv_p) != DUET_OK)
        return -1;
    snprintf(target, cap, "127.0.0.1:%d", duet_rpc_server_port(*srv_p));
    return 0;
}

/* One call; its latency in ns, -1 on failure. */
static int64_t duet__call(duet_rpc_client_t *cli, const char *target, const uint8_t *msg,
                          size_t len)
{
    duet_rpc_result_t res;
    int64_t t0 = duet_now_ns();
    duet_status_t st = duet_rpc_client_unary(cli, target, "/bench.B/Echo", msg, len,
                                             duet_deadline_in_ms(10000), &res);
    int64_t t = duet_now_ns() - t0;
    bool ok = st == DUET_OK && res.len == len;
    duet_rpc_result_cleanup(&res);
    return ok ? t : -1;
}

int main(int argc, char **argv)
{
    int calls = 2000, size = 64, rounds = 5, errors = 0;
    static const struct option opts[] = {{"calls", required_argument, NULL, 'n'},
                                         {"size", required_argument, NULL, 's'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'n')
            calls = atoi(optarg);
        else if (c == 's')
            size = atoi(optarg);
        else if (c == 'r')
            rounds = atoi(optarg);
        else
            return 2;
    }
    if (optind != argc - 1 || calls < DUET__BLOCK || size < 1 || size > (1 << 20) || rounds < 1) {
        fprintf(stderr, "usage: bench_rpc_tls AUTH_DIR [--calls N>=100] [--size B] [--rounds R]\n");
        return 2;
    }
    duet_log_init_from_env();
    const char *dir = argv[optind];
    char ca[512], cert[512], key[512], secret[512];
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    snprintf(cert, sizeof(cert), "%s/node.pem", dir);
    snprintf(key, sizeof(key), "%s/node.key", dir);
    snprintf(secret, sizeof(secret), "%s/secret", dir);
    duet_auth_config_t ac = {ca, cert, key, secret, "", "", false};
    duet_rpc_auth_t *auth = NULL;
    if (duet_rpc_auth_load(&ac, &auth) != DUET_OK) {
        fprintf(stderr, "bench_rpc_tls: %s\n", duet_error_msg());
        return 2;
    }

    duet_rpc_server_t *srv[2] = {NULL, NULL};
    duet_rpc_client_t *cli[2] = {NULL, NULL};
    char target[2][64];
    duet_rpc_client_config_t cc;
    duet_rpc_client_config_init(&cc);
    for (int m = 0; m < 2; m++) {
        cc.auth = m ? auth : NULL;
        if (duet__server(m ? auth : NULL, &srv[m], target[m], sizeof(target[m])) != 0 ||
            duet_rpc_client_create(&cc, &cli[m]) != DUET_OK) {
            fprintf(stderr, "bench_rpc_tls: %s\n", duet_error_msg());
            return 1;
        }
    }
    uint8_t *msg = duet_malloc((size_t)size);
    int64_t *lat[2] = {duet_malloc((size_t)calls * sizeof(int64_t)),
                       duet_malloc((size_t)calls * sizeof(int64_t))};
    if (!msg || !lat[0] || !lat[1])
        return 1;
    memset(msg, 'x', (size_t)size);
    for (int i = 0; i < 50; i++) /* connections, handshakes, first calls */
        for (int m = 0; m < 2; m++)
            duet__call(cli[m], target[m], msg, (size_t)size);

    printf("bench_rpc_tls: unary echo of %d bytes over one loopback hop, A plain, B mutual TLS + "
           "secret; %d calls each per round, blocks of %d alternating\n",
           size, calls, DUET__BLOCK);
    printf("  %-6s %9s %9s %8s   %9s %9s   %9s %9s %8s\n", "round", "p50 A", "p50 B", "B-A",
           "p99 A", "p99 B", "cpu/callA", "cpu/callB", "B-A");
    for (int r = 0; r < rounds; r++) {
        size_t n[2] = {0, 0};
        int64_t cpu[2] = {0, 0};
        for (int b = 0; b < calls / DUET__BLOCK; b++) {
            for (int j = 0; j < 2; j++) {
                int m = (b + j) % 2;
                int64_t c0 = duet__cpu_ns();
                for (int i = 0; i < DUET__BLOCK; i++) {
                    int64_t t = duet__call(cli[m], target[m], msg, (size_t)size);
                    if (t < 0)
                        errors++;
                    else
                        lat[m][n[m]++] = t;
                }
                cpu[m] += duet__cpu_ns() - c0;
            }
        }
        double c0 = (double)cpu[0] / 1e3 / (double)n[0], c1 = (double)cpu[1] / 1e3 / (double)n[1];
        double p0 = duet__pct(lat[0], n[0], 0.5), p1 = duet__pct(lat[1], n[1], 0.5);
        double q0 = duet__pct(lat[0], n[0], 0.99), q1 = duet__pct(lat[1], n[1], 0.99);
        printf("  %-6d %7.1fus %7.1fus %+7.1f%%   %7.1fus %7.1fus   %7.1fus %7.1fus %+6.1fus\n",
               r + 1, p0, p1, 100.0 * (p1 - p0) / p0, q0, q1, c0, c1, c1 - c0);
        fflush(stdout);
    }
    for (int m = 0; m < 2; m++) {
        duet_rpc_client_destroy(cli[m]);
        duet_rpc_server_destroy(srv[m]);
        duet_free(lat[m]);
    }
    duet_free(msg);
    duet_rpc_auth_destroy(auth);
    if (errors)
        fprintf(stderr, "bench_rpc_tls: %d failed calls\n", errors);
    return errors ? 1 : 0;
}
