/* The decode daemon's gRPC handlers (decode/service.c): protobuf-c's
 * unpack of each request and what the handler checks before it posts the
 * request to the scheduler.  Decode.Generate: the checks on the serialized
 * bytes (duet_pb_check_nul), the unpack and duet_dc_validate, in
 * the handler's order, on a
 * daemon context built as decode's start-up builds it, minus the engine
 * and the network: stories260K's config.json and tokenizer (text prompts
 * are tokenized here), 64 pages of 16 tokens, TP 1.  Decode.Abort: the
 * NUL scan and the unpack.
 *
 * Input: byte 0 bit 0 set: an AbortRequest; else a DecodeGenerateRequest;
 * the rest is the message.  An accepted request must be one the scheduler
 * can run: a prompt of ids in the vocabulary that fits the context, stop
 * lists within their limits, pages for prompt + max_tokens - 1 tokens. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/pb_strings.h"
#include "decode/limits.h"
#include "decode/req.h"
#include "decode/service.h"
#include "duet/v1/decode.pb-c.h"
#include "fuzz/fuzz.h"
#include "kv/pool.h"
#include "model/model_config.h"

static duet_decode_t duet__fuzz_dc;
static duet_cluster_config_t duet__fuzz_cluster;
static duet_instance_config_t duet__fuzz_self;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    duet_decode_t *dc = &duet__fuzz_dc;
    duet_node_t *node = &dc->node;
    static char model[512];

    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    snprintf(model, sizeof(model), "%s/models/stories260K", DUET_FUZZ_SOURCE_DIR);
    duet__fuzz_cluster.model = model;
    duet__fuzz_cluster.page_size = 16;
    duet__fuzz_self.name = "decode-fuzz";
    duet__fuzz_self.n_pages = 64;
    duet__fuzz_self.max_tokens_default = 256;
    node->args.cluster = &duet__fuzz_cluster;
    node->args.self = &duet__fuzz_self;
    snprintf(node->args.instance_id, sizeof(node->args.instance_id),
             "decode-fuzz-0123456789abcdef");
    node->role = "decode";
    pthread_mutex_init(&dc->evlock, NULL);
    if (duet_model_config_load(model, &node->ke.model_cfg) != DUET_OK ||
        duet_kv_pool_create(64, &node->pages) != DUET_OK) {
        fprintf(stderr, "fuzz_rpc_decode: %s\n", duet_error_msg());
        abort();
    }
    dc->tok = duet_fuzz_tokenizer("models/stories260K");
    node->ke.tp = 1;
    dc->max_ctx = node->ke.model_cfg.max_pos;
    return 0;
}

static void duet__fuzz_generate(const uint8_t *data, size_t size)
{
    duet_decode_t *dc = &duet__fuzz_dc;
    Duet__V1__DecodeGenerateRequest *m;
    duet_dc_req_t *req;

    if (duet_pb_check_nul(&duet__v1__decode_generate_request__descriptor, data, size) != DUET_OK)
        return;
    if ((m = duet__v1__decode_generate_request__unpack(NULL, size, data)) == NULL)
        return;
    req = DUET_NEW(duet_dc_req_t);
    if (req == NULL)
        abort();
    if (duet_dc_validate(dc, m, req) == DUET_OK) {
        int vocab = dc->node.ke.model_cfg.vocab;
        if (req->n_prompt < 1 || req->n_prompt > dc->max_ctx || req->max_tokens < 1 ||
            req->n_prompt + req->max_tokens - 1 > dc->max_ctx || req->request_id[0] == '\0' ||
            req->n_stops > DUET_DC_MAX_STOPS || req->n_pages < req->n_prompt_pages ||
            (int64_t)req->n_pages * 16 < (int64_t)req->n_prompt + req->max_tokens - 1 ||
            req->n_pages > duet_kv_pool_total(dc->node.pages)) {
            fprintf(stderr, "accepted: prompt %d, max_tokens %d, pages %d\n", req->n_prompt,
                    req->max_tokens, req->n_pages);
            abort();
        }
        for (int i = 0; i < req->n_prompt; i++)
            if (req->prompt[i] < 0 || req->prompt[i] >= vocab)
                abort();
        for (int i = 0; i < req->n_stop_ids; i++)
            if (req->stop_ids[i] < 0 || req->stop_ids[i] >= vocab)
                abort();
    } else if (duet_error_msg()[0] == '\0') {
        abort();
    }
    duet_dc_req_free(dc, req);
    duet__v1__decode_generate_request__free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1) {
        char field[64];
        if (duet_pb_find_nul(&duet__v1__abort_request__descriptor, data + 1, size - 1, field,
                             sizeof(field)))
            return 0;
        Duet__V1__AbortRequest *m = duet__v1__abort_request__unpack(NULL, size - 1, data + 1);
        if (m != NULL)
            duet__v1__abort_request__free_unpacked(m, NULL);
        return 0;
    }
    duet__fuzz_generate(data + 1, size - 1);
    return 0;
}
