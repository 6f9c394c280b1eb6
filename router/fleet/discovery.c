#include "router/fleet/discovery.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/sync.h"

/* ---- "name:port" ---- */

static bool duet__port_ok(const char *p, char out[6])
{
    size_t n = strlen(p);
    long v = 0;

    if (n == 0 || n > 5)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        v = v * 10 + (p[i] - '0');
    }
    if (v < 1 || v > 65535)
        return false;
    snprintf(out, 6, "%ld", v);
    return true;
}

/* letters, digits, '-', '_' and dots between labels of 1..63 bytes */
static const char *duet__name_problem(const char *h, size_t n)
{
    size_t label = 0;

    if (n > 0 && h[n - 1] == '.')
        n--; /* a fully qualified name */
    if (n == 0)
        return "the name is empty";
    if (n > 253)
        return "the name is longer than 253 bytes";
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (c == '.') {
            if (label == 0)
                return "the name has an empty label";
            label = 0;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return "the name may only hold letters, digits, '-', '_' and '.'";
        if (++label > 63)
            return "a label of the name is longer than 63 bytes";
    }
    return label == 0 ? "the name has an empty label" : NULL;
}

duet_status_t duet_router_disc_parse(const char *text, duet_router_disc_spec_t *spec_p)
{
    duet_router_disc_spec_t spec;
    const char *colon, *host;
    size_t hlen;

    memset(&spec, 0, sizeof(spec));
    if (text == NULL || text[0] == '\0')
        return duet_error(DUET_ERR_CONFIG, "expected \"name:port\", got an empty string");
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        unsigned char buf[sizeof(struct in6_addr)];
        if (close == NULL)
            return duet_error(DUET_ERR_CONFIG, "'%s': '[' without ']'", text);
        host = text + 1;
        hlen = (size_t)(close - host);
        if (hlen == 0 || hlen >= sizeof(spec.host))
            return duet_error(DUET_ERR_CONFIG, "'%s': expected \"[ipv6]:port\"", text);
        memcpy(spec.host, host, hlen);
        if (inet_pton(AF_INET6, spec.host, buf) != 1)
            return duet_error(DUET_ERR_CONFIG, "'%s': '%s' is not an IPv6 address", text,
                              spec.host);
        if (close[1] != ':')
            return duet_error(DUET_ERR_CONFIG, "'%s': expected \"[ipv6]:port\"", text);
        colon = close + 1;
    } else {
        const char *problem;
        colon = strrchr(text, ':');
        if (colon == NULL)
            return duet_error(DUET_ERR_CONFIG, "'%s': expected \"name:port\" (no port)", text);
        if (memchr(text, ':', (size_t)(colon - text)) != NULL)
            return duet_error(DUET_ERR_CONFIG,
                              "'%s': an IPv6 address needs brackets: \"[addr]:port\"", text);
        hlen = (size_t)(colon - text);
        if ((problem = duet__name_problem(text, hlen)) != NULL)
            return duet_error(DUET_ERR_CONFIG, "'%s': %s", text, problem);
        memcpy(spec.host, text, hlen);
    }
    if (!duet__port_ok(colon + 1, spec.port))
        return duet_error(DUET_ERR_CONFIG, "'%s': the port '%s' is not a number in 1..65535", text,
                          colon + 1);
    *spec_p = spec;
    return DUET_OK;
}

/* ---- addresses ---- */

duet_status_t duet_router_disc_addr_from_sockaddr(const void *sa, const char *port,
                                                  duet_router_disc_addr_t *a)
{
    const struct sockaddr *s = sa;

    memset(a, 0, sizeof(*a));
    if (s->sa_family == AF_INET) {
        const struct sockaddr_in *in = sa;
        if (inet_ntop(AF_INET, &in->sin_addr, a->ip, sizeof(a->ip)) == NULL)
            return DUET_ERR_INVALID;
        snprintf(a->addr, sizeof(a->addr), "%s:%s", a->ip, port);
        return DUET_OK;
    }
    if (s->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = sa;
        if (inet_ntop(AF_INET6, &in6->sin6_addr, a->ip, sizeof(a->ip)) == NULL)
            return DUET_ERR_INVALID;
        snprintf(a->addr, sizeof(a->addr), "[%s]:%s", a->ip, port);
        return DUET_OK;
    }
    return DUET_ERR_INVALID;
}

static int duet__addr_cmp(const void *x, const void *y)
{
    return strcmp(((const duet_router_disc_addr_t *)x)->addr,
                  ((const duet_router_disc_addr_t *)y)->addr);
}

size_t duet_router_disc_normalize(duet_router_disc_addr_t *a, size_t n)
{
    size_t out = 0;

    if (n == 0)
        return 0;
    qsort(a, n, sizeof(*a), duet__addr_cmp);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(a[i].addr, a[out].addr) != 0)
            a[++out] = a[i];
    }
    return out + 1;
}

const char *duet_router_disc_err_str(int err, char *buf, size_t cap)
{
    static const struct {
        int code;
        const char *name;
    } names[] = {
        {EAI_NONAME, "EAI_NONAME"},   {EAI_AGAIN, "EAI_AGAIN"},
        {EAI_FAIL, "EAI_FAIL"},       {EAI_NODATA, "EAI_NODATA"},
        {EAI_MEMORY, "EAI_MEMORY"},   {EAI_SYSTEM, "EAI_SYSTEM"},
        {EAI_SERVICE, "EAI_SERVICE"}, {EAI_ADDRFAMILY, "EAI_ADDRFAMILY"},
    };

    switch (err) {
    case 0:
        snprintf(buf, cap, "ok");
        return buf;
    case DUET_ROUTER_DISC_ERR_TIMEOUT:
        snprintf(buf, cap, "timeout (the resolver did not answer)");
        return buf;
    case DUET_ROUTER_DISC_ERR_EMPTY:
        snprintf(buf, cap, "no IPv4 or IPv6 address in the answer");
        return buf;
    case DUET_ROUTER_DISC_ERR_START:
        snprintf(buf, cap, "could not start a lookup (no memory or thread)");
        return buf;
    default:
        break;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (names[i].code == err) {
            snprintf(buf, cap, "%s (%s)", names[i].name, gai_strerror(err));
            return buf;
        }
    }
    snprintf(buf, cap, "getaddrinfo error %d (%s)", err, gai_strerror(err));
    return buf;
}

int duet_router_disc_resolve(const duet_router_disc_spec_t *spec, duet_router_disc_addr_t **addrs_p,
                             size_t *n_p)
{
    struct addrinfo hints, *res = NULL, *ai;
    duet_router_disc_addr_t *out;
    size_t n = 0;
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC; /* A and AAAA */
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    hints.ai_flags = AI_NUMERICSERV;
    if ((rc = getaddrinfo(spec->host, spec->port, &hints, &res)) != 0)
        return rc;
    for (ai = res; ai; ai = ai->ai_next)
        n++;
    out = DUET_NEW_ARRAY(duet_router_disc_addr_t, n ? n : 1);
    if (out == NULL) {
        freeaddrinfo(res);
        return EAI_MEMORY;
    }
    n = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_addr != NULL &&
            duet_router_disc_addr_from_sockaddr(ai->ai_addr, spec->port, &out[n]) == DUET_OK)
            n++;
    }
    freeaddrinfo(res);
    n = duet_router_disc_normalize(out, n);
    if (n == 0) {
        duet_free(out);
        return DUET_ROUTER_DISC_ERR_EMPTY;
    }
    *addrs_p = out;
    *n_p = n;
    return 0;
}

/* ---- lookups on a detached thread ---- */

struct duet_router_disc_lookup {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* done */
    int refs;            /* the caller's and the thread's */
    bool done;
    int err;
    duet_router_disc_addr_t *addrs;
    size_t n;
    duet_router_disc_spec_t spec;
};

static void duet__lookup_unref(duet_router_disc_lookup_t *lk)
{
    pthread_mutex_lock(&lk->lock);
    bool last = --lk->refs == 0;
    pthread_mutex_unlock(&lk->lock);
    if (!last)
        return;
    pthread_cond_destroy(&lk->cond);
    pthread_mutex_destroy(&lk->lock);
    duet_free(lk->addrs);
    duet_free(lk);
}

static void *duet__lookup_main(void *arg)
{
    duet_router_disc_lookup_t *lk = arg;
    duet_router_disc_addr_t *addrs = NULL;
    size_t n = 0;

    duet_thread_set_name("rt-dns");
    int err = duet_router_disc_resolve(&lk->spec, &addrs, &n);
    pthread_mutex_lock(&lk->lock);
    lk->err = err;
    lk->addrs = addrs;
    lk->n = n;
    lk->done = true;
    pthread_cond_broadcast(&lk->cond);
    pthread_mutex_unlock(&lk->lock);
    duet__lookup_unref(lk);
    return NULL;
}

duet_router_disc_lookup_t *duet_router_disc_lookup_start(const duet_router_disc_spec_t *spec)
{
    duet_router_disc_lookup_t *lk = DUET_NEW(duet_router_disc_lookup_t);
    pthread_attr_t attr;
    pthread_t thr;
    int rc;

    if (lk == NULL)
        return NULL;
    lk->spec = *spec;
    lk->refs = 2;
    pthread_mutex_init(&lk->lock, NULL);
    duet_cond_init_monotonic(&lk->cond);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = pthread_create(&thr, &attr, duet__lookup_main, lk);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_cond_destroy(&lk->cond);
        pthread_mutex_destroy(&lk->lock);
        duet_free(lk);
        return NULL;
    }
    return lk;
}

bool duet_router_disc_lookup_wait(duet_router_disc_lookup_t *lk, int64_t deadline_ns)
{
    struct timespec ts = duet_deadline_timespec(deadline_ns);
    bool done;

    pthread_mutex_lock(&lk->lock);
    while (!lk->done && duet_now_ns() < deadline_ns)
        pthread_cond_timedwait(&lk->cond, &lk->lock, &ts);
    done = lk->done;
    pthread_mutex_unlock(&lk->lock);
    return done;
}

int duet_router_disc_lookup_result(duet_router_disc_lookup_t *lk,
                                   const duet_router_disc_addr_t **addrs_p, size_t *n_p)
{
    int err;

    pthread_mutex_lock(&lk->lock);
    err = lk->done ? lk->err : DUET_ROUTER_DISC_ERR_TIMEOUT;
    *addrs_p = lk->done ? lk->addrs : NULL;
    *n_p = lk->done ? lk->n : 0;
    pthread_mutex_unlock(&lk->lock);
    return err;
}

void duet_router_disc_lookup_release(duet_router_disc_lookup_t *lk)
{
    if (lk != NULL)
        duet__lookup_unref(lk);
}

/* ---- reconciliation ---- */

/* Index of addr in the sorted set, or -1. */
static long duet__disc_find_addr(const duet_router_disc_addr_t *want, size_t n, const char *addr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(addr, want[mid].addr);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

void duet_router_disc_reconcile(const duet_router_disc_member_t *m, size_t n_m,
                                const duet_router_disc_addr_t *want, size_t n_want,
                                duet_router_disc_verdict_t *verdict, bool *add)
{
    /* add[j] doubles as "no member has taken want[j] yet" */
    for (size_t j = 0; j < n_want; j++)
        add[j] = true;
    for (int pass = 0; pass < 2; pass++) { /* active members first */
        for (size_t i = 0; i < n_m; i++) {
            if (m[i].active != (pass == 0))
                continue;
            long j = duet__disc_find_addr(want, n_want, m[i].addr);
            bool take = j >= 0 && add[j];
            if (take)
                add[j] = false;
            if (pass == 0)
                verdict[i] = take ? DUET_ROUTER_DISC_STAY : DUET_ROUTER_DISC_LEAVE;
            else
                verdict[i] = take ? DUET_ROUTER_DISC_REVIVE : DUET_ROUTER_DISC_STAY;
        }
    }
}

duet_router_disc_id_t duet_router_disc_identity(const char *known, const char *reported)
{
    if (reported == NULL || reported[0] == '\0')
        return DUET_ROUTER_DISC_ID_SAME;
    if (known == NULL || known[0] == '\0')
        return DUET_ROUTER_DISC_ID_FIRST;
    return strcmp(known, reported) == 0 ? DUET_ROUTER_DISC_ID_SAME : DUET_ROUTER_DISC_ID_RESTARTED;
}

duet_router_disc_event_t duet_router_disc_outcome(duet_router_disc_state_t *s, int err,
                                                  int64_t now_ns, int64_t grace_ns,
                                                  duet_router_disc_action_t *action_p)
{
    duet_router_disc_event_t ev = DUET_ROUTER_DISC_EV_NONE;

    if (err == 0) {
        if (s->err != 0)
            ev = DUET_ROUTER_DISC_EV_RECOVERED;
        s->err = 0;
        s->failing_since = 0;
        s->dropped = false;
        *action_p = DUET_ROUTER_DISC_APPLY;
        return ev;
    }
    if (s->err == 0) {
        s->failing_since = now_ns;
        ev = DUET_ROUTER_DISC_EV_FAILING;
    } else if (s->err != err) {
        ev = DUET_ROUTER_DISC_EV_FAILING;
    }
    s->err = err;
    if (now_ns - s->failing_since >= grace_ns) {
        *action_p = DUET_ROUTER_DISC_DROP;
        if (!s->dropped) {
            s->dropped = true;
            ev = DUET_ROUTER_DISC_EV_DROPPED;
        }
    } else {
        *action_p = DUET_ROUTER_DISC_KEEP;
    }
    return ev;
}
