/* The HTTP front end (libmicrohttpd): the OpenAI-compatible endpoints and
 * the small ones (/health, /metrics, /workers, /v1/models).  The daemon
 * (router.c) starts, ticks, quiesces and stops it. */
#ifndef DUET_ROUTER_HTTP_HTTP_H
#define DUET_ROUTER_HTTP_HTTP_H

#include <stddef.h>

#include "common/status.h"
#include "router/job/ctx.h"

duet_status_t duet_router_http_start(duet_router_t *rt, const char *addr, int threads,
                                     int keepalive_ms, duet_router_http_t **http_p);
int duet_router_http_bound_port(const duet_router_http_t *http);
/* Stop accepting new connections (in-flight requests go on). */
void duet_router_http_quiesce(duet_router_http_t *http);
/* Ticker: keepalives and disconnect detection on suspended connections. */
void duet_router_http_tick(duet_router_http_t *http);
/* Requests whose connection is still open. */
size_t duet_router_http_active(duet_router_http_t *http);
/* Resume every suspended connection and stop the daemon; requests still
 * referenced by jobs stay allocated.  Accepts NULL. */
void duet_router_http_stop(duet_router_http_t *http);
/* Free (after the rpc client is gone: no sink runs any more).  Accepts NULL. */
void duet_router_http_destroy(duet_router_http_t *http);

#endif
