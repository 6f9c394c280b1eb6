/* The gRPC front end: duet.v1.Generate/Generate and grpc.health.v1.Health
 * on the router's gRPC port (grpc_api.c; a call's choices: grpc_choices.c).
 * The daemon (router.c) starts it and keeps its health status. */
#ifndef DUET_ROUTER_GRPC_GRPC_H
#define DUET_ROUTER_GRPC_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rpc.h"
#include "common/status.h"
#include "duet/v1/generate.pb-c.h"
#include "router/job/ctx.h"

/* The most choices (GenerateRequest.n) one gRPC call may ask for (as HTTP). */
#define DUET_ROUTER_GRPC_N_MAX 16

duet_status_t duet_router_grpc_start(duet_router_t *rt, const char *addr, int threads);
/* Generate's validation of a client's request: the token ids, the request
 * id and, on failure, the status and message (exposed for fuzz/). */
bool duet_router_grpc_prepare(duet_router_t *rt, Duet__V1__GenerateRequest *in, char *id_buf,
                              size_t id_cap, int32_t **ids_p, size_t *n_p, grpc_status_code *code_p,
                              char *msg, size_t msg_cap);
/* Set the router's own grpc.health.v1 status from the workers' state. */
void duet_router_update_health(duet_router_t *rt);

#endif
