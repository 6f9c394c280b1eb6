/* duet-client: a command-line client of duet.v1.Decode/Generate (or the
 * router's duet.v1.Generate/Generate), for scripts and machines without
 * Python gRPC.
 *
 *   duet-client --target HOST:PORT (--prompt TEXT | --prompt-ids "1 2 3")
 *               [--prefill HOST:PORT] [--router] [--max-tokens N]
 *               [--temperature X] [--seed N] [--ignore-eos]
 *               [--output text|ids|logprobs] [--timeout-ms N] [AUTH]
 *   duet-client --target HOST:PORT --health [AUTH]
 *
 * AUTH, as the cluster config's auth section (docs/security.md):
 *   --config FILE                      take the auth section of a cluster config
 *                                      (the flags below override its keys)
 *   --ca FILE --cert FILE --key FILE   mutual TLS with the cluster CA
 *   --secret-file FILE                 the shared secret (x-duet-secret)
 *   --server-name NAME                 name expected in the server certificate
 *   --api-key KEY                      the router's API key (Bearer)
 *
 * --health asks grpc.health.v1 Check: exit 0 when SERVING, 1 otherwise
 * (an exec probe for Kubernetes when TLS is on: kubelet's gRPC probe
 * speaks plaintext only).
 *
 * --output ids prints the generated token ids on one line (the format of
 * `duet generate --output ids`); text prints the streamed text; logprobs
 * prints one line per generated token, "ID LOGPROB ID:LOGPROB ..." with
 * its 5 most likely tokens (docs/api-logprobs.md).  Exit
 * status 0 on success, 1 on an RPC error (printed with its gRPC code). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/cluster.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/rpc_auth.h"
#include "common/rpc_pb.h"
#include "duet/v1/decode.pb-c.h"
#include "duet/v1/generate.pb-c.h"

static int duet__ids(const char *s, int32_t **ids_p, size_t *n_p)
{
    size_t cap = 64, n = 0;
    int32_t *ids = duet_malloc(cap * sizeof(int32_t));
    char *end;
    while (ids != NULL && *s) {
        while (*s == ' ' || *s == ',')
            s++;
        if (!*s)
            break;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX) {
            duet_free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *g = duet_realloc(ids, 2 * cap * sizeof(int32_t));
            if (g == NULL)
                break;
            ids = g;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    if (ids == NULL || n == 0) {
        duet_free(ids);
        return -1;
    }
    *ids_p = ids;
    *n_p = n;
    return 0;
}

/* The auth material: a cluster config's auth section (when config is not
 * NULL) with the flags (ca, cert, key, secret_file, server_name; NULL =
 * not given) over it. */
static duet_status_t duet__auth(const char *config, const char *const flag[5],
                                duet_rpc_auth_t **auth_p)
{
    static const char *const keys[5] = {"ca", "cert", "key", "secret_file", "server_name"};
    duet_cluster_config_t *cfg = NULL;
    duet_auth_config_t plain = {"", "", "", "", "", "", false};
    char **field[5] = {&plain.ca, &plain.cert, &plain.key, &plain.secret_file, &plain.server_name};
    duet_status_t st = DUET_OK;

    if (config != NULL && (st = duet_cluster_load(config, &cfg)) != DUET_OK)
        return duet_error_wrap(st, "--config: ");
    for (int i = 0; i < 5; i++) {
        if (flag[i] == NULL)
            continue;
        if (cfg != NULL)
            st = duet_cluster_auth_set(cfg, keys[i], flag[i]);
        else
            *field[i] = (char *)flag[i];
        if (st != DUET_OK)
            goto out;
    }
    st = duet_rpc_auth_load(cfg != NULL ? &cfg->auth : &plain, auth_p);
out:
    duet_cluster_free(cfg);
    return st;
}

/* grpc.health.v1 Check of the whole server: 0 when SERVING. */
static int duet__health(const char *target, duet_rpc_auth_t *auth, long timeout_ms)
{
    duet_rpc_client_config_t cc;
    duet_rpc_client_t *cli = NULL;
    duet_rpc_result_t res = {0};
    int rc = 1;

    duet_rpc_client_config_init(&cc);
    cc.auth = auth;
    if (duet_rpc_client_create(&cc, &cli) != DUET_OK) {
        fprintf(stderr, "duet-client: %s\n", duet_error_msg());
        return 1;
    }
    /* an empty HealthCheckRequest asks about service "" */
    duet_status_t st = duet_rpc_client_unary(cli, target, "/grpc.health.v1.Health/Check", NULL, 0,
                                             duet_deadline_in_ms(timeout_ms), &res);
    if (st != DUET_OK) {
        fprintf(stderr, "duet-client: %s: %s\n", duet_rpc_code_name(res.code),
                res.message ? res.message : "");
    } else {
        /* HealthCheckResponse: field 1 (status) varint; absent = UNKNOWN */
        int status = res.len == 2 && res.data[0] == 0x08 ? res.data[1] : 0;
        printf("%s\n", status == 1 ? "SERVING" : status == 2 ? "NOT_SERVING" : "UNKNOWN");
        rc = status == 1 ? 0 : 1;
    }
    duet_rpc_result_cleanup(&res);
    duet_rpc_client_destroy(cli);
    return rc;
}


static const char *const duet__outputs[] = {"text", "ids", "logprobs", NULL};

int main(int argc, char **argv)
{
    const char *target = NULL, *prefill = "", *text = NULL, *ids_arg = NULL, *output;
    int max_tokens = 16, timeout_ms = 60000, output_i = 0;
    double temperature = 0;
    duet_flag_seed_t sd = {0, false};
    bool ignore_eos = false, router = false, health = false, help = false;
    const char *flag[5] = {NULL, NULL, NULL, NULL, NULL}; /* ca cert key secret name */
    const char *config = NULL;
    duet_rpc_auth_t *auth = NULL;
    int rc = 1;
    const duet_flag_t flags[] = {
        {"target", DUET_FLAG_STRING, &target, .arg = "HOST:PORT"},
        {"prefill", DUET_FLAG_STRING, &prefill, .arg = "HOST:PORT"},
        {"prompt", DUET_FLAG_STRING, &text, .arg = "TEXT"},
        {"prompt-ids", DUET_FLAG_STRING, &ids_arg, .arg = "IDS"},
        {"max-tokens", DUET_FLAG_INT, &max_tokens, 1, 1 << 30, .arg = "N"},
        {"temperature", DUET_FLAG_DOUBLE, &temperature, -1e9, 1e9, .arg = "X"},
        {"seed", DUET_FLAG_FUNC, &sd, .fn = duet_flag_seed, .arg = "N"},
        {"ignore-eos", DUET_FLAG_TRUE, &ignore_eos, .help = "see the usage"},
        {"output", DUET_FLAG_CHOICE, &output_i, .choices = duet__outputs,
         .arg = "text|ids|logprobs"},
        {"timeout-ms", DUET_FLAG_INT, &timeout_ms, 1, 1 << 30, .arg = "N"},
        {"router", DUET_FLAG_TRUE, &router, .help = "see the usage"},
        {"help", DUET_FLAG_STOP, &help, .help = "see the usage"},
        {"ca", DUET_FLAG_STRING, &flag[0], .arg = "FILE"},
        {"cert", DUET_FLAG_STRING, &flag[1], .arg = "FILE"},
        {"key", DUET_FLAG_STRING, &flag[2], .arg = "FILE"},
        {"secret-file", DUET_FLAG_STRING, &flag[3], .arg = "FILE"},
        {"server-name", DUET_FLAG_STRING, &flag[4], .arg = "NAME"},
        {"health", DUET_FLAG_TRUE, &health, .help = "see the usage"},
        {"config", DUET_FLAG_STRING, &config, .arg = "FILE"},
    };

    duet_log_init_from_env();
    if (duet_flags_parse(flags, DUET_FLAGS_N(flags), argc, argv, NULL, NULL) != DUET_OK) {
        fprintf(stderr, "duet-client: %s\n", duet_error_msg());
        return 2;
    }
    if (help) {
        printf("usage: duet-client --target HOST:PORT (--prompt TEXT | --prompt-ids \"1 2 3\") "
               "[--prefill HOST:PORT] [--router] [--max-tokens N] [--temperature X] "
               "[--seed N] [--ignore-eos] [--output text|ids|logprobs] [--timeout-ms N] [AUTH]\n"
               "       duet-client --target HOST:PORT --health [AUTH]\n"
               "AUTH: [--config CLUSTER.json] [--ca FILE --cert FILE --key FILE] "
               "[--secret-file FILE] [--server-name NAME]\n");
        return 0;
    }
    output = duet__outputs[output_i];
    if (duet__auth(config, flag, &auth) != DUET_OK) {
        fprintf(stderr, "duet-client: %s\n", duet_error_msg());
        return 2;
    }
    if (health && target != NULL) {
        rc = duet__health(target, auth, timeout_ms);
        duet_rpc_auth_destroy(auth);
        return rc;
    }
    if (target == NULL || (text == NULL) == (ids_arg == NULL)) {
        fprintf(stderr, "duet-client: need --target and one of --prompt / --prompt-ids "
                        "(--help for usage)\n");
        duet_rpc_auth_destroy(auth);
        return 2;
    }

    Duet__V1__GenerateRequest g = DUET__V1__GENERATE_REQUEST__INIT;
    Duet__V1__SamplingParams sp = DUET__V1__SAMPLING_PARAMS__INIT;
    Duet__V1__TokenIds tids = DUET__V1__TOKEN_IDS__INIT;
    Duet__V1__DecodeGenerateRequest dg = DUET__V1__DECODE_GENERATE_REQUEST__INIT;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (ids_arg != NULL) {
        if (duet__ids(ids_arg, &ids, &n_ids) != 0) {
            fprintf(stderr, "duet-client: --prompt-ids: not a list of token ids\n");
            duet_rpc_auth_destroy(auth);
            return 2;
        }
        tids.n_ids = n_ids;
        tids.ids = ids;
        g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
        g.token_ids = &tids;
    } else {
        g.prompt_case = DUET__V1__GENERATE_REQUEST__PROMPT_TEXT;
        g.text = (char *)text;
    }
    sp.temperature = (float)temperature;
    sp.seed = sd.value;
    sp.has_seed = sd.set;
    g.sampling = &sp;
    g.max_tokens = (uint32_t)max_tokens;
    g.ignore_eos = ignore_eos;
    g.logprobs = strcmp(output, "logprobs") == 0;
    g.top_logprobs = g.logprobs ? 5 : 0;
    dg.request = &g;
    dg.prefill_target = (char *)prefill;

    uint8_t *buf = NULL;
    size_t len = 0;
    duet_rpc_client_config_t cc;
    duet_rpc_client_t *cli = NULL;
    duet_rpc_messages_t msgs = {0};
    duet_rpc_client_config_init(&cc);
    cc.auth = auth;
    if (duet_pb_pack(router ? &g.base : &dg.base, &buf, &len) != DUET_OK ||
        duet_rpc_client_create(&cc, &cli) != DUET_OK) {
        fprintf(stderr, "duet-client: %s\n", duet_error_msg());
        goto out;
    }
    duet_status_t st = duet_rpc_client_stream_collect(
        cli, target, router ? "/duet.v1.Generate/Generate" : "/duet.v1.Decode/Generate", buf, len,
        duet_deadline_in_ms(timeout_ms), 1u << 20, &msgs);
    int first = 1;
    for (size_t i = 0; i < msgs.count; i++) {
        Duet__V1__GenerateResponse *r =
            duet__v1__generate_response__unpack(NULL, msgs.len[i], msgs.data[i]);
        if (r == NULL)
            continue;
        if (r->kind_case == DUET__V1__GENERATE_RESPONSE__KIND_CHUNK) {
            if (g.logprobs) {
                for (size_t k = 0; k < r->chunk->n_logprobs; k++) {
                    const Duet__V1__TokenLogprob *lp = r->chunk->logprobs[k];
                    printf("%d %.6f", lp->id, (double)lp->logprob);
                    for (size_t t = 0; t < lp->n_top; t++)
                        printf(" %d:%.6f", lp->top[t]->id, (double)lp->top[t]->logprob);
                    printf("\n");
                }
                first = 0;
            } else if (strcmp(output, "ids") == 0) {
                for (size_t k = 0; k < r->chunk->n_ids; k++, first = 0)
                    printf(first ? "%d" : " %d", r->chunk->ids[k]);
            } else {
                fputs(r->chunk->text, stdout);
            }
        }
        duet__v1__generate_response__free_unpacked(r, NULL);
    }
    if (!g.logprobs || first)
        printf("\n");
    if (st != DUET_OK) {
        fprintf(stderr, "duet-client: %s: %s\n", duet_rpc_code_name(msgs.code),
                msgs.message ? msgs.message : "");
        goto out;
    }
    rc = 0;
out:
    duet_rpc_messages_cleanup(&msgs);
    duet_rpc_client_destroy(cli);
    duet_rpc_auth_destroy(auth);
    duet_free(buf);
    duet_free(ids);
    return rc;
}
