/* Worker discovery through DNS (DESIGN §7, §8).  A cluster-config instance
 * with `discover: "name:port"` is a group: its members are the addresses
 * the name resolves to (a Kubernetes headless Service answers with one
 * record per ready pod).  workers.c drives the groups; this module holds
 * the parts that need no router:
 *
 *   duet_router_disc_parse       "name:port" / "[v6]:port" syntax
 *   duet_router_disc_resolve     getaddrinfo (AF_INET + AF_INET6), formatted
 *                                as "ip:port" / "[ip]:port", sorted, unique
 *   duet_router_disc_lookup_*    the same on a detached thread, so a stuck
 *                                resolver never holds up the router
 *   duet_router_disc_reconcile   which members stay, leave or come back, which
 *                                addresses join
 *   duet_router_disc_identity    has the daemon behind an address restarted?
 *   duet_router_disc_outcome     what a lookup failure does to the last
 *                                known set (grace period), what to log
 *
 * Everything but the lookup object is pure and thread-compatible. */
#ifndef DUET_ROUTER_FLEET_DISCOVERY_H
#define DUET_ROUTER_FLEET_DISCOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define DUET_ROUTER_DISC_HOST_MAX 254 /* 253 name bytes + NUL */
#define DUET_ROUTER_DISC_IP_MAX   46  /* INET6_ADDRSTRLEN */
#define DUET_ROUTER_DISC_ADDR_MAX 56  /* "[" ip "]:" port NUL */

typedef struct {
    char host[DUET_ROUTER_DISC_HOST_MAX]; /* DNS name or IP literal, no brackets */
    char port[6];                         /* decimal, 1..65535 */
} duet_router_disc_spec_t;

/* Parse "name:port", "1.2.3.4:port" or "[v6]:port".  The name is a DNS
 * name (letters, digits, '-', '_', '.'; labels of 1..63 bytes, at most 253
 * bytes; one trailing dot allowed).  DUET_ERR_CONFIG with a message (no key
 * path: the caller adds it); *spec_p is set only on success. */
duet_status_t duet_router_disc_parse(const char *text, duet_router_disc_spec_t *spec_p);

typedef struct {
    char addr[DUET_ROUTER_DISC_ADDR_MAX]; /* "ip:port" or "[ip]:port": a gRPC target */
    char ip[DUET_ROUTER_DISC_IP_MAX];     /* the bare ip, for names */
} duet_router_disc_addr_t;

/* Fill a from an IPv4 or IPv6 socket address (sa points to a sockaddr_in
 * or sockaddr_in6) and port.  DUET_ERR_INVALID for another family. */
duet_status_t duet_router_disc_addr_from_sockaddr(const void *sa, const char *port,
                                                  duet_router_disc_addr_t *a);

/* Sort by addr and drop duplicates in place; returns the new count. */
size_t duet_router_disc_normalize(duet_router_disc_addr_t *a, size_t n);

/* Lookup errors: getaddrinfo's EAI_* codes, or one of these. */
#define DUET_ROUTER_DISC_ERR_TIMEOUT 10001 /* no answer within the lookup timeout */
#define DUET_ROUTER_DISC_ERR_EMPTY   10002 /* an answer without IPv4/IPv6 addresses */
#define DUET_ROUTER_DISC_ERR_START   10003 /* no memory or thread for the lookup */

/* "EAI_NONAME (Name or service not known)" and the like; never NULL. */
const char *duet_router_disc_err_str(int err, char *buf, size_t cap);

/* Resolve spec now, on the calling thread (blocks as long as the system
 * resolver does).  Returns 0 with *addrs_p (duet_malloc'd, normalized,
 * n >= 1) or an error code above. */
int duet_router_disc_resolve(const duet_router_disc_spec_t *spec, duet_router_disc_addr_t **addrs_p,
                             size_t *n_p);

/* A resolution running on its own detached thread.  Thread-safe. */
typedef struct duet_router_disc_lookup duet_router_disc_lookup_t;

/* Start resolving spec (copied).  NULL when no memory or thread. */
duet_router_disc_lookup_t *duet_router_disc_lookup_start(const duet_router_disc_spec_t *spec);
/* Wait until the lookup finished or deadline_ns (CLOCK_MONOTONIC) passed:
 * whether it finished. */
bool duet_router_disc_lookup_wait(duet_router_disc_lookup_t *lk, int64_t deadline_ns);
/* The outcome of a finished lookup: 0 with the addresses (owned by the
 * lookup, valid until release), or an error code. */
int duet_router_disc_lookup_result(duet_router_disc_lookup_t *lk,
                                   const duet_router_disc_addr_t **addrs_p, size_t *n_p);
/* Drop the caller's reference.  A lookup still running frees itself when
 * the resolver returns.  Accepts NULL. */
void duet_router_disc_lookup_release(duet_router_disc_lookup_t *lk);

/* A group's member as reconciliation sees it. */
typedef struct {
    const char *addr; /* "ip:port" */
    bool active;      /* in the table; false: leaving (requests finishing) */
} duet_router_disc_member_t;

typedef enum {
    DUET_ROUTER_DISC_STAY = 0, /* as it is (active and resolved, or still leaving) */
    DUET_ROUTER_DISC_LEAVE,    /* active but no longer resolved: out of rotation */
    DUET_ROUTER_DISC_REVIVE,   /* leaving but resolved again: back, checked first */
} duet_router_disc_verdict_t;

/* Reconcile a group's members m with a resolved set want (normalized).
 * Each resolved address ends up with exactly one active member: the active
 * one that has it (another active one with the same address leaves), else
 * a leaving one that has it (revived), else add[j] is set (a new member
 * joins).  Active members whose address is not resolved leave; leaving
 * members not revived stay leaving.  verdict has n_m entries, add n_want. */
void duet_router_disc_reconcile(const duet_router_disc_member_t *m, size_t n_m,
                                const duet_router_disc_addr_t *want, size_t n_want,
                                duet_router_disc_verdict_t *verdict, bool *add);

typedef enum {
    DUET_ROUTER_DISC_ID_SAME = 0,  /* the instance we knew, or nothing reported */
    DUET_ROUTER_DISC_ID_FIRST = 1, /* first instance_id seen for this worker */
    DUET_ROUTER_DISC_ID_RESTARTED = 2,
} duet_router_disc_id_t;

/* Compare the instance_id known for a worker ("" = none yet) with the one
 * its Info reports now ("" = the daemon reports none). */
duet_router_disc_id_t duet_router_disc_identity(const char *known, const char *reported);

/* A group's resolution health across lookups. */
typedef struct {
    int err;               /* 0: the last lookup succeeded (or none yet) */
    int64_t failing_since; /* CLOCK_MONOTONIC ns of the first failure of this run */
    bool dropped;          /* the grace period ran out: the known set was let go */
} duet_router_disc_state_t;

typedef enum {
    DUET_ROUTER_DISC_APPLY, /* reconcile with this lookup's addresses */
    DUET_ROUTER_DISC_KEEP,  /* failing within the grace period: keep the members */
    DUET_ROUTER_DISC_DROP,  /* failing past it: reconcile with the empty set */
} duet_router_disc_action_t;

typedef enum {
    DUET_ROUTER_DISC_EV_NONE = 0,  /* nothing to log */
    DUET_ROUTER_DISC_EV_FAILING,   /* started failing, or fails differently */
    DUET_ROUTER_DISC_EV_DROPPED,   /* the grace period just ran out */
    DUET_ROUTER_DISC_EV_RECOVERED, /* resolves again after failures */
} duet_router_disc_event_t;

/* Feed one lookup outcome (err 0: success) seen at now_ns.  *action_p says
 * what to do with the members; the return value is the state change to log
 * (one line per change, not one per failed lookup).  s starts zeroed. */
duet_router_disc_event_t duet_router_disc_outcome(duet_router_disc_state_t *s, int err,
                                                  int64_t now_ns, int64_t grace_ns,
                                                  duet_router_disc_action_t *action_p);

#endif
