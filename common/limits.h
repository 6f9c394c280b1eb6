/* Request limits shared by the router (HTTP and gRPC) and the daemons, so
 * that a request sent straight to a daemon meets the same caps as one that
 * came through the router (docs/security.md, "Input limits").  The numbers
 * that are configurable live in the cluster config's router section
 * (max_body_bytes, max_prompt_tokens, max_tokens_limit); these are the
 * fixed ones and the rules that derive the rest. */
#ifndef DUET_COMMON_LIMITS_H
#define DUET_COMMON_LIMITS_H

#include <stddef.h>

#include "common/cluster.h"

#define DUET_LIMIT_STOP_STRINGS   16   /* stop sequences per request */
#define DUET_LIMIT_STOP_BYTES     256  /* bytes in one stop sequence */
#define DUET_LIMIT_STOP_TOKEN_IDS 64   /* stop_token_ids per request */
#define DUET_LIMIT_CHAT_MESSAGES  4096 /* messages in a chat request */
#define DUET_LIMIT_MESSAGE_SLACK  4096 /* router gRPC: bytes allowed over max_body_bytes */

/* The longest prompt in tokens: router.max_prompt_tokens when set and
 * shorter, else the model context. */
int duet_limit_prompt_tokens(const duet_cluster_config_t *cfg, int context);

/* The largest gRPC message the router's gRPC server accepts:
 * router.max_body_bytes plus DUET_LIMIT_MESSAGE_SLACK. */
size_t duet_limit_router_message_bytes(const duet_cluster_config_t *cfg);

/* The largest gRPC message a daemon's server accepts: what the router
 * accepts, plus a longest prompt as token ids and its destination pages
 * (5 bytes each at most), plus 64 KiB for transfer descriptors. */
size_t duet_limit_daemon_message_bytes(const duet_cluster_config_t *cfg, int context);

#endif
