#include "common/cluster.h"

#include <libgen.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static duet_status_t duet__parse_devices(const cJSON *item, void *field, const char *path);
static duet_status_t duet__parse_cache_aware(const cJSON *item, void *field, const char *path);

/* clang-format off */
static const duet_cfg_field_t duet__instance_fields[] = {
    DUET_CFG_F_STRING(duet_instance_config_t, name, NULL, "unique instance name (--name)"),
    DUET_CFG_F_STRING(duet_instance_config_t, address, NULL, "host:port others use to reach the gRPC server"),
    DUET_CFG_F_STRING(duet_instance_config_t, listen, NULL, "host:port to bind (default: address)"),
    DUET_CFG_F_STRING(duet_instance_config_t, discover, NULL, "DNS name:port resolving to every instance (Kubernetes headless Service)"),
    DUET_CFG_F_INT(duet_instance_config_t, tp, 1, 64, 1, "tensor-parallel ranks"),
    DUET_CFG_F_STRING(duet_instance_config_t, backend, "cpu", "compute backend: cpu or cuda"),
    DUET_CFG_F_INT(duet_instance_config_t, threads, 0, 1024, 0, "cpu threads per rank (0 = cpus / tp)"),
    DUET_CFG_F_CUSTOM(duet_instance_config_t, devices, duet__parse_devices, "cuda device of each rank (default 0..tp-1)"),
    DUET_CFG_F_INT(duet_instance_config_t, n_pages, 1, 1 << 26, 4096, "KV pages per rank (ids shared by all ranks)"),
    DUET_CFG_F_INT(duet_instance_config_t, max_batch_tokens, 1, 1 << 20, 2048, "tokens per forward chunk"),
    DUET_CFG_F_INT(duet_instance_config_t, max_seqs, 1, 4096, 64, "sequences per batch"),
    DUET_CFG_F_INT(duet_instance_config_t, max_queue, 0, 1 << 20, 256, "requests waiting for admission before RESOURCE_EXHAUSTED"),
    DUET_CFG_F_INT(duet_instance_config_t, grpc_threads, 1, 64, 2, "gRPC completion-queue threads"),
    DUET_CFG_F_INT(duet_instance_config_t, drain_timeout_ms, 0, 3600000, 30000, "SIGTERM grace period for in-flight requests"),
    DUET_CFG_F_INT(duet_instance_config_t, max_tokens_default, 1, 1 << 20, 256, "max_tokens when a request gives none"),
    DUET_CFG_F_STRING(duet_instance_config_t, prefill_local, "off", "decode: prefill prompts on its own engine: off, always or auto (conditional)"),
    DUET_CFG_F_INT(duet_instance_config_t, prefill_local_max_tokens, 0, 1 << 24, 512, "decode, auto: longest prompt prefilled locally"),
    DUET_CFG_F_INT(duet_instance_config_t, prefill_local_max_running, 0, 4096, 8, "decode, auto: prefill locally only while fewer sequences decode here"),
    DUET_CFG_F_INT(duet_instance_config_t, prefill_chunk_tokens, 0, 1 << 20, 512, "decode: prompt tokens of local prefills per decode step, sharing its forward (chunked prefill; capped to max_batch_tokens; 0 = whole prompts before the step)"),
    DUET_CFG_F_INT(duet_instance_config_t, stage_pages, -1, 1 << 26, -1, "packed KV transfers: staging pages beside the pool (-1 = auto: n_pages / 4 where packing runs)"),
    DUET_CFG_F_BOOL(duet_instance_config_t, prefix_cache, 1, "keep computed prompt pages and reuse them for prompts with the same prefix (docs/prefix-cache.md)"),
};

static const duet_cfg_field_t duet__router_fields[] = {
    DUET_CFG_F_STRING(duet_router_config_t, name, "router", "router name (--name)"),
    DUET_CFG_F_STRING(duet_router_config_t, http, "127.0.0.1:8000", "HTTP listen host:port (\"\" = off)"),
    DUET_CFG_F_STRING(duet_router_config_t, grpc, "127.0.0.1:8001", "gRPC listen host:port (\"\" = off)"),
    DUET_CFG_F_STRING(duet_router_config_t, policy, "least_load", "worker selection policy (checked by duet-router: see its --help)"),
    DUET_CFG_F_INT(duet_router_config_t, max_concurrent, 1, 1 << 20, 256, "requests in flight before queueing"),
    DUET_CFG_F_INT(duet_router_config_t, queue_limit, 0, 1 << 20, 1024, "queued requests before 429"),
    DUET_CFG_F_INT(duet_router_config_t, prefill_wait_max_ms, 0, 86400000, 10000, "admission: requests wait in the router's queue (429 once it is full) while every prefill's estimated queue wait exceeds this (0 = off; docs/migration.md \"Overload\")"),
    DUET_CFG_F_STRING(duet_router_config_t, api_key, "", "required bearer token (\"\" = none)"),
    DUET_CFG_F_STRING(duet_router_config_t, api_key_env, "", "environment variable holding the bearer token"),
    DUET_CFG_F_INT(duet_router_config_t, max_body_bytes, 64, 1 << 30, 1 << 20, "largest request body (413 above)"),
    DUET_CFG_F_INT(duet_router_config_t, max_prompt_tokens, 0, 1 << 24, 0, "longest prompt (0 = the model context)"),
    DUET_CFG_F_INT(duet_router_config_t, max_tokens_limit, 1, 1 << 24, 4096, "largest max_tokens accepted"),
    DUET_CFG_F_INT(duet_router_config_t, health_interval_ms, 50, 600000, 1000, "worker health-check period"),
    DUET_CFG_F_INT(duet_router_config_t, request_timeout_ms, 100, 86400000, 600000, "end-to-end deadline of a request"),
    DUET_CFG_F_STRING(duet_router_config_t, served_model_name, "", "model id in the API (\"\" = model directory name)"),
    DUET_CFG_F_STRING(duet_router_config_t, https_cert, "", "PEM certificate chain: HTTPS on router.http (\"\" = plain HTTP)"),
    DUET_CFG_F_STRING(duet_router_config_t, https_key, "", "PEM private key of router.https_cert"),
    DUET_CFG_F_INT(duet_router_config_t, migrate_max, 0, 64, 3, "times a started stream moves to another decode when its decode fails or stalls (0 = never; docs/migration.md)"),
    DUET_CFG_F_BOOL(duet_router_config_t, migrate_on_drain, 1, "the streams of a decode stopping (SIGTERM) move to a healthy decode, make-before-break (off: the draining decode finishes them; docs/migration.md \"Drains\")"),
    DUET_CFG_F_INT(duet_router_config_t, stall_timeout_ms, 0, 86400000, 5000, "a started stream with no token for this long migrates (0 = off; docs/migration.md)"),
    DUET_CFG_F_INT(duet_router_config_t, http_max_connections, 0, 1 << 20, 0, "HTTP(S) connections open at once (0 = auto: the descriptor limit less a reserve, at most 16384; more is an error)"),
    DUET_CFG_F_INT(duet_router_config_t, http_max_connections_per_client, 0, 1 << 20, 0, "HTTP(S) connections open at once from one IP address (0 = auto: a quarter of http_max_connections, at most 1024)"),
    DUET_CFG_F_INT(duet_router_config_t, http_header_timeout_s, 1, 3600, 10, "HTTP(S): close a connection idle this long before a complete request header (new or between keep-alive requests)"),
    DUET_CFG_F_CUSTOM(duet_router_config_t, cache_aware, duet__parse_cache_aware, "object: the cache_aware policy's thresholds (router.cache_aware.*)"),
};

static const duet_cfg_field_t duet__cache_aware_fields[] = {
    DUET_CFG_F_DOUBLE(duet_router_cache_aware_config_t, balance_abs_threshold, 0, 100000, 16, "cache_aware: load imbalanced when max - min load exceeds this ..."),
    DUET_CFG_F_DOUBLE(duet_router_cache_aware_config_t, balance_rel_threshold, 1, 100000, 1.5, "... and max load exceeds this times min load: then the least loaded"),
    DUET_CFG_F_DOUBLE(duet_router_cache_aware_config_t, min_match_ratio, 0, 1, 0.3, "cache_aware: matched/prompt tokens needed to follow a prefix (else least loaded)"),
    DUET_CFG_F_I64(duet_router_cache_aware_config_t, max_tree_tokens, 1, 1LL << 40, 1 << 21, "cache_aware: prompt tokens remembered per instance (LRU beyond)"),
};

static const duet_cfg_field_t duet__auth_fields[] = {
    DUET_CFG_F_STRING(duet_auth_config_t, ca, "", "PEM cluster CA: mutual TLS on every gRPC server and client (\"\" = off)"),
    DUET_CFG_F_STRING(duet_auth_config_t, cert, "", "PEM certificate chain of this process (with auth.ca)"),
    DUET_CFG_F_STRING(duet_auth_config_t, key, "", "PEM private key of auth.cert"),
    DUET_CFG_F_STRING(duet_auth_config_t, secret_file, "", "file whose first line is the shared secret (\"\" = none)"),
    DUET_CFG_F_STRING(duet_auth_config_t, server_name, "", "name expected in server certificates (\"\" = the host dialled)"),
    DUET_CFG_F_STRING(duet_auth_config_t, clients, "", "comma-separated client names (certificates naming spiffe://duet/client/<name>) allowed to call Decode.Generate/Abort besides routers"),
    DUET_CFG_F_BOOL(duet_auth_config_t, insecure, 0, "allow listening on a non-loopback address without TLS (auth.ca): development only"),
};
/* clang-format on */

typedef struct {
    int page_size;
    int max_context;
} duet__kv_section_t;

static const duet_cfg_field_t duet__kv_fields[] = {
    DUET_CFG_F_INT(duet__kv_section_t, page_size, 1, 4096, 16,
                   "tokens per KV page (all instances)"),
    DUET_CFG_F_INT(duet__kv_section_t, max_context, 0, 1 << 24, 0,
                   "context length in tokens, prompt + output (0 = the model's "
                   "max_position_embeddings; more than that is refused at start-up)"),
};

typedef struct {
    int timeout_ms;
    bool checksum;
    int rpc_timeout_ms;
    int queue_timeout_ms;
    char *on_failure;
} duet__transfer_section_t;

static const duet_cfg_field_t duet__transfer_fields[] = {
    DUET_CFG_F_INT(duet__transfer_section_t, timeout_ms, 1, 3600000, 10000,
                   "deadline for a request's KV to arrive"),
    DUET_CFG_F_BOOL(duet__transfer_section_t, checksum, 0, "CRC32C of every KV slice"),
    DUET_CFG_F_INT(duet__transfer_section_t, rpc_timeout_ms, 1, 3600000, 30000,
                   "deadline of control-plane calls between daemons"),
    DUET_CFG_F_INT(duet__transfer_section_t, queue_timeout_ms, 0, 3600000, 30000,
                   "how long a request may wait in prefill's queue before prefill starts it; "
                   "timeout_ms counts from that start (docs/migration.md \"Overload\")"),
    DUET_CFG_F_STRING(duet__transfer_section_t, on_failure, "recompute",
                      "a request's KV transfer failed after decode admitted it: fail, retry "
                      "(the router, on another pair) or recompute (decode prefills it "
                      "locally; docs/migration.md)"),
};

static const char *const duet__on_failure_names[] = {"fail", "retry", "recompute"};

duet_status_t duet_cluster_context(const duet_cluster_config_t *cfg, int model_max_pos, int *ctx_p)
{
    if (cfg->max_context > model_max_pos)
        return duet_error(DUET_ERR_CONFIG,
                          "kv.max_context: %d is above the model's max_position_embeddings %d "
                          "(%s/config.json)",
                          cfg->max_context, model_max_pos, cfg->model ? cfg->model : "model");
    *ctx_p = cfg->max_context > 0 ? cfg->max_context : model_max_pos;
    return DUET_OK;
}

const char *duet_role_name(duet_role_t role)
{
    return role == DUET_ROLE_PREFILL ? "prefill" : "decode";
}

static duet_status_t duet__parse_devices(const cJSON *item, void *field, const char *path)
{
    duet_instance_config_t *inst =
        (duet_instance_config_t *)((char *)field - offsetof(duet_instance_config_t, devices));
    const cJSON *d;
    int n = 0;

    if (!cJSON_IsArray(item))
        return duet_error(DUET_ERR_CONFIG, "%s: expected an array of device ordinals", path);
    cJSON_ArrayForEach(d, item)
    {
        if (!cJSON_IsNumber(d) || d->valuedouble != (int)d->valuedouble || d->valuedouble < 0 ||
            d->valuedouble > 1023)
            return duet_error(DUET_ERR_CONFIG, "%s[%d]: expected a device ordinal 0..1023", path,
                              n);
        if (n == DUET_CLUSTER_MAX_DEVICES)
            return duet_error(DUET_ERR_CONFIG, "%s: more than %d devices", path,
                              DUET_CLUSTER_MAX_DEVICES);
        inst->devices[n++] = (int)d->valuedouble;
    }
    inst->n_devices = n;
    return DUET_OK;
}

/* router.cache_aware: its own table; the defaults are set before the
 * router section is parsed (duet_cfg_defaults skips custom fields). */
static duet_status_t duet__parse_cache_aware(const cJSON *item, void *field, const char *path)
{
    if (!cJSON_IsObject(item))
        return duet_error(DUET_ERR_CONFIG, "%s: expected an object", path);
    return duet_cfg_parse(item, path, duet__cache_aware_fields, N_OF(duet__cache_aware_fields),
                          field);
}

static const char *const duet__prefill_local_names[] = {"off", "always", "auto"};

duet_prefill_local_t duet_cluster_prefill_local(const duet_instance_config_t *inst)
{
    for (size_t m = 0; inst->prefill_local != NULL && m < N_OF(duet__prefill_local_names); m++)
        if (strcmp(inst->prefill_local, duet__prefill_local_names[m]) == 0)
            return (duet_prefill_local_t)m;
    return DUET_PREFILL_LOCAL_OFF;
}

duet_status_t duet_cluster_instance_check(const duet_instance_config_t *inst, const char *role,
                                          const char *path)
{
    size_t m;
    for (m = 0; m < N_OF(duet__prefill_local_names); m++)
        if (strcmp(inst->prefill_local, duet__prefill_local_names[m]) == 0)
            break;
    if (m == N_OF(duet__prefill_local_names))
        return duet_error(DUET_ERR_CONFIG, "%s.prefill_local: '%s' is not off, always or auto",
                          path, inst->prefill_local);
    if (m != DUET_PREFILL_LOCAL_OFF && strcmp(role, "decode") != 0)
        return duet_error(DUET_ERR_CONFIG,
                          "%s.prefill_local: only decode instances prefill locally (a prefill "
                          "instance always prefills)",
                          path);
    return DUET_OK;
}

static duet_status_t duet__parse_instances(const cJSON *arr, const char *role,
                                           duet_instance_config_t **list_p, int *n_p)
{
    int n = cJSON_GetArraySize(arr), i = 0;
    const cJSON *item;
    duet_instance_config_t *list;
    char path[64];

    if (!cJSON_IsArray(arr))
        return duet_error(DUET_ERR_CONFIG, "%s: expected an array of instances", role);
    list = DUET_NEW_ARRAY(duet_instance_config_t, (size_t)(n ? n : 1));
    if (list == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", role);
    *list_p = list;
    *n_p = n;
    cJSON_ArrayForEach(item, arr)
    {
        duet_status_t st;
        snprintf(path, sizeof(path), "%s[%d]", role, i);
        if ((st = duet_cfg_defaults(duet__instance_fields, N_OF(duet__instance_fields),
                                    &list[i])) != DUET_OK)
            return st;
        if ((st = duet_cfg_parse(item, path, duet__instance_fields, N_OF(duet__instance_fields),
                                 &list[i])) != DUET_OK)
            return st;
        if (list[i].name == NULL || list[i].name[0] == '\0')
            return duet_error(DUET_ERR_CONFIG, "%s.name: required", path);
        if (list[i].address == NULL && list[i].discover == NULL)
            return duet_error(DUET_ERR_CONFIG, "%s: needs address or discover", path);
        if (strcmp(list[i].backend, "cpu") != 0 && strcmp(list[i].backend, "cuda") != 0)
            return duet_error(DUET_ERR_CONFIG, "%s.backend: '%s' is not cpu or cuda", path,
                              list[i].backend);
        if (list[i].n_devices != 0 && list[i].n_devices != list[i].tp)
            return duet_error(DUET_ERR_CONFIG, "%s.devices: %d devices for tp %d", path,
                              list[i].n_devices, list[i].tp);
        if ((st = duet_cluster_instance_check(&list[i], role, path)) != DUET_OK)
            return st;
        if (list[i].listen == NULL && list[i].address != NULL &&
            (list[i].listen = duet_strdup(list[i].address)) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
        i++;
    }
    return DUET_OK;
}

static duet_status_t duet__section(const cJSON *root, const char *key,
                                   const duet_cfg_field_t *fields, size_t n, void *obj)
{
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, key);
    duet_status_t st = duet_cfg_defaults(fields, n, obj);
    if (st != DUET_OK || sec == NULL)
        return st;
    return duet_cfg_parse(sec, key, fields, n, obj);
}

/* A relative path in the file names a file next to it. */
static duet_status_t duet__resolve(char **path_p, const char *base_dir, const char *key)
{
    char *p = *path_p, *r;
    size_t n;

    if (p == NULL || p[0] == '\0' || p[0] == '/' || base_dir == NULL)
        return DUET_OK;
    n = strlen(base_dir) + strlen(p) + 2;
    if ((r = duet_malloc(n)) == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", key);
    snprintf(r, n, "%s/%s", base_dir, p);
    duet_free(p);
    *path_p = r;
    return DUET_OK;
}

static duet_status_t duet__resolve_paths(duet_cluster_config_t *cfg, const char *base_dir)
{
    duet_status_t st;
    if ((st = duet__resolve(&cfg->auth.ca, base_dir, "auth.ca")) ||
        (st = duet__resolve(&cfg->auth.cert, base_dir, "auth.cert")) ||
        (st = duet__resolve(&cfg->auth.key, base_dir, "auth.key")) ||
        (st = duet__resolve(&cfg->auth.secret_file, base_dir, "auth.secret_file")) ||
        (st = duet__resolve(&cfg->router.https_cert, base_dir, "router.https_cert")) ||
        (st = duet__resolve(&cfg->router.https_key, base_dir, "router.https_key")))
        return st;
    return DUET_OK;
}

duet_status_t duet_cluster_parse(const char *text, size_t len, const char *what,
                                 const char *base_dir, duet_cluster_config_t **cfg_p)
{
    static const char *const known[] = {"model", "kv",      "transfer", "router",
                                        "auth",  "prefill", "decode"};
    duet_cluster_config_t *cfg;
    duet__kv_section_t kv;
    duet__transfer_section_t tr = {0};
    cJSON *root = NULL;
    const cJSON *item;
    duet_status_t st;

    if ((st = duet_json_parse(text, len, what, &root)) != DUET_OK)
        return st;
    cfg = DUET_NEW(duet_cluster_config_t);
    if (cfg == NULL) {
        cJSON_Delete(root);
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", what);
    }
    if (!cJSON_IsObject(root)) {
        st = duet_error(DUET_ERR_CONFIG, "%s: expected a JSON object", what);
        goto err;
    }
    cJSON_ArrayForEach(item, root)
    {
        size_t i;
        for (i = 0; i < N_OF(known); i++) {
            if (strcmp(item->string, known[i]) == 0)
                break;
        }
        if (i == N_OF(known)) {
            st = duet_error(DUET_ERR_CONFIG, "%s: unknown key", item->string);
            goto err;
        }
    }
    item = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsString(item) || item->valuestring[0] == '\0') {
        st = duet_error(DUET_ERR_CONFIG, "model: required, the model directory");
        goto err;
    }
    if (item->valuestring[0] != '/' && base_dir != NULL) {
        size_t n = strlen(base_dir) + strlen(item->valuestring) + 2;
        cfg->model = duet_malloc(n);
        if (cfg->model != NULL)
            snprintf(cfg->model, n, "%s/%s", base_dir, item->valuestring);
    } else {
        cfg->model = duet_strdup(item->valuestring);
    }
    if (cfg->model == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "model: no memory");
        goto err;
    }
    if ((st = duet__section(root, "kv", duet__kv_fields, N_OF(duet__kv_fields), &kv)) ||
        (st = duet__section(root, "transfer", duet__transfer_fields, N_OF(duet__transfer_fields),
                            &tr)) ||
        (st = duet_cfg_defaults(duet__cache_aware_fields, N_OF(duet__cache_aware_fields),
                                &cfg->router.cache_aware)) ||
        (st = duet__section(root, "router", duet__router_fields, N_OF(duet__router_fields),
                            &cfg->router)) ||
        (st =
             duet__section(root, "auth", duet__auth_fields, N_OF(duet__auth_fields), &cfg->auth)) ||
        (st = duet__resolve_paths(cfg, base_dir)))
        goto err;
    cfg->page_size = kv.page_size;
    cfg->max_context = kv.max_context;
    cfg->transfer_timeout_ms = tr.timeout_ms;
    cfg->transfer_checksum = tr.checksum;
    cfg->rpc_timeout_ms = tr.rpc_timeout_ms;
    cfg->transfer_queue_timeout_ms = tr.queue_timeout_ms;
    cfg->transfer_on_failure = DUET_XFER_ON_FAILURE_COUNT;
    for (size_t m = 0; m < N_OF(duet__on_failure_names); m++)
        if (tr.on_failure != NULL && strcmp(tr.on_failure, duet__on_failure_names[m]) == 0)
            cfg->transfer_on_failure = (duet_xfer_on_failure_t)m;
    if (cfg->transfer_on_failure == DUET_XFER_ON_FAILURE_COUNT) {
        st = duet_error(DUET_ERR_CONFIG,
                        "transfer.on_failure: '%s' is not fail, retry or recompute",
                        tr.on_failure ? tr.on_failure : "");
        goto err;
    }
    duet_free(tr.on_failure);
    tr.on_failure = NULL;
    item = cJSON_GetObjectItemCaseSensitive(root, "prefill");
    if (item != NULL &&
        (st = duet__parse_instances(item, "prefill", &cfg->prefill, &cfg->n_prefill)) != DUET_OK)
        goto err;
    item = cJSON_GetObjectItemCaseSensitive(root, "decode");
    if (item != NULL &&
        (st = duet__parse_instances(item, "decode", &cfg->decode, &cfg->n_decode)) != DUET_OK)
        goto err;
    for (int a = 0; a < cfg->n_prefill + cfg->n_decode; a++) {
        const duet_instance_config_t *x =
            a < cfg->n_prefill ? &cfg->prefill[a] : &cfg->decode[a - cfg->n_prefill];
        for (int b = a + 1; b < cfg->n_prefill + cfg->n_decode; b++) {
            const duet_instance_config_t *y =
                b < cfg->n_prefill ? &cfg->prefill[b] : &cfg->decode[b - cfg->n_prefill];
            if (strcmp(x->name, y->name) == 0) {
                st = duet_error(DUET_ERR_CONFIG, "%s[%d].name: '%s' is used twice",
                                b < cfg->n_prefill ? "prefill" : "decode",
                                b < cfg->n_prefill ? b : b - cfg->n_prefill, y->name);
                goto err;
            }
        }
    }
    cJSON_Delete(root);
    *cfg_p = cfg;
    return DUET_OK;

err:
    duet_free(tr.on_failure);
    cJSON_Delete(root);
    duet_cluster_free(cfg);
    return st;
}

duet_status_t duet_cluster_load(const char *path, duet_cluster_config_t **cfg_p)
{
    char *text, *dir_copy;
    size_t len;
    duet_status_t st = duet_file_read(path, &text, &len);
    if (st != DUET_OK)
        return st;
    dir_copy = duet_strdup(path);
    if (dir_copy == NULL) {
        duet_free(text);
        return duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    }
    st = duet_cluster_parse(text, len, path, dirname(dir_copy), cfg_p);
    if (st == DUET_OK && ((*cfg_p)->path = duet_strdup(path)) == NULL) {
        duet_cluster_free(*cfg_p);
        st = duet_error(DUET_ERR_NO_MEMORY, "%s: no memory", path);
    }
    duet_free(dir_copy);
    duet_free(text);
    return st;
}

void duet_cluster_free(duet_cluster_config_t *cfg)
{
    if (cfg == NULL)
        return;
    for (int i = 0; cfg->prefill != NULL && i < cfg->n_prefill; i++)
        duet_cfg_free(duet__instance_fields, N_OF(duet__instance_fields), &cfg->prefill[i]);
    for (int i = 0; cfg->decode != NULL && i < cfg->n_decode; i++)
        duet_cfg_free(duet__instance_fields, N_OF(duet__instance_fields), &cfg->decode[i]);
    duet_free(cfg->prefill);
    duet_free(cfg->decode);
    duet_cfg_free(duet__router_fields, N_OF(duet__router_fields), &cfg->router);
    duet_cfg_free(duet__auth_fields, N_OF(duet__auth_fields), &cfg->auth);
    duet_free(cfg->model);
    duet_free(cfg->path);
    duet_free(cfg);
}

duet_instance_config_t *duet_cluster_find(duet_cluster_config_t *cfg, const char *name,
                                          duet_role_t *role_p)
{
    for (int i = 0; i < cfg->n_prefill; i++) {
        if (strcmp(cfg->prefill[i].name, name) == 0) {
            *role_p = DUET_ROLE_PREFILL;
            return &cfg->prefill[i];
        }
    }
    for (int i = 0; i < cfg->n_decode; i++) {
        if (strcmp(cfg->decode[i].name, name) == 0) {
            *role_p = DUET_ROLE_DECODE;
            return &cfg->decode[i];
        }
    }
    return NULL;
}

duet_status_t duet_cluster_instance_set(duet_instance_config_t *inst, const char *key,
                                        const char *value)
{
    return duet_cfg_set_str(duet__instance_fields, N_OF(duet__instance_fields), inst, key, value);
}

duet_status_t duet_cluster_auth_set(duet_cluster_config_t *cfg, const char *key, const char *value)
{
    return duet_cfg_set_str(duet__auth_fields, N_OF(duet__auth_fields), &cfg->auth, key, value);
}

void duet_cluster_describe(FILE *out)
{
    fprintf(out, "cluster config keys:\n  model                   string  (required) model "
                 "directory, relative to the config file\n");
    duet_cfg_describe(out, "kv.", duet__kv_fields, N_OF(duet__kv_fields));
    duet_cfg_describe(out, "transfer.", duet__transfer_fields, N_OF(duet__transfer_fields));
    duet_cfg_describe(out, "router.", duet__router_fields, N_OF(duet__router_fields));
    duet_cfg_describe(out, "router.cache_aware.", duet__cache_aware_fields,
                      N_OF(duet__cache_aware_fields));
    duet_cfg_describe(out, "auth.", duet__auth_fields, N_OF(duet__auth_fields));
    duet_cfg_describe(out, "prefill[]./decode[].", duet__instance_fields,
                      N_OF(duet__instance_fields));
}
