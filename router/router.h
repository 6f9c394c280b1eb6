/* duet-router: the daemon's context and lifecycle (DESIGN §7).
 *
 *   duet_router_create()   load the cluster config, apply overrides, load the
 *                          tokenizer / model config / chat template; binds
 *                          nothing (so --check-config uses it too)
 *   duet_router_start()    start the worker checkers, the HTTP server
 *                          (libmicrohttpd), the gRPC server and the ticker
 *   duet_router_drain()    stop accepting, let in-flight requests finish
 *                          for up to grace_ms, then cancel the rest
 *   duet_router_destroy()
 *
 * Not thread-safe itself: main() drives the lifecycle from one thread. */
#ifndef DUET_ROUTER_ROUTER_H
#define DUET_ROUTER_ROUTER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "router/base/options.h"

typedef struct duet_router duet_router_t;

void duet_router_options_init(duet_router_options_t *opt);

duet_status_t duet_router_create(const duet_router_options_t *opt, duet_router_t **rt_p);
duet_status_t duet_router_start(duet_router_t *rt);
/* Ports actually bound (0 when that listener is off). */
int duet_router_http_port(const duet_router_t *rt);
int duet_router_grpc_port(const duet_router_t *rt);
/* Returns DUET_ERR_TIMEOUT when requests had to be cancelled. */
duet_status_t duet_router_drain(duet_router_t *rt, int64_t grace_ms);
void duet_router_destroy(duet_router_t *rt);

#endif
