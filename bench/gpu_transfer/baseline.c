/* bench_gpu_transfer: the copies that bound a transfer (gpu_transfer.h). */
#include "bench/gpu_transfer/gpu_transfer.h"

/* ---- baselines ---------------------------------------------------------------------------- */

enum { C_D2H, C_H2D, C_PEER, C_D2D };

/* Median GB/s of `rounds` copies of `bytes` (after one warm-up). */
static int time_copy(const bench_t *b, int what, void *dst, const void *src, size_t bytes,
                     cudaStream_t s, double *gbps_p)
{
    double t[G_MAX_ROUNDS + 1];
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (b->cuda) {
        G_CUDA(cudaEventCreate(&e0));
        G_CUDA(cudaEventCreate(&e1));
    }
    for (int i = 0; i <= b->rounds; i++) {
        int64_t h0 = duet_now_ns();
        float ms = 0;
        if (!b->cuda) {
            memcpy(dst, src, bytes);
            t[i] = (double)(duet_now_ns() - h0) / 1e9;
            continue;
        }
        G_CUDA(cudaEventRecord(e0, s));
        if (what == C_PEER)
            G_CUDA(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, s));
        else
            G_CUDA(cudaMemcpyAsync(dst, src, bytes,
                                   what == C_D2H   ? cudaMemcpyDeviceToHost
                                   : what == C_H2D ? cudaMemcpyHostToDevice
                                                   : cudaMemcpyDeviceToDevice,
                                   s));
        G_CUDA(cudaEventRecord(e1, s));
        G_CUDA(cudaEventSynchronize(e1));
        G_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        t[i] = ms / 1e3;
    }
    if (b->cuda) {
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    *gbps_p = (double)bytes / median(t + 1, b->rounds) / 1e9;
    return 0;
}

static int describe_gpus(base_t *r)
{
    int drv = 0, rt = 0;
    G_CUDA(cudaGetDeviceCount(&r->n_dev));
    G_CUDA(cudaDriverGetVersion(&drv));
    G_CUDA(cudaRuntimeGetVersion(&rt));
    printf("# CUDA driver %d.%d, runtime %d.%d, %d GPU(s)\n", drv / 1000, drv % 1000 / 10,
           rt / 1000, rt % 1000 / 10, r->n_dev);
    for (int d = 0; d < r->n_dev; d++) {
        struct cudaDeviceProp p;
        char bus[32] = "";
        G_CUDA(cudaGetDeviceProperties(&p, d));
        cudaDeviceGetPCIBusId(bus, sizeof(bus), d);
        printf("# GPU %d: %s, %.1f GiB, PCI %s\n", d, p.name, p.totalGlobalMem / 1073741824.0, bus);
    }
    if (r->n_dev >= 2) {
        int a = 0, c = 0, perf = -1;
        G_CUDA(cudaDeviceCanAccessPeer(&a, 0, 1));
        G_CUDA(cudaDeviceCanAccessPeer(&c, 1, 0));
        cudaDeviceGetP2PAttribute(&perf, cudaDevP2PAttrPerformanceRank, 0, 1);
        r->p2p = a && c;
        if (r->p2p) {
            G_CUDA(cudaSetDevice(0));
            G_CUDA(cudaDeviceEnablePeerAccess(1, 0));
            G_CUDA(cudaSetDevice(1));
            G_CUDA(cudaDeviceEnablePeerAccess(0, 0));
        }
        printf("# GPU 0 <-> 1 peer access %s (performance rank %d)\n",
               r->p2p ? "yes, enabled" : "NO (cudaMemcpyPeer staged through the host)", perf);
    }
    return 0;
}

/* --mirror device: can this UCX (with b->tls) move CUDA memory? */
static int probe_ucx_cuda(const bench_t *b, int *yes_p)
{
    duet_xfer_config_t cfg;
    duet_xfer_t *x;
    memset(&cfg, 0, sizeof(cfg));
    cfg.role = DUET_XFER_PREFILL;
    cfg.tp = 1;
    cfg.kv_heads = G_HEADS;
    cfg.dtype = DUET_DTYPE_BF16;
    cfg.layout = (duet_kv_layout_t){.n_layers = G_LAYERS,
                                    .n_pages = 1,
                                    .page_size = G_PAGE,
                                    .n_kv_heads = G_HEADS,
                                    .head_dim = G_HEAD_DIM,
                                    .elem_size = G_ELEM};
    cfg.model_fingerprint = 1;
    cfg.tls = b->tls;
    DUET_TESTKIT_OK(duet_xfer_create(&cfg, &x));
    *yes_p = duet_xfer_supports_cuda_memory(x);
    duet_xfer_destroy(x);
    return 0;
}

int bench_baseline(void *arg)
{
    const bench_t *b = arg;
    base_t r;
    size_t max = (size_t)max_pages(b) * G_PAGE * G_TOKEN_BYTES;
    void *host = NULL, *d0 = NULL, *d0b = NULL, *d1 = NULL;
    cudaStream_t s = NULL;
    memset(&r, 0, sizeof(r));
    if (b->device) {
        if (probe_ucx_cuda(b, &r.ucx_cuda))
            return 1;
        if (!r.ucx_cuda) {
            /* nothing to measure: say so to the parent */
            DUET_TESTKIT_CHECK(duet_testkit_chan_send(b->fd_d, &r, sizeof(r)) == 0, "channel");
            return 0;
        }
    }
    if (b->cuda) {
        if (describe_gpus(&r))
            return 1;
        DUET_TESTKIT_CHECK(r.n_dev >= 1, "no GPU (--no-cuda runs without one)");
        G_CUDA(cudaSetDevice(0));
        G_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        G_CUDA(cudaMallocHost(&host, max));
        G_CUDA(cudaMalloc(&d0, max));
        G_CUDA(cudaMalloc(&d0b, max));
        memset(host, 0x3c, max);
        G_CUDA(cudaMemset(d0, 0x3c, max));
        if (r.n_dev >= 2) {
            G_CUDA(cudaSetDevice(1));
            G_CUDA(cudaMalloc(&d1, max));
            G_CUDA(cudaSetDevice(0));
        }
    } else {
        r.n_dev = 2; /* both variants run on host memory */
        printf("# --no-cuda: host memory for device memory, memcpy for every copy\n");
        host = duet_aligned_alloc(4096, max);
        d0 = duet_aligned_alloc(4096, max);
        d0b = duet_aligned_alloc(4096, max);
        d1 = duet_aligned_alloc(4096, max);
        DUET_TESTKIT_CHECK(host && d0 && d0b && d1, "out of memory");
        memset(host, 0x3c, max);
        memset(d0, 0x3c, max);
        memset(d0b, 0, max);
        memset(d1, 0, max);
    }
    printf("# copies, one of each size, median of %d (GB/s): pinned host<->GPU 0, GPU 0 -> GPU 1 "
           "(cudaMemcpyPeer), GPU 0 -> GPU 0\n",
           b->rounds);
    printf("%-7s %6s %7s %9s %9s %9s %9s\n", "# copy", "tokens", "MiB", "d2h", "h2d", "peer",
           "d2d");
    for (int i = 0; i < b->n_tokens; i++) {
        size_t bytes = (size_t)((b->tokens[i] + G_PAGE - 1) / G_PAGE) * G_PAGE * G_TOKEN_BYTES;
        if (time_copy(b, C_D2H, host, d0, bytes, s, &r.d2h[i]) ||
            time_copy(b, C_H2D, d0b, host, bytes, s, &r.h2d[i]) ||
            time_copy(b, C_D2D, d0b, d0, bytes, s, &r.d2d[i]) ||
            (d1 != NULL && time_copy(b, C_PEER, d1, d0, bytes, s, &r.peer[i])))
            return 1;
        printf("%-7s %6d %7.0f %9.2f %9.2f %9.2f %9.2f\n", "copy", b->tokens[i], bytes / 1048576.0,
               r.d2h[i], r.h2d[i], r.peer[i], r.d2d[i]);
    }
    fflush(stdout);
    if (b->cuda) {
        cudaFreeHost(host);
        cudaFree(d0);
        cudaFree(d0b);
        cudaFree(d1);
        cudaStreamDestroy(s);
    } else {
        duet_aligned_free(host);
        duet_aligned_free(d0);
        duet_aligned_free(d0b);
        duet_aligned_free(d1);
    }
    DUET_TESTKIT_CHECK(duet_testkit_chan_send(b->fd_d, &r, sizeof(r)) == 0, "channel");
    return 0;
}
