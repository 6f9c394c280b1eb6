/* What one layer's "pack, then tell the host" costs on the host, with one
 * launching thread per rank as in the daemons (issue 12: at 1024 tokens
 * the per-layer launches, not the bytes, bound the packed transfer).
 *
 * Each rank (GPU r % n_gpus) has a launcher thread that, for 32 layers,
 * queues a copy kernel of --bytes on its stream and marks the layer's end,
 * and a waiter thread that waits for each layer in order (as
 * engine/cuda/kv_done.c's completion thread does).  Ways to mark and wait:
 *
 *   ev-spin   cudaEventRecord; waiter cudaEventSynchronize (the default
 *             scheduling: spins) -- what kv_done.c does today
 *   ev-block  events made with cudaEventBlockingSync (the waiter sleeps)
 *   ev-query  cudaEventRecord; waiter polls cudaEventQuery, sched_yield
 *   flag      the kernel's last block writes the layer's number into a
 *             host-mapped word after a system fence; the waiter polls
 *             that word (no CUDA call at all)
 *   none      cudaEventRecord, no waiter (the launches alone)
 *
 * Prints per (mode, ranks): the launchers' time to queue all layers
 * (max over ranks) and the time until the last layer was seen done, both
 * from one start barrier, medians of --rounds.  Thread start-up is
 * printed separately (pthread_create + cudaSetDevice).
 *
 *   nvcc -O2 -arch=sm_90 -o launch_probe tests/gpu/launch_probe.cu -lpthread
 *   ./launch_probe [--bytes 4194304] [--rounds 21] */
#include <cuda_runtime.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS   32
#define MAX_RANK 8

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { M_EV_SPIN, M_EV_BLOCK, M_EV_QUERY, M_FLAG, M_NONE, M_COUNT };
static const char *mode_name[M_COUNT] = {"ev-spin", "ev-block", "ev-query", "flag", "none"};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static __global__ void copy_kernel(uint4 *d, const uint4 *s, size_t n, unsigned *ctr,
                                   volatile unsigned long long *word, unsigned long long seq)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = s[i];
    if (word == NULL)
        return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(ctr, 1u) == gridDim.x - 1) {
            *ctr = 0;
            __threadfence_system();
            *word = seq;
        }
    }
}

typedef struct {
    int rank, dev, mode;
    size_t n16;
    cudaStream_t s;
    uint4 *src, *dst;
    unsigned *ctr;
    unsigned long long *word_h, *word_d;
    cudaEvent_t ev[LAYERS];
    volatile int recorded;
    unsigned long long seq0;
    int64_t t_launched, t_done;
    pthread_barrier_t *bar;
} rank_t;

static void *launcher(void *p)
{
    rank_t *k = (rank_t *)p;
    CK(cudaSetDevice(k->dev));
    pthread_barrier_wait(k->bar);
    for (int l = 0; l < LAYERS; l++) {
        bool flag = k->mode == M_FLAG;
        copy_kernel<<<132, 256, 0, k->s>>>(k->dst, k->src, k->n16, flag ? k->ctr : NULL,
                                           flag ? k->word_d : NULL, k->seq0 + (unsigned long long)l);
        if (!flag)
            CK(cudaEventRecord(k->ev[l], k->s));
        __atomic_store_n(&k->recorded, l + 1, __ATOMIC_RELEASE);
    }
    k->t_launched = now_ns();
    return NULL;
}

static void *waiter(void *p)
{
    rank_t *k = (rank_t *)p;
    CK(cudaSetDevice(k->dev));
    pthread_barrier_wait(k->bar);
    for (int l = 0; l < LAYERS; l++) {
        while (__atomic_load_n(&k->recorded, __ATOMIC_ACQUIRE) <= l)
            ;
        switch (k->mode) {
        case M_EV_SPIN:
        case M_EV_BLOCK:
            CK(cudaEventSynchronize(k->ev[l]));
            break;
        case M_EV_QUERY:
            for (;;) {
                cudaError_t e = cudaEventQuery(k->ev[l]);
                if (e == cudaSuccess)
                    break;
                if (e != cudaErrorNotReady)
                    CK(e);
                sched_yield();
            }
            break;
        case M_FLAG:
            while (*(volatile unsigned long long *)k->word_h < k->seq0 + (unsigned long long)l)
                ;
            break;
        }
    }
    k->t_done = now_ns();
    return NULL;
}

static void *thread_start(void *p)
{
    CK(cudaSetDevice(0));
    *(int64_t *)p = now_ns();
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    size_t bytes = 4u << 20;
    int rounds = 21, n_gpus = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--bytes") == 0)
            bytes = strtoull(argv[i + 1], NULL, 0);
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
    }
    CK(cudaGetDeviceCount(&n_gpus));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# launch_probe: %d GPU(s), %s; %d layers, %zu bytes copied per layer, median of %d\n",
           n_gpus, prop.name, LAYERS, bytes, rounds);
    printf("# %-9s %5s %11s %11s %14s\n", "mode", "ranks", "launch_us", "done_us",
           "launch/layer_us");
    static rank_t rk[MAX_RANK];
    for (int r = 0; r < MAX_RANK; r++) {
        rank_t *k = &rk[r];
        k->rank = r;
        k->dev = r % n_gpus;
        k->n16 = bytes / 16;
        CK(cudaSetDevice(k->dev));
        CK(cudaSetDeviceFlags(cudaDeviceMapHost));
        CK(cudaStreamCreateWithFlags(&k->s, cudaStreamNonBlocking));
        CK(cudaMalloc(&k->src, bytes));
        CK(cudaMalloc(&k->dst, bytes));
        CK(cudaMalloc(&k->ctr, sizeof(unsigned)));
        CK(cudaMemset(k->ctr, 0, sizeof(unsigned)));
        CK(cudaHostAlloc(&k->word_h, sizeof(unsigned long long), cudaHostAllocMapped));
        *k->word_h = 0;
        CK(cudaHostGetDevicePointer((void **)&k->word_d, k->word_h, 0));
    }
    unsigned long long seq = 1;
    int ranks_list[] = {1, 2, 4};
    for (int m = 0; m < M_COUNT; m++)
        for (int ri = 0; ri < 3; ri++) {
            int R = ranks_list[ri];
            double *lt = (double *)malloc(sizeof(double) * rounds);
            double *dt = (double *)malloc(sizeof(double) * rounds);
            for (int r = 0; r < R; r++) {
                CK(cudaSetDevice(rk[r].dev));
                for (int l = 0; l < LAYERS; l++) {
                    if (rk[r].ev[l] != NULL)
                        CK(cudaEventDestroy(rk[r].ev[l]));
                    CK(cudaEventCreateWithFlags(&rk[r].ev[l],
                                                cudaEventDisableTiming |
                                                    (m == M_EV_BLOCK ? cudaEventBlockingSync : 0)));
                }
            }
            for (int it = 0; it < rounds; it++) {
                pthread_barrier_t bar;
                int waiters = m == M_NONE ? 0 : R;
                pthread_barrier_init(&bar, NULL, (unsigned)(R + waiters + 1));
                pthread_t th[2 * MAX_RANK];
                for (int r = 0; r < R; r++) {
                    rank_t *k = &rk[r];
                    k->mode = m;
                    k->bar = &bar;
                    k->recorded = 0;
                    k->seq0 = seq;
                    seq += LAYERS;
                    pthread_create(&th[r], NULL, launcher, k);
                    if (waiters)
                        pthread_create(&th[R + r], NULL, waiter, k);
                }
                pthread_barrier_wait(&bar);
                int64_t t0 = now_ns();
                for (int r = 0; r < R + waiters; r++)
                    pthread_join(th[r], NULL);
                int64_t tl = 0, td = 0;
                for (int r = 0; r < R; r++) {
                    CK(cudaSetDevice(rk[r].dev));
                    CK(cudaStreamSynchronize(rk[r].s));
                    tl = rk[r].t_launched - t0 > tl ? rk[r].t_launched - t0 : tl;
                    td = rk[r].t_done - t0 > td ? rk[r].t_done - t0 : td;
                }
                lt[it] = (double)tl / 1e3;
                dt[it] = waiters ? (double)td / 1e3 : 0.0;
                pthread_barrier_destroy(&bar);
            }
            qsort(lt, (size_t)rounds, sizeof(double), cmp);
            qsort(dt, (size_t)rounds, sizeof(double), cmp);
            printf("%-11s %5d %11.1f %11.1f %14.2f\n", mode_name[m], R, lt[rounds / 2],
                   dt[rounds / 2], lt[rounds / 2] / LAYERS);
            free(lt);
            free(dt);
        }
    /* thread start-up: pthread_create -> cudaSetDevice returned */
    double st[21];
    for (int it = 0; it < 21; it++) {
        int64_t t0 = now_ns(), t1 = 0;
        pthread_t t;
        pthread_create(&t, NULL, thread_start, &t1);
        pthread_join(t, NULL);
        st[it] = (double)(t1 - t0) / 1e3;
    }
    qsort(st, 21, sizeof(double), cmp);
    printf("# thread start (pthread_create -> cudaSetDevice returned): median %.1f us\n", st[10]);
    return 0;
}
