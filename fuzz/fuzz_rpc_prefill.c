/* The prefill daemon's gRPC handlers (prefill/service.c, node/link.c):
 * protobuf-c's unpack of each request and what the handler checks before
 * it does any work.  Prefill.Prefill: the NUL scan of the serialized
 * strings (duet_pb_find_nul), the unpack, duet_pf_validate and the page
 * grant check (duet_pf_grant_check) in the handler's order, on a daemon
 * context built as prefill's start-up builds it, minus the network: the
 * stories260K engine on the CPU backend (TP 1, 64 pages of 16 tokens) and
 * one bootstrapped decode link ("decode-fuzz", so requests naming it get
 * past the link check).  Prefill.Bootstrap: the request and each rank
 * descriptor in it (transfer/xfer_wire.h), as the serving task decodes
 * them.  Prefill.Abort: the request.
 *
 * Input: byte 0 (mod 3) picks Prefill, Bootstrap or Abort; the rest is the
 * message.  An accepted Prefill request must be one the scheduler can run:
 * every token id in the vocabulary, one destination page per 16 tokens,
 * none negative. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/pb_strings.h"
#include "duet/v1/prefill.pb-c.h"
#include "engine/engine.h"
#include "fuzz/fuzz.h"
#include "kv/pool.h"
#include "model/model_config.h"
#include "prefill/prefill.h"
#include "transfer/xfer_wire.h"

static duet_prefill_t duet__fuzz_pf;
static duet_cluster_config_t duet__fuzz_cluster;
static duet_instance_config_t duet__fuzz_self;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    duet_prefill_t *pf = &duet__fuzz_pf;
    duet_node_t *node = &pf->node;
    static char model[512];

    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    snprintf(model, sizeof(model), "%s/models/stories260K", DUET_FUZZ_SOURCE_DIR);
    duet__fuzz_cluster.model = model;
    duet__fuzz_cluster.page_size = 16;
    duet__fuzz_self.name = "prefill-fuzz";
    duet__fuzz_self.n_pages = 64;
    node->args.cluster = &duet__fuzz_cluster;
    node->args.self = &duet__fuzz_self;
    node->role = "prefill";
    pthread_mutex_init(&pf->lock, NULL);
    pf->grants_seen = duet_node_replay_create(1024);
    pthread_mutex_init(&node->links_lock, NULL);
    duet_engine_opts_t eo;
    duet_engine_opts_default(&eo);
    eo.model_dir = model;
    eo.tp = 1;
    eo.threads = 1;
    eo.page_size = 16;
    eo.n_pages = 64;
    if (duet_model_config_load(model, &node->ke.model_cfg) != DUET_OK ||
        duet_engine_create(&eo, &node->ke.engine) != DUET_OK ||
        duet_kv_pool_create(64, &node->pages) != DUET_OK) {
        fprintf(stderr, "fuzz_rpc_prefill: %s\n", duet_error_msg());
        abort();
    }
    node->ke.tp = 1;
    node->ke.path = "ucx-host";
    duet_node_link_t *link = duet_node_link_add(node, "decode-fuzz", sizeof(*link));
    if (link == NULL)
        abort();
    duet_node_link_ready(link);
    return 0;
}

static void duet__fuzz_prefill(const uint8_t *data, size_t size)
{
    duet_prefill_t *pf = &duet__fuzz_pf;
    Duet__V1__PrefillRequest *m;
    duet_pf_req_t *req;
    char field[64];

    if (duet_pb_find_nul(&duet__v1__prefill_request__descriptor, data, size, field,
                         sizeof(field))) {
        if (field[0] == '\0')
            abort(); /* the handler names the field */
        return;
    }
    if ((m = duet__v1__prefill_request__unpack(NULL, size, data)) == NULL)
        return;
    req = DUET_NEW(duet_pf_req_t);
    if (req == NULL)
        abort();
    req->src_stage0 = -1;
    if (duet_pf_validate(pf, m, req) == DUET_OK) {
        int vocab = pf->node.ke.model_cfg.vocab;
        size_t pages = (m->n_prompt_ids + 15) / 16;
        if (req->n_prompt < 1 || req->link == NULL || req->transfer_id == 0 ||
            req->request_id[0] == '\0' || m->n_dst_pages != pages)
            abort();
        for (int i = 0; i < req->n_prompt; i++)
            if (req->prompt[i] < 0 || req->prompt[i] >= vocab)
                abort();
        for (size_t i = 0; i < pages; i++)
            if (req->dst_pages[i] < 0)
                abort();
        /* the fuzz link has no grant secret: this refuses, after parsing */
        (void)duet_pf_grant_check(pf, m, req);
    } else if (duet_error_msg()[0] == '\0') {
        abort();
    }
    duet_pf_req_free(pf, req);
    duet__v1__prefill_request__free_unpacked(m, NULL);
}

static void duet__fuzz_bootstrap(const uint8_t *data, size_t size)
{
    Duet__V1__BootstrapRequest *m = duet__v1__bootstrap_request__unpack(NULL, size, data);
    duet__desc_t d;

    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n_rank_descriptors; i++)
        (void)duet__desc_decode(m->rank_descriptors[i].data, m->rank_descriptors[i].len, &d);
    duet__v1__bootstrap_request__free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] % 3) {
    case 0:
        duet__fuzz_prefill(data + 1, size - 1);
        break;
    case 1:
        duet__fuzz_bootstrap(data + 1, size - 1);
        break;
    default: {
        Duet__V1__AbortRequest *m = duet__v1__abort_request__unpack(NULL, size - 1, data + 1);
        if (m != NULL)
            duet__v1__abort_request__free_unpacked(m, NULL);
        break;
    }
    }
    return 0;
}
