/* common/rpc_auth: loading and checking the material (every error names its
 * config key), the constant-time secret comparison, and an in-process
 * server and clients over 127.0.0.1 with mutual TLS and the secret: the
 * right client is served, a client without the secret, with a wrong one or
 * without a certificate is UNAUTHENTICATED before the handler (health and
 * unknown methods too), a plaintext client never gets a call through.
 * Identities and roles: the per-method table (PERMISSION_DENIED), the
 * identity a handler sees, auth.clients, the loopback listen check.
 * Material comes from scripts/gen-auth.sh (the openssl CLI); the test
 * skips without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/rpc.h"
#include "common/rpc_auth.h"

static char dir[256];
static char ca[300], cert[300], key[300], secret[300], bad[300];

static int setup(void **state)
{
    (void)state;
    const char *src = getenv("DUET_SOURCE_DIR");
    char cmd[1024];
    snprintf(dir, sizeof(dir), "/tmp/duet-test-auth-XXXXXX");
    if (src == NULL || mkdtemp(dir) == NULL)
        return -1;
    snprintf(cmd, sizeof(cmd),
             "command -v openssl >/dev/null && '%s/scripts/gen-auth.sh' '%s/m' router/r0 "
             "decode/d0 prefill/p0 client/ops client/eve",
             src, dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(ca, sizeof(ca), "%s/m/ca.pem", dir);
    snprintf(cert, sizeof(cert), "%s/m/node.pem", dir);
    snprintf(key, sizeof(key), "%s/m/node.key", dir);
    snprintf(secret, sizeof(secret), "%s/m/secret", dir);
    snprintf(bad, sizeof(bad), "%s/bad", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Load cfg and expect failure with `want` in the message. */
static void expect_error(duet_auth_config_t *cfg, const char *want)
{
    duet_rpc_auth_t *auth = (duet_rpc_auth_t *)1;
    assert_int_equal(duet_rpc_auth_load(cfg, &auth), DUET_ERR_CONFIG);
    assert_null(auth);
    if (strstr(duet_error_msg(), want) == NULL)
        fail_msg("error \"%s\" lacks \"%s\"", duet_error_msg(), want);
}

static void test_load_errors(void **state)
{
    (void)state;
    duet_auth_config_t c = {ca, cert, key, secret, "", "", false};
    duet_rpc_auth_t *auth = NULL;
    char path[320];

    assert_int_equal(duet_rpc_auth_load(&c, &auth), DUET_OK);
    assert_string_equal(duet_rpc_auth_mode(auth), "mtls+secret");
    duet_rpc_auth_destroy(auth);
    duet_auth_config_t off = {"", "", "", "", "", "", false};
    assert_int_equal(duet_rpc_auth_load(&off, &auth), DUET_OK);
    assert_null(auth);
    assert_string_equal(duet_rpc_auth_mode(NULL), "off");

    duet_auth_config_t c1 = {"", cert, key, "", "", "", false};
    expect_error(&c1, "auth.ca: required");
    duet_auth_config_t c2 = {ca, "", key, "", "", "", false};
    expect_error(&c2, "auth.cert: required");
    duet_auth_config_t c3 = {ca, cert, "", "", "", "", false};
    expect_error(&c3, "auth.key: required");
    snprintf(path, sizeof(path), "%s/missing.pem", dir);
    duet_auth_config_t c4 = {path, cert, key, "", "", "", false};
    expect_error(&c4, "auth.ca: ");
    duet_auth_config_t c5 = {dir, cert, key, "", "", "", false};
    expect_error(&c5, "not a regular file");
    snprintf(path, sizeof(path), "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    duet_auth_config_t c6 = {ca, path, key, "", "", "", false};
    expect_error(&c6, "auth.cert: ");
    write_file(bad, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    duet_auth_config_t c7 = {bad, cert, key, "", "", "", false};
    expect_error(&c7, "auth.ca: ");
    duet_auth_config_t c8 = {ca, cert, ca, "", "", "", false};
    expect_error(&c8, "auth.key: ");
    /* a certificate the CA did not sign: its own CA as the leaf */
    duet_auth_config_t c9 = {cert, ca, key, "", "", "", false};
    expect_error(&c9, "auth.");
    write_file(bad, "short\n");
    duet_auth_config_t c10 = {"", "", "", bad, "", "", false};
    expect_error(&c10, "auth.secret_file: ");
    write_file(bad, "0123456789 abcdef0123\n");
    expect_error(&c10, "not printable");
    write_file(bad, "0123456789abcdef0123\r\nsecond line ignored\n");
    assert_int_equal(duet_rpc_auth_load(&c10, &auth), DUET_OK);
    assert_string_equal(duet_rpc_auth_mode(auth), "secret");
    duet_rpc_auth_destroy(auth);
}

static void test_secret_equal(void **state)
{
    (void)state;
    const char *s = "0123456789abcdef";
    assert_true(duet_rpc_auth_secret_equal(s, 16, "0123456789abcdef", 16));
    assert_false(duet_rpc_auth_secret_equal(s, 16, "0123456789abcdeX", 16));
    assert_false(duet_rpc_auth_secret_equal(s, 16, "0123456789abcde", 15));
    assert_false(duet_rpc_auth_secret_equal(s, 16, "0123456789abcdef0", 17));
    assert_false(duet_rpc_auth_secret_equal(s, 16, NULL, 0));
    assert_false(duet_rpc_auth_secret_equal(s, 16, "", 0));
}

static void h_echo(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    (void)arg;
    duet_rpc_call_reply(call, req, len);
}

/* One unary call; returns the gRPC code. */
static grpc_status_code call_with(duet_auth_config_t *cfg, const char *target, const char *method)
{
    duet_rpc_auth_t *auth = NULL;
    duet_rpc_client_config_t cc;
    duet_rpc_client_t *cli;
    duet_rpc_result_t res;

    assert_int_equal(duet_rpc_auth_load(cfg, &auth), DUET_OK);
    duet_rpc_client_config_init(&cc);
    cc.auth = auth;
    assert_int_equal(duet_rpc_client_create(&cc, &cli), DUET_OK);
    duet_rpc_client_unary(cli, target, method, "hi", 2, duet_deadline_in_ms(10000), &res);
    grpc_status_code code = res.code;
    if (code == GRPC_STATUS_OK && strcmp(method, "/t.T/Echo") == 0) {
        assert_int_equal(res.len, 2);
        assert_memory_equal(res.data, "hi", 2);
    }
    duet_rpc_result_cleanup(&res);
    duet_rpc_client_destroy(cli);
    duet_rpc_auth_destroy(auth);
    return code;
}

static void test_server_client(void **state)
{
    (void)state;
    duet_auth_config_t sc = {ca, cert, key, secret, "", "", false};
    duet_rpc_auth_t *sauth = NULL;
    duet_rpc_server_config_t cfg;
    duet_rpc_server_t *srv;
    duet_rpc_health_t *health;
    char target[64];

    assert_int_equal(duet_rpc_auth_load(&sc, &sauth), DUET_OK);
    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = "127.0.0.1:0";
    cfg.auth = sauth;
    assert_int_equal(duet_rpc_server_create(&cfg, &srv), DUET_OK);
    assert_int_equal(duet_rpc_server_add_method(srv, "/t.T/Echo", DUET_RPC_UNARY, h_echo, NULL),
                     DUET_OK);
    assert_int_equal(duet_rpc_health_create(srv, DUET_RPC_HEALTH_SERVING, &health), DUET_OK);
    assert_int_equal(duet_rpc_server_start(srv), DUET_OK);
    snprintf(target, sizeof(target), "127.0.0.1:%d", duet_rpc_server_port(srv));

    write_file(bad, "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff\n");
    duet_auth_config_t good = {ca, cert, key, secret, "", "", false};
    duet_auth_config_t no_secret = {ca, cert, key, "", "", "", false};
    duet_auth_config_t wrong = {ca, cert, key, bad, "", "", false};
    duet_auth_config_t plain_secret = {"", "", "", secret, "", "", false};
    /* the server certificate names localhost: an override that matches */
    duet_auth_config_t named = {ca, cert, key, secret, "localhost", "", false};
    duet_auth_config_t misnamed = {ca, cert, key, secret, "elsewhere.example", "", false};

    assert_int_equal(call_with(&good, target, "/t.T/Echo"), GRPC_STATUS_OK);
    assert_int_equal(call_with(&named, target, "/t.T/Echo"), GRPC_STATUS_OK);
    assert_int_equal(call_with(&good, target, "/grpc.health.v1.Health/Check"), GRPC_STATUS_OK);
    assert_int_equal(call_with(&good, target, "/t.T/Nope"), GRPC_STATUS_UNIMPLEMENTED);
    const char *methods[] = {"/t.T/Echo", "/grpc.health.v1.Health/Check", "/t.T/Nope"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(call_with(&no_secret, target, methods[i]), GRPC_STATUS_UNAUTHENTICATED);
        assert_int_equal(call_with(&wrong, target, methods[i]), GRPC_STATUS_UNAUTHENTICATED);
    }
    /* plaintext to a TLS port, or a server name the certificate lacks: no
     * call at all */
    assert_int_equal(call_with(&plain_secret, target, "/t.T/Echo"), GRPC_STATUS_UNAVAILABLE);
    assert_int_equal(call_with(&misnamed, target, "/t.T/Echo"), GRPC_STATUS_UNAVAILABLE);

    duet_rpc_server_destroy(srv);
    duet_rpc_health_destroy(health);
    duet_rpc_auth_destroy(sauth);
}

/* One unary call of len bytes; returns the gRPC code. */
static grpc_status_code call_size(duet_auth_config_t *cfg, const char *target, size_t len)
{
    duet_rpc_auth_t *auth = NULL;
    duet_rpc_client_config_t cc;
    duet_rpc_client_t *cli;
    duet_rpc_result_t res;
    uint8_t *msg = calloc(len, 1);

    assert_non_null(msg);
    if (cfg->ca[0] || cfg->secret_file[0])
        assert_int_equal(duet_rpc_auth_load(cfg, &auth), DUET_OK);
    duet_rpc_client_config_init(&cc);
    cc.auth = auth;
    cc.max_message_bytes = 8u << 20;
    assert_int_equal(duet_rpc_client_create(&cc, &cli), DUET_OK);
    duet_rpc_client_unary(cli, target, "/t.T/Echo", msg, len, duet_deadline_in_ms(10000), &res);
    grpc_status_code code = res.code;
    duet_rpc_result_cleanup(&res);
    duet_rpc_client_destroy(cli);
    duet_rpc_auth_destroy(auth);
    free(msg);
    return code;
}

/* The request message is read only after the call's authentication (issue
 * 25): a caller without credentials sending more than the server's message
 * limit is UNAUTHENTICATED, not RESOURCE_EXHAUSTED as when the server read
 * the message first; with credentials the limit still holds. */
static void test_message_after_auth(void **state)
{
    (void)state;
    for (int tls = 0; tls < 2; tls++) {
        duet_auth_config_t sc = {tls ? ca : "", tls ? cert : "", tls ? key : "", secret, "", "",
                                 false};
        duet_auth_config_t good = {tls ? ca : "", tls ? cert : "", tls ? key : "", secret, "", "",
                                   false};
        duet_auth_config_t no_secret = {tls ? ca : "", tls ? cert : "", tls ? key : "", "", "", "",
                                        false};
        duet_rpc_auth_t *sauth = NULL;
        duet_rpc_server_config_t cfg;
        duet_rpc_server_t *srv;
        char target[64];

        assert_int_equal(duet_rpc_auth_load(&sc, &sauth), DUET_OK);
        duet_rpc_server_config_init(&cfg);
        cfg.bind_addr = "127.0.0.1:0";
        cfg.auth = sauth;
        cfg.max_message_bytes = 64u << 10;
        assert_int_equal(duet_rpc_server_create(&cfg, &srv), DUET_OK);
        assert_int_equal(duet_rpc_server_add_method(srv, "/t.T/Echo", DUET_RPC_UNARY, h_echo, NULL),
                         DUET_OK);
        assert_int_equal(duet_rpc_server_start(srv), DUET_OK);
        snprintf(target, sizeof(target), "127.0.0.1:%d", duet_rpc_server_port(srv));

        assert_int_equal(call_size(&good, target, 1000), GRPC_STATUS_OK);
        assert_int_equal(call_size(&good, target, 1u << 20), GRPC_STATUS_RESOURCE_EXHAUSTED);
        assert_int_equal(call_size(&no_secret, target, 1000), GRPC_STATUS_UNAUTHENTICATED);
        assert_int_equal(call_size(&no_secret, target, 4u << 20), GRPC_STATUS_UNAUTHENTICATED);
        /* an empty message is still a message */
        assert_int_equal(call_size(&good, target, 0), GRPC_STATUS_OK);
        duet_rpc_server_destroy(srv);
        duet_rpc_auth_destroy(sauth);
    }
}

/* The handler sees the caller's identity: replies "<role>/<name>". */
static void h_whoami(duet_rpc_call_t *call, const uint8_t *req, size_t len, void *arg)
{
    (void)req, (void)len, (void)arg;
    const char *name = NULL;
    duet_rpc_role_t role = duet_rpc_call_identity(call, &name);
    char buf[96];
    int n = snprintf(buf, sizeof(buf), "%s/%s", duet_rpc_role_name(role), name);
    duet_rpc_call_reply(call, buf, (size_t)n);
}

/* One call as identity id ("router-r0", or "node" for none). */
static grpc_status_code call_as(const char *id, const char *target, const char *method, char *reply,
                                size_t cap)
{
    char c[320], k[320];
    duet_auth_config_t cfg = {ca, c, k, secret, "", "", false};
    duet_rpc_auth_t *auth = NULL;
    duet_rpc_client_config_t cc;
    duet_rpc_client_t *cli;
    duet_rpc_result_t res;

    snprintf(c, sizeof(c), "%s/m/%s.pem", dir, id);
    snprintf(k, sizeof(k), "%s/m/%s.key", dir, id);
    assert_int_equal(duet_rpc_auth_load(&cfg, &auth), DUET_OK);
    duet_rpc_client_config_init(&cc);
    cc.auth = auth;
    assert_int_equal(duet_rpc_client_create(&cc, &cli), DUET_OK);
    duet_rpc_client_unary(cli, target, method, "hi", 2, duet_deadline_in_ms(10000), &res);
    grpc_status_code code = res.code;
    if (reply != NULL) {
        const char *src = code == GRPC_STATUS_OK ? (const char *)res.data : res.message;
        size_t n = code == GRPC_STATUS_OK ? res.len : strlen(res.message ? res.message : "");
        n = n < cap - 1 ? n : cap - 1;
        memcpy(reply, src ? src : "", n);
        reply[n] = '\0';
    }
    duet_rpc_result_cleanup(&res);
    duet_rpc_client_destroy(cli);
    duet_rpc_auth_destroy(auth);
    return code;
}

static void test_roles(void **state)
{
    (void)state;
    char sc_cert[320], sc_key[320], target[64], reply[256];
    snprintf(sc_cert, sizeof(sc_cert), "%s/m/decode-d0.pem", dir);
    snprintf(sc_key, sizeof(sc_key), "%s/m/decode-d0.key", dir);
    duet_auth_config_t sc = {ca, sc_cert, sc_key, secret, "", "ops, x.y_z-1", false};
    duet_rpc_auth_t *sauth = NULL;
    duet_rpc_server_config_t cfg;
    duet_rpc_server_t *srv;
    static const char *const paths[] = {"/duet.v1.Decode/Generate", "/duet.v1.Decode/Abort",
                                        "/duet.v1.Decode/Info",     "/duet.v1.Prefill/Bootstrap",
                                        "/duet.v1.Prefill/Prefill", "/duet.v1.Prefill/Abort"};

    assert_int_equal(duet_rpc_auth_load(&sc, &sauth), DUET_OK);
    assert_string_equal(duet_rpc_auth_identity(sauth), "decode/d0");
    duet_rpc_server_config_init(&cfg);
    cfg.bind_addr = "127.0.0.1:0";
    cfg.auth = sauth;
    assert_int_equal(duet_rpc_server_create(&cfg, &srv), DUET_OK);
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        assert_int_equal(duet_rpc_server_add_method(srv, paths[i], DUET_RPC_UNARY, h_whoami, NULL),
                         DUET_OK);
    assert_int_equal(duet_rpc_server_start(srv), DUET_OK);
    snprintf(target, sizeof(target), "127.0.0.1:%d", duet_rpc_server_port(srv));

    /* who may call what */
    static const struct {
        const char *id, *method;
        grpc_status_code want;
        const char *text; /* the reply or a piece of the message */
    } cases[] = {
        {"router-r0", "/duet.v1.Decode/Generate", GRPC_STATUS_OK, "router/r0"},
        {"router-r0", "/duet.v1.Decode/Abort", GRPC_STATUS_OK, "router/r0"},
        {"client-ops", "/duet.v1.Decode/Generate", GRPC_STATUS_OK, "client/ops"},
        {"client-eve", "/duet.v1.Decode/Generate", GRPC_STATUS_PERMISSION_DENIED, "client/eve"},
        {"prefill-p0", "/duet.v1.Decode/Generate", GRPC_STATUS_PERMISSION_DENIED, "prefill/p0"},
        {"decode-d0", "/duet.v1.Decode/Abort", GRPC_STATUS_PERMISSION_DENIED, "router"},
        {"node", "/duet.v1.Decode/Generate", GRPC_STATUS_PERMISSION_DENIED, "names none"},
        {"node", "/duet.v1.Decode/Info", GRPC_STATUS_OK, "/"},
        {"prefill-p0", "/duet.v1.Decode/Info", GRPC_STATUS_OK, "prefill/p0"},
        {"decode-d0", "/duet.v1.Prefill/Bootstrap", GRPC_STATUS_OK, "decode/d0"},
        {"decode-d0", "/duet.v1.Prefill/Prefill", GRPC_STATUS_OK, "decode/d0"},
        {"decode-d0", "/duet.v1.Prefill/Abort", GRPC_STATUS_OK, "decode/d0"},
        {"router-r0", "/duet.v1.Prefill/Bootstrap", GRPC_STATUS_PERMISSION_DENIED, "decode"},
        {"client-ops", "/duet.v1.Prefill/Prefill", GRPC_STATUS_PERMISSION_DENIED, "client/ops"},
        {"prefill-p0", "/duet.v1.Prefill/Abort", GRPC_STATUS_PERMISSION_DENIED, "prefill/p0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        grpc_status_code got = call_as(cases[i].id, target, cases[i].method, reply, sizeof(reply));
        if (got != cases[i].want || strstr(reply, cases[i].text) == NULL)
            fail_msg("%s calling %s: %d %s (want %d, \"%s\")", cases[i].id, cases[i].method, got,
                     reply, cases[i].want, cases[i].text);
    }
    duet_rpc_server_destroy(srv);
    duet_rpc_auth_destroy(sauth);

    /* auth.clients must be names */
    duet_auth_config_t badc = {ca, sc_cert, sc_key, "", "", "ops,a b", false};
    expect_error(&badc, "auth.clients: ");
}

static void test_listen_check(void **state)
{
    (void)state;
    static const char *const loop[] = {"127.0.0.1:1", "127.9.8.7:1", "[::1]:1",
                                       "localhost:1", "unix:/tmp/s", "[::ffff:127.0.0.1]:1",
                                       "127.0.0.1:0"};
    static const char *const open_[] = {"0.0.0.0:1",  "[::]:1", "10.0.0.1:1",
                                        "duet.svc:1", ":1",     "192.168.1.1:80"};
    for (size_t i = 0; i < sizeof(loop) / sizeof(loop[0]); i++)
        assert_int_equal(duet_rpc_auth_listen_check(false, false, "k", loop[i]), DUET_OK);
    for (size_t i = 0; i < sizeof(open_) / sizeof(open_[0]); i++) {
        assert_int_equal(duet_rpc_auth_listen_check(false, false, "router.grpc", open_[i]),
                         DUET_ERR_CONFIG);
        assert_non_null(strstr(duet_error_msg(), "router.grpc: "));
        assert_non_null(strstr(duet_error_msg(), "auth.insecure"));
        assert_int_equal(duet_rpc_auth_listen_check(true, false, "k", open_[i]), DUET_OK);
        assert_int_equal(duet_rpc_auth_listen_check(false, true, "k", open_[i]), DUET_OK);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_secret_equal),
        cmocka_unit_test(test_server_client),
        cmocka_unit_test(test_message_after_auth),
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_listen_check),
    };
    if (system("command -v openssl >/dev/null") != 0) {
        printf("SKIP: the openssl command is missing (scripts/install-deps.sh)\n");
        return 0;
    }
    return cmocka_run_group_tests(tests, setup, teardown);
}
