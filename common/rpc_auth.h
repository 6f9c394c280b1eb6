/* Authentication of the cluster's gRPC calls (docs/security.md
 * "Authentication"): mutual TLS with a cluster CA and/or a shared secret
 * sent as metadata.
 *
 * A duet_rpc_auth_t holds the material named by an auth config (the cluster
 * config's "auth" section), read and checked once at start-up.  Hand it to
 * duet_rpc_server_config_t.auth and duet_rpc_client_config_t.auth: servers
 * then use TLS credentials that ask for a client certificate signed by the
 * CA and refuse, UNAUTHENTICATED, any call without a verified client
 * certificate or without the right secret, before the method is looked up;
 * clients present the certificate, verify the server's, and send the
 * secret.  A refused call is logged with the peer address (at most
 * DUET_RPC_AUTH_LOG_BURST lines a second, then a count).
 *
 * The object is immutable after load and may be shared by any number of
 * servers and clients on any thread; it must outlive them. */
#ifndef DUET_COMMON_RPC_AUTH_H
#define DUET_COMMON_RPC_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "common/cluster.h"
#include "common/status.h"

/* Metadata key of the shared secret. */
#define DUET_RPC_AUTH_SECRET_KEY "x-duet-secret"
/* Shortest secret accepted. */
#define DUET_RPC_AUTH_SECRET_MIN 16
#define DUET_RPC_AUTH_LOG_BURST  5

typedef struct duet_rpc_auth duet_rpc_auth_t;

/* Read and check the files cfg names.  *auth_p is NULL when cfg turns
 * nothing on (no ca, no secret_file).  DUET_ERR_CONFIG with the key in the
 * message ("auth.cert: /x/node.pem: not a PEM certificate") for a missing
 * or unreadable file, bad PEM, a key that does not match its certificate,
 * cert/key without ca (or the reverse), or a secret that is too short or
 * has characters metadata cannot carry. */
duet_status_t duet_rpc_auth_load(const duet_auth_config_t *cfg, duet_rpc_auth_t **auth_p);

/* Read a PEM certificate chain and its private key for a TLS server that
 * is not gRPC (the router's HTTPS): both must parse and match.  Errors name
 * cert_key / key_key (the config keys).  The texts are duet_malloc'd. */
duet_status_t duet_rpc_auth_read_pair(const char *cert_key, const char *cert_path,
                                      const char *key_key, const char *key_path, char **cert_pem_p,
                                      char **key_pem_p);

/* Accepts NULL. */
void duet_rpc_auth_destroy(duet_rpc_auth_t *auth);

/* "mtls+secret", "mtls", "secret" or "off" (auth NULL): for logs. */
const char *duet_rpc_auth_mode(const duet_rpc_auth_t *auth);

/* This process's identity from auth.cert ("decode/decode-0"), "" when
 * its certificate names none or TLS is off. */
const char *duet_rpc_auth_identity(const duet_rpc_auth_t *auth);

/* A server about to listen on addr (the config key `key` names it): without
 * TLS (tls false) only a loopback address (127.0.0.0/8, ::1, localhost,
 * unix:) is allowed unless insecure (auth.insecure); DUET_ERR_CONFIG
 * naming key, the address and auth.insecure otherwise. */
duet_status_t duet_rpc_auth_listen_check(bool tls, bool insecure, const char *key,
                                         const char *addr);

/* Constant-time comparison of a received secret (got, len bytes, NULL =
 * absent) with the expected one: the time depends only on the expected
 * length. */
bool duet_rpc_auth_secret_equal(const char *expected, size_t expected_len, const char *got,
                                size_t len);

#endif
