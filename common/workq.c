#include "common/workq.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "common/alloc.h"
#include "common/sync.h"

typedef struct duet__task {
    duet_workq_fn fn;
    void *arg;
    struct duet__task *next;
} duet__task_t;

struct duet_workq {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    duet__task_t *head, *tail;
    bool stop;
    pthread_t thread;
    char name[16];
};

static void *duet__workq_main(void *p)
{
    duet_workq_t *wq = p;
    duet_thread_set_name("%s", wq->name);
    pthread_mutex_lock(&wq->lock);
    for (;;) {
        while (wq->head == NULL && !wq->stop)
            pthread_cond_wait(&wq->cv, &wq->lock);
        if (wq->head == NULL)
            break;
        duet__task_t *t = wq->head;
        wq->head = t->next;
        if (wq->head == NULL)
            wq->tail = NULL;
        pthread_mutex_unlock(&wq->lock);
        t->fn(t->arg);
        duet_free(t);
        pthread_mutex_lock(&wq->lock);
    }
    pthread_mutex_unlock(&wq->lock);
    return NULL;
}

duet_status_t duet_workq_create(const char *name, duet_workq_t **wq_p)
{
    duet_workq_t *wq = DUET_NEW(duet_workq_t);
    if (wq == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "workq %s: no memory", name);
    pthread_mutex_init(&wq->lock, NULL);
    pthread_cond_init(&wq->cv, NULL);
    snprintf(wq->name, sizeof(wq->name), "%s", name);
    if (pthread_create(&wq->thread, NULL, duet__workq_main, wq) != 0) {
        pthread_cond_destroy(&wq->cv);
        pthread_mutex_destroy(&wq->lock);
        duet_free(wq);
        return duet_error(DUET_ERR_NO_MEMORY, "workq %s: cannot start its thread", name);
    }
    *wq_p = wq;
    return DUET_OK;
}

duet_status_t duet_workq_post(duet_workq_t *wq, duet_workq_fn fn, void *arg)
{
    duet__task_t *t = DUET_NEW(duet__task_t);
    if (t == NULL)
        return duet_error(DUET_ERR_NO_MEMORY, "workq %s: no memory", wq->name);
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_lock(&wq->lock);
    if (wq->stop) {
        pthread_mutex_unlock(&wq->lock);
        duet_free(t);
        return duet_error(DUET_ERR_SHUTDOWN, "workq %s: shutting down", wq->name);
    }
    if (wq->tail != NULL)
        wq->tail->next = t;
    else
        wq->head = t;
    wq->tail = t;
    pthread_cond_signal(&wq->cv);
    pthread_mutex_unlock(&wq->lock);
    return DUET_OK;
}

void duet_workq_destroy(duet_workq_t *wq)
{
    if (wq == NULL)
        return;
    pthread_mutex_lock(&wq->lock);
    wq->stop = true;
    pthread_cond_signal(&wq->cv);
    pthread_mutex_unlock(&wq->lock);
    pthread_join(wq->thread, NULL);
    pthread_cond_destroy(&wq->cv);
    pthread_mutex_destroy(&wq->lock);
    duet_free(wq);
}
