/* Shared by grpc_api.c (the server, validation) and grpc_choices.c (a
 * call's choices).  Router-internal. */
#ifndef DUET_ROUTER_GRPC_GRPC_INTERNAL_H
#define DUET_ROUTER_GRPC_GRPC_INTERNAL_H

#include "router/grpc/grpc.h"
#include "router/job/job.h"
#include "router/job/request.h"

/* Run a validated decode request (token ids, request id, clamped
 * max_tokens: duet_router_gen_from_client; `n` 0..DUET_ROUTER_GRPC_N_MAX)
 * as its n choices' jobs; ends the call, at once on failure or when the
 * last choice ended.  in is borrowed for the call only. */
void duet_router_grpc_run(duet_router_t *rt, duet_rpc_call_t *call,
                          const Duet__V1__GenerateRequest *in, int64_t deadline_ns);

#endif
