/* Who may do what to a decode request (docs/security.md "Page grants and
 * ownership"): unpredictable request ids, the abort token that makes the
 * Generate caller the only one who can Abort, and the rule that decode
 * connects only to prefill instances of its cluster. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "common/random.h"
#include "common/sha256.h"
#include "decode/owner.h"

duet_status_t duet_dc_request_owner(duet_decode_t *dc, const char *request_id,
                                    const char *abort_token, duet_dc_req_t *req)
{
    (void)dc;
    if (request_id != NULL && request_id[0] != '\0') {
        if (strlen(request_id) >= sizeof(req->request_id))
            return duet_error(DUET_ERR_INVALID, "request_id: longer than %zu bytes",
                              sizeof(req->request_id) - 1);
        snprintf(req->request_id, sizeof(req->request_id), "%s", request_id);
    } else {
        /* 128 random bits: nobody learns the next id from this one */
        char id[DUET_RANDOM_ID_LEN + 1];
        duet_status_t st = duet_random_id(id);
        if (st != DUET_OK)
            return duet_error_wrap(DUET_ERR_INTERNAL, "request_id: ");
        snprintf(req->request_id, sizeof(req->request_id), "%s", id);
    }
    size_t n = abort_token != NULL ? strlen(abort_token) : 0;
    if (n > 0 && (n < DUET_DC_ABORT_TOKEN_MIN || n > DUET_DC_ABORT_TOKEN_MAX))
        return duet_error(DUET_ERR_INVALID,
                          "abort_token: %zu bytes, must be %d..%d (a secret: e.g. 32 random hex "
                          "digits)",
                          n, DUET_DC_ABORT_TOKEN_MIN, DUET_DC_ABORT_TOKEN_MAX);
    snprintf(req->abort_token, sizeof(req->abort_token), "%s", n > 0 ? abort_token : "");
    return DUET_OK;
}

bool duet_dc_abort_allowed(const duet_dc_req_t *req, const char *token)
{
    size_t have = strlen(req->abort_token), given = strlen(token);
    /* a request started without a token is stopped by cancelling its
     * stream only; the lengths are no secret, the bytes are */
    if (have == 0 || have != given)
        return false;
    return duet_ct_equal(req->abort_token, token, have);
}

/* target == one address of the "host:port" discover name */
static bool duet__discovered(const char *discover, const char *target)
{
    char host[256], port[8];
    const char *colon = strrchr(discover, ':');
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    bool found = false;

    if (colon == NULL || (size_t)(colon - discover) >= sizeof(host) ||
        strlen(colon + 1) >= sizeof(port))
        return false;
    memcpy(host, discover, (size_t)(colon - discover));
    host[colon - discover] = '\0';
    snprintf(port, sizeof(port), "%s", colon + 1);
    /* a lookup of our own cluster's name: no connection to anyone */
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return false;
    for (const struct addrinfo *a = res; a != NULL && !found; a = a->ai_next) {
        char ip[INET6_ADDRSTRLEN], addr[INET6_ADDRSTRLEN + 16];
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *in = (const void *)a->ai_addr;
            if (inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip)) == NULL)
                continue;
            snprintf(addr, sizeof(addr), "%s:%s", ip, port);
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *in6 = (const void *)a->ai_addr;
            if (inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip)) == NULL)
                continue;
            snprintf(addr, sizeof(addr), "[%s]:%s", ip, port);
        } else {
            continue;
        }
        found = strcmp(addr, target) == 0;
    }
    freeaddrinfo(res);
    return found;
}

duet_status_t duet_dc_target_check(duet_decode_t *dc, const char *target, bool resolve)
{
    const duet_cluster_config_t *c = dc->node.args.cluster;
    bool discover = false;

    for (int i = 0; i < c->n_prefill; i++) {
        const duet_instance_config_t *p = &c->prefill[i];
        if (p->address != NULL && strcmp(p->address, target) == 0)
            return DUET_OK;
        if (p->discover != NULL && p->discover[0] != '\0') {
            discover = true;
            if (resolve && duet__discovered(p->discover, target))
                return DUET_OK;
        }
    }
    if (discover && !resolve)
        return DUET_ERR_NOT_FOUND; /* not decided: resolve later (no message set) */
    /* one answer whatever is or is not listening there */
    return duet_error(DUET_ERR_INVALID,
                      "prefill_target: '%s' is not a prefill instance of this cluster (an "
                      "address in the cluster config or one its discover names resolve to)",
                      target);
}
