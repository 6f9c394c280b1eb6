/* Fork-style n (docs/api-logprobs.md "Fork-style sharing"): a choice made
 * with duet_router_job_start_after waits for its leader's (choice 0's)
 * first token, then starts pinned to the leader's prefill/decode pair, whose
 * decode holds the prompt's pages by then (workers.h "pinned picks"). */
#include "common/log.h"
#include "router/job/job_internal.h"

/* Can a follower of job share its prompt's pages?  The prompt has a full
 * page before its last token (what a decode's cache serves), prompt
 * logprobs (which skip the cache) are not asked, and a decode of the
 * config keeps a prefix cache. */
static bool duet__fork_worth(const duet_router_job_t *job)
{
    const duet_cluster_config_t *cfg = job->rt->cfg;
    bool cache = false;

    for (int i = 0; i < cfg->n_decode; i++)
        cache = cache || cfg->decode[i].prefix_cache;
    return cache && !job->prompt_logprobs && cfg->page_size > 0 &&
           job->n_prompt > (uint32_t)cfg->page_size;
}

grpc_status_code duet_router_job_start_code(duet_status_t st)
{
    return st == DUET_ERR_EXHAUSTED                         ? GRPC_STATUS_RESOURCE_EXHAUSTED
           : st == DUET_ERR_CANCELLED                       ? GRPC_STATUS_CANCELLED
           : st == DUET_ERR_PEER || st == DUET_ERR_SHUTDOWN ? GRPC_STATUS_UNAVAILABLE
                                                            : GRPC_STATUS_INTERNAL;
}

/* Release job's waiting followers (once): pinned to job's pair when its
 * first token came, else unpinned.  Each starts as duet_router_job_start;
 * one that cannot start ends through its sink with the reason. */
void duet__job_fork(duet_router_job_t *job, bool pinned)
{
    duet_router_t *rt = job->rt;
    duet__pins_t pins = {.on = false, .prefill = {-1, 0}, .decode = {-1, 0}};
    duet_router_job_t *list;

    if (pinned) {
        pthread_mutex_lock(&job->lock);
        pins.on = job->decode >= 0;
        pins.prefill = (duet_router_pin_t){job->prefill, job->inst_p};
        pins.decode = (duet_router_pin_t){job->decode, job->inst_d};
        pthread_mutex_unlock(&job->lock);
    }
    pthread_mutex_lock(&rt->adm_lock);
    if (job->forked) {
        pthread_mutex_unlock(&rt->adm_lock);
        return;
    }
    job->forked = true;
    job->fork_pins = pins;
    list = job->followers;
    job->followers = NULL;
    for (duet_router_job_t *f = list; f != NULL; f = f->fnext) {
        f->state = DUET__JOB_NEW;
        f->leader = NULL;
        f->pins = pins;
    }
    pthread_mutex_unlock(&rt->adm_lock);
    while (list != NULL) {
        duet_router_job_t *f = list;
        list = f->fnext;
        f->fnext = NULL;
        duet_status_t st = duet__job_start(f, true);
        if (st != DUET_OK) {
            duet_router_job_end_t end = {
                .ok = false, .code = duet_router_job_start_code(st), .message = duet_error_msg()};
            f->sink->on_end(f->sink_arg, &end);
            duet__job_fork(f, false);
        }
        duet__job_unref(f); /* the leader's reference */
    }
}

duet_status_t duet_router_job_start_after(duet_router_job_t *job, duet_router_job_t *leader)
{
    duet_router_t *rt = job->rt;
    bool cancelled;

    if (leader == NULL || !duet__fork_worth(job))
        return duet_router_job_start(job);
    if (atomic_load(&rt->draining))
        return duet_error(DUET_ERR_SHUTDOWN, "the router is shutting down");
    pthread_mutex_lock(&rt->adm_lock);
    pthread_mutex_lock(&job->lock);
    cancelled = job->cancelled;
    pthread_mutex_unlock(&job->lock);
    if (cancelled) {
        pthread_mutex_unlock(&rt->adm_lock);
        return duet_error(DUET_ERR_CANCELLED, "cancelled");
    }
    if (!leader->forked) {
        duet_router_job_t **pp = &leader->followers;
        while (*pp != NULL) /* in index order */
            pp = &(*pp)->fnext;
        *pp = job;
        job->leader = leader;
        job->state = DUET__JOB_WAITING;
        atomic_fetch_add(&job->refs, 1); /* the leader's */
        pthread_mutex_unlock(&rt->adm_lock);
        return DUET_OK;
    }
    job->pins = leader->fork_pins; /* the leader is past its first token (or ended) */
    pthread_mutex_unlock(&rt->adm_lock);
    return duet_router_job_start(job);
}

/* Take a waiting follower off its leader's list (adm_lock held); false
 * when it is not waiting. */
bool duet__job_unwait_locked(duet_router_job_t *job)
{
    duet_router_job_t **pp;

    if (job->state != DUET__JOB_WAITING)
        return false;
    for (pp = &job->leader->followers; *pp && *pp != job; pp = &(*pp)->fnext)
        ;
    if (*pp == job)
        *pp = job->fnext;
    job->fnext = NULL;
    job->leader = NULL;
    job->state = DUET__JOB_ENDED;
    return true;
}
