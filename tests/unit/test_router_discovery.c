/* Worker discovery's pure parts (router/fleet/discovery.h): "name:port" parsing,
 * address formatting, the reconciliation of a group's members with a
 * resolved set across scale-up, scale-down and restarts, the lookup-failure
 * grace period, and the config validation that --check-config runs.  The
 * resolver itself is exercised on IP literals (no DNS needed); names are
 * covered by tests/router/test_router_discovery.py. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "router/fleet/discovery.h"
#include "router/fleet/workers.h"

static void parse_ok(const char *text, const char *host, const char *port)
{
    duet_router_disc_spec_t s;
    if (duet_router_disc_parse(text, &s) != DUET_OK)
        fail_msg("'%s' rejected: %s", text, duet_error_msg());
    assert_string_equal(s.host, host);
    assert_string_equal(s.port, port);
}

static void parse_bad(const char *text, const char *needle)
{
    duet_router_disc_spec_t s;
    memset(&s, 0x5a, sizeof(s));
    if (duet_router_disc_parse(text, &s) != DUET_ERR_CONFIG)
        fail_msg("'%s' accepted", text ? text : "(null)");
    if (strstr(duet_error_msg(), needle) == NULL)
        fail_msg("'%s': message '%s' lacks '%s'", text ? text : "(null)", duet_error_msg(), needle);
    assert_int_equal(((unsigned char *)&s)[0], 0x5a); /* untouched on failure */
}

static void test_parse(void **state)
{
    (void)state;
    parse_ok("duet-prefill:9100", "duet-prefill", "9100");
    parse_ok("duet-decode.duet.svc.cluster.local:9200", "duet-decode.duet.svc.cluster.local",
             "9200");
    parse_ok("duet-decode.duet.svc.cluster.local.:1", "duet-decode.duet.svc.cluster.local.", "1");
    parse_ok("_grpc.x:65535", "_grpc.x", "65535");
    parse_ok("10.0.0.7:9100", "10.0.0.7", "9100");
    parse_ok("[::1]:9100", "::1", "9100");
    parse_ok("[fd00:1::2]:80", "fd00:1::2", "80");
    parse_ok("host:00080", "host", "80");

    parse_bad(NULL, "empty");
    parse_bad("", "empty");
    parse_bad("duet-prefill", "no port");
    parse_bad("duet-prefill:", "port");
    parse_bad("duet-prefill:0", "1..65535");
    parse_bad("duet-prefill:65536", "1..65535");
    parse_bad("duet-prefill:123456", "1..65535");
    parse_bad("duet-prefill:-1", "1..65535");
    parse_bad("duet-prefill:80x", "1..65535");
    parse_bad(":9100", "empty");
    parse_bad("a..b:9100", "empty label");
    parse_bad(".a:9100", "empty label");
    parse_bad("a b:9100", "letters, digits");
    parse_bad("a/b:9100", "letters, digits");
    parse_bad("::1:9100", "brackets");
    parse_bad("fd00::2:9100", "brackets");
    parse_bad("[::1]", "[ipv6]:port");
    parse_bad("[::1]9100", "[ipv6]:port");
    parse_bad("[::1:9100", "without ']'");
    parse_bad("[]:9100", "[ipv6]:port");
    parse_bad("[not-v6]:9100", "not an IPv6 address");
    parse_bad("[1.2.3.4]:9100", "not an IPv6 address");
    char label[80], longname[300];
    memset(label, 'a', 64);
    snprintf(label + 64, sizeof(label) - 64, ":1");
    parse_bad(label, "63 bytes");
    for (int i = 0; i < 60; i++)
        memcpy(longname + 5 * i, "abcd.", 5);
    snprintf(longname + 300 - 8, 8, "ab:9");
    parse_bad(longname, "253 bytes");
}

static duet_router_disc_addr_t v4(const char *ip, const char *port)
{
    struct sockaddr_in in;
    duet_router_disc_addr_t a;
    memset(&in, 0, sizeof(in));
    in.sin_family = AF_INET;
    assert_int_equal(inet_pton(AF_INET, ip, &in.sin_addr), 1);
    assert_int_equal(duet_router_disc_addr_from_sockaddr(&in, port, &a), DUET_OK);
    return a;
}

static void test_format_normalize(void **state)
{
    struct sockaddr_in6 in6;
    struct sockaddr other;
    duet_router_disc_addr_t a;
    (void)state;

    a = v4("127.0.0.2", "9100");
    assert_string_equal(a.addr, "127.0.0.2:9100");
    assert_string_equal(a.ip, "127.0.0.2");
    memset(&in6, 0, sizeof(in6));
    in6.sin6_family = AF_INET6;
    assert_int_equal(inet_pton(AF_INET6, "fd00:0:0::0:5", &in6.sin6_addr), 1);
    assert_int_equal(duet_router_disc_addr_from_sockaddr(&in6, "80", &a), DUET_OK);
    assert_string_equal(a.addr, "[fd00::5]:80");
    assert_string_equal(a.ip, "fd00::5");
    memset(&other, 0, sizeof(other));
    other.sa_family = AF_UNIX;
    assert_int_equal(duet_router_disc_addr_from_sockaddr(&other, "80", &a), DUET_ERR_INVALID);

    duet_router_disc_addr_t set[6] = {v4("10.0.0.3", "1"), v4("10.0.0.1", "1"),
                                      v4("10.0.0.3", "1"), v4("10.0.0.2", "1"),
                                      v4("10.0.0.1", "1"), v4("10.0.0.3", "1")};
    assert_int_equal(duet_router_disc_normalize(set, 6), 3);
    assert_string_equal(set[0].addr, "10.0.0.1:1");
    assert_string_equal(set[1].addr, "10.0.0.2:1");
    assert_string_equal(set[2].addr, "10.0.0.3:1");
    assert_int_equal(duet_router_disc_normalize(set, 0), 0);
}

/* A toy group driven by the same rules as workers.c: members (address,
 * instance id, active or leaving, requests in flight) reconciled against
 * resolved sets. */
typedef struct {
    char addr[DUET_ROUTER_DISC_ADDR_MAX];
    char id[64];
    bool active, gone;
    int inflight;
} member_t;

typedef struct {
    member_t m[32];
    size_t n;
    int joined, left, revived;
} group_t;

static void reconcile(group_t *g, const char *const *ips, size_t n_ips)
{
    duet_router_disc_addr_t want[32];
    duet_router_disc_member_t mem[32];
    duet_router_disc_verdict_t verdict[32];
    size_t idx[32], n_m = 0, n_want = n_ips;
    bool add[32];

    for (size_t j = 0; j < n_ips; j++)
        want[j] = v4(ips[j], "9100");
    n_want = duet_router_disc_normalize(want, n_want);
    for (size_t i = 0; i < g->n; i++) {
        if (!g->m[i].gone) {
            mem[n_m] = (duet_router_disc_member_t){g->m[i].addr, g->m[i].active};
            idx[n_m++] = i;
        }
    }
    duet_router_disc_reconcile(mem, n_m, want, n_want, verdict, add);
    g->joined = g->left = g->revived = 0;
    for (size_t i = 0; i < n_m; i++) {
        member_t *m = &g->m[idx[i]];
        switch (verdict[i]) {
        case DUET_ROUTER_DISC_LEAVE:
            assert_true(m->active);
            m->active = false;
            g->left++;
            break;
        case DUET_ROUTER_DISC_REVIVE:
            assert_false(m->active);
            m->active = true;
            g->revived++;
            break;
        case DUET_ROUTER_DISC_STAY:
            break;
        }
    }
    for (size_t j = 0; j < n_want; j++) {
        if (add[j]) {
            assert_true(g->n < 32);
            memset(&g->m[g->n], 0, sizeof(g->m[0]));
            memcpy(g->m[g->n].addr, want[j].addr, sizeof(want[j].addr));
            g->m[g->n++].active = true;
            g->joined++;
        }
    }
    /* leaving members with nothing in flight are removed */
    for (size_t i = 0; i < g->n; i++)
        if (!g->m[i].active && g->m[i].inflight == 0)
            g->m[i].gone = true;
    /* the invariant: one active member per resolved address, none other */
    for (size_t j = 0; j < n_want; j++) {
        size_t k = 0;
        for (size_t i = 0; i < g->n; i++)
            k += !g->m[i].gone && g->m[i].active && strcmp(g->m[i].addr, want[j].addr) == 0;
        assert_int_equal(k, 1);
    }
    size_t n_active = 0;
    for (size_t i = 0; i < g->n; i++)
        n_active += !g->m[i].gone && g->m[i].active;
    assert_int_equal(n_active, n_want);
}

/* An Info answer from the daemon at addr; returns the identity verdict and
 * applies it as workers.c does (a restart is a new instance in place). */
static duet_router_disc_id_t info(group_t *g, const char *addr, const char *id)
{
    for (size_t i = 0; i < g->n; i++) {
        if (g->m[i].gone || !g->m[i].active || strcmp(g->m[i].addr, addr) != 0)
            continue;
        duet_router_disc_id_t v = duet_router_disc_identity(g->m[i].id, id);
        snprintf(g->m[i].id, sizeof(g->m[i].id), "%s", id);
        return v;
    }
    fail_msg("no active member for %s", addr);
    return DUET_ROUTER_DISC_ID_SAME;
}

static member_t *member(group_t *g, const char *addr)
{
    for (size_t i = 0; i < g->n; i++)
        if (!g->m[i].gone && strcmp(g->m[i].addr, addr) == 0)
            return &g->m[i];
    return NULL;
}

static void test_reconcile(void **state)
{
    static group_t g;
    member_t *m;
    (void)state;

    memset(&g, 0, sizeof(g));
    /* first answer: two pods (a duplicate in the answer counts once) */
    const char *a1[] = {"10.0.0.2", "10.0.0.1", "10.0.0.2"};
    reconcile(&g, a1, 3);
    assert_int_equal(g.joined, 2);
    assert_int_equal(g.left, 0);
    assert_int_equal(info(&g, "10.0.0.1:9100", "decode-aaa"), DUET_ROUTER_DISC_ID_FIRST);
    assert_int_equal(info(&g, "10.0.0.2:9100", "decode-bbb"), DUET_ROUTER_DISC_ID_FIRST);
    /* the same set in another order: nothing changes */
    const char *a2[] = {"10.0.0.1", "10.0.0.2"};
    reconcile(&g, a2, 2);
    assert_int_equal(g.joined + g.left + g.revived, 0);
    /* scale up */
    const char *a3[] = {"10.0.0.3", "10.0.0.1", "10.0.0.2"};
    reconcile(&g, a3, 3);
    assert_int_equal(g.joined, 1);
    assert_int_equal(g.left, 0);
    /* scale down with a stream on .2: it leaves rotation, stays until done */
    member(&g, "10.0.0.2:9100")->inflight = 1;
    const char *a4[] = {"10.0.0.1", "10.0.0.3"};
    reconcile(&g, a4, 2);
    assert_int_equal(g.joined, 0);
    assert_int_equal(g.left, 1);
    m = member(&g, "10.0.0.2:9100");
    assert_non_null(m);
    assert_false(m->active);
    reconcile(&g, a4, 2); /* still leaving: nothing to do */
    assert_int_equal(g.joined + g.left + g.revived, 0);
    assert_non_null(member(&g, "10.0.0.2:9100"));
    /* .2 resolves again while its stream runs: the same worker comes back */
    reconcile(&g, a3, 3);
    assert_int_equal(g.revived, 1);
    assert_int_equal(g.joined, 0);
    assert_true(member(&g, "10.0.0.2:9100")->active);
    assert_int_equal(info(&g, "10.0.0.2:9100", "decode-bbb"), DUET_ROUTER_DISC_ID_SAME);
    /* it leaves again and its stream ends: removed; when it comes back it
     * is a new member */
    reconcile(&g, a4, 2);
    assert_int_equal(g.left, 1);
    member(&g, "10.0.0.2:9100")->inflight = 0;
    reconcile(&g, a4, 2);
    assert_null(member(&g, "10.0.0.2:9100"));
    size_t before = g.n;
    reconcile(&g, a3, 3);
    assert_int_equal(g.joined, 1);
    assert_int_equal(g.n, before + 1);
    assert_int_equal(info(&g, "10.0.0.2:9100", "decode-ddd"), DUET_ROUTER_DISC_ID_FIRST);
    /* the daemon at .1 restarted at the same address: a new instance */
    assert_int_equal(info(&g, "10.0.0.1:9100", "decode-ccc"), DUET_ROUTER_DISC_ID_RESTARTED);
    assert_int_equal(info(&g, "10.0.0.1:9100", "decode-ccc"), DUET_ROUTER_DISC_ID_SAME);
    reconcile(&g, a3, 3);
    assert_int_equal(g.joined + g.left + g.revived, 0);
    /* the group dropped (empty set): everyone leaves */
    reconcile(&g, NULL, 0);
    assert_int_equal(g.joined, 0);
    assert_int_equal(g.left, 3);
}

static void test_reconcile_rules(void **state)
{
    duet_router_disc_addr_t want[2] = {v4("10.0.0.1", "1"), v4("10.0.0.2", "1")};
    duet_router_disc_member_t m[6] = {
        {"10.0.0.2:1", false}, /* leaving, but an active one has the address */
        {"10.0.0.9:1", true},  /* not resolved: leaves */
        {"10.0.0.2:1", true},  /* stays */
        {"10.0.0.2:1", true},  /* a second active one with the address: leaves */
        {"10.0.0.1:1", false}, /* leaving, resolved again: revived */
        {"10.0.0.1:1", false}, /* another leaving one: stays leaving */
    };
    duet_router_disc_verdict_t v[6];
    bool add[2];
    (void)state;
    duet_router_disc_reconcile(m, 6, want, 2, v, add);
    assert_int_equal(v[0], DUET_ROUTER_DISC_STAY);
    assert_int_equal(v[1], DUET_ROUTER_DISC_LEAVE);
    assert_int_equal(v[2], DUET_ROUTER_DISC_STAY);
    assert_int_equal(v[3], DUET_ROUTER_DISC_LEAVE);
    assert_int_equal(v[4], DUET_ROUTER_DISC_REVIVE);
    assert_int_equal(v[5], DUET_ROUTER_DISC_STAY);
    assert_false(add[0]);
    assert_false(add[1]);
    /* nothing yet: everything joins */
    duet_router_disc_reconcile(NULL, 0, want, 2, v, add);
    assert_true(add[0] && add[1]);
}

static void test_identity(void **state)
{
    (void)state;
    assert_int_equal(duet_router_disc_identity("", "p-1"), DUET_ROUTER_DISC_ID_FIRST);
    assert_int_equal(duet_router_disc_identity(NULL, "p-1"), DUET_ROUTER_DISC_ID_FIRST);
    assert_int_equal(duet_router_disc_identity("p-1", "p-1"), DUET_ROUTER_DISC_ID_SAME);
    assert_int_equal(duet_router_disc_identity("p-1", "p-2"), DUET_ROUTER_DISC_ID_RESTARTED);
    assert_int_equal(duet_router_disc_identity("p-1", ""), DUET_ROUTER_DISC_ID_SAME);
    assert_int_equal(duet_router_disc_identity("", ""), DUET_ROUTER_DISC_ID_SAME);
}

static void test_outcome(void **state)
{
    const int64_t ms = DUET_NS_PER_MS, grace = 600 * ms;
    duet_router_disc_state_t s;
    duet_router_disc_action_t a;
    (void)state;

    memset(&s, 0, sizeof(s));
    assert_int_equal(duet_router_disc_outcome(&s, 0, 1000 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_NONE);
    assert_int_equal(a, DUET_ROUTER_DISC_APPLY);
    /* NXDOMAIN: logged once, the set kept through the grace period */
    assert_int_equal(duet_router_disc_outcome(&s, EAI_NONAME, 1200 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_FAILING);
    assert_int_equal(a, DUET_ROUTER_DISC_KEEP);
    assert_int_equal(duet_router_disc_outcome(&s, EAI_NONAME, 1400 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_NONE);
    assert_int_equal(a, DUET_ROUTER_DISC_KEEP);
    /* another failure kind is a state change: logged, same grace clock */
    assert_int_equal(duet_router_disc_outcome(&s, EAI_AGAIN, 1600 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_FAILING);
    assert_int_equal(a, DUET_ROUTER_DISC_KEEP);
    /* grace over (600 ms after the first failure): dropped, logged once */
    assert_int_equal(duet_router_disc_outcome(&s, EAI_AGAIN, 1800 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_DROPPED);
    assert_int_equal(a, DUET_ROUTER_DISC_DROP);
    assert_int_equal(duet_router_disc_outcome(&s, EAI_AGAIN, 2000 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_NONE);
    assert_int_equal(a, DUET_ROUTER_DISC_DROP);
    /* back */
    assert_int_equal(duet_router_disc_outcome(&s, 0, 2200 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_RECOVERED);
    assert_int_equal(a, DUET_ROUTER_DISC_APPLY);
    assert_int_equal(duet_router_disc_outcome(&s, 0, 2400 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_NONE);
    /* a new failure run starts its own clock */
    assert_int_equal(
        duet_router_disc_outcome(&s, DUET_ROUTER_DISC_ERR_TIMEOUT, 3000 * ms, grace, &a),
        DUET_ROUTER_DISC_EV_FAILING);
    assert_int_equal(a, DUET_ROUTER_DISC_KEEP);
    assert_int_equal(
        duet_router_disc_outcome(&s, DUET_ROUTER_DISC_ERR_TIMEOUT, 3599 * ms, grace, &a),
        DUET_ROUTER_DISC_EV_NONE);
    assert_int_equal(a, DUET_ROUTER_DISC_KEEP);
    assert_int_equal(
        duet_router_disc_outcome(&s, DUET_ROUTER_DISC_ERR_TIMEOUT, 3600 * ms, grace, &a),
        DUET_ROUTER_DISC_EV_DROPPED);
    /* failing from the start: nothing known, logged once */
    memset(&s, 0, sizeof(s));
    assert_int_equal(duet_router_disc_outcome(&s, EAI_NONAME, 0, grace, &a),
                     DUET_ROUTER_DISC_EV_FAILING);
    assert_int_equal(duet_router_disc_outcome(&s, EAI_NONAME, 100 * ms, grace, &a),
                     DUET_ROUTER_DISC_EV_NONE);
}

static void test_err_str(void **state)
{
    char b[160];
    (void)state;
    assert_non_null(strstr(duet_router_disc_err_str(EAI_NONAME, b, sizeof(b)), "EAI_NONAME"));
    assert_non_null(strstr(duet_router_disc_err_str(EAI_AGAIN, b, sizeof(b)), "EAI_AGAIN"));
    assert_non_null(
        strstr(duet_router_disc_err_str(DUET_ROUTER_DISC_ERR_TIMEOUT, b, sizeof(b)), "timeout"));
    assert_string_equal(duet_router_disc_err_str(0, b, sizeof(b)), "ok");
}

/* The resolver and the lookup thread on literals (no DNS involved). */
static void test_resolve_literals(void **state)
{
    duet_router_disc_spec_t s;
    duet_router_disc_addr_t *a = NULL;
    const duet_router_disc_addr_t *la;
    size_t n = 0;
    (void)state;

    assert_int_equal(duet_router_disc_parse("127.0.0.3:9100", &s), DUET_OK);
    assert_int_equal(duet_router_disc_resolve(&s, &a, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(a[0].addr, "127.0.0.3:9100");
    assert_string_equal(a[0].ip, "127.0.0.3");
    duet_free(a);

    assert_int_equal(duet_router_disc_parse("[::1]:9200", &s), DUET_OK);
    duet_router_disc_lookup_t *lk = duet_router_disc_lookup_start(&s);
    assert_non_null(lk);
    assert_true(duet_router_disc_lookup_wait(lk, duet_now_ns() + 10 * DUET_NS_PER_S));
    assert_int_equal(duet_router_disc_lookup_result(lk, &la, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(la[0].addr, "[::1]:9200");
    duet_router_disc_lookup_release(lk);

    /* a released lookup that has not been waited for frees itself */
    assert_int_equal(duet_router_disc_parse("127.0.0.1:1", &s), DUET_OK);
    duet_router_disc_lookup_release(duet_router_disc_lookup_start(&s));
}

static duet_status_t parse_cfg(const char *prefill, const char *decode,
                               duet_cluster_config_t **cfg_p)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"model\": \"/nonexistent\", \"prefill\": [%s], \"decode\": [%s]}", prefill, decode);
    return duet_cluster_parse(text, strlen(text), "test", "/", cfg_p);
}

static void validate(const char *prefill, const char *decode, const char *needle)
{
    duet_cluster_config_t *cfg = NULL;
    if (parse_cfg(prefill, decode, &cfg) != DUET_OK)
        fail_msg("config does not parse: %s", duet_error_msg());
    duet_status_t st = duet_router_workers_validate(cfg);
    if (needle == NULL && st != DUET_OK)
        fail_msg("rejected: %s", duet_error_msg());
    if (needle != NULL && (st != DUET_ERR_CONFIG || strstr(duet_error_msg(), needle) == NULL))
        fail_msg("want an error with '%s', got %d '%s'", needle, st, st ? duet_error_msg() : "");
    duet_cluster_free(cfg);
}

static void test_validate(void **state)
{
    (void)state;
    validate("{\"name\": \"p0\", \"address\": \"127.0.0.1:1\"}",
             "{\"name\": \"d\", \"discover\": \"duet-decode.test:9200\", \"tp\": 2}", NULL);
    validate("{\"name\": \"p0\", \"address\": \"127.0.0.1:1\"}, {\"name\": \"p\", \"discover\": "
             "\"duet-prefill:9100\", \"listen\": \"0.0.0.0:9100\"}",
             "{\"name\": \"d\", \"discover\": \"[::1]:9200\"}", NULL);
    validate("{\"name\": \"p\", \"discover\": \"duet-prefill\"}",
             "{\"name\": \"d\", \"address\": \"127.0.0.1:2\"}", "prefill[0].discover: ");
    validate("{\"name\": \"p\", \"address\": \"127.0.0.1:1\"}",
             "{\"name\": \"d0\", \"address\": \"127.0.0.1:2\"}, {\"name\": \"d\", \"discover\": "
             "\"fd00::1:9200\"}",
             "decode[1].discover: ");
    validate("{\"name\": \"p\", \"address\": \"127.0.0.1:1\", \"discover\": \"p:1\"}",
             "{\"name\": \"d\", \"address\": \"127.0.0.1:2\"}", "not both");
    validate("{\"name\": \"p\", \"address\": \"127.0.0.1:1\"}", "", "at least one decode");
    validate("{\"name\": \"decode/10.0.0.1\", \"address\": \"127.0.0.1:1\"}",
             "{\"name\": \"decode\", \"discover\": \"d:1\"}", "prefill[0].name: ");
    validate("{\"name\": \"p/1\", \"address\": \"127.0.0.1:1\"}",
             "{\"name\": \"decode\", \"discover\": \"d:1\"}", NULL);
    /* no prefill: only when a decode prefills locally (colocated mode) */
    validate("", "{\"name\": \"d\", \"address\": \"127.0.0.1:2\"}",
             "at least one prefill instance (or decode instances with prefill_local)");
    validate("", "{\"name\": \"d\", \"address\": \"127.0.0.1:2\", \"prefill_local\": \"always\"}",
             NULL);
    validate("", "{\"name\": \"d\", \"discover\": \"d:1\", \"prefill_local\": \"auto\"}", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),     cmocka_unit_test(test_format_normalize),
        cmocka_unit_test(test_reconcile), cmocka_unit_test(test_reconcile_rules),
        cmocka_unit_test(test_identity),  cmocka_unit_test(test_outcome),
        cmocka_unit_test(test_err_str),   cmocka_unit_test(test_resolve_literals),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
