/* The router's gRPC handler duet.v1.Generate/Generate: protobuf-c's
 * unpack of a client's GenerateRequest and the validation the handler runs
 * before it makes a job (duet_router_grpc_prepare, router/grpc/grpc_api.c), on
 * a router context like fuzz_openai's (Qwen2-style tokenizer fixture,
 * 512-token context, default limits).  Also the grpc.health.v1 request.
 *
 * Input: byte 0 bit 0 set: a HealthCheckRequest; else a GenerateRequest;
 * the rest is the message.  An accepted request must give token ids in
 * the vocabulary, within the prompt limit, and a request id. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/pb_strings.h"
#include "fuzz/fuzz.h"
#include "grpc/health/v1/health.pb-c.h"
#include "router/grpc/grpc.h"
#include "router/job/request.h"

static duet_router_t duet__fuzz_rt;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    duet_router_t *rt = &duet__fuzz_rt;

    (void)argc;
    (void)argv;
    duet_fuzz_quiet();
    rt->tok = duet_fuzz_tokenizer("tests/data/tokenizers/bytelevel_qwen2");
    rt->model_name = "qwen2-fixture";
    rt->context_len = 512;
    rt->prompt_limit = 512;
    rt->vocab = duet_tokenizer_vocab_size(rt->tok);
    rt->max_tokens_limit = 4096;
    rt->default_max_tokens = 256;
    return 0;
}

static void duet__fuzz_generate(const uint8_t *data, size_t size)
{
    duet_router_t *rt = &duet__fuzz_rt;
    Duet__V1__GenerateRequest *in;
    grpc_status_code code = GRPC_STATUS_OK;
    char msg[320], id[160];
    int32_t *ids = NULL;
    size_t n = 0;

    if (duet_pb_find_nul(&duet__v1__generate_request__descriptor, data, size, id, sizeof(id)))
        return;
    if ((in = duet__v1__generate_request__unpack(NULL, size, data)) == NULL)
        return;
    if (duet_router_grpc_prepare(rt, in, id, sizeof(id), &ids, &n, &code, msg, sizeof(msg))) {
        if (n < 1 || n > (size_t)rt->prompt_limit || id[0] == '\0' || ids == NULL)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= rt->vocab)
                abort();
        uint32_t max = duet_router_max_tokens(rt, n, in->max_tokens);
        if (max < 1 || max > rt->max_tokens_limit)
            abort();
    } else if (code == GRPC_STATUS_OK || msg[0] == '\0') {
        fprintf(stderr, "refused without a status and message\n");
        abort();
    }
    duet_free(ids);
    duet__v1__generate_request__free_unpacked(in, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1) {
        Grpc__Health__V1__HealthCheckRequest *h =
            grpc__health__v1__health_check_request__unpack(NULL, size - 1, data + 1);
        if (h != NULL)
            grpc__health__v1__health_check_request__free_unpacked(h, NULL);
        return 0;
    }
    duet__fuzz_generate(data + 1, size - 1);
    return 0;
}
