/* Request preparation shared by the HTTP and gRPC front ends, and the
 * decode request (duet.v1.GenerateRequest) both build their jobs from. */
#include "router/job/request.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/alloc.h"
#include "common/random.h"
#include "common/sha256.h"

duet_status_t duet_router_new_id(duet_router_t *rt, const char *prefix, char *buf, size_t cap)
{
    /* 128 bits from the CSPRNG, no counter: one id tells nothing about
     * another (docs/security.md), and collisions are out of reach */
    char hex[DUET_RANDOM_ID_LEN + 1];
    duet_status_t st = duet_random_id(hex);
    (void)rt;
    if (st != DUET_OK)
        return st;
    snprintf(buf, cap, "%s-%s", prefix, hex);
    return DUET_OK;
}

bool duet_router_auth_ok(const duet_router_t *rt, const char *header, size_t len)
{
    static const char bearer[] = "Bearer ";

    if (rt->api_key == NULL)
        return true;
    if (header == NULL || len < sizeof(bearer) - 1 ||
        strncasecmp(header, bearer, sizeof(bearer) - 1) != 0)
        return false;
    header += sizeof(bearer) - 1;
    len -= sizeof(bearer) - 1;
    while (len > 0 && header[0] == ' ')
        header++, len--;
    while (len > 0 && (header[len - 1] == ' ' || header[len - 1] == '\r'))
        len--;
    /* constant time in the key's length */
    return duet_ct_equal_secret(rt->api_key, strlen(rt->api_key), header, len);
}

duet_status_t duet_router_prompt_ids(duet_router_t *rt, const char *text, size_t len,
                                     bool add_special, const int32_t *ids, size_t n,
                                     const char *param, int32_t **ids_p, size_t *n_p,
                                     duet_router_oai_error_t *err)
{
    int32_t *out = NULL;
    size_t n_out = 0;

    if (text != NULL) {
        if (duet_tokenizer_encode(rt->tok, text, len, add_special, &out, &n_out) != DUET_OK)
            return duet_router_oai_fail(err, 500, NULL, "tokenizer_error",
                                        "could not tokenize the prompt: %s", duet_error_msg());
    } else {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= rt->vocab)
                return duet_router_oai_fail(err, 400, param, NULL,
                                            "%s[%zu]: token id %d is out of range 0..%d", param, i,
                                            ids[i], rt->vocab - 1);
        out = duet_malloc((n ? n : 1) * sizeof(*out));
        if (out == NULL)
            return duet_router_oai_fail(err, 500, NULL, "out_of_memory", "out of memory");
        memcpy(out, ids, n * sizeof(*out));
        n_out = n;
    }
    if (n_out == 0) {
        duet_free(out);
        return duet_router_oai_fail(err, 400, param, NULL, "the prompt is empty");
    }
    if (n_out > (size_t)rt->prompt_limit) {
        duet_free(out);
        if (rt->prompt_limit < rt->context_len)
            return duet_router_oai_fail(err, 400, param, "context_length_exceeded",
                                        "the prompt has %zu tokens; this server accepts at "
                                        "most %d (max_prompt_tokens)",
                                        n_out, rt->prompt_limit);
        return duet_router_oai_fail(err, 400, param, "context_length_exceeded",
                                    "this model's maximum context length is %d tokens, and the "
                                    "prompt has %zu tokens",
                                    rt->context_len, n_out);
    }
    *ids_p = out;
    *n_p = n_out;
    return DUET_OK;
}

uint32_t duet_router_max_tokens(const duet_router_t *rt, size_t n_prompt, int64_t requested)
{
    int64_t room = (int64_t)rt->context_len - (int64_t)n_prompt + 1;
    int64_t want = requested > 0 ? requested : rt->default_max_tokens;
    if (want > rt->max_tokens_limit)
        want = rt->max_tokens_limit;
    if (want > room)
        want = room;
    return want < 1 ? 1 : (uint32_t)want;
}

duet_status_t duet_router_fit_check(duet_router_t *rt, size_t n_prompt, int64_t requested,
                                    duet_router_oai_error_t *err)
{
    uint32_t have =
        rt->workers != NULL ? duet_router_workers_max_pages(rt->workers, DUET_ROLE_DECODE) : 0;
    if (have == 0) /* no decode has reported its pool yet */
        return DUET_OK;
    int ps = rt->cfg->page_size;
    uint32_t max_tokens = duet_router_max_tokens(rt, n_prompt, requested);
    /* decode holds the prompt and every output token but the last */
    int64_t span = (int64_t)n_prompt + max_tokens - 1;
    int64_t need = ps > 0 ? (span + ps - 1) / ps : 0;
    if (need <= (int64_t)have)
        return DUET_OK;
    return duet_router_oai_fail(err, 400, "max_tokens", NULL,
                                "this request needs %lld KV pages (%zu prompt tokens + %u "
                                "max_tokens), more than the largest decode KV pool holds "
                                "(%u pages of %d tokens): shorten the prompt or lower max_tokens",
                                (long long)need, n_prompt, max_tokens, have, ps);
}

duet_status_t duet_router_chat_prompt(duet_router_t *rt, const duet_router_oai_req_t *req,
                                      char **text_p, size_t *len_p, duet_router_oai_error_t *err)
{
    duet_router_chat_vars_t vars = {.msgs = req->msgs,
                                    .n_msgs = req->n_msgs,
                                    .bos_token = rt->bos_str,
                                    .eos_token = rt->eos_str,
                                    .add_generation_prompt = req->add_generation_prompt};
    duet_status_t st;

    if (rt->chat == NULL)
        return duet_router_oai_fail(err, 400, "messages", "chat_template_unavailable", "%s",
                                    rt->chat_unavailable);
    st = duet_router_chat_tmpl_render(rt->chat, &vars, text_p, len_p);
    if (st == DUET_ERR_NO_MEMORY)
        return duet_router_oai_fail(err, 500, NULL, "out_of_memory", "out of memory");
    if (st != DUET_OK)
        return duet_router_oai_fail(err, 400, "messages", NULL, "chat template: %s",
                                    duet_error_msg());
    return DUET_OK;
}

uint64_t duet_router_choice_seed(uint64_t seed, int i)
{
    uint64_t z;

    if (i == 0)
        return seed;
    z = seed + (uint64_t)i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- the decode request ---- */

void duet_router_gen_from_oai(duet_router_gen_t *gen, const duet_router_t *rt,
                              const duet_router_oai_req_t *req, const int32_t *ids, size_t n_ids)
{
    Duet__V1__GenerateRequest *g = &gen->g;

    duet__v1__generate_request__init(g);
    duet__v1__sampling_params__init(&gen->sp);
    duet__v1__token_ids__init(&gen->tids);
    gen->id[0] = '\0';
    gen->tids.n_ids = n_ids;
    gen->tids.ids = (int32_t *)ids;
    gen->sp.temperature = (float)req->temperature;
    gen->sp.top_k = req->top_k;
    gen->sp.top_p = req->top_p >= 1.0 ? 0.0f : (float)req->top_p;
    gen->sp.seed = req->has_seed ? req->seed : 0;
    gen->sp.has_seed = req->has_seed;
    g->prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g->token_ids = &gen->tids;
    g->sampling = &gen->sp;
    g->max_tokens = duet_router_max_tokens(rt, n_ids, req->max_tokens);
    g->n_stop = req->n_stop;
    g->stop = req->stop;
    g->n_stop_token_ids = req->n_stop_ids;
    g->stop_token_ids = req->stop_ids;
    g->ignore_eos = req->ignore_eos;
    g->logprobs = req->logprobs;
    g->top_logprobs = (uint32_t)req->top_logprobs;
    g->prompt_logprobs = req->logprobs && req->echo;
}

void duet_router_gen_from_client(duet_router_gen_t *gen, const duet_router_t *rt,
                                 const Duet__V1__GenerateRequest *in, const char *id,
                                 const int32_t *ids, size_t n_ids)
{
    Duet__V1__GenerateRequest *g = &gen->g;

    *g = *in; /* shallow: in stays the owner of what it points to */
    duet__v1__sampling_params__init(&gen->sp);
    duet__v1__token_ids__init(&gen->tids);
    snprintf(gen->id, sizeof(gen->id), "%s", id);
    gen->tids.ids = (int32_t *)ids;
    gen->tids.n_ids = n_ids;
    g->request_id = gen->id;
    g->model = (char *)"";
    g->prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g->token_ids = &gen->tids;
    g->max_tokens = duet_router_max_tokens(rt, n_ids, in->max_tokens);
}

void duet_router_gen_choice(duet_router_gen_t *out, const Duet__V1__GenerateRequest *base,
                            const char *base_id, int i, int n)
{
    out->g = *base;
    if (n > 1)
        snprintf(out->id, sizeof(out->id), "%s-%d", base_id, i);
    else
        snprintf(out->id, sizeof(out->id), "%s", base_id);
    out->g.request_id = out->id;
    if (base->sampling != NULL && base->sampling->has_seed) {
        out->sp = *base->sampling;
        out->sp.seed = duet_router_choice_seed(base->sampling->seed, i);
        out->g.sampling = &out->sp;
    }
    out->g.n = 0;
}

duet_status_t duet_router_job_create_choice(duet_router_t *rt,
                                            const Duet__V1__GenerateRequest *base,
                                            const char *base_id, int i, int n, int64_t deadline_ns,
                                            const duet_router_sink_t *sink, void *sink_arg,
                                            duet_router_job_t **job_p)
{
    duet_router_gen_t gen;

    duet_router_gen_choice(&gen, base, base_id, i, n);
    return duet_router_job_create(rt, &gen.g, deadline_ns, sink, sink_arg, job_p);
}
