/* Engine lifecycle, rank threads, and the forward step's validation,
 * chunking and dispatch.  What a rank computes is in forward.c. */
#include "engine/engine_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"

/* Host arrays of one chunk, allocated once at create. */
typedef struct {
    duet__job_t job;
    int32_t *tokens, *positions, *slots, *q_start, *ctx_len, *page_table;
    int page_stride;
} duet__job_bufs_t;

void duet_engine_opts_default(duet_engine_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->backend = "cpu";
    o->tp = 1;
    o->page_size = 16;
    o->max_batch_tokens = 2048;
    o->max_seqs = 256;
    o->comm_timeout_ms = 60000;
}

const duet_backend_ops_t *duet_backend_find(const char *name)
{
    if (name == NULL || strcmp(name, "cpu") == 0)
        return &duet_backend_cpu;
#ifdef DUET_HAVE_CUDA
    if (strcmp(name, "cuda") == 0)
        return &duet_backend_cuda;
#else
    if (strcmp(name, "cuda") == 0) {
        duet_error(DUET_ERR_UNSUPPORTED, "backend cuda: this build has no CUDA support");
        return NULL;
    }
#endif
    duet_error(DUET_ERR_CONFIG, "backend '%s': unknown (cpu or cuda)", name);
    return NULL;
}

static void duet__rank_report(duet__rank_t *rk, duet_status_t st)
{
    duet_engine_t *e = rk->e;
    if (st != DUET_OK)
        snprintf(rk->errmsg, sizeof(rk->errmsg), "%s", duet_error_msg());
    pthread_mutex_lock(&e->lock);
    rk->status = st;
    if (++e->n_done == e->tp)
        pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->lock);
}

static void *duet__rank_main(void *arg)
{
    duet__rank_t *rk = arg;
    duet_engine_t *e = rk->e;
    uint64_t seen;
    duet_status_t st;

    duet_thread_set_name("duet-rank%d", rk->rank);
    pthread_mutex_lock(&e->lock);
    seen = e->gen;
    pthread_mutex_unlock(&e->lock);
    st = duet__rank_init(rk);
#ifdef DUET_HAVE_CUDA
    /* ranks still joining the nccl group must not wait for this one */
    if (st != DUET_OK && e->nccl_group != NULL)
        duet_comm_nccl_group_abort(e->nccl_group, st, duet_error_msg());
#endif
    duet__rank_report(rk, st);
    for (;;) {
        const duet__job_t *job;
        pthread_mutex_lock(&e->lock);
        while (e->gen == seen && !e->stop)
            pthread_cond_wait(&e->work_cv, &e->lock);
        if (e->stop) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        seen = e->gen;
        job = e->job;
        pthread_mutex_unlock(&e->lock);
        st = job->kind == DUET__JOB_FORWARD ? duet__rank_forward(rk, job)
                                            : duet__rank_kv_job(rk, job);
        if (st != DUET_OK && rk->comm->size > 1)
            rk->comm->ops->abort(rk->comm, st, duet_error_msg());
        duet__rank_report(rk, st);
    }
    duet__rank_cleanup(rk);
    return NULL;
}

/* Wait until every rank reported for the current generation; a forward
 * that takes longer than the collective deadline is logged, naming the
 * ranks still running (the collectives' own deadlines end real hangs). */
static duet_status_t duet__wait_ranks(duet_engine_t *e, const char *what)
{
    duet_status_t st = DUET_OK;
    int64_t start = duet_now_ns();

    pthread_mutex_lock(&e->lock);
    while (e->n_done < e->tp) {
        struct timespec ts = duet_deadline_timespec(
            duet_now_ns() + (int64_t)e->opts.comm_timeout_ms * DUET_NS_PER_MS);
        if (pthread_cond_timedwait(&e->done_cv, &e->lock, &ts) == ETIMEDOUT && e->n_done < e->tp)
            DUET_LOG_WARN("engine: %s running for %lld ms, %d of %d ranks done", what,
                          (long long)((duet_now_ns() - start) / DUET_NS_PER_MS), e->n_done, e->tp);
    }
    for (int r = 0; r < e->tp; r++) {
        if (e->ranks[r].status != DUET_OK) {
            /* a timeout names the rank that waited; other ranks' errors are
             * usually the abort it caused, so report the first cause */
            st = duet_error(e->ranks[r].status, "%s", e->ranks[r].errmsg);
            break;
        }
    }
    pthread_mutex_unlock(&e->lock);
    return st;
}

static void duet__stop_ranks(duet_engine_t *e)
{
    pthread_mutex_lock(&e->lock);
    e->stop = true;
    pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->lock);
    for (int r = 0; r < e->tp; r++) {
        if (e->ranks[r].started)
            pthread_join(e->ranks[r].thread, NULL);
    }
}

static duet_status_t duet__check_opts(const duet_engine_opts_t *o)
{
    if (o->model_dir == NULL)
        return duet_error(DUET_ERR_CONFIG, "model: no model directory given");
    if (o->tp < 1 || o->tp > DUET_TP_MAX)
        return duet_error(DUET_ERR_CONFIG, "tp: %d is out of range 1..%d", o->tp, DUET_TP_MAX);
    if (o->page_size < 1 || o->page_size > 4096)
        return duet_error(DUET_ERR_CONFIG, "page_size: %d is out of range 1..4096", o->page_size);
    if (o->n_pages < 1)
        return duet_error(DUET_ERR_CONFIG, "n_pages: %d must be positive", o->n_pages);
    if (o->max_batch_tokens < 1 || o->max_seqs < 1 || o->max_seqs > o->max_batch_tokens)
        return duet_error(DUET_ERR_CONFIG,
                          "max_batch_tokens %d / max_seqs %d: need 1 <= max_seqs <= "
                          "max_batch_tokens",
                          o->max_batch_tokens, o->max_seqs);
    if (o->comm_timeout_ms < 1)
        return duet_error(DUET_ERR_CONFIG, "comm_timeout_ms: %d must be positive",
                          o->comm_timeout_ms);
    if (o->threads < 0 || o->threads > 1024)
        return duet_error(DUET_ERR_CONFIG, "threads: %d is out of range 0..1024", o->threads);
    return DUET_OK;
}

static duet_status_t duet__alloc_job_bufs(duet_engine_t *e, duet__job_bufs_t *jb)
{
    size_t T = (size_t)e->opts.max_batch_tokens, S = (size_t)e->opts.max_seqs;
    int ps = e->opts.page_size;
    long cap = (long)e->opts.n_pages * ps;
    if (cap > e->model->cfg.max_pos)
        cap = e->model->cfg.max_pos;
    jb->page_stride = (int)((cap + ps - 1) / ps);
    jb->tokens = duet_malloc(T * sizeof(int32_t));
    jb->positions = duet_malloc(T * sizeof(int32_t));
    jb->slots = duet_malloc(T * sizeof(int32_t));
    jb->q_start = duet_malloc((S + 1) * sizeof(int32_t));
    jb->ctx_len = duet_malloc(S * sizeof(int32_t));
    jb->page_table = duet_malloc(S * (size_t)jb->page_stride * sizeof(int32_t));
    jb->job.out = duet_malloc(T * sizeof(duet__out_row_t));
    if (!jb->tokens || !jb->positions || !jb->slots || !jb->q_start || !jb->ctx_len ||
        !jb->page_table || !jb->job.out)
        return duet_error(DUET_ERR_NO_MEMORY, "engine: no memory for batch buffers");
    return DUET_OK;
}

static void duet__free_job_bufs(duet__job_bufs_t *jb)
{
    duet_free(jb->tokens);
    duet_free(jb->positions);
    duet_free(jb->slots);
    duet_free(jb->q_start);
    duet_free(jb->ctx_len);
    duet_free(jb->page_table);
    duet_free(jb->job.out);
}

static duet__job_bufs_t *duet__bufs(duet_engine_t *e)
{
    return (duet__job_bufs_t *)(void *)(e + 1);
}

duet_status_t duet_engine_create(const duet_engine_opts_t *opts, duet_engine_t **e_p)
{
    duet_engine_t *e;
    duet_status_t st;
    int cpus = duet_cpu_count();

    if ((st = duet__check_opts(opts)) != DUET_OK)
        return st;
    /* the chunk buffers live right after the struct */
    e = duet_calloc(1, sizeof(duet_engine_t) + sizeof(duet__job_bufs_t));
    if (e == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "engine: no memory");
    e->opts = *opts;
    e->tp = opts->tp;
    e->ops = opts->backend_ops != NULL ? opts->backend_ops : duet_backend_find(opts->backend);
    if (e->ops == NULL) {
        st = DUET_ERR_CONFIG;
        goto err_free;
    }
    if ((st = duet_model_open(opts->model_dir, &e->model)) != DUET_OK)
        goto err_free;
    if ((st = duet_tp_check(&e->model->cfg, e->tp)) != DUET_OK)
        goto err_close_model;
    e->threads = opts->threads > 0 ? opts->threads : (cpus / e->tp > 0 ? cpus / e->tp : 1);
    e->spin = e->tp * e->threads <= cpus;

    duet_shard_t s0;
    duet_shard_init(&e->model->cfg, e->tp, 0, &s0);
    e->kv_layout = (duet_kv_layout_t){
        .n_layers = e->model->cfg.n_layers,
        .n_pages = opts->n_pages,
        .page_size = opts->page_size,
        .n_kv_heads = s0.n_kv_heads,
        .head_dim = e->model->cfg.head_dim,
        .elem_size = (int)duet_dtype_size(e->ops->kv_dtype),
    };
    if ((st = duet__alloc_job_bufs(e, duet__bufs(e))) != DUET_OK)
        goto err_free_bufs;
#ifdef DUET_HAVE_CUDA
    if (e->ops == &duet_backend_cuda && e->tp > 1) {
        /* nccl: each rank thread joins once its device is set (forward.c) */
        st = duet_comm_nccl_group_create(e->tp, opts->comm_timeout_ms, &e->nccl_group);
        if (st != DUET_OK)
            goto err_free_bufs;
    } else
#endif
    {
        st = duet_comm_host_group_create(
            e->tp, (size_t)opts->max_batch_tokens * (size_t)e->model->cfg.hidden * sizeof(float),
            opts->comm_timeout_ms, &e->comm_group);
        if (st != DUET_OK)
            goto err_free_bufs;
        duet_comm_host_group_set_spin(e->comm_group, e->spin);
    }
    e->ranks = DUET_NEW_ARRAY(duet__rank_t, (size_t)e->tp);
    if (e->ranks == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "engine: no memory");
        goto err_destroy_group;
    }
    pthread_mutex_init(&e->lock, NULL);
    duet_cond_init_monotonic(&e->done_cv);
    pthread_cond_init(&e->work_cv, NULL);
    for (int r = 0; r < e->tp; r++) {
        duet__rank_t *rk = &e->ranks[r];
        rk->e = e;
        rk->rank = r;
        duet_shard_init(&e->model->cfg, e->tp, r, &rk->shard);
        if (e->comm_group != NULL &&
            (st = duet_comm_host_create(e->comm_group, r, &rk->comm)) != DUET_OK)
            goto err_stop;
    }
    for (int r = 0; r < e->tp; r++) {
        if (pthread_create(&e->ranks[r].thread, NULL, duet__rank_main, &e->ranks[r]) != 0) {
            st = duet_error(DUET_ERR_NO_MEMORY, "engine: cannot start rank thread %d", r);
            /* the started ranks still report; pretend the rest did */
            pthread_mutex_lock(&e->lock);
            e->n_done += e->tp - r;
            pthread_mutex_unlock(&e->lock);
            duet__wait_ranks(e, "start-up");
            goto err_stop;
        }
        e->ranks[r].started = true;
    }
    if ((st = duet__wait_ranks(e, "start-up")) != DUET_OK)
        goto err_stop;
    DUET_LOG_INFO("engine: model %s arch %s layers %d hidden %d heads %d/%d backend %s tp %d "
                  "threads %d pages %d x %d tokens",
                  opts->model_dir, duet_arch_name(e->model->cfg.arch), e->model->cfg.n_layers,
                  e->model->cfg.hidden, e->model->cfg.n_heads, e->model->cfg.n_kv_heads,
                  e->ops->name, e->tp, e->threads, opts->n_pages, opts->page_size);
    *e_p = e;
    return DUET_OK;

err_stop:
    duet_engine_destroy(e);
    return st;
err_destroy_group:
    duet_comm_host_group_destroy(e->comm_group);
#ifdef DUET_HAVE_CUDA
    duet_comm_nccl_group_destroy(e->nccl_group);
#endif
err_free_bufs:
    duet__free_job_bufs(duet__bufs(e));
err_close_model:
    duet_model_close(e->model);
err_free:
    duet_free(e);
    return st;
}

void duet_engine_destroy(duet_engine_t *e)
{
    if (e == NULL)
        return;
    if (e->ranks != NULL) {
        duet__stop_ranks(e);
        for (int r = 0; r < e->tp; r++) {
            /* ranks that never started still own their comm */
            if (!e->ranks[r].started && e->ranks[r].comm != NULL)
                e->ranks[r].comm->ops->destroy(e->ranks[r].comm);
        }
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->work_cv);
        pthread_cond_destroy(&e->done_cv);
        duet_free(e->ranks);
    }
    duet_comm_host_group_destroy(e->comm_group);
#ifdef DUET_HAVE_CUDA
    duet_comm_nccl_group_destroy(e->nccl_group);
#endif
    duet__free_job_bufs(duet__bufs(e));
    duet_model_close(e->model);
    duet_free(e);
}

const duet_model_t *duet_engine_model(const duet_engine_t *e)
{
    return e->model;
}

const duet_kv_layout_t *duet_engine_kv_layout(const duet_engine_t *e)
{
    return &e->kv_layout;
}

static duet_status_t duet__check_seq(const duet_engine_t *e, const duet_engine_seq_t *s, int i)
{
    const duet_model_config_t *cfg = &e->model->cfg;
    int ps = e->opts.page_size;
    long total = (long)s->start_pos + s->n_tokens;
    long need;

    if (s->n_tokens < 1 || s->start_pos < 0 || s->tokens == NULL)
        return duet_error(DUET_ERR_INVALID, "sequence %d: %d new tokens at position %d", i,
                          s->n_tokens, s->start_pos);
    if (total > cfg->max_pos)
        return duet_error(DUET_ERR_TOO_LONG,
                          "sequence %d: %ld tokens exceed the model context of %d tokens", i, total,
                          cfg->max_pos);
    need = (total + ps - 1) / ps;
    if (need > e->opts.n_pages)
        return duet_error(DUET_ERR_EXHAUSTED,
                          "sequence %d: %ld tokens need %ld pages, the pool has %d", i, total, need,
                          e->opts.n_pages);
    if (s->pages == NULL || s->n_pages < need)
        return duet_error(DUET_ERR_INVALID, "sequence %d: %ld tokens need %ld pages, %d given", i,
                          total, need, s->n_pages);
    for (long p = 0; p < need; p++) {
        if (s->pages[p] < 0 || s->pages[p] >= e->opts.n_pages)
            return duet_error(DUET_ERR_INVALID, "sequence %d: page id %d out of range 0..%d", i,
                              s->pages[p], e->opts.n_pages - 1);
    }
    for (int t = 0; t < s->n_tokens; t++) {
        if (s->tokens[t] < 0 || s->tokens[t] >= cfg->vocab)
            return duet_error(DUET_ERR_INVALID, "sequence %d: token id %d out of range 0..%d", i,
                              s->tokens[t], cfg->vocab - 1);
    }
    if (s->sample) {
        duet_status_t st = duet_sampling_check(&s->sampling);
        if (st != DUET_OK)
            return duet_error_wrap(st, "sequence %d: ", i);
    }
    return DUET_OK;
}

static duet_status_t duet__dispatch(duet_engine_t *e, duet__job_t *job)
{
    duet_status_t st;
    pthread_mutex_lock(&e->lock);
    e->job = job;
    e->n_done = 0;
    e->gen++;
    pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->lock);
    st = duet__wait_ranks(e, "forward");
    if (st != DUET_OK) {
        e->failed = st;
        snprintf(e->failed_msg, sizeof(e->failed_msg), "%s", duet_error_msg());
        DUET_LOG_ERROR("engine: forward failed: %s", e->failed_msg);
    }
    return st;
}

bool duet_engine_kv_mirrored(const duet_engine_t *e)
{
    return e->ranks[0].kv_mirror != NULL;
}

duet_status_t duet_engine_device_id(duet_engine_t *e, int rank, char *buf, size_t cap)
{
    if (rank < 0 || rank >= e->tp || buf == NULL || cap == 0)
        return duet_error(DUET_ERR_INVALID, "device id: rank %d of %d", rank, e->tp);
    buf[0] = '\0';
    return e->ops->device_id != NULL ? e->ops->device_id(e->ranks[rank].br, buf, cap) : DUET_OK;
}

duet_status_t duet_engine_thread_bind(duet_engine_t *e, int rank)
{
    if (rank < 0 || rank >= e->tp)
        return duet_error(DUET_ERR_INVALID, "thread bind: rank %d of %d", rank, e->tp);
    return e->ops->thread_bind != NULL ? e->ops->thread_bind(e->ranks[rank].br) : DUET_OK;
}

bool duet_engine_kv_registered(const duet_engine_t *e)
{
    return e->ranks[0].kv_registered;
}

duet_status_t duet_engine_kv_export_layer(duet_engine_t *e, int rank, int layer,
                                          const int32_t *pages, int n, void (*done)(void *arg),
                                          void *arg)
{
    duet__rank_t *rk = &e->ranks[rank];
    if (rk->kv_mirror == NULL && !rk->kv_registered) {
        done(arg);
        return DUET_OK;
    }
    /* registered device pool: host NULL, done() only ordered after the store */
    return e->ops->kv_export_layer(rk->br, layer, pages, n, rk->kv_mirror, done, arg);
}

static duet_status_t duet__kv_dispatch(duet_engine_t *e, duet__job_t *job)
{
    if (e->failed != DUET_OK)
        return duet_error(e->failed, "engine failed earlier: %s", e->failed_msg);
    return duet__dispatch(e, job);
}

duet_status_t duet_engine_kv_export_sync(duet_engine_t *e)
{
    duet__job_t job = {.kind = DUET__JOB_KV_EXPORT_SYNC};
    /* a backend that queues exports or copies (cuda) waits on every rank,
     * whether the pool has a mirror, is registered for direct puts, or
     * neither: their done()s post the layers' puts */
    if (e->ops->kv_export_sync == NULL)
        return DUET_OK;
    return duet__kv_dispatch(e, &job);
}

duet_status_t duet_engine_kv_import(duet_engine_t *e, const int32_t *pages, int n)
{
    duet__job_t job = {.kind = DUET__JOB_KV_IMPORT, .kv_pages = pages, .kv_n_pages = n};
    for (int i = 0; i < n; i++) {
        if (pages[i] < 0 || pages[i] >= e->opts.n_pages)
            return duet_error(DUET_ERR_INVALID, "kv import: page id %d out of range", pages[i]);
    }
    if (!duet_engine_kv_mirrored(e))
        return DUET_OK;
    return duet__kv_dispatch(e, &job);
}

uint64_t duet_engine_kv_pool_bytes(const duet_engine_t *e)
{
    return duet_kv_total_bytes(&e->kv_layout) + (uint64_t)e->opts.kv_extra_bytes;
}

/* Whether [off, off + len) in every plane p of [0, n_planes) stays inside
 * the region a plane-0 offset can reach: a stepless side inside plane p,
 * a stepped one inside the pool. */
static bool duet__kv_copy_side_ok(uint64_t off, uint64_t step, uint64_t len, uint64_t plane,
                                  uint64_t pool, int n_planes)
{
    uint64_t last = (uint64_t)(n_planes - 1);
    if (step == 0)
        return off <= plane && len <= plane - off;
    if (step > pool || last * step > pool || off > pool - last * step)
        return false;
    return len <= pool - (off + last * step);
}

/* Every entry inside the pool (a stepless side inside its plane), its
 * source and destination apart in every plane: their distance is linear in
 * the plane, so apart in the first and the last plane on the same side
 * means apart in all. */
static duet_status_t duet__kv_copies_check(const duet_engine_t *e, const char *what,
                                           const duet_kv_copy_t *copies, int n)
{
    uint64_t plane = duet_kv_plane_bytes(&e->kv_layout), pool = duet_engine_kv_pool_bytes(e);
    int np = 2 * e->kv_layout.n_layers;
    if (n < 0 || (n > 0 && copies == NULL))
        return duet_error(DUET_ERR_INVALID, "%s: %d copies", what, n);
    for (int i = 0; i < n; i++) {
        const duet_kv_copy_t *c = &copies[i];
        if (!duet__kv_copy_side_ok(c->src, c->src_step, c->len, plane, pool, np) ||
            !duet__kv_copy_side_ok(c->dst, c->dst_step, c->len, plane, pool, np))
            return duet_error(DUET_ERR_INVALID,
                              "%s: copy %d (src %llu step %llu, dst %llu step %llu, len %llu) "
                              "leaves the %llu-byte plane or the %llu-byte pool",
                              what, i, (unsigned long long)c->src, (unsigned long long)c->src_step,
                              (unsigned long long)c->dst, (unsigned long long)c->dst_step,
                              (unsigned long long)c->len, (unsigned long long)plane,
                              (unsigned long long)pool);
        if (c->len == 0)
            continue;
        int side = 0;
        for (int k = 0; k < 2; k++) {
            int p = k == 0 ? 0 : np - 1;
            uint64_t s = duet_kv_copy_at(c->src, c->src_step, plane, p);
            uint64_t d = duet_kv_copy_at(c->dst, c->dst_step, plane, p);
            int now = s + c->len <= d ? -1 : d + c->len <= s ? 1 : 0;
            if (now == 0 || (side != 0 && now != side)) {
                side = 0;
                break;
            }
            side = now;
        }
        if (side == 0)
            return duet_error(DUET_ERR_INVALID,
                              "%s: copy %d (src %llu dst %llu len %llu) overlaps itself", what, i,
                              (unsigned long long)c->src, (unsigned long long)c->dst,
                              (unsigned long long)c->len);
    }
    return DUET_OK;
}

duet_status_t duet_engine_kv_copy_layer(duet_engine_t *e, int rank, int layer,
                                        const duet_kv_copy_t *copies, int n,
                                        void (*done)(void *arg), void *arg)
{
    duet_status_t st;
    if (rank < 0 || rank >= e->tp || layer < 0 || layer >= e->kv_layout.n_layers || done == NULL)
        return duet_error(DUET_ERR_INVALID, "kv copy: rank %d of %d, layer %d of %d%s", rank, e->tp,
                          layer, e->kv_layout.n_layers, done == NULL ? ", no done" : "");
    if ((st = duet__kv_copies_check(e, "kv copy", copies, n)) != DUET_OK)
        return st;
    if (e->ops->kv_copy == NULL)
        return duet_error(DUET_ERR_UNSUPPORTED, "kv copy: backend %s has none", e->ops->name);
    return e->ops->kv_copy(e->ranks[rank].br, layer, layer + 1, copies, n, done, arg);
}

duet_status_t duet_engine_kv_copy_ranks(duet_engine_t *e, const duet_kv_copy_t *const *copies,
                                        const int *n)
{
    return duet_engine_kv_copy_ranks_layers(e, copies, n, 0, e->kv_layout.n_layers, true);
}

duet_status_t duet_engine_kv_copy_ranks_layers(duet_engine_t *e,
                                               const duet_kv_copy_t *const *copies, const int *n,
                                               int l0, int l1, bool wait)
{
    duet__job_t job = {.kind = DUET__JOB_KV_COPY,
                       .kv_rank_copies = copies,
                       .kv_rank_n = n,
                       .kv_l0 = l0,
                       .kv_l1 = l1,
                       .kv_queue = !wait};
    duet_status_t st;
    if (copies == NULL || n == NULL)
        return duet_error(DUET_ERR_INVALID, "kv copy: no lists");
    if (l0 < 0 || l1 > e->kv_layout.n_layers || l0 > l1)
        return duet_error(DUET_ERR_INVALID, "kv copy: layers [%d, %d) of %d", l0, l1,
                          e->kv_layout.n_layers);
    for (int r = 0; r < e->tp; r++)
        if ((st = duet__kv_copies_check(e, "kv copy", copies[r], n[r])) != DUET_OK)
            return duet_error_wrap(st, "rank %d: ", r);
    if (e->ops->kv_copy == NULL)
        return duet_error(DUET_ERR_UNSUPPORTED, "kv copy: backend %s has none", e->ops->name);
    return duet__kv_dispatch(e, &job);
}

duet_status_t duet_engine_kv_copy(duet_engine_t *e, const duet_kv_copy_t *copies, int n)
{
    duet__job_t job = {.kind = DUET__JOB_KV_COPY,
                       .kv_copies = copies,
                       .kv_n_copies = n,
                       .kv_l1 = e->kv_layout.n_layers};
    duet_status_t st = duet__kv_copies_check(e, "kv copy", copies, n);
    if (st != DUET_OK || n == 0)
        return st;
    if (e->ops->kv_copy == NULL)
        return duet_error(DUET_ERR_UNSUPPORTED, "kv copy: backend %s has none", e->ops->name);
    return duet__kv_dispatch(e, &job);
}

duet_status_t duet_engine_kv_crc(duet_engine_t *e, int rank, const duet_crc32c_range_t *ranges,
                                 int n, uint32_t *crc_p)
{
    uint64_t pool = duet_engine_kv_pool_bytes(e);
    if (rank < 0 || rank >= e->tp || n < 0 || (n > 0 && ranges == NULL))
        return duet_error(DUET_ERR_INVALID, "kv crc: rank %d of %d, %d ranges", rank, e->tp, n);
    for (int i = 0; i < n; i++)
        if (ranges[i].off > pool || ranges[i].len > pool - ranges[i].off)
            return duet_error(DUET_ERR_INVALID,
                              "kv crc: range %d (off %llu len %llu) leaves the %llu-byte pool", i,
                              (unsigned long long)ranges[i].off, (unsigned long long)ranges[i].len,
                              (unsigned long long)pool);
    if (e->ops->kv_crc == NULL)
        return duet_error(DUET_ERR_UNSUPPORTED, "kv crc: backend %s has none", e->ops->name);
    return e->ops->kv_crc(e->ranks[rank].br, ranges, n, crc_p);
}

duet_status_t duet_engine_forward(duet_engine_t *e, const duet_engine_seq_t *seqs, int n_seqs,
                                  int32_t *sampled)
{
    duet__job_bufs_t *jb = duet__bufs(e);
    duet__job_t *job = &jb->job;
    int ps = e->opts.page_size, vocab = e->model->cfg.vocab;
    int si = 0, off = 0;
    duet_status_t st;

    if (e->failed != DUET_OK)
        return duet_error(e->failed, "engine failed earlier: %s", e->failed_msg);
    for (int i = 0; i < n_seqs; i++) {
        if ((st = duet__check_seq(e, &seqs[i], i)) != DUET_OK)
            return st;
        if (sampled != NULL)
            sampled[i] = -1;
    }
    job->seqs = seqs;
    job->sampled = sampled;
    while (si < n_seqs) {
        int nt = 0, ns = 0, max_ctx = 0;
        job->n_out = 0;
        while (si < n_seqs && ns < e->opts.max_seqs && nt < e->opts.max_batch_tokens) {
            const duet_engine_seq_t *s = &seqs[si];
            int take = s->n_tokens - off;
            if (take > e->opts.max_batch_tokens - nt)
                take = e->opts.max_batch_tokens - nt;
            bool final = off + take == s->n_tokens;
            int ctx = s->start_pos + off + take;

            jb->q_start[ns] = nt;
            for (int k = 0; k < take; k++) {
                int pos = s->start_pos + off + k;
                jb->tokens[nt + k] = s->tokens[off + k];
                jb->positions[nt + k] = pos;
                jb->slots[nt + k] = s->pages[pos / ps] * ps + pos % ps;
            }
            jb->ctx_len[ns] = ctx;
            memcpy(jb->page_table + (size_t)ns * (size_t)jb->page_stride, s->pages,
                   (size_t)((ctx + ps - 1) / ps) * sizeof(int32_t));
            if (ctx > max_ctx)
                max_ctx = ctx;
            if (s->all_logits) {
                for (int k = 0; k < take; k++) {
                    job->out[job->n_out++] = (duet__out_row_t){
                        .token = nt + k,
                        .seq = si,
                        .logits = s->logits ? s->logits + (size_t)(off + k) * (size_t)vocab : NULL,
                        .sample = final && k == take - 1 && s->sample && sampled != NULL,
                    };
                }
            } else if (final && (s->logits != NULL || (s->sample && sampled != NULL))) {
                job->out[job->n_out++] = (duet__out_row_t){
                    .token = nt + take - 1,
                    .seq = si,
                    .logits = s->logits,
                    .sample = s->sample && sampled != NULL,
                };
            }
            nt += take;
            ns++;
            if (final) {
                si++;
                off = 0;
            } else {
                off += take;
            }
        }
        jb->q_start[ns] = nt;
        job->last_chunk = si == n_seqs;
        job->desc = (duet_batch_desc_t){
            .n_tokens = nt,
            .n_seqs = ns,
            .tokens = jb->tokens,
            .positions = jb->positions,
            .slots = jb->slots,
            .q_start = jb->q_start,
            .ctx_len = jb->ctx_len,
            .page_table = jb->page_table,
            .page_stride = jb->page_stride,
            .max_ctx = max_ctx,
        };
        if ((st = duet__dispatch(e, job)) != DUET_OK)
            return st;
    }
    return DUET_OK;
}
