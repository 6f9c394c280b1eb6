/* duet-router context: configuration, model facts (tokenizer, context
 * length, chat template), the ticker thread and the lifecycle.  The daemon
 * sits above its rooms: it assembles the fleet, the front ends and the
 * jobs between them (router/README.md "Rooms"). */
#include "router/router.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/rpc_auth.h"
#include "common/sync.h"
#include "model/model_config.h"
#include "router/grpc/grpc.h"
#include "router/http/http.h"
#include "router/job/ctx.h"
#include "router/job/job.h"

void duet_router_options_init(duet_router_options_t *opt)
{
    memset(opt, 0, sizeof(*opt));
    opt->http_threads = 2;
    opt->grpc_threads = 2;
    opt->client_threads = 2;
    opt->keepalive_ms = 2000;
}

static duet_status_t duet__set_str(char **field, const char *value)
{
    char *copy = duet_strdup(value);
    if (copy == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory");
    duet_free(*field);
    *field = copy;
    return DUET_OK;
}

/* The served model id: served_model_name, else the model directory's name. */
static char *duet__model_name(const duet_cluster_config_t *cfg)
{
    if (cfg->router.served_model_name && cfg->router.served_model_name[0])
        return duet_strdup(cfg->router.served_model_name);
    char *copy = duet_strdup(cfg->model), *name;
    if (copy == NULL)
        return NULL;
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/')
        copy[--n] = '\0';
    name = duet_strdup(basename(copy));
    duet_free(copy);
    return name;
}

static duet_status_t duet__auth_overrides(duet_router_t *rt, const duet_router_options_t *opt)
{
    const struct {
        const char *key, *value;
    } ov[] = {{"ca", opt->auth_ca},
              {"cert", opt->auth_cert},
              {"key", opt->auth_key},
              {"secret_file", opt->auth_secret_file},
              {"server_name", opt->auth_server_name}};
    duet_router_config_t *rc = &rt->cfg->router;
    duet_status_t st;

    for (size_t i = 0; i < sizeof(ov) / sizeof(ov[0]); i++)
        if (ov[i].value && (st = duet_cluster_auth_set(rt->cfg, ov[i].key, ov[i].value)) != DUET_OK)
            return st;
    if ((opt->https_cert && (st = duet__set_str(&rc->https_cert, opt->https_cert))) ||
        (opt->https_key && (st = duet__set_str(&rc->https_key, opt->https_key))))
        return st;
    return DUET_OK;
}

/* router.https_cert/https_key: both or neither, checked now. */
static duet_status_t duet__https_load(duet_router_t *rt)
{
    const duet_router_config_t *rc = &rt->cfg->router;
    bool cert = rc->https_cert[0] != '\0', key = rc->https_key[0] != '\0';

    if (!cert && !key)
        return DUET_OK;
    if (!cert || !key)
        return duet_error(DUET_ERR_CONFIG, "%s: required with %s",
                          cert ? "router.https_key" : "router.https_cert",
                          cert ? "router.https_cert" : "router.https_key");
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return duet_error(DUET_ERR_CONFIG,
                          "router.https_cert: this libmicrohttpd is built without TLS");
    return duet_rpc_auth_read_pair("router.https_cert", rc->https_cert, "router.https_key",
                                   rc->https_key, &rt->https_cert_pem, &rt->https_key_pem);
}

/* No plaintext listen on a non-loopback address unless auth.insecure; a
 * certificate naming an identity must name a router (docs/security.md
 * "Identities and roles"). */
static duet_status_t duet__check_roles(duet_router_t *rt)
{
    const duet_router_config_t *rc = &rt->cfg->router;
    const duet_auth_config_t *ac = &rt->cfg->auth;
    bool tls = ac->ca[0] != '\0';
    const char *id = duet_rpc_auth_identity(rt->auth);
    duet_status_t st;

    if ((st = duet_rpc_auth_listen_check(tls, ac->insecure, "router.grpc", rc->grpc)) != DUET_OK ||
        (st = duet_rpc_auth_listen_check(rc->https_cert[0] != '\0', ac->insecure, "router.http",
                                         rc->http)) != DUET_OK)
        return st;
    if (tls && id[0] == '\0')
        DUET_LOG_WARN("router: auth.cert %s names no identity (URI SAN "
                      "spiffe://duet/router/<name>): decodes refuse its Generate calls",
                      ac->cert);
    if (id[0] != '\0' && strncmp(id, "router/", 7) != 0)
        return duet_error(DUET_ERR_CONFIG, "auth.cert: %s names spiffe://duet/%s, not a router",
                          ac->cert, id);
    return DUET_OK;
}

static duet_status_t duet__load_model(duet_router_t *rt)
{
    duet_model_config_t mc;
    duet_status_t st;
    const char *tmpl;

    if ((st = duet_model_config_load(rt->cfg->model, &mc)) != DUET_OK)
        return duet_error_wrap(st, "model: ");
    if ((st = duet_tokenizer_load(rt->cfg->model, &rt->tok)) != DUET_OK)
        return duet_error_wrap(st, "model: ");
    if ((st = duet_cluster_context(rt->cfg, mc.max_pos, &rt->context_len)) != DUET_OK)
        return st;
    rt->vocab = mc.vocab;
    if (duet_tokenizer_vocab_size(rt->tok) > rt->vocab)
        rt->vocab = duet_tokenizer_vocab_size(rt->tok);
    int bos = duet_tokenizer_bos(rt->tok), eos = duet_tokenizer_eos(rt->tok);
    const char *bp = bos >= 0 ? duet_tokenizer_piece(rt->tok, bos) : NULL;
    const char *ep = eos >= 0 ? duet_tokenizer_piece(rt->tok, eos) : NULL;
    rt->bos_str = duet_strdup(bp ? bp : "");
    rt->eos_str = duet_strdup(ep ? ep : "");
    if (rt->bos_str == NULL || rt->eos_str == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory");
    tmpl = duet_tokenizer_chat_template(rt->tok);
    if (tmpl == NULL) {
        snprintf(rt->chat_unavailable, sizeof(rt->chat_unavailable),
                 "model '%s' has no chat template (tokenizer_config.json chat_template); use "
                 "/v1/completions",
                 rt->model_name);
    } else if ((st = duet_router_chat_tmpl_compile(tmpl, &rt->chat)) != DUET_OK) {
        snprintf(rt->chat_unavailable, sizeof(rt->chat_unavailable),
                 "the chat template of model '%s' is not supported: %s", rt->model_name,
                 duet_error_msg());
        DUET_LOG_WARN("%s", rt->chat_unavailable);
        rt->chat = NULL;
    }
    return DUET_OK;
}

duet_status_t duet_router_create(const duet_router_options_t *opt, duet_router_t **rt_p)
{
    duet_router_t *rt = DUET_NEW(duet_router_t);
    duet_router_config_t *rc;
    duet_status_t st;

    if (rt == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "router: no memory");
    rt->opt = *opt;
    pthread_mutex_init(&rt->adm_lock, NULL);
    duet_cond_init_monotonic(&rt->adm_cond);
    pthread_mutex_init(&rt->tick_lock, NULL);
    duet_cond_init_monotonic(&rt->tick_cond);
    duet_router_metrics_init(&rt->metrics);
    atomic_init(&rt->draining, false);
    rt->started_unix = (int64_t)time(NULL);

    if ((st = duet_cluster_load(opt->config_path, &rt->cfg)) != DUET_OK)
        goto err;
    rc = &rt->cfg->router;
    if ((opt->name && (st = duet__set_str(&rc->name, opt->name))) ||
        (opt->http_addr && (st = duet__set_str(&rc->http, opt->http_addr))) ||
        (opt->grpc_addr && (st = duet__set_str(&rc->grpc, opt->grpc_addr))) ||
        (opt->policy && (st = duet__set_str(&rc->policy, opt->policy))))
        goto err;
    if ((st = duet__auth_overrides(rt, opt)) != DUET_OK ||
        (st = duet_rpc_auth_load(&rt->cfg->auth, &rt->auth)) != DUET_OK ||
        (st = duet__https_load(rt)) != DUET_OK)
        goto err;
    if ((st = duet_router_policy_check(rc->policy, "router.policy", &rt->policy)) != DUET_OK)
        goto err;
    if (rt->policy == DUET_ROUTER_POLICY_CACHE_AWARE &&
        rc->cache_aware.max_tree_tokens < rt->cfg->page_size) {
        st = duet_error(DUET_ERR_CONFIG,
                        "router.cache_aware.max_tree_tokens: %lld is less than one KV page "
                        "(kv.page_size %d)",
                        (long long)rc->cache_aware.max_tree_tokens, rt->cfg->page_size);
        goto err;
    }
    if (rc->http[0] == '\0' && rc->grpc[0] == '\0') {
        st = duet_error(DUET_ERR_CONFIG, "router.http, router.grpc: both are off");
        goto err;
    }
    if ((st = duet__check_roles(rt)) != DUET_OK)
        goto err;
    if (rc->api_key_env[0] != '\0') {
        const char *v = getenv(rc->api_key_env);
        if (v == NULL || v[0] == '\0') {
            st = duet_error(DUET_ERR_CONFIG,
                            "router.api_key_env: environment variable %s is not set",
                            rc->api_key_env);
            goto err;
        }
        if (rc->api_key[0] != '\0') {
            st = duet_error(DUET_ERR_CONFIG, "router.api_key_env: give api_key or api_key_env, "
                                             "not both");
            goto err;
        }
        rt->api_key = duet_strdup(v);
    } else if (rc->api_key[0] != '\0') {
        rt->api_key = duet_strdup(rc->api_key);
    }
    if ((rt->model_name = duet__model_name(rt->cfg)) == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "router: no memory");
        goto err;
    }
    if ((st = duet__load_model(rt)) != DUET_OK)
        goto err;
    if (rt->context_len < 1) {
        st = duet_error(DUET_ERR_CONFIG, "model: context length %d is too short", rt->context_len);
        goto err;
    }
    /* as decode counts: a prompt may fill the context; the last token
     * generated needs no KV slot, so context - prompt + 1 tokens fit */
    rt->prompt_limit = rt->context_len;
    if (rc->max_prompt_tokens > 0 && rc->max_prompt_tokens < rt->prompt_limit)
        rt->prompt_limit = rc->max_prompt_tokens;
    rt->max_tokens_limit = rc->max_tokens_limit;
    rt->default_max_tokens = rt->cfg->n_decode > 0 ? rt->cfg->decode[0].max_tokens_default : 256;
    rt->request_timeout_ms = rc->request_timeout_ms;
    /* static addresses and discover groups ("name:port" syntax) */
    if ((st = duet_router_workers_validate(rt->cfg)) != DUET_OK)
        goto err;
    *rt_p = rt;
    return DUET_OK;

err:
    duet_router_destroy(rt);
    return st;
}

/* ---- lifecycle ---- */

static void duet__on_workers_change(void *arg)
{
    duet_router_update_health(arg);
}

static void *duet__ticker_main(void *arg)
{
    duet_router_t *rt = arg;
    duet_thread_set_name("rt-ticker");
    pthread_mutex_lock(&rt->tick_lock);
    while (!rt->tick_stop) {
        struct timespec ts = duet_deadline_timespec(duet_now_ns() + 200 * DUET_NS_PER_MS);
        pthread_cond_timedwait(&rt->tick_cond, &rt->tick_lock, &ts);
        if (rt->tick_stop)
            break;
        pthread_mutex_unlock(&rt->tick_lock);
        duet_router_jobs_expire(rt);
        duet_router_jobs_admit(rt);
        duet_router_jobs_watch(rt);
        duet_router_jobs_handoff(rt);
        if (rt->http)
            duet_router_http_tick(rt->http);
        pthread_mutex_lock(&rt->tick_lock);
    }
    pthread_mutex_unlock(&rt->tick_lock);
    return NULL;
}

duet_status_t duet_router_start(duet_router_t *rt)
{
    duet_rpc_client_config_t cc;
    duet_router_config_t *rc = &rt->cfg->router;
    duet_status_t st;
    int rc_thr;

    duet_rpc_client_config_init(&cc);
    cc.auth = rt->auth;
    cc.n_threads = rt->opt.client_threads > 0 ? rt->opt.client_threads : 2;
    cc.reconnect_backoff_ms = 500;
    if ((st = duet_rpc_client_create(&cc, &rt->cli)) != DUET_OK)
        return st;
    duet_router_workers_config_t wc = {.policy = rt->policy,
                                       .interval_ms = rc->health_interval_ms,
                                       .grace_ms = rt->opt.disc_grace_ms,
                                       .cli = rt->cli,
                                       .metrics = &rt->metrics,
                                       .on_change = duet__on_workers_change,
                                       .change_arg = rt};
    if ((st = duet_router_workers_create(rt->cfg, &wc, &rt->workers)) != DUET_OK)
        return st;
    if (rc->grpc[0] != '\0' &&
        (st = duet_router_grpc_start(rt, rc->grpc, rt->opt.grpc_threads)) != DUET_OK)
        return st;
    if (rc->http[0] != '\0' &&
        (st = duet_router_http_start(rt, rc->http, rt->opt.http_threads, rt->opt.keepalive_ms,
                                     &rt->http)) != DUET_OK)
        return st;
    if ((st = duet_router_workers_start(rt->workers)) != DUET_OK)
        return st;
    if ((rc_thr = pthread_create(&rt->ticker, NULL, duet__ticker_main, rt)) != 0)
        return duet_error(DUET_ERR_INTERNAL, "router: pthread_create: %s", strerror(rc_thr));
    rt->ticker_started = true;
    int groups[2] = {0, 0};
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < (r ? rt->cfg->n_decode : rt->cfg->n_prefill); i++) {
            const char *d = (r ? rt->cfg->decode : rt->cfg->prefill)[i].discover;
            groups[r] += d != NULL && d[0] != '\0';
        }
    DUET_LOG_INFO("%s serving model %s (context %d) http %s (port %d) grpc %s (port %d) policy %s, "
                  "prefill: %d static + %d discover groups, decode: %d static + %d discover "
                  "groups",
                  rc->name, rt->model_name, rt->context_len, rc->http, duet_router_http_port(rt),
                  rc->grpc, duet_router_grpc_port(rt), duet_router_policy_name(rt->policy),
                  rt->cfg->n_prefill - groups[0], groups[0], rt->cfg->n_decode - groups[1],
                  groups[1]);
    return DUET_OK;
}

int duet_router_http_port(const duet_router_t *rt)
{
    return rt->http ? duet_router_http_bound_port(rt->http) : 0;
}

int duet_router_grpc_port(const duet_router_t *rt)
{
    return rt->grpc ? duet_rpc_server_port(rt->grpc) : 0;
}

duet_status_t duet_router_drain(duet_router_t *rt, int64_t grace_ms)
{
    int64_t deadline = duet_deadline_in_ms(grace_ms);
    duet_status_t st = DUET_OK;
    bool cancelled = false;

    atomic_store(&rt->draining, true);
    duet_router_update_health(rt);
    if (rt->http)
        duet_router_http_quiesce(rt->http);
    DUET_LOG_INFO("draining (grace %lld ms)", (long long)grace_ms);
    pthread_mutex_lock(&rt->adm_lock);
    for (;;) {
        if (rt->running == 0 && rt->queued == 0)
            break;
        if (duet_now_ns() >= deadline && !cancelled) {
            DUET_LOG_WARN("grace period over: cancelling %d running and %d queued "
                          "requests",
                          rt->running, rt->queued);
            pthread_mutex_unlock(&rt->adm_lock);
            duet_router_jobs_cancel_all(rt);
            pthread_mutex_lock(&rt->adm_lock);
            cancelled = true;
            st = DUET_ERR_TIMEOUT;
            deadline = duet_deadline_in_ms(5000); /* cancellations settle */
            continue;
        }
        if (duet_now_ns() >= deadline)
            break;
        struct timespec ts = duet_deadline_timespec(deadline);
        pthread_cond_timedwait(&rt->adm_cond, &rt->adm_lock, &ts);
    }
    pthread_mutex_unlock(&rt->adm_lock);
    /* HTTP responses may still be flushing to clients: give them a moment */
    for (int i = 0; rt->http && i < 100 && duet_router_http_active(rt->http) > 0; i++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (rt->grpc)
        duet_rpc_server_shutdown(rt->grpc, 1000);
    return st;
}

void duet_router_destroy(duet_router_t *rt)
{
    if (rt == NULL)
        return;
    if (rt->ticker_started) {
        pthread_mutex_lock(&rt->tick_lock);
        rt->tick_stop = true;
        pthread_cond_broadcast(&rt->tick_cond);
        pthread_mutex_unlock(&rt->tick_lock);
        pthread_join(rt->ticker, NULL);
    }
    atomic_store(&rt->draining, true);
    /* Order: no new work, then the front ends (their calls end through the
     * jobs, whose streams end on the client's threads), then the client. */
    if (rt->workers)
        duet_router_jobs_cancel_all(rt);
    duet_router_workers_stop(rt->workers);
    duet_rpc_server_destroy(rt->grpc);
    duet_router_http_stop(rt->http);
    duet_rpc_client_destroy(rt->cli);
    duet_router_http_destroy(rt->http);
    duet_rpc_health_destroy(rt->health);
    duet_router_workers_destroy(rt->workers);
    duet_router_chat_tmpl_destroy(rt->chat);
    duet_tokenizer_destroy(rt->tok);
    duet_free(rt->bos_str);
    duet_free(rt->eos_str);
    duet_free(rt->model_name);
    duet_free(rt->api_key);
    duet_rpc_auth_destroy(rt->auth);
    if (rt->https_key_pem)
        memset(rt->https_key_pem, 0, strlen(rt->https_key_pem));
    duet_free(rt->https_key_pem);
    duet_free(rt->https_cert_pem);
    duet_cluster_free(rt->cfg);
    pthread_cond_destroy(&rt->tick_cond);
    pthread_mutex_destroy(&rt->tick_lock);
    pthread_cond_destroy(&rt->adm_cond);
    pthread_mutex_destroy(&rt->adm_lock);
    duet_free(rt);
}
