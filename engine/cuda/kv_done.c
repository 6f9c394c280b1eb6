/* The copy stream's done callbacks (kv_copy_host.c's pack, kv_mirror.c's
 * export): released by a per-rank completion thread instead of host
 * functions.
 *
 * A host function (cudaLaunchHostFunc) holds its stream until the host ran
 * it, so each layer cost a GPU -> host -> GPU round trip before the next
 * layer's copy could start (~60 us per layer on H200s).  Here the rank
 * thread records an event from a small pool after the layer's work and
 * queues (event, done, arg); the completion thread takes the queue in
 * FIFO order, waits for each event and runs done(arg).  The copy stream
 * never waits for the host (~15 us per layer in bench_gpu_transfer
 * --layer-done event, the same scheme).
 *
 * The wait is cudaEventSynchronize: the thread has nothing else to do, the
 * runtime picks spinning or yielding by the device's scheduling flags
 * (spin while the host has cores to spare: the lowest latency, and it is
 * what the bench measured), and it reports the event's error directly.
 * The thread sleeps on a condition variable while the queue is empty, so
 * it only spins while a layer's work is in flight.
 *
 * Launch signals (the packs of kv_copy_host.c): the pack kernel itself
 * writes a sequence number into a pinned word once its last block is done
 * (cuda_kernels.h), so its done needs no event: the rank thread saves a
 * cudaEventRecord per layer, and the completion thread spins on the word,
 * not in the driver, where its polling contended with the rank threads'
 * launches and UCX's cuda_ipc progress (launch_probe.cu: 6.8 -> 4.7 us per
 * layer and rank on H200s).  A failed stream never writes the word, so
 * the wait asks cudaStreamQuery every 100 us.  DUET_CUDA_LAYER_DONE=event
 * keeps events for packs too (the A/B of tests/gpu/run_packed.sh).
 *
 * Contracts kept (engine/backend.h): done runs once per successful call,
 * on this thread (not the rank's), after the event, so after the layer's
 * work; dones of a rank run in the order they were queued.  kv_export_sync
 * returns once every done queued so far has returned (queued vs finished
 * counters and a condition variable).  A failed event (the stream's work
 * failed: a sticky device error) is what a host function in a failed
 * stream did before: its done does not run (the layer's bytes are not
 * there: its puts are never posted and the send fails "ended ... after N
 * of M layers"), and the next kv_export_sync returns the error, which
 * fails the batch. */
#include "engine/cuda/cuda_internal.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

static inline void duet__relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *duet__done_main(void *p)
{
    duet_backend_rank_t *r = p;
    duet__cuda_done_queue_t *q = &r->dq;

    if (cudaSetDevice(r->device) != cudaSuccess) {
        /* the events still complete; cudaEventSynchronize does not need
         * the device to be current */
        DUET_LOG_WARN("cuda rank %d: completion thread: cudaSetDevice: %s", r->rank,
                      cudaGetErrorString(cudaGetLastError()));
    }
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->head == NULL && !q->stop)
            pthread_cond_wait(&q->work, &q->mu);
        if (q->head == NULL)
            break; /* stopping, and drained */
        /* only this thread removes nodes: head stays valid unlocked */
        duet__cuda_done_node_t *n = q->head;
        pthread_mutex_unlock(&q->mu);
        cudaError_t e =
            n->seq != 0 ? duet__cuda_signal_wait(r, n->seq) : cudaEventSynchronize(n->ev);
        if (e == cudaSuccess) {
            n->done(n->arg);
        } else {
            (void)cudaGetLastError();
            DUET_LOG_WARN("cuda rank %d: layer %d's copy-stream work failed (%s): its done "
                          "does not run",
                          r->rank, n->layer, cudaGetErrorString(e));
        }
        pthread_mutex_lock(&q->mu);
        if (e != cudaSuccess && q->err == cudaSuccess) {
            q->err = e;
            q->err_layer = n->layer;
        }
        q->head = n->next;
        if (q->head == NULL)
            q->tail = NULL;
        n->next = q->free;
        q->free = n;
        q->finished++;
        pthread_cond_broadcast(&q->drained);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* The queue's lock and thread, on first use (rank thread). */
static duet_status_t duet__done_start(duet_backend_rank_t *r)
{
    duet__cuda_done_queue_t *q = &r->dq;
    int rc;

    if (q->started)
        return DUET_OK;
    if ((rc = pthread_mutex_init(&q->mu, NULL)) != 0)
        goto err;
    if ((rc = pthread_cond_init(&q->work, NULL)) != 0)
        goto err_mu;
    if ((rc = pthread_cond_init(&q->drained, NULL)) != 0)
        goto err_work;
    if ((rc = pthread_create(&q->thread, NULL, duet__done_main, r)) != 0)
        goto err_drained;
    q->started = true;
    return DUET_OK;

err_drained:
    pthread_cond_destroy(&q->drained);
err_work:
    pthread_cond_destroy(&q->work);
err_mu:
    pthread_mutex_destroy(&q->mu);
err:
    return duet_error(DUET_ERR_EXHAUSTED, "cuda rank %d: completion thread: %s", r->rank,
                      strerror(rc));
}

/* A node from the free list, or a new one with its event. */
static duet_status_t duet__node_get(duet_backend_rank_t *r, duet__cuda_done_node_t **n_p)
{
    duet__cuda_done_queue_t *q = &r->dq;
    duet__cuda_done_node_t *n;
    duet_status_t st;
    cudaError_t e;

    if ((st = duet__done_start(r)) != DUET_OK)
        return st;
    pthread_mutex_lock(&q->mu);
    n = q->free;
    if (n != NULL)
        q->free = n->next;
    pthread_mutex_unlock(&q->mu);
    if (n == NULL) {
        /* the pool grows to the most dones in flight, then stays */
        if ((n = DUET_NEW(duet__cuda_done_node_t)) == NULL)
            return duet_error(DUET_ERR_NO_MEMORY, "cuda rank %d: no memory", r->rank);
        if ((e = cudaEventCreateWithFlags(&n->ev, cudaEventDisableTiming)) != cudaSuccess) {
            duet_free(n);
            return duet__cuda_check(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
        }
    }
    *n_p = n;
    return DUET_OK;
}

static void duet__node_put(duet_backend_rank_t *r, duet__cuda_done_node_t *n)
{
    duet__cuda_done_queue_t *q = &r->dq;
    pthread_mutex_lock(&q->mu);
    n->next = q->free;
    q->free = n;
    pthread_mutex_unlock(&q->mu);
}

static void duet__node_queue(duet_backend_rank_t *r, duet__cuda_done_node_t *n, uint64_t seq,
                             int layer, void (*done)(void *arg), void *arg)
{
    duet__cuda_done_queue_t *q = &r->dq;
    n->seq = seq;
    n->done = done;
    n->arg = arg;
    n->layer = layer;
    n->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail != NULL)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    q->queued++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
}

duet_status_t duet__cuda_launch_done(duet_backend_rank_t *r, cudaStream_t s, int layer,
                                     void (*done)(void *arg), void *arg)
{
    duet__cuda_done_node_t *n;
    duet_status_t st;
    cudaError_t e;

    if ((st = duet__node_get(r, &n)) != DUET_OK)
        return st;
    if ((e = cudaEventRecord(n->ev, s)) != cudaSuccess) {
        duet__node_put(r, n);
        return duet__cuda_check(e, "cudaEventRecord (layer done)", __FILE__, __LINE__);
    }
    duet__node_queue(r, n, 0, layer, done, arg);
    return DUET_OK;
}

duet_status_t duet__cuda_queue_done(duet_backend_rank_t *r, uint64_t seq, int layer,
                                    void (*done)(void *arg), void *arg)
{
    duet__cuda_done_node_t *n;
    duet_status_t st;

    if (seq == 0)
        return duet_error(DUET_ERR_INTERNAL, "cuda rank %d: a done without a signal", r->rank);
    if ((st = duet__node_get(r, &n)) != DUET_OK)
        return st;
    duet__node_queue(r, n, seq, layer, done, arg);
    return DUET_OK;
}

bool duet__cuda_signal_next(duet_backend_rank_t *r, duet__cuda_signal_t *sig)
{
    duet__cuda_done_queue_t *q = &r->dq;

    if (q->sig_mode == DUET__SIG_UNSET) {
        const char *v = getenv("DUET_CUDA_LAYER_DONE");
        q->sig_mode = v != NULL && strcmp(v, "event") == 0 ? DUET__SIG_OFF : DUET__SIG_ON;
        if (q->sig_mode == DUET__SIG_ON &&
            (cudaHostAlloc((void **)&q->sig_word, sizeof(*q->sig_word),
                           cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
             cudaHostGetDevicePointer((void **)&q->sig_word_dev, q->sig_word, 0) != cudaSuccess ||
             cudaMalloc((void **)&q->sig_ctr, sizeof(*q->sig_ctr)) != cudaSuccess ||
             cudaMemset(q->sig_ctr, 0, sizeof(*q->sig_ctr)) != cudaSuccess)) {
            DUET_LOG_WARN("cuda rank %d: no launch signals (%s): layer dones wait on events",
                          r->rank, cudaGetErrorString(cudaGetLastError()));
            q->sig_mode = DUET__SIG_OFF;
        }
        if (q->sig_mode == DUET__SIG_ON)
            *q->sig_word = 0;
        DUET_LOG_DEBUG("cuda rank %d: layer dones: %s", r->rank,
                       q->sig_mode == DUET__SIG_ON ? "launch signals" : "events");
    }
    if (q->sig_mode != DUET__SIG_ON)
        return false;
    *sig = (duet__cuda_signal_t){q->sig_ctr, q->sig_word_dev, (unsigned long long)++q->sig_seq};
    return true;
}

cudaError_t duet__cuda_signal_wait(duet_backend_rank_t *r, uint64_t seq)
{
    const unsigned long long *w = r->dq.sig_word;
    int64_t t_query = duet_now_ns() + 100000;

    for (;;) {
        if (__atomic_load_n(w, __ATOMIC_ACQUIRE) >= seq)
            return cudaSuccess;
        /* a failed stream never writes the word: ask it now and then (a
         * driver call, which the spin on the word avoids otherwise) */
        if (duet_now_ns() >= t_query) {
            cudaError_t e = cudaStreamQuery(r->copy_stream);
            if (e == cudaSuccess)
                return __atomic_load_n(w, __ATOMIC_ACQUIRE) >= seq ? cudaSuccess
                                                                   : cudaErrorLaunchFailure;
            if (e != cudaErrorNotReady)
                return e;
            t_query = duet_now_ns() + 100000;
        }
        duet__relax();
    }
}

duet_status_t duet__cuda_done_drain(duet_backend_rank_t *r)
{
    duet__cuda_done_queue_t *q = &r->dq;
    cudaError_t e;
    int layer;

    if (!q->started)
        return DUET_OK;
    pthread_mutex_lock(&q->mu);
    uint64_t want = q->queued;
    while (q->finished < want)
        pthread_cond_wait(&q->drained, &q->mu);
    e = q->err;
    layer = q->err_layer;
    q->err = cudaSuccess;
    pthread_mutex_unlock(&q->mu);
    if (e != cudaSuccess)
        return duet_error(e == cudaErrorMemoryAllocation ? DUET_ERR_NO_MEMORY : DUET_ERR_INTERNAL,
                          "cuda rank %d: layer %d's copy-stream work failed, its done did not "
                          "run: %s (%s)",
                          r->rank, layer, cudaGetErrorString(e), cudaGetErrorName(e));
    return DUET_OK;
}

void duet__cuda_done_stop(duet_backend_rank_t *r)
{
    duet__cuda_done_queue_t *q = &r->dq;

    if (!q->started) {
        cudaFreeHost(q->sig_word);
        cudaFree(q->sig_ctr);
        memset(q, 0, sizeof(*q));
        return;
    }
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL); /* it drains the queue first */
    if (q->err != cudaSuccess)
        DUET_LOG_WARN("cuda rank %d: layer %d's copy-stream work failed before shutdown: %s",
                      r->rank, q->err_layer, cudaGetErrorString(q->err));
    while (q->free != NULL) {
        duet__cuda_done_node_t *n = q->free;
        q->free = n->next;
        cudaEventDestroy(n->ev);
        duet_free(n);
    }
    cudaFreeHost(q->sig_word);
    cudaFree(q->sig_ctr);
    pthread_cond_destroy(&q->drained);
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->mu);
    memset(q, 0, sizeof(*q));
}
