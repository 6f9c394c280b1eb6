/* The part of Info (duet.v1.Prefill/Info, duet.v1.Decode/Info) that is the
 * node's, the same on both daemons: who it is (role, name, instance id,
 * TP, backend), the model and its fingerprint, the KV pool and prefix
 * cache (node/cache_info.h), how KV moves, and whether it drains.  Each
 * daemon adds its own queue and request counters. */
#ifndef DUET_NODE_INFO_H
#define DUET_NODE_INFO_H

#include "duet/v1/common.pb-c.h"
#include "node/node.h"

/* The version both daemons report. */
#define DUET_NODE_VERSION "0.1.0"

/* Fill r's node fields (r keeps pointers into node: reply before it goes).
 * Thread-safe once the node is ready. */
void duet_node_info_fill(duet_node_t *node, Duet__V1__InfoResponse *r);

#endif
