/* bench_gpu_transfer: one process's ranks (gpu_transfer.h). */
#include "bench/gpu_transfer/gpu_transfer.h"

/* ---- copies: CUDA streams, or memcpy with --no-cuda ------------------------------ */

int gs_copy(const gstream_t *s, void *dst, const void *src, size_t n, bool to_host)
{
    if (!s->cuda) {
        memcpy(dst, src, n);
        return 0;
    }
    G_CUDA(cudaSetDevice(s->dev));
    G_CUDA(cudaMemcpyAsync(dst, src, n, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                           s->s));
    return 0;
}

static int gs_memset(const gstream_t *s, void *dev, int byte, size_t n)
{
    if (!s->cuda) {
        memset(dev, byte, n);
        return 0;
    }
    G_CUDA(cudaSetDevice(s->dev));
    G_CUDA(cudaMemsetAsync(dev, byte, n, s->s));
    return 0;
}

/* fn runs once the work queued before it landed (at once without CUDA). */
int gs_host_fn(const gstream_t *s, cudaHostFn_t fn, void *arg)
{
    if (!s->cuda) {
        fn(arg);
        return 0;
    }
    G_CUDA(cudaSetDevice(s->dev));
    G_CUDA(cudaLaunchHostFunc(s->s, fn, arg));
    return 0;
}

int gs_sync(const gstream_t *s)
{
    if (s->cuda) {
        G_CUDA(cudaSetDevice(s->dev));
        G_CUDA(cudaStreamSynchronize(s->s));
    }
    return 0;
}

/* ---- KV contents ------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Pages [0, n_pages) of every (layer, K|V) plane in a buffer whose planes
 * are plane_bytes apart: one 64-bit word per 4 elements, from (layer, K|V,
 * global head, token position, word). */
static void fill_pattern(const duet_kv_layout_t *l, unsigned char *base, size_t plane_bytes,
                         int head0, int n_pages)
{
    int words = l->head_dim * l->elem_size / 8;
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int page = 0; page < n_pages; page++)
                for (int h = 0; h < l->n_kv_heads; h++) {
                    uint64_t *w = (uint64_t *)(base + plane_bytes * (size_t)(layer * 2 + kv) +
                                               duet_kv_page_bytes(l) * (size_t)page +
                                               duet_kv_head_bytes(l) * (size_t)h);
                    for (int t = 0; t < l->page_size; t++) {
                        uint64_t pos = (uint64_t)page * (uint64_t)l->page_size + (uint64_t)t;
                        uint64_t key = ((uint64_t)(layer * 2 + kv) << 48) ^
                                       ((uint64_t)(head0 + h) << 40) ^ (pos << 8);
                        for (int i = 0; i < words; i++)
                            *w++ = mix64(key ^ (uint64_t)i);
                    }
                }
}

/* ---- one process's ranks ------------------------------------------------------------ */

int max_pages(const bench_t *b)
{
    int m = 0;
    for (int i = 0; i < b->n_tokens; i++)
        m = b->tokens[i] > m ? b->tokens[i] : m;
    return (m + G_PAGE - 1) / G_PAGE;
}

/* Queue the copies of layers [l0, l1) of pages[0..n) between rank r's pool
 * and its mirror; a run of consecutive page ids is one copy. */
int copy_pages(gside_t *g, int r, int l0, int l1, const int32_t *pages, int n, bool to_host)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    for (int layer = l0; layer < l1; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int i = 0; i < n;) {
                int run = 1;
                while (i + run < n && pages[i + run] == pages[i] + run)
                    run++;
                size_t off = duet_kv_offset(l, layer, kv, pages[i], 0);
                unsigned char *d = k->pool + off, *h = g->sd.base[r] + off;
                if (gs_copy(&k->st, to_host ? h : d, to_host ? d : h,
                            (size_t)run * duet_kv_page_bytes(l), to_host))
                    return 1;
                i += run;
            }
    return 0;
}

/* Overwrite pages [0, n) of every plane of rank r's mirror (and, on decode,
 * of its device pool), so data from an earlier round cannot pass.  With
 * --mirror device (no mirror) decode overwrites its device pages and
 * prefill rewrites its source pages from the host pattern, on the device. */
int clear_pages(gside_t *g, int r, int n)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t len = (size_t)n * duet_kv_page_bytes(l);
    for (int p = 0; p < 2 * l->n_layers; p++) {
        size_t off = duet_kv_plane_bytes(l) * (size_t)p;
        if (!g->b->device)
            memset(g->sd.base[r] + off, 0x5a, len);
        if (g->role == DUET_XFER_DECODE && gs_memset(&k->st, k->pool + off, 0xa5, len))
            return 1;
        if (g->role == DUET_XFER_PREFILL && g->b->device &&
            gs_copy(&k->st, k->pool + off, k->src + g->cplane * (size_t)p, len, false))
            return 1;
    }
    /* packed: staging from an earlier round must not pass either (the
     * request's staging: every plane of its n units, from unit 0) */
    if (g->b->packed && gs_memset(&k->st, k->pool + duet_kv_total_bytes(l),
                                  g->role == DUET_XFER_DECODE ? 0x3c : 0xc3,
                                  2u * (size_t)n * duet_xfer_stage_unit_bytes(l)))
        return 1;
    return gs_sync(&k->st);
}

/* Device pool, stream and pinned mirror of rank r (--mirror device: the
 * device pool registered with the transfer engine instead); prefill fills
 * its pool with the pattern, decode builds the expected contents. */
/* duet_xfer_rank_run: make *arg (a device id) current on the calling thread. */
static duet_status_t bind_device(void *arg)
{
    if (cudaSetDevice(*(const int *)arg) != cudaSuccess || cudaFree(NULL) != cudaSuccess)
        return duet_error(DUET_ERR_IO, "cudaSetDevice(%d): %s", *(const int *)arg,
                          cudaGetErrorString(cudaGetLastError()));
    return DUET_OK;
}

/* --checksum on device pools: the transfer's checksum hook, the cuda
 * backend's kv_crc over the rank's pool (node/kv_engine.c installs the
 * same through the engine). */
static duet_status_t crc_hook(void *ctx, const duet_crc32c_range_t *ranges, int n, uint32_t *crc_p)
{
    return duet_backend_cuda.kv_crc(ctx, ranges, n, crc_p);
}

static int rank_start(gside_t *g, int r, int dev)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t cbytes = g->cplane * 2 * (size_t)l->n_layers;
    unsigned char *src = NULL;

    duet_kv_heads_owned(G_HEADS, g->tp, r, &k->head0, &k->n_heads);
    k->st.cuda = g->b->cuda;
    k->st.dev = dev;
    for (int layer = 0; layer < G_LAYERS; layer++)
        k->post[layer] = (gpost_t){g, r, layer};
    if (g->b->cuda) {
        cudaError_t e;
        G_CUDA(cudaSetDevice(dev));
        G_CUDA(cudaStreamCreateWithFlags(&k->st.s, cudaStreamNonBlocking));
        G_CUDA(cudaMalloc((void **)&k->pool, g->pool_bytes));
        if (g->b->device) {
            DUET_TESTKIT_OK(
                duet_xfer_pool_register_device(duet_xfer_rank(g->sd.x, r), k->pool, g->pool_bytes));
            /* UCX's CUDA transports use the progress thread's current
             * context: the rank's GPU (transfer/kv_engine.c does the same) */
            DUET_TESTKIT_OK(
                duet_xfer_rank_run(duet_xfer_rank(g->sd.x, r), bind_device, &k->st.dev));
            if (g->b->checksum) {
                duet_backend_rank_opts_t o = {
                    .rank = r, .tp = g->tp, .threads = 1, .device = dev, .kv_layout = *l};
                DUET_TESTKIT_OK(duet_backend_cuda.rank_create(&o, &k->crc_br));
                duet_backend_cuda.kv_attach(k->crc_br, k->pool);
                duet_xfer_rank_set_checksum(duet_xfer_rank(g->sd.x, r), crc_hook, k->crc_br);
            }
        } else {
            e = cudaHostRegister(g->sd.base[r], g->pool_bytes, cudaHostRegisterPortable);
            k->pinned = e == cudaSuccess;
            if (!k->pinned) {
                (void)cudaGetLastError();
                fprintf(stderr,
                        "# rank %d: mirror not pinned: %s (copies will be staged by the "
                        "driver)\n",
                        r, cudaGetErrorString(e));
            }
        }
    } else {
        k->pool = duet_aligned_alloc(4096, g->pool_bytes);
        DUET_TESTKIT_CHECK(k->pool != NULL, "out of memory");
    }
    if (g->role == DUET_XFER_PREFILL) {
        if (!g->b->cuda) {
            fill_pattern(l, k->pool, duet_kv_plane_bytes(l), k->head0, g->max_pages);
            return 0;
        }
        /* --mirror device keeps the pattern to rewrite the source before every transfer */
        if (g->b->device)
            G_CUDA(cudaMallocHost((void **)&k->src, cbytes));
        src = g->b->device ? k->src : duet_aligned_alloc(4096, cbytes);
        DUET_TESTKIT_CHECK(src != NULL, "out of memory");
        fill_pattern(l, src, g->cplane, k->head0, g->max_pages);
        for (int p = 0; p < 2 * l->n_layers; p++) {
            cudaError_t e =
                cudaMemcpy(k->pool + duet_kv_plane_bytes(l) * (size_t)p,
                           src + g->cplane * (size_t)p, g->cplane, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) {
                if (src != k->src)
                    duet_aligned_free(src);
                G_CUDA(e);
            }
        }
        if (src != k->src)
            duet_aligned_free(src);
        return 0;
    }
    k->ref = duet_aligned_alloc(4096, cbytes);
    DUET_TESTKIT_CHECK(k->ref != NULL, "out of memory");
    fill_pattern(l, k->ref, g->cplane, k->head0, g->max_pages);
    if (g->b->cuda)
        G_CUDA(cudaMallocHost((void **)&k->back, cbytes));
    else
        k->back = duet_aligned_alloc(4096, cbytes);
    DUET_TESTKIT_CHECK(k->back != NULL, "out of memory");
    return 0;
}

/* --mirror device: duet_testkit_side_start without the pools (rank_start registers
 * each rank's device pool once it is allocated), on a UCX that can. */
static int device_side_start(duet_testkit_side_t *sd)
{
    sd->no_pools = 1;
    if (duet_testkit_side_start(sd))
        return 1;
    DUET_TESTKIT_CHECK(duet_xfer_supports_cuda_memory(sd->x),
                       "--mirror device: this UCX build has no CUDA transports (UCX_TLS %s)",
                       sd->tls);
    return 0;
}

int gside_start(gside_t *g, const bench_t *b, duet_xfer_role_t role, int fd)
{
    duet_testkit_side_t *sd = &g->sd;
    const int *devs = role == DUET_XFER_PREFILL ? b->pdev : b->ddev;
    memset(g, 0, sizeof(*g));
    g->b = b;
    g->role = role;
    g->tp = role == DUET_XFER_PREFILL ? b->P : b->D;
    g->max_pages = max_pages(b);
    sd->role = role;
    sd->tp = g->tp;
    sd->remote_tp = role == DUET_XFER_PREFILL ? b->D : b->P;
    sd->kv_heads = G_HEADS;
    sd->layout.n_layers = G_LAYERS;
    sd->layout.page_size = G_PAGE;
    sd->layout.head_dim = G_HEAD_DIM;
    sd->layout.elem_size = G_ELEM;
    /* every rank can hold a whole request: rank 0 also takes the single put */
    sd->layout.n_pages = g->max_pages * (g->tp < G_HEADS ? g->tp : G_HEADS);
    sd->dtype = DUET_DTYPE_BF16;
    sd->fingerprint = 0x11a3a3b8b0000002ULL;
    sd->tls = b->tls;
    sd->registered = b->registered;
    if (b->device ? device_side_start(sd) : duet_testkit_side_start(sd))
        return 1;
    g->pool_bytes = duet_kv_total_bytes(&sd->layout);
    /* packed: a staging arena after the planes (transfer/xfer_pack.h), the
     * request's staging from unit 0 */
    if (b->packed)
        g->pool_bytes += 2u * (size_t)g->max_pages * duet_xfer_stage_unit_bytes(&sd->layout);
    g->cplane = (size_t)g->max_pages * duet_kv_page_bytes(&sd->layout);
    for (int r = 0; r < g->tp; r++)
        if (rank_start(g, r, devs[r]))
            return 1;
    printf("# %-7s ranks on %s %d", role == DUET_XFER_PREFILL ? "prefill" : "decode",
           b->cuda ? "GPUs" : "(host memory)", devs[0]);
    for (int r = 1; r < g->tp; r++)
        printf(",%d", devs[r]);
    if (b->device)
        printf("; pool device (registered with UCX, no mirror: %s); UCX CUDA memory support %s\n",
               duet_xfer_pool_kind(duet_xfer_rank(sd->x, 0)),
               duet_xfer_supports_cuda_memory(sd->x) ? "yes (used)" : "no");
    else
        printf("; mirror %s, pinned %s; UCX CUDA memory support %s\n",
               duet_xfer_pool_kind(duet_xfer_rank(sd->x, 0)),
               !b->cuda          ? "n/a"
               : g->rk[0].pinned ? "yes"
                                 : "NO",
               duet_xfer_supports_cuda_memory(sd->x) ? "yes (unused)" : "no");
    fflush(stdout);
    return duet_testkit_side_connect(sd, fd);
}

/* Unpin the mirrors and unregister the device pools, stop the transfer
 * engine (which unmaps the mirrors and counts our allocations), then free
 * the CUDA memory. */
int gside_stop(gside_t *g)
{
    int rc;
    for (int r = 0; r < g->tp; r++) {
        grank_t *k = &g->rk[r];
        duet_aligned_free(k->ref);
        k->ref = NULL;
        duet_free(k->hlist);
        k->hlist = NULL;
        if (!g->b->cuda) {
            duet_aligned_free(k->pool);
            duet_aligned_free(k->back);
            k->pool = k->back = NULL;
            continue;
        }
        cudaSetDevice(k->st.dev);
        if (k->pinned)
            cudaHostUnregister(g->sd.base[r]);
        if (g->b->device)
            duet_xfer_pool_unregister(duet_xfer_rank(g->sd.x, r)); /* before cudaFree */
        if (k->crc_br != NULL) {
            /* nothing is in flight any more: the hook goes first, then its
             * backend rank (before side_stop counts the blocks still live) */
            duet_xfer_rank_set_checksum(duet_xfer_rank(g->sd.x, r), NULL, NULL);
            duet_backend_cuda.rank_destroy(k->crc_br);
            k->crc_br = NULL;
        }
    }
    rc = duet_testkit_side_stop(&g->sd);
    for (int r = 0; g->b->cuda && r < g->tp; r++) {
        grank_t *k = &g->rk[r];
        cudaSetDevice(k->st.dev);
        cudaFreeHost(k->back);
        cudaFreeHost(k->src);
        cudaFree(k->pool);
        cudaFree(k->dlist);
        for (int l = 0; l < G_LAYERS; l++)
            if (k->ev[l] != NULL)
                cudaEventDestroy(k->ev[l]);
        cudaFreeHost(k->sig_word);
        cudaFree(k->sig_ctr);
        if (k->st.s != NULL)
            cudaStreamDestroy(k->st.s);
    }
    return rc;
}

/* --mirror packed: build rank r's copies that stage (prefill: the runs it
 * sends) or unstage (decode: the runs it receives) pages[0..n) with
 * staging from unit 0, and upload them (before the timed region). */
int upload_list(gside_t *g, int r, const duet_slice_plan_t *plan, const int32_t *pages, int n)
{
    const duet_kv_layout_t *l = &g->sd.layout;
    grank_t *k = &g->rk[r];
    size_t cap = 2u * (size_t)g->max_pages * (size_t)l->n_kv_heads;
    const duet_slice_run_t *runs;
    int n_runs = g->role == DUET_XFER_PREFILL ? duet_slice_plan_src_runs(plan, r, &runs)
                                              : duet_slice_plan_dst_runs(plan, r, &runs);
    DUET_TESTKIT_CHECK((size_t)n * (size_t)duet_xfer_pack_slots(runs, n_runs) <= cap,
                       "rank %d: %d runs overflow the copy list", r, n_runs);
    if (k->hlist == NULL) {
        k->hlist = DUET_NEW_ARRAY(duet_kv_copy_t, cap);
        DUET_TESTKIT_CHECK(k->hlist != NULL, "out of memory");
    }
    int m =
        duet_xfer_pack_copies(l, pages, n, 0, runs, n_runs, g->role == DUET_XFER_DECODE, k->hlist);
    /* cut into the engine's pieces, as kv_copy_host.c does (a page run of
     * all a rank's heads is one long copy) */
    size_t pieces = duet__cuda_kv_copy_pieces(k->hlist, m);
    duet_kv_copy_t *split = DUET_NEW_ARRAY(duet_kv_copy_t, pieces + 1);
    DUET_TESTKIT_CHECK(split != NULL && pieces <= INT_MAX, "out of memory");
    duet__cuda_kv_copy_split(k->hlist, m, split);
    k->n_list = (int)pieces;
    G_CUDA(cudaSetDevice(k->st.dev));
    if (pieces > k->dcap) {
        cudaFree(k->dlist);
        k->dlist = NULL;
        G_CUDA(cudaMalloc((void **)&k->dlist, pieces * sizeof(duet_kv_copy_t)));
        k->dcap = pieces;
    }
    G_CUDA(cudaMemcpy(k->dlist, split, pieces * sizeof(duet_kv_copy_t), cudaMemcpyHostToDevice));
    duet_free(split);
    return 0;
}

/* --mirror packed: queue rank r's copies on planes [plane0, plane0 + n_planes). */
int run_list(gside_t *g, int r, int plane0, int n_planes)
{
    grank_t *k = &g->rk[r];
    G_CUDA(cudaSetDevice(k->st.dev));
    DUET_TESTKIT_OK(duet__cuda_kv_copy(k->st.s, k->pool, duet_kv_plane_bytes(&g->sd.layout), plane0,
                                       n_planes, k->dlist, k->n_list, NULL));
    return 0;
}

int32_t *seq_pages(int n)
{
    int32_t *p = duet_malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; p != NULL && i < n; i++)
        p[i] = i;
    return p;
}
