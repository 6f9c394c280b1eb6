/* bench_router: the router's overhead and throughput on a running cluster.
 *
 *   scripts/cluster.sh &          (or any cluster; defaults match
 *                                  deploy/configs/local.json)
 *   bench_router [--router 127.0.0.1:8001] [--http 127.0.0.1:8000]
 *                [--decode 127.0.0.1:9200] [--prefill 127.0.0.1:9100]
 *                [--requests 200] [--max-tokens 4] [--concurrency 8]
 *                [--seconds 10] [--ca FILE --cert FILE --key FILE] [--secret-file FILE]
 *
 * With the auth options (the cluster's auth section: docs/security.md) the
 * gRPC calls use mutual TLS and/or the shared secret; the raw HTTP client
 * has no TLS, so give --http "" against an HTTPS router.
 *
 * --b-router H:P --b-decode H:P --b-prefill H:P: compare two clusters, A
 * (the targets above, plain) and B (these, with the auth options), request
 * by request (bench/auth_cost.py runs it); --seconds 0 there: latency only.
 * 1. Latency: the same greedy request, alternately straight to decode's
 *    Decode.Generate (with prefill_target) and through the router's
 *    duet.v1.Generate (gRPC) and POST /v1/completions (HTTP, keep-alive,
 *    non-streaming); p50/p99 of each and what the router adds.
 * 2. Throughput: `concurrency` client threads for `seconds`, through the
 *    router (gRPC) and straight to decode: requests/s and p50/p99.
 * Every reply is checked (a finished message / HTTP 200); errors are
 * counted and make the exit status 1. */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/rpc_auth.h"
#include "duet/v1/decode.pb-c.h"
#include "duet/v1/generate.pb-c.h"

typedef struct {
    const char *router, *http, *decode, *prefill;
    int requests, max_tokens, concurrency, seconds;
    const char *b_router, *b_decode, *b_prefill; /* --compare: cluster B */
} duet__bargs_t;

typedef struct {
    uint8_t *gen, *dec; /* packed GenerateRequest / DecodeGenerateRequest */
    size_t gen_len, dec_len;
    char http_req[1024];
    size_t http_len;
} duet__bodies_t;

static int duet__cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double duet__pct(int64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof(*v), duet__cmp_i64);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return (double)v[i] / 1e3; /* us */
}

/* One gRPC call to the end; returns its latency in ns, -1 on error. */
static int64_t duet__grpc_once(duet_rpc_client_t *cli, const char *target, const char *method,
                               const uint8_t *req, size_t len)
{
    duet_rpc_messages_t m;
    int64_t t0 = duet_now_ns();
    duet_status_t st = duet_rpc_client_stream_collect(cli, target, method, req, len,
                                                      duet_deadline_in_ms(60000), 100000, &m);
    int64_t dt = duet_now_ns() - t0;
    bool ok = st == DUET_OK && m.count > 0;
    if (ok) {
        Duet__V1__GenerateResponse *r =
            duet__v1__generate_response__unpack(NULL, m.len[m.count - 1], m.data[m.count - 1]);
        ok = r && r->kind_case == DUET__V1__GENERATE_RESPONSE__KIND_FINISHED;
        if (r)
            duet__v1__generate_response__free_unpacked(r, NULL);
    }
    if (!ok)
        fprintf(stderr, "bench_router: %s %s: %s\n", target, method,
                m.message ? m.message : duet_error_msg());
    duet_rpc_messages_cleanup(&m);
    return ok ? dt : -1;
}

static int duet__connect(const char *addr)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int fd;

    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host))
        return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
        return -1;
    fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* One keep-alive HTTP request; reads the whole response (Content-Length). */
static int64_t duet__http_once(int fd, const duet__bodies_t *b)
{
    char buf[65536];
    size_t have = 0;
    int64_t t0 = duet_now_ns();
    if (send(fd, b->http_req, b->http_len, MSG_NOSIGNAL) != (ssize_t)b->http_len)
        return -1;
    for (;;) {
        ssize_t n = recv(fd, buf + have, sizeof(buf) - 1 - have, 0);
        if (n <= 0)
            return -1;
        have += (size_t)n;
        buf[have] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end == NULL)
            continue;
        char *cl = strcasestr(buf, "Content-Length:");
        if (cl == NULL || cl > end)
            return -1;
        size_t want = (size_t)(end + 4 - buf) + strtoul(cl + 15, NULL, 10);
        if (have >= want)
            return strncmp(buf, "HTTP/1.1 200", 12) == 0 ? duet_now_ns() - t0 : -1;
    }
}

typedef struct {
    duet_rpc_client_t *cli;
    const char *target, *method;
    const uint8_t *req;
    size_t len;
    int64_t deadline;
    int64_t *lat;
    size_t n, cap;
    atomic_long *errors;
} duet__worker_t;

static void *duet__worker(void *p)
{
    duet__worker_t *w = p;
    while (duet_now_ns() < w->deadline) {
        int64_t dt = duet__grpc_once(w->cli, w->target, w->method, w->req, w->len);
        if (dt < 0) {
            atomic_fetch_add(w->errors, 1);
            continue;
        }
        if (w->n == w->cap) {
            size_t cap = w->cap ? w->cap * 2 : 1024;
            int64_t *l = duet_realloc(w->lat, cap * sizeof(*l));
            if (l == NULL)
                break;
            w->lat = l;
            w->cap = cap;
        }
        w->lat[w->n++] = dt;
    }
    return NULL;
}

/* concurrency clients on target for `seconds`: every latency (appended to
 * *lat_p, *n_p) and the wall time; returns the errors. */
static long duet__load(const duet__bargs_t *a, duet_rpc_client_t *cli, const char *target,
                       const char *method, const uint8_t *req, size_t len, int seconds,
                       int64_t **lat_p, size_t *n_p, double *secs_p)
{
    duet__worker_t *w = DUET_NEW_ARRAY(duet__worker_t, (size_t)a->concurrency);
    pthread_t *th = DUET_NEW_ARRAY(pthread_t, (size_t)a->concurrency);
    atomic_long errors = 0;
    int64_t t0 = duet_now_ns();
    size_t total = *n_p;

    for (int i = 0; i < a->concurrency; i++) {
        w[i] = (duet__worker_t){
            cli,  target, method, req,    len, t0 + (int64_t)seconds * DUET_NS_PER_S,
            NULL, 0,      0,      &errors};
        pthread_create(&th[i], NULL, duet__worker, &w[i]);
    }
    for (int i = 0; i < a->concurrency; i++) {
        pthread_join(th[i], NULL);
        total += w[i].n;
    }
    *secs_p += (double)(duet_now_ns() - t0) / 1e9;
    int64_t *all = duet_realloc(*lat_p, (total ? total : 1) * sizeof(*all));
    for (int i = 0; i < a->concurrency; i++) {
        if (all != NULL)
            memcpy(all + *n_p, w[i].lat, w[i].n * sizeof(*all));
        *n_p += w[i].n;
        duet_free(w[i].lat);
    }
    if (all == NULL)
        *n_p = 0;
    else
        *lat_p = all;
    duet_free(w);
    duet_free(th);
    return atomic_load(&errors);
}

static long duet__throughput(const duet__bargs_t *a, duet_rpc_client_t *cli, const char *label,
                             const char *target, const char *method, const uint8_t *req, size_t len)
{
    int64_t *all = NULL;
    size_t total = 0;
    double secs = 0;
    long errors = duet__load(a, cli, target, method, req, len, a->seconds, &all, &total, &secs);
    printf("  %-22s %8.1f req/s  p50 %8.0f us  p99 %8.0f us  (%zu requests, %ld errors, "
           "%d clients)\n",
           label, (double)total / secs, duet__pct(all, total, 0.5), duet__pct(all, total, 0.99),
           total, errors, a->concurrency);
    duet_free(all);
    return errors;
}

static int duet__build(const duet__bargs_t *a, const char *prefill, duet__bodies_t *b)
{
    static int32_t ids[] = {1, 403, 407, 261, 378}; /* "Once upon a time" (stories260K) */
    Duet__V1__TokenIds tids = DUET__V1__TOKEN_IDS__INIT;
    Duet__V1__SamplingParams sp = DUET__V1__SAMPLING_PARAMS__INIT;
    Duet__V1__GenerateRequest g = DUET__V1__GENERATE_REQUEST__INIT;
    Duet__V1__DecodeGenerateRequest d = DUET__V1__DECODE_GENERATE_REQUEST__INIT;
    char body[256];

    tids.n_ids = sizeof(ids) / sizeof(ids[0]);
    tids.ids = ids;
    g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g.token_ids = &tids;
    g.sampling = &sp;
    g.max_tokens = (uint32_t)a->max_tokens;
    g.ignore_eos = true;
    d.request = &g;
    d.prefill_target = (char *)prefill;
    b->gen_len = duet__v1__generate_request__get_packed_size(&g);
    b->dec_len = duet__v1__decode_generate_request__get_packed_size(&d);
    b->gen = duet_malloc(b->gen_len);
    b->dec = duet_malloc(b->dec_len);
    if (b->gen == NULL || b->dec == NULL)
        return -1;
    duet__v1__generate_request__pack(&g, b->gen);
    duet__v1__decode_generate_request__pack(&d, b->dec);
    int n = snprintf(body, sizeof(body),
                     "{\"prompt\":[1,403,407,261,378],\"max_tokens\":%d,\"temperature\":0,"
                     "\"ignore_eos\":true}",
                     a->max_tokens);
    b->http_len = (size_t)snprintf(b->http_req, sizeof(b->http_req),
                                   "POST /v1/completions HTTP/1.1\r\nHost: bench\r\n"
                                   "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                   "%s",
                                   n, body);
    return 0;
}

/* --compare: the same requests to cluster A (plain client) and cluster B
 * (the auth options), interleaved request by request and, for throughput,
 * in alternating slices (ABBA...), so both see the same machine load. */
static long duet__compare(const duet__bargs_t *a, duet_rpc_client_t *cli[2],
                          const duet__bodies_t b[2])
{
    const char *router[2] = {a->router, a->b_router}, *decode[2] = {a->decode, a->b_decode};
    static const char *const gen = "/duet.v1.Generate/Generate", *dec = "/duet.v1.Decode/Generate";
    int64_t *lat[2][2], *load[2] = {NULL, NULL};
    size_t n[2][2] = {{0, 0}, {0, 0}}, nl[2] = {0, 0};
    double secs[2] = {0, 0};
    long errors = 0;

    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 2; k++)
            lat[s][k] = duet_malloc((size_t)a->requests * sizeof(int64_t));
    for (int i = 0; i < 5; i++)
        for (int s = 0; s < 2; s++) {
            duet__grpc_once(cli[s], decode[s], dec, b[s].dec, b[s].dec_len);
            duet__grpc_once(cli[s], router[s], gen, b[s].gen, b[s].gen_len);
        }
    for (int i = 0; i < a->requests; i++) {
        for (int j = 0; j < 2; j++) {
            int s = (i + j) % 2;
            int64_t t;
            if ((t = duet__grpc_once(cli[s], decode[s], dec, b[s].dec, b[s].dec_len)) >= 0)
                lat[s][0][n[s][0]++] = t;
            else
                errors++;
            if ((t = duet__grpc_once(cli[s], router[s], gen, b[s].gen, b[s].gen_len)) >= 0)
                lat[s][1][n[s][1]++] = t;
            else
                errors++;
        }
    }
    int slice = a->seconds / 4 > 0 ? a->seconds / 4 : 1;
    for (int k = 0; k < 8 && a->seconds > 0; k++) {
        int s = (k % 4 == 0 || k % 4 == 3) ? 0 : 1;
        errors += duet__load(a, cli[s], router[s], gen, b[s].gen, b[s].gen_len, slice, &load[s],
                             &nl[s], &secs[s]);
    }
    printf("bench_router --compare: A plain, B with the auth options; %d interleaved "
           "requests each, max_tokens %d\n",
           a->requests, a->max_tokens);
    printf("  %-26s %10s %10s %8s\n", "", "A", "B", "B vs A");
    const char *what[2] = {"decode direct gRPC", "router gRPC"};
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < 2; q++) {
            double p = q ? 0.99 : 0.5;
            double x = duet__pct(lat[0][k], n[0][k], p), y = duet__pct(lat[1][k], n[1][k], p);
            printf("  %-22s %s %10.0f %10.0f %+7.1f%%  (us)\n", what[k], q ? "p99" : "p50", x, y,
                   100.0 * (y - x) / x);
        }
    if (a->seconds == 0)
        goto out; /* latency only */
    double ra = (double)nl[0] / secs[0], rb = (double)nl[1] / secs[1];
    printf("  %-26s %10.1f %10.1f %+7.1f%%  (%d clients, 8 alternating slices of %d s)\n",
           "router gRPC req/s", ra, rb, 100.0 * (rb - ra) / ra, a->concurrency, slice);
    for (int q = 0; q < 2; q++) {
        double p = q ? 0.99 : 0.5;
        double x = duet__pct(load[0], nl[0], p), y = duet__pct(load[1], nl[1], p);
        printf("  %-22s %s %10.0f %10.0f %+7.1f%%  (us, under load)\n", "router gRPC",
               q ? "p99" : "p50", x, y, 100.0 * (y - x) / x);
    }
out:
    for (int s = 0; s < 2; s++) {
        duet_free(load[s]);
        for (int k = 0; k < 2; k++)
            duet_free(lat[s][k]);
    }
    return errors;
}

int main(int argc, char **argv)
{
    duet__bargs_t a = {"127.0.0.1:8001",
                       "127.0.0.1:8000",
                       "127.0.0.1:9200",
                       "127.0.0.1:9100",
                       200,
                       4,
                       8,
                       10,
                       NULL,
                       NULL,
                       NULL};
    static const struct option opts[] = {{"router", required_argument, NULL, 'r'},
                                         {"http", required_argument, NULL, 'h'},
                                         {"decode", required_argument, NULL, 'd'},
                                         {"prefill", required_argument, NULL, 'p'},
                                         {"requests", required_argument, NULL, 'n'},
                                         {"max-tokens", required_argument, NULL, 't'},
                                         {"concurrency", required_argument, NULL, 'c'},
                                         {"seconds", required_argument, NULL, 's'},
                                         {"ca", required_argument, NULL, 'A'},
                                         {"cert", required_argument, NULL, 'C'},
                                         {"key", required_argument, NULL, 'K'},
                                         {"secret-file", required_argument, NULL, 'S'},
                                         {"b-router", required_argument, NULL, 'R'},
                                         {"b-decode", required_argument, NULL, 'D'},
                                         {"b-prefill", required_argument, NULL, 'F'},
                                         {NULL, 0, NULL, 0}};
    duet_auth_config_t ac = {"", "", "", "", "", "", false};
    duet_rpc_auth_t *auth = NULL;
    duet_rpc_client_config_t cc;
    duet_rpc_client_t *cli;
    duet__bodies_t b;
    long errors = 0;
    int c;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            a.router = optarg;
            break;
        case 'h':
            a.http = optarg;
            break;
        case 'd':
            a.decode = optarg;
            break;
        case 'p':
            a.prefill = optarg;
            break;
        case 'n':
            a.requests = atoi(optarg);
            break;
        case 't':
            a.max_tokens = atoi(optarg);
            break;
        case 'c':
            a.concurrency = atoi(optarg);
            break;
        case 's':
            a.seconds = atoi(optarg);
            break;
        case 'A':
            ac.ca = optarg;
            break;
        case 'C':
            ac.cert = optarg;
            break;
        case 'K':
            ac.key = optarg;
            break;
        case 'S':
            ac.secret_file = optarg;
            break;
        case 'R':
            a.b_router = optarg;
            break;
        case 'D':
            a.b_decode = optarg;
            break;
        case 'F':
            a.b_prefill = optarg;
            break;
        default:
            fprintf(stderr, "usage: see the header of bench/bench_router.c\n");
            return 2;
        }
    }
    if (a.requests < 1 || a.max_tokens < 1 || a.concurrency < 1 ||
        a.seconds < (a.b_router != NULL ? 0 : 1)) {
        fprintf(stderr, "bench_router: counts must be positive\n");
        return 2;
    }
    duet_log_init_from_env();
    duet_rpc_client_config_init(&cc);
    cc.n_threads = 2;
    if (duet_rpc_auth_load(&ac, &auth) != DUET_OK) {
        fprintf(stderr, "bench_router: %s\n", duet_error_msg());
        return 2;
    }
    if (a.b_router != NULL) {
        if (a.b_decode == NULL || a.b_prefill == NULL) {
            fprintf(stderr, "bench_router: --b-router needs --b-decode and --b-prefill\n");
            return 2;
        }
        duet_rpc_client_t *clis[2] = {NULL, NULL};
        duet__bodies_t bs[2];
        memset(bs, 0, sizeof(bs));
        if (duet_rpc_client_create(&cc, &clis[0]) != DUET_OK ||
            (cc.auth = auth, duet_rpc_client_create(&cc, &clis[1])) != DUET_OK ||
            duet__build(&a, a.prefill, &bs[0]) != 0 || duet__build(&a, a.b_prefill, &bs[1]) != 0) {
            fprintf(stderr, "bench_router: %s\n", duet_error_msg());
            return 1;
        }
        errors = duet__compare(&a, clis, bs);
        for (int s = 0; s < 2; s++) {
            duet_rpc_client_destroy(clis[s]);
            duet_free(bs[s].gen);
            duet_free(bs[s].dec);
        }
        duet_rpc_auth_destroy(auth);
        if (errors)
            fprintf(stderr, "bench_router: %ld errors\n", errors);
        return errors ? 1 : 0;
    }
    cc.auth = auth;
    if (duet_rpc_client_create(&cc, &cli) != DUET_OK || duet__build(&a, a.prefill, &b) != 0) {
        fprintf(stderr, "bench_router: %s\n", duet_error_msg());
        return 1;
    }
    int fd = a.http[0] ? duet__connect(a.http) : -1;
    int64_t *direct = duet_malloc((size_t)a.requests * sizeof(int64_t));
    int64_t *via = duet_malloc((size_t)a.requests * sizeof(int64_t));
    int64_t *via_http = duet_malloc((size_t)a.requests * sizeof(int64_t));
    size_t nd = 0, nv = 0, nh = 0;

    /* warm-up: channels, connections, first-request costs */
    for (int i = 0; i < 5; i++) {
        duet__grpc_once(cli, a.decode, "/duet.v1.Decode/Generate", b.dec, b.dec_len);
        duet__grpc_once(cli, a.router, "/duet.v1.Generate/Generate", b.gen, b.gen_len);
        if (fd >= 0)
            duet__http_once(fd, &b);
    }
    for (int i = 0; i < a.requests; i++) {
        int64_t t;
        if ((t = duet__grpc_once(cli, a.decode, "/duet.v1.Decode/Generate", b.dec, b.dec_len)) >= 0)
            direct[nd++] = t;
        else
            errors++;
        if ((t = duet__grpc_once(cli, a.router, "/duet.v1.Generate/Generate", b.gen, b.gen_len)) >=
            0)
            via[nv++] = t;
        else
            errors++;
        if (fd >= 0) {
            if ((t = duet__http_once(fd, &b)) >= 0)
                via_http[nh++] = t;
            else
                errors++;
        }
    }
    double d50 = duet__pct(direct, nd, 0.5), d99 = duet__pct(direct, nd, 0.99);
    double v50 = duet__pct(via, nv, 0.5), v99 = duet__pct(via, nv, 0.99);
    double h50 = duet__pct(via_http, nh, 0.5), h99 = duet__pct(via_http, nh, 0.99);
    printf("bench_router: %d sequential requests each, prompt 5 tokens, max_tokens %d "
           "(ignore_eos)\n",
           a.requests, a.max_tokens);
    printf("  %-22s p50 %8.0f us  p99 %8.0f us\n", "decode direct (gRPC)", d50, d99);
    printf("  %-22s p50 %8.0f us  p99 %8.0f us   added p50 %+6.0f us  p99 %+6.0f us\n",
           "router gRPC", v50, v99, v50 - d50, v99 - d99);
    if (fd >= 0)
        printf("  %-22s p50 %8.0f us  p99 %8.0f us   added p50 %+6.0f us  p99 %+6.0f us\n",
               "router HTTP", h50, h99, h50 - d50, h99 - d99);
    printf("throughput for %d s:\n", a.seconds);
    errors += duet__throughput(&a, cli, "router gRPC", a.router, "/duet.v1.Generate/Generate",
                               b.gen, b.gen_len);
    errors += duet__throughput(&a, cli, "decode direct (gRPC)", a.decode,
                               "/duet.v1.Decode/Generate", b.dec, b.dec_len);
    if (fd >= 0)
        close(fd);
    duet_free(direct);
    duet_free(via);
    duet_free(via_http);
    duet_free(b.gen);
    duet_free(b.dec);
    duet_rpc_client_destroy(cli);
    duet_rpc_auth_destroy(auth);
    if (errors)
        fprintf(stderr, "bench_router: %ld errors\n", errors);
    return errors ? 1 : 0;
}
