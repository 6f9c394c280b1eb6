/* Authentication material and the per-call check (common/rpc_auth.h).
 *
 * The PEM files are parsed with OpenSSL's libcrypto (the library gRPC itself
 * uses on Debian) only to fail at start-up, naming the config key, instead
 * of at the first handshake: gRPC takes the PEM text as is.
 *
 * Client certificates: servers use GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_
 * AND_VERIFY, not ..._AND_REQUIRE_...: a presented certificate must chain
 * to the CA (else the handshake fails), and a connection without one is
 * accepted so that each of its calls can be answered UNAUTHENTICATED with a
 * reason and logged, rather than dropped silently at the TLS layer.  The
 * call check below requires an authenticated peer whenever TLS is on, so
 * the two modes admit exactly the same calls. */
#include "common/rpc_auth.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <arpa/inet.h>
#include <openssl/x509_vfy.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_internal.h"
#include "common/sha256.h"

#define DUET__AUTH_FILE_MAX (1u << 20)

struct duet_rpc_auth {
    char *ca_pem; /* NULL: no TLS */
    char *cert_pem;
    char *key_pem;
    char *server_name; /* NULL: the host dialled */
    char *secret;      /* NULL: no secret */
    size_t secret_len;
    char *clients; /* ",a,b," (client names allowed as routers), NULL: none */
    char self_id[DUET_RPC_ID_NAME_MAX + 16]; /* "decode/decode-0" from auth.cert, "" */

    /* refusal log limiter: the only mutable state */
    pthread_mutex_t log_lock;
    int64_t log_window_ns;
    int log_count;
    unsigned long long log_suppressed;
};

/* Read a small regular file; errors name the config key.  Opened
 * non-blocking and checked with fstat so that a FIFO or a directory is an
 * error, not a hang. */
static duet_status_t duet__read_file(const char *key, const char *path, char **text_p,
                                     size_t *len_p)
{
    struct stat sb;
    char *buf;
    size_t off = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);

    if (fd < 0)
        return duet_error(DUET_ERR_CONFIG, "%s: %s: %s", key, path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return duet_error(DUET_ERR_CONFIG, "%s: %s: not a regular file", key, path);
    }
    if (sb.st_size > (off_t)DUET__AUTH_FILE_MAX) {
        close(fd);
        return duet_error(DUET_ERR_CONFIG, "%s: %s: larger than %u bytes", key, path,
                          DUET__AUTH_FILE_MAX);
    }
    buf = duet_malloc((size_t)sb.st_size + 1);
    if (buf == NULL) {
        close(fd);
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", key);
    }
    while (off < (size_t)sb.st_size) {
        ssize_t n = read(fd, buf + off, (size_t)sb.st_size - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            duet_status_t st = duet_error(DUET_ERR_CONFIG, "%s: %s: %s", key, path,
                                          n < 0 ? strerror(errno) : "short read");
            duet_free(buf);
            close(fd);
            return st;
        }
        off += (size_t)n;
    }
    close(fd);
    buf[off] = '\0';
    *text_p = buf;
    *len_p = off;
    return DUET_OK;
}

/* Every certificate of a PEM text into a new stack; NULL when there is none
 * or one does not parse. */
static STACK_OF(X509) * duet__pem_certs(const char *pem)
{
    STACK_OF(X509) *sk = sk_X509_new_null();
    BIO *bio = BIO_new_mem_buf(pem, -1);
    X509 *x;

    if (sk == NULL || bio == NULL)
        goto err_free;
    while ((x = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
        if (sk_X509_push(sk, x) <= 0) {
            X509_free(x);
            goto err_free;
        }
    }
    /* the loop ends at the end of the text (PEM_R_NO_START_LINE) or at a
     * block that does not parse */
    unsigned long e = ERR_peek_last_error();
    if (sk_X509_num(sk) == 0 ||
        (e != 0 && !(ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE)))
        goto err_free;
    ERR_clear_error();
    BIO_free(bio);
    return sk;

err_free:
    ERR_clear_error();
    BIO_free(bio);
    sk_X509_pop_free(sk, X509_free);
    return NULL;
}

/* The chain parses and the key matches its first certificate; *leaf_p
 * (when not NULL) gets the chain, owned by the caller. */
static duet_status_t duet__check_pair(const char *cert_key, const char *cert_path,
                                      const char *cert_pem, const char *key_key,
                                      const char *key_path, const char *key_pem,
                                      STACK_OF(X509) * *chain_p)
{
    STACK_OF(X509) *chain = NULL;
    EVP_PKEY *pkey = NULL;
    BIO *bio = NULL;
    duet_status_t st = DUET_OK;

    if ((chain = duet__pem_certs(cert_pem)) == NULL) {
        st = duet_error(DUET_ERR_CONFIG, "%s: %s: no valid PEM certificate", cert_key, cert_path);
        goto out;
    }
    bio = BIO_new_mem_buf(key_pem, -1);
    if (bio == NULL || (pkey = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL)) == NULL) {
        st = duet_error(DUET_ERR_CONFIG, "%s: %s: not a PEM private key (or encrypted)", key_key,
                        key_path);
        goto out;
    }
    if (X509_check_private_key(sk_X509_value(chain, 0), pkey) != 1) {
        st = duet_error(DUET_ERR_CONFIG, "%s: %s: does not match the certificate in %s", key_key,
                        key_path, cert_path);
        goto out;
    }
    if (chain_p) {
        *chain_p = chain;
        chain = NULL;
    }
out:
    ERR_clear_error();
    EVP_PKEY_free(pkey);
    BIO_free(bio);
    sk_X509_pop_free(chain, X509_free);
    return st;
}

duet_status_t duet_rpc_auth_read_pair(const char *cert_key, const char *cert_path,
                                      const char *key_key, const char *key_path, char **cert_pem_p,
                                      char **key_pem_p)
{
    char *cert = NULL, *key = NULL;
    size_t len;
    duet_status_t st;

    if ((st = duet__read_file(cert_key, cert_path, &cert, &len)) != DUET_OK ||
        (st = duet__read_file(key_key, key_path, &key, &len)) != DUET_OK ||
        (st = duet__check_pair(cert_key, cert_path, cert, key_key, key_path, key, NULL)) !=
            DUET_OK) {
        duet_free(cert);
        if (key)
            memset(key, 0, strlen(key));
        duet_free(key);
        return st;
    }
    *cert_pem_p = cert;
    *key_pem_p = key;
    return DUET_OK;
}

/* Parse the CA, the chain and the key; the key must match the chain's
 * first certificate, which must chain to the CA now. */
static duet_status_t duet__check_tls(const duet_auth_config_t *cfg, const duet_rpc_auth_t *auth)
{
    STACK_OF(X509) *ca = NULL, *chain = NULL;
    X509_STORE *store = NULL;
    X509_STORE_CTX *ctx = NULL;
    duet_status_t st = DUET_OK;

    if ((ca = duet__pem_certs(auth->ca_pem)) == NULL) {
        st = duet_error(DUET_ERR_CONFIG, "auth.ca: %s: no valid PEM certificate", cfg->ca);
        goto out;
    }
    if ((st = duet__check_pair("auth.cert", cfg->cert, auth->cert_pem, "auth.key", cfg->key,
                               auth->key_pem, &chain)) != DUET_OK)
        goto out;
    X509 *leaf = sk_X509_value(chain, 0);
    store = X509_STORE_new();
    ctx = X509_STORE_CTX_new();
    if (store == NULL || ctx == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "auth: no memory");
        goto out;
    }
    for (int i = 0; i < sk_X509_num(ca); i++)
        X509_STORE_add_cert(store, sk_X509_value(ca, i));
    if (X509_STORE_CTX_init(ctx, store, leaf, chain) != 1 || X509_verify_cert(ctx) != 1) {
        st = duet_error(DUET_ERR_CONFIG, "auth.cert: %s: not valid under auth.ca %s: %s", cfg->cert,
                        cfg->ca, X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
        goto out;
    }
out:
    ERR_clear_error();
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    sk_X509_pop_free(chain, X509_free);
    sk_X509_pop_free(ca, X509_free);
    return st;
}

/* The secret is the file's first line without trailing white space:
 * printable ASCII without spaces (a metadata value), DUET_RPC_AUTH_SECRET_MIN
 * bytes at least. */
static duet_status_t duet__load_secret(const char *path, duet_rpc_auth_t *auth)
{
    char *text;
    size_t len, n = 0;
    duet_status_t st = duet__read_file("auth.secret_file", path, &text, &len);

    if (st != DUET_OK)
        return st;
    while (n < len && text[n] != '\n')
        n++;
    while (n > 0 && (text[n - 1] == '\r' || text[n - 1] == ' ' || text[n - 1] == '\t'))
        n--;
    text[n] = '\0';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x21 || c > 0x7e) {
            st = duet_error(DUET_ERR_CONFIG,
                            "auth.secret_file: %s: byte %zu is not printable ASCII (use e.g. "
                            "base64 or hex)",
                            path, i);
            goto err_free;
        }
    }
    if (n < DUET_RPC_AUTH_SECRET_MIN) {
        st = duet_error(DUET_ERR_CONFIG, "auth.secret_file: %s: secret of %zu bytes, need %d", path,
                        n, DUET_RPC_AUTH_SECRET_MIN);
        goto err_free;
    }
    auth->secret = text;
    auth->secret_len = n;
    return DUET_OK;

err_free:
    duet_free(text);
    return st;
}

/* ---- identities (spiffe://duet/<role>/<name>) ---- */

#define DUET__ID_PREFIX "spiffe://duet/"

static const char *const duet__role_names[] = {"", "router", "prefill", "decode", "client"};

const char *duet_rpc_role_name(duet_rpc_role_t role)
{
    return (unsigned)role < sizeof(duet__role_names) / sizeof(duet__role_names[0])
               ? duet__role_names[role]
               : "";
}

static bool duet__name_ok(const char *s, size_t len)
{
    if (len == 0 || len >= DUET_RPC_ID_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* A duet identity URI: its role, and its name into name[DUET_RPC_ID_NAME_MAX].
 * NONE for any other URI or a malformed one. */
static duet_rpc_role_t duet__id_parse(const char *uri, size_t len, char *name)
{
    size_t plen = strlen(DUET__ID_PREFIX);

    if (len <= plen || memcmp(uri, DUET__ID_PREFIX, plen) != 0)
        return DUET_RPC_ROLE_NONE;
    const char *r = uri + plen, *end = uri + len;
    const char *slash = memchr(r, '/', (size_t)(end - r));
    if (slash == NULL || !duet__name_ok(slash + 1, (size_t)(end - slash - 1)))
        return DUET_RPC_ROLE_NONE;
    for (int i = DUET_RPC_ROLE_ROUTER; i <= DUET_RPC_ROLE_CLIENT; i++) {
        if ((size_t)(slash - r) == strlen(duet__role_names[i]) &&
            memcmp(r, duet__role_names[i], (size_t)(slash - r)) == 0) {
            memcpy(name, slash + 1, (size_t)(end - slash - 1));
            name[end - slash - 1] = '\0';
            return (duet_rpc_role_t)i;
        }
    }
    return DUET_RPC_ROLE_NONE;
}

/* Fold one URI into the identity found so far: a second duet identity
 * (or a second URI that looks like one but is malformed) makes it
 * ambiguous, which is no identity. */
static void duet__id_add(const char *uri, size_t len, duet_rpc_role_t *role, char *name, int *n)
{
    char nm[DUET_RPC_ID_NAME_MAX];
    size_t plen = strlen(DUET__ID_PREFIX);

    if (len < plen || memcmp(uri, DUET__ID_PREFIX, plen) != 0)
        return; /* another kind of URI: not ours */
    (*n)++;
    duet_rpc_role_t r = duet__id_parse(uri, len, nm);
    if (*n == 1 && r != DUET_RPC_ROLE_NONE) {
        *role = r;
        memcpy(name, nm, sizeof(nm));
    } else {
        *role = DUET_RPC_ROLE_NONE;
        name[0] = '\0';
    }
}

/* The identity an X509 certificate names in its URI SANs. */
static duet_rpc_role_t duet__cert_identity(X509 *x, char *name)
{
    duet_rpc_role_t role = DUET_RPC_ROLE_NONE;
    int n = 0;
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);

    name[0] = '\0';
    for (int i = 0; sans != NULL && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type == GEN_URI)
            duet__id_add((const char *)ASN1_STRING_get0_data(g->d.uniformResourceIdentifier),
                         (size_t)ASN1_STRING_length(g->d.uniformResourceIdentifier), &role, name,
                         &n);
    }
    GENERAL_NAMES_free(sans);
    return role;
}

/* auth.clients into ",a,b," and this process's own identity for logs. */
static duet_status_t duet__load_roles(const duet_auth_config_t *cfg, duet_rpc_auth_t *auth)
{
    const char *c = cfg->clients ? cfg->clients : "";
    size_t len = strlen(c);
    char name[DUET_RPC_ID_NAME_MAX];
    STACK_OF(X509) *chain = duet__pem_certs(auth->cert_pem);

    if (chain != NULL) {
        duet_rpc_role_t r = duet__cert_identity(sk_X509_value(chain, 0), name);
        if (r != DUET_RPC_ROLE_NONE)
            snprintf(auth->self_id, sizeof(auth->self_id), "%s/%s", duet_rpc_role_name(r), name);
        sk_X509_pop_free(chain, X509_free);
    }
    if (len == 0)
        return DUET_OK;
    if ((auth->clients = duet_malloc(len + 3)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "auth: no memory");
    size_t o = 0;
    auth->clients[o++] = ',';
    for (const char *p = c; *p;) {
        size_t n = strcspn(p, ",");
        const char *q = p;
        size_t m = n;
        while (m > 0 && *q == ' ')
            q++, m--;
        while (m > 0 && q[m - 1] == ' ')
            m--;
        if (!duet__name_ok(q, m))
            return duet_error(DUET_ERR_CONFIG,
                              "auth.clients: \"%.*s\" is not a name (1..63 of A-Z a-z 0-9 . _ -)",
                              (int)n, p);
        memcpy(auth->clients + o, q, m);
        o += m;
        auth->clients[o++] = ',';
        p += n;
        if (*p == ',')
            p++;
    }
    auth->clients[o] = '\0';
    return DUET_OK;
}

static bool duet__client_listed(const duet_rpc_auth_t *auth, const char *name)
{
    if (auth->clients == NULL)
        return false;
    size_t n = strlen(name);
    for (const char *p = auth->clients; (p = strstr(p, name)) != NULL; p++)
        if (p[-1] == ',' && p[n] == ',')
            return true;
    return false;
}

const char *duet_rpc_auth_identity(const duet_rpc_auth_t *auth)
{
    return auth ? auth->self_id : "";
}

static bool duet__host_loopback(const char *addr)
{
    char host[256];
    const char *h = addr, *e;
    struct in_addr a4;
    struct in6_addr a6;

    if (strncmp(addr, "unix:", 5) == 0 || strncmp(addr, "unix-abstract:", 14) == 0)
        return true;
    if (h[0] == '[') {
        h++;
        e = strchr(h, ']');
    } else {
        e = strrchr(h, ':');
        if (e != NULL && strchr(h, ':') != e) /* bare IPv6 without a port */
            e = h + strlen(h);
    }
    if (e == NULL)
        e = h + strlen(h);
    if ((size_t)(e - h) >= sizeof(host))
        return false;
    memcpy(host, h, (size_t)(e - h));
    host[e - h] = '\0';
    if (strcmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&a6))
            return true;
        return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
    }
    return false;
}

duet_status_t duet_rpc_auth_listen_check(bool tls, bool insecure, const char *key, const char *addr)
{
    if (tls || insecure || addr == NULL || addr[0] == '\0' || duet__host_loopback(addr))
        return DUET_OK;
    return duet_error(DUET_ERR_CONFIG,
                      "%s: %s is not a loopback address and TLS is off: set auth.ca, auth.cert "
                      "and auth.key%s, or auth.insecure: true to serve without TLS (anyone who "
                      "reaches the port can call it; docs/security.md)",
                      key, addr,
                      strncmp(key, "router.http", 11) == 0 ? " (router.https_cert)" : "");
}

duet_status_t duet_rpc_auth_load(const duet_auth_config_t *cfg, duet_rpc_auth_t **auth_p)
{
    duet_rpc_auth_t *auth;
    duet_status_t st;
    size_t len;
    bool tls = cfg->ca && cfg->ca[0], secret = cfg->secret_file && cfg->secret_file[0];
    bool cert = cfg->cert && cfg->cert[0], key = cfg->key && cfg->key[0];

    *auth_p = NULL;
    if (!tls && (cert || key))
        return duet_error(DUET_ERR_CONFIG, "auth.ca: required with auth.cert and auth.key");
    if (tls && !cert)
        return duet_error(DUET_ERR_CONFIG, "auth.cert: required with auth.ca");
    if (tls && !key)
        return duet_error(DUET_ERR_CONFIG, "auth.key: required with auth.ca");
    if (!tls && !secret)
        return DUET_OK;
    if ((auth = DUET_NEW(duet_rpc_auth_t)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "auth: no memory");
    pthread_mutex_init(&auth->log_lock, NULL);
    if (tls && ((st = duet__read_file("auth.ca", cfg->ca, &auth->ca_pem, &len)) != DUET_OK ||
                (st = duet__read_file("auth.cert", cfg->cert, &auth->cert_pem, &len)) != DUET_OK ||
                (st = duet__read_file("auth.key", cfg->key, &auth->key_pem, &len)) != DUET_OK ||
                (st = duet__check_tls(cfg, auth)) != DUET_OK))
        goto err_destroy;
    if (tls && cfg->server_name && cfg->server_name[0] &&
        (auth->server_name = duet_strdup(cfg->server_name)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "auth: no memory");
        goto err_destroy;
    }
    if (secret && (st = duet__load_secret(cfg->secret_file, auth)) != DUET_OK)
        goto err_destroy;
    if (tls && (st = duet__load_roles(cfg, auth)) != DUET_OK)
        goto err_destroy;
    *auth_p = auth;
    return DUET_OK;

err_destroy:
    duet_rpc_auth_destroy(auth);
    return st;
}

void duet_rpc_auth_destroy(duet_rpc_auth_t *auth)
{
    if (auth == NULL)
        return;
    if (auth->key_pem)
        memset(auth->key_pem, 0, strlen(auth->key_pem));
    if (auth->secret)
        memset(auth->secret, 0, auth->secret_len);
    duet_free(auth->ca_pem);
    duet_free(auth->cert_pem);
    duet_free(auth->key_pem);
    duet_free(auth->server_name);
    duet_free(auth->secret);
    duet_free(auth->clients);
    pthread_mutex_destroy(&auth->log_lock);
    duet_free(auth);
}

const char *duet_rpc_auth_mode(const duet_rpc_auth_t *auth)
{
    if (auth == NULL)
        return "off";
    if (auth->ca_pem && auth->secret)
        return "mtls+secret";
    return auth->ca_pem ? "mtls" : "secret";
}

bool duet_rpc_auth_secret_equal(const char *expected, size_t expected_len, const char *got,
                                size_t len)
{
    return duet_ct_equal_secret(expected, expected_len, got, len);
}

/* ---- used by rpc_server.c / rpc_client.c ---- */

grpc_server_credentials *duet__rpc_auth_server_creds(const duet_rpc_auth_t *auth)
{
    if (auth == NULL || auth->ca_pem == NULL)
        return grpc_insecure_server_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {.private_key = auth->key_pem, .cert_chain = auth->cert_pem};
    return grpc_ssl_server_credentials_create_ex(
        auth->ca_pem, &pair, 1, GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY, NULL);
}

grpc_channel_credentials *duet__rpc_auth_channel_creds(const duet_rpc_auth_t *auth)
{
    if (auth == NULL || auth->ca_pem == NULL)
        return grpc_insecure_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {.private_key = auth->key_pem, .cert_chain = auth->cert_pem};
    return grpc_ssl_credentials_create(auth->ca_pem, &pair, NULL, NULL);
}

const char *duet__rpc_auth_server_name(const duet_rpc_auth_t *auth)
{
    return auth ? auth->server_name : NULL;
}

bool duet__rpc_auth_secret(const duet_rpc_auth_t *auth, const char **secret_p, size_t *len_p)
{
    if (auth == NULL || auth->secret == NULL)
        return false;
    *secret_p = auth->secret;
    *len_p = auth->secret_len;
    return true;
}

static void duet__log_refusal(duet_rpc_auth_t *auth, duet_rpc_call_t *call, bool denied,
                              const char *why)
{
    int64_t now = duet_now_ns();
    unsigned long long suppressed = 0;
    bool log;

    pthread_mutex_lock(&auth->log_lock);
    if (now - auth->log_window_ns >= DUET_NS_PER_S) {
        suppressed = auth->log_suppressed;
        auth->log_suppressed = 0;
        auth->log_window_ns = now;
        auth->log_count = 0;
    }
    log = auth->log_count < DUET_RPC_AUTH_LOG_BURST;
    if (log)
        auth->log_count++;
    else
        auth->log_suppressed++;
    pthread_mutex_unlock(&auth->log_lock);
    if (suppressed > 0)
        DUET_LOG_WARN("rpc: auth: %llu more unauthenticated calls not logged", suppressed);
    if (!log)
        return;
    char *peer = grpc_call_get_peer(call->gcall);
    if (denied)
        DUET_LOG_WARN("rpc: permission denied peer %s identity %s%s%s method %s: %s",
                      peer ? peer : "?",
                      call->peer_role ? duet_rpc_role_name(call->peer_role) : "(none)",
                      call->peer_role ? "/" : "", call->peer_name, duet_rpc_call_method(call), why);
    else
        DUET_LOG_WARN("rpc: unauthenticated call peer %s method %s: %s", peer ? peer : "?",
                      duet_rpc_call_method(call), why);
    gpr_free(peer);
}

/* Which roles may call a method (TLS on); methods not listed: any
 * authenticated caller (Info, health, the router's Generate API). */
static const struct {
    const char *path;
    unsigned roles;    /* bit per duet_rpc_role_t */
    bool clients;      /* and clients named in auth.clients */
    const char *needs; /* for the message */
} duet__authz[] = {
    {"/duet.v1.Prefill/Bootstrap", 1u << DUET_RPC_ROLE_DECODE, false, "a decode identity"},
    {"/duet.v1.Prefill/Prefill", 1u << DUET_RPC_ROLE_DECODE, false, "a decode identity"},
    {"/duet.v1.Prefill/Abort", 1u << DUET_RPC_ROLE_DECODE, false, "a decode identity"},
    {"/duet.v1.Decode/Generate", 1u << DUET_RPC_ROLE_ROUTER, true,
     "a router identity or a client named in auth.clients"},
    {"/duet.v1.Decode/Abort", 1u << DUET_RPC_ROLE_ROUTER, true,
     "a router identity or a client named in auth.clients"},
};

/* The method's row of the table, or -1. */
static int duet__authz_find(const char *path)
{
    for (size_t i = 0; i < sizeof(duet__authz) / sizeof(duet__authz[0]); i++)
        if (strcmp(path, duet__authz[i].path) == 0)
            return (int)i;
    return -1;
}

/* The peer's identity from the call's auth context: gRPC's peer_uri
 * properties (one per URI SAN; gRPC 1.51 has them).  Where there are none,
 * and pem (a method of the table), the leaf certificate's PEM is parsed
 * too, for a gRPC that does not report URIs: it costs a parse per call, so
 * not for the methods open to every caller. */
static void duet__peer_identity(grpc_auth_context *ctx, duet_rpc_call_t *call, bool pem)
{
    grpc_auth_property_iterator it =
        grpc_auth_context_find_properties_by_name(ctx, GRPC_PEER_URI_PROPERTY_NAME);
    const grpc_auth_property *p;
    bool any = false;
    int n = 0;

    call->peer_role = DUET_RPC_ROLE_NONE;
    call->peer_name[0] = '\0';
    while ((p = grpc_auth_property_iterator_next(&it)) != NULL) {
        any = true;
        duet__id_add(p->value, p->value_length, &call->peer_role, call->peer_name, &n);
    }
    if (any || !pem)
        return;
    it = grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_PEM_CERT_PROPERTY_NAME);
    if ((p = grpc_auth_property_iterator_next(&it)) == NULL)
        return;
    BIO *bio = BIO_new_mem_buf(p->value, (int)p->value_length);
    X509 *x = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    if (x != NULL)
        call->peer_role = duet__cert_identity(x, call->peer_name);
    X509_free(x);
    BIO_free(bio);
    ERR_clear_error();
}

duet_rpc_role_t duet_rpc_call_identity(const duet_rpc_call_t *call, const char **name_p)
{
    if (name_p)
        *name_p = call->peer_name;
    return call->peer_role;
}

/* A call the caller's role may not make: the reason into call->deny_msg. */
static bool duet__denied(const duet_rpc_auth_t *auth, duet_rpc_call_t *call, int row)
{
    const char *path = duet_rpc_call_method(call);

    if (row >= 0) {
        size_t i = (size_t)row;
        if (duet__authz[i].roles & (1u << call->peer_role))
            return false;
        if (duet__authz[i].clients && call->peer_role == DUET_RPC_ROLE_CLIENT &&
            duet__client_listed(auth, call->peer_name))
            return false;
        if (call->peer_role == DUET_RPC_ROLE_NONE)
            snprintf(call->deny_msg, sizeof(call->deny_msg),
                     "%s needs %s; the client certificate names none (URI SAN "
                     "spiffe://duet/<role>/<name>)",
                     path, duet__authz[i].needs);
        else
            snprintf(call->deny_msg, sizeof(call->deny_msg), "%s needs %s; caller is %s/%s", path,
                     duet__authz[i].needs, duet_rpc_role_name(call->peer_role), call->peer_name);
        return true;
    }
    return false;
}

grpc_status_code duet__rpc_auth_check(duet_rpc_auth_t *auth, duet_rpc_call_t *call,
                                      const char **msg_p)
{
    const char *why = NULL;
    int row = duet__authz_find(duet_rpc_call_method(call));

    if (auth->ca_pem != NULL) {
        grpc_auth_context *ctx = grpc_call_auth_context(call->gcall);
        if (ctx == NULL || !grpc_auth_context_peer_is_authenticated(ctx))
            why = "client certificate required (signed by the cluster CA)";
        else
            duet__peer_identity(ctx, call, row >= 0);
        grpc_auth_context_release(ctx);
    }
    if (why == NULL && auth->secret != NULL) {
        size_t len = 0;
        const char *v = duet_rpc_call_metadata(call, DUET_RPC_AUTH_SECRET_KEY, &len);
        if (!duet_rpc_auth_secret_equal(auth->secret, auth->secret_len, v, len))
            why = v ? "wrong cluster secret (metadata " DUET_RPC_AUTH_SECRET_KEY ")"
                    : "cluster secret missing (metadata " DUET_RPC_AUTH_SECRET_KEY ")";
    }
    if (why != NULL) {
        duet__log_refusal(auth, call, false, why);
        *msg_p = why;
        return GRPC_STATUS_UNAUTHENTICATED;
    }
    if (auth->ca_pem != NULL && duet__denied(auth, call, row)) {
        duet__log_refusal(auth, call, true, call->deny_msg);
        *msg_p = call->deny_msg;
        return GRPC_STATUS_PERMISSION_DENIED;
    }
    return GRPC_STATUS_OK;
}
