/* The transfer context and its ranks: creating the transport, one worker,
 * wake-up fds and progress thread per rank (xfer_progress.c runs it), and
 * tearing them down in the order the transport needs; plus the capability
 * queries of xfer.h. */
#include "transfer/xfer_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sync.h"
#include "transfer/xfer_crc32c.h"

/* ---- ranks -------------------------------------------------------------------- */

static void duet__xfer_rank_destroy(duet_xfer_rank_t *r)
{
    if (r == NULL)
        return;
    if (r->thread_started) {
        duet__cmd_t c;
        memset(&c, 0, sizeof(c));
        c.kind = DUET__CMD_STOP;
        duet__call(r, &c, 0);
        pthread_join(r->thread, NULL);
        r->thread_started = 0;
    }
    duet__peer_drop_rkeys(r); /* rkeys go before the worker (and its endpoints) */
    r->ops->worker_destroy(r->worker);
    duet__peer_reap_all(r);
    while (r->send_list != NULL) {
        duet__send_t *s = r->send_list;
        duet__send_free(s); /* unlinks itself */
    }
    duet__recv_cleanup(r);
    duet__map_cleanup(&r->sends);
    r->ops->mem_unmap(r->x->transport, r->mem);
    if (r->epfd >= 0)
        close(r->epfd);
    if (r->evfd >= 0)
        close(r->evfd);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mu);
    duet_free(r->inbox);
    duet_free(r);
}

/* The worker, its event fd and the command eventfd, both in the rank's
 * epoll set. */
static duet_status_t duet__rank_wakeup_init(duet_xfer_rank_t *r)
{
    struct epoll_event ev;
    duet_status_t st;

    st = r->ops->worker_create(r->x->transport, duet__rank_on_msg, r, &r->worker);
    if (st != DUET_OK) {
        r->worker = NULL;
        return duet_error_wrap(st, "xfer rank %d: ", r->index);
    }
    r->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (r->evfd < 0 || r->epfd < 0)
        return duet_error(DUET_ERR_IO, "xfer rank %d: eventfd/epoll: %s", r->index,
                          strerror(errno));
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.fd = r->ops->event_fd(r->worker);
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0)
        return duet_error(DUET_ERR_IO, "xfer rank %d: epoll_ctl: %s", r->index, strerror(errno));
    ev.data.fd = r->evfd;
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->evfd, &ev) != 0)
        return duet_error(DUET_ERR_IO, "xfer rank %d: epoll_ctl: %s", r->index, strerror(errno));
    return DUET_OK;
}

static duet_status_t duet__xfer_rank_create(duet_xfer_t *x, int index, duet_xfer_rank_t **rank_p)
{
    duet_xfer_rank_t *r;
    duet_status_t st;
    int rc;

    r = DUET_NEW(duet_xfer_rank_t);
    if (r == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer rank %d", index);
    r->x = x;
    r->ops = x->ops;
    r->index = index;
    r->evfd = r->epfd = -1;
    r->next_deadline_ns = INT64_MAX;
    duet_fault_count_init(&r->corrupt, "xfer.corrupt_put");
    r->info.role = x->cfg.role;
    r->info.rank = index;
    r->info.tp = x->cfg.tp;
    r->info.kv_heads = x->cfg.kv_heads;
    r->info.dtype = x->cfg.dtype;
    r->info.layout = x->cfg.layout;
    r->info.model_fingerprint = x->cfg.model_fingerprint;
    r->info.instance = x->instance;
    r->info.host_id = x->host_id;
    duet__map_init(&r->sends);
    duet__map_init(&r->expects);
    duet__map_init(&r->tombs);
    pthread_mutex_init(&r->mu, NULL);
    rc = duet_cond_init_monotonic(&r->cond);
    if (rc != 0) {
        pthread_mutex_destroy(&r->mu);
        duet_free(r);
        return duet_error(DUET_ERR_INTERNAL, "xfer rank %d: condition variable: %s", index,
                          strerror(rc));
    }
    r->tomb_ring = DUET_NEW_ARRAY(uint64_t, DUET__TOMB_CAP);
    r->early = DUET_NEW_ARRAY(duet__early_t, (size_t)x->cfg.early_max);
    if (r->tomb_ring == NULL || r->early == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "xfer rank %d: tables", index);
        goto err_destroy;
    }
    st = duet__rank_wakeup_init(r);
    if (st != DUET_OK)
        goto err_destroy;
    {
        /* the bench's A/B of duet__rank_sleep's device polling */
        const char *arm = getenv("DUET_XFER_ARM_DEVICE");
        r->arm_device = arm != NULL && strcmp(arm, "1") == 0;
    }
    rc = pthread_create(&r->thread, NULL, duet__rank_main, r);
    if (rc != 0) {
        st = duet_error(DUET_ERR_INTERNAL, "xfer rank %d: pthread_create: %s", index, strerror(rc));
        goto err_destroy;
    }
    r->thread_started = 1;
    *rank_p = r;
    return DUET_OK;

err_destroy:
    duet__xfer_rank_destroy(r);
    return st;
}

/* ---- context ------------------------------------------------------------------ */

/* Same host <=> same hostname and boot: only then can shared memory work. */
static uint64_t duet__host_id_get(void)
{
    char buf[320] = "";
    size_t n = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        n = fread(buf, 1, 64, f);
        fclose(f);
    }
    if (gethostname(buf + n, sizeof(buf) - n - 1) != 0)
        buf[n] = '\0';
    n = strlen(buf);
    return ((uint64_t)duet__crc32c(0, buf, n) << 32) | duet__crc32c(0x9e3779b9u, buf, n);
}

static uint64_t duet__instance_new(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = (uint64_t)duet_now_ns() ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

duet_status_t duet_xfer_create(const duet_xfer_config_t *cfg, duet_xfer_t **xfer_p)
{
    duet_xfer_desc_info_t info;
    duet_xfer_t *x;
    duet_status_t st;

    memset(&info, 0, sizeof(info));
    info.role = cfg->role;
    info.tp = cfg->tp;
    info.kv_heads = cfg->kv_heads;
    info.dtype = cfg->dtype;
    info.layout = cfg->layout;
    info.pool_bytes = UINT64_MAX;
    if (duet__desc_check_info(&info, "xfer config") != DUET_OK)
        return duet_error(DUET_ERR_CONFIG, "%s", duet_error_msg());

    x = DUET_NEW(duet_xfer_t);
    if (x == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "xfer context");
    x->cfg = *cfg;
    if (x->cfg.early_ttl_ms <= 0)
        x->cfg.early_ttl_ms = 5000;
    if (x->cfg.early_max <= 0)
        x->cfg.early_max = 1024;
    if (cfg->tls != NULL) {
        x->tls = duet_strdup(cfg->tls);
        if (x->tls == NULL) {
            duet_free(x);
            return duet_error(DUET_ERR_NO_MEMORY, "xfer context");
        }
    }
    x->cfg.tls = x->tls;
    x->instance = duet__instance_new();
    x->host_id = duet__host_id_get();
    x->ops = &duet_xfer_transport_ucx;
    st = x->ops->create(x->tls, &x->transport);
    if (st != DUET_OK)
        goto err_free;
    if (!x->ops->detects_peer_failure(x->transport))
        atomic_store(&x->no_peer_mode, 1); /* (logged by the transport) */
    x->ranks = DUET_NEW_ARRAY(duet_xfer_rank_t *, (size_t)cfg->tp);
    if (x->ranks == NULL) {
        st = duet_error(DUET_ERR_NO_MEMORY, "xfer ranks");
        goto err_destroy;
    }
    for (int i = 0; i < cfg->tp; i++) {
        st = duet__xfer_rank_create(x, i, &x->ranks[i]);
        if (st != DUET_OK)
            goto err_destroy;
        x->n_ranks++;
    }
    DUET_LOG_INFO("xfer: %s daemon, tp %d, instance %016" PRIx64 ", tls %s",
                  duet__role_name(cfg->role), cfg->tp, x->instance,
                  x->tls ? x->tls : "(ucx default)");
    *xfer_p = x;
    return DUET_OK;

err_destroy:
    duet_xfer_destroy(x);
    return st;
err_free:
    duet_free(x->tls);
    duet_free(x);
    return st;
}

void duet_xfer_destroy(duet_xfer_t *x)
{
    if (x == NULL)
        return;
    for (int i = 0; i < x->n_ranks; i++)
        duet__xfer_rank_destroy(x->ranks[i]);
    duet_free(x->ranks);
    x->ops->destroy(x->transport);
    duet_free(x->tls);
    duet_free(x);
}

duet_xfer_rank_t *duet_xfer_rank(duet_xfer_t *x, int i)
{
    return (x != NULL && i >= 0 && i < x->n_ranks) ? x->ranks[i] : NULL;
}

/* ---- capabilities ---------------------------------------------------------------- */

bool duet_xfer_supports_cuda_memory(const duet_xfer_t *xfer)
{
    return xfer->ops->supports_cuda_memory(xfer->transport);
}

int duet_xfer_ucx_version(void)
{
    return duet_xfer_transport_ucx.version();
}

bool duet_xfer_device_puts(const duet_xfer_t *xfer, const char **why)
{
    return xfer->ops->device_puts(xfer->transport, why);
}
