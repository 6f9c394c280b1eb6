/* The node's part of Info (node/info.h). */
#include "node/info.h"

#include "node/cache_info.h"

void duet_node_info_fill(duet_node_t *node, Duet__V1__InfoResponse *r)
{
    r->role = (char *)node->role;
    r->name = node->args.self->name;
    r->instance_id = node->args.instance_id;
    r->tp = (uint32_t)node->ke.tp;
    r->backend = node->args.self->backend;
    r->model = node->args.cluster->model;
    r->model_fingerprint = node->ke.fingerprint;
    r->page_size = (uint32_t)node->args.cluster->page_size;
    duet_node_cache_info(node->pages, r);
    r->max_context = (uint32_t)node->ke.model_cfg.max_pos;
    r->version = DUET_NODE_VERSION;
    r->transfer_path = (char *)node->ke.path;
    r->ucx_version = node->ke.ucx_version;
    r->transfer_packed = node->ke.pack;
    r->draining = atomic_load(&node->draining);
}
