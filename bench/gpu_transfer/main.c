/* GPU KV transfer benchmark: device-to-device KV transfer between a prefill
 * and a decode process over the staged path the daemons run, next to the
 * copies that bound it, all measured in the same run.
 *
 * Each process keeps, per engine rank, a KV pool in device memory
 * (cudaMalloc) and a pinned host *mirror* of it with the same layout, which
 * is the transfer engine's pool (duet_xfer_pool_alloc + cudaHostRegister,
 * as transfer/kv_engine.c and engine/forward.c set it up).  One request:
 *   prefill  per layer, on each rank's copy stream: cudaMemcpyAsync of the
 *            layer's K and V pages device -> mirror, then cudaLaunchHostFunc
 *            posting that layer's puts (duet_xfer_send_layers); after the
 *            stream drained, duet_xfer_send_end (engine/cuda/kv_mirror.c,
 *            prefill/sched.c)
 *   decode   duet_xfer_recv_wait on every rank, then every layer's pages
 *            mirror -> device, waiting until they landed (decode/sched.c)
 * End to end: from the first device->host copy being issued on prefill to
 * the last host->device copy landed on decode (CLOCK_MONOTONIC, shared by
 * both processes).  Stages: export (last layer landed in the prefill
 * mirror), puts (every decode rank notified), import (copies landed).
 * After every transfer decode reads its destination pages back and compares
 * every byte with the pattern the source was filled with; a mismatch fails
 * the run.  Before every transfer both mirrors and the destination pages are
 * overwritten, so stale data cannot pass.
 *
 * --mirror packed is the device-direct path with packed transfers
 * (transfer/xfer_pack.h), as the daemons run it on GPUs: per layer prefill
 * stages the layer's runs for its receivers in its staging arena (the engine's
 * kv_copy kernel, engine/cuda/kv_copy.cu, on the copy stream) and then posts
 * one put per (run, chunk of released layers); decode unstages every layer into the pages
 * once all senders reported (counted as import).  The puts column is the
 * transport operations of one request, all prefill ranks.
 *
 * --mirror device runs the device-direct path instead: no mirror, each
 * rank's device pool itself is the transfer engine's pool
 * (duet_xfer_pool_register_device; needs a UCX with CUDA transports), so the
 * puts go device pool -> device pool (cuda_ipc).  The pool is filled before
 * the timed region; prefill still posts each layer's puts from a host
 * function on the copy stream, in the same order as the staged path, with
 * no copy before it (export ~0), and decode imports nothing (import 0).
 * Verification reads the destination device pages back as on the staged
 * path; before every transfer prefill rewrites its source pages from the
 * host pattern and decode overwrites its destination pages (device copies
 * and memsets).  --checksum works here too: the GPU computes the CRC32C
 * (the cuda backend's kv_crc as the transfer's checksum hook, as the
 * daemons install it), and --corrupt-put then fails the run with a checksum
 * mismatch (the corruption is an extra put: transfer/xfer.h).
 *
 * Same run, a separate process first: cudaMemcpyPeer GPU 0 -> GPU 1 (peer
 * access enabled when the GPUs allow it), pinned host -> device, device ->
 * host, device -> device on GPU 0, one copy of each request size (median of
 * the rounds).  Per transfer case the host-side put of the same bytes
 * between the two mirrors (one duet_xfer_debug_put + flush, the number
 * bench_transfer reports; with --mirror device between the two device
 * pools) is interleaved with the transfers.
 *
 * KV shape: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, page 16 tokens,
 * bf16: 128 KiB per token); page ids are consecutive on both sides.
 *
 *   bench_gpu_transfer [--plans 1x1,1x2,2x1] [--tokens 512,1024,2048,4096,8192]
 *                      [--variants spread,same] [--rounds 5] [--tls sm,self]
 *                      [--mirror ucx-alloc|registered|device] [--no-cuda]
 *     spread   prefill rank i on GPU i mod n, decode ranks on the last D GPUs
 *              (1x1: 0 -> 1; 1x2: 0 -> 0,1; 2x1: 0,1 -> 1), as
 *              tests/gpu/disagg_gpu.sh places the daemons
 *     same     every rank of both processes on GPU 0
 *     affine   where P != D, each rank of the side with fewer ranks on the
 *              GPU of its first peer (4x2 on 4 GPUs: prefill 0,1,2,3 ->
 *              decode 0,2; 2x4: prefill 0,2 -> decode 0,1,2,3), so part of
 *              every rank's KV stays on its GPU; P == D: as spread
 *     --mirror registered  the mirror from our allocator, registered with
 *              duet_xfer_pool_register (puts are then emulated over active
 *              messages: the decode side progresses them)
 *     --mirror device  no mirror: the device pools are registered with UCX
 *              (see above; default --tls sm,self,cuda_copy,cuda_ipc).  When
 *              this UCX has no CUDA transports it says so and exits 0
 *              without measuring
 *     --no-cuda  host memory stands in for device memory and memcpy for the
 *              copies (runs without a GPU: a self-test of everything else)
 *     --mirror auto  what the daemons run on GPUs (DUET_KV_TRANSFER_PACK=auto):
 *              packed when P != D, the unpacked direct path when P == D
 *              (consecutive pages coalesce: one put per plane already), with
 *              --layer-done event unless told otherwise (the daemons' copy
 *              stream releases layers from a completion thread, kv_done.c)
 *     --layer-done event  release each layer's puts from a waiter thread that
 *              waits for an event recorded after the layer (instead of a
 *              host function on the copy stream, which holds the stream
 *              for a GPU -> host -> GPU round trip per layer)
 *     --layer-done signal  the same, but a pack's layer (packed requests)
 *              is released when the pack kernel's signal reached host
 *              memory (engine/cuda/kv_done.c: what the daemons do); the
 *              waiter spins on that word, not in the driver.  Unpacked
 *              layers keep their event.  The default with --mirror auto.
 *     --corrupt-put N  corrupt what prefill rank 0's N-th put (0 = the
 *              first) delivers (duet_xfer_debug_corrupt_put): the run must
 *              fail -- by the byte verification, and with --checksum by the
 *              receiver's CRC first ("checksum mismatch"); a fault point
 *              (common/fault.h): refused where the build has fault
 *              injection compiled out (DUET_FAULT_INJECTION=OFF)
 *     --progress auto|N|off  packed requests: prefill announces every N
 *              layers it put to a decode rank (progress_layers), and decode
 *              unpacks the layers every sender of a rank announced as they
 *              come, the rest once the transfer completed (what the decode
 *              daemon does, DUET_KV_TRANSFER_PROGRESS); auto (default, the
 *              daemons'): every 8 layers for requests of at least
 *              DUET_XFER_PROGRESS_MIN_BYTES, none below; off: one unpack at
 *              the end.  Either
 *              way decode learns of the end from the expectation's
 *              callback (the daemons' way), not duet_xfer_recv_wait, and
 *              import is from the end to the last unpack landed
 *     --checksum  DUET_XFER_SEND_CRC on every request (transfer.checksum):
 *              the CPU checksums host pools and mirrors, the GPU device
 *              pools; e2e includes it (compare with a run without)
 *
 * CUDA is only initialised in children (fork after CUDA init is not
 * allowed), like UCX. */
#include "bench/gpu_transfer/gpu_transfer.h"

/* ---- main ---------------------------------------------------------------------------------- */

static int parse_ints(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1 << 20)
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return *s ? -1 : n;
}

/* affine: the GPU of rank `me`'s first peer in the plan (`peer_dev`, n_peer
 * ranks) that no earlier rank of its own side (taken[0..me)) holds, else
 * of its first peer; by_decode: `me` is a decode rank and its peers are
 * its senders, else a prefill rank and its peers its receivers. */
static int affine_gpu(const int *peer_dev, int n_peer, const int *taken, int me,
                      const duet_slice_plan_t *plan, bool by_decode)
{
    int first = -1;
    for (int k = 0; k < n_peer; k++) {
        bool peer = by_decode ? duet_slice_plan_sender_mask(plan, me) >> k & 1u
                              : duet_slice_plan_sender_mask(plan, k) >> me & 1u;
        bool free = true;
        if (!peer)
            continue;
        if (first < 0)
            first = peer_dev[k];
        for (int t = 0; t < me; t++)
            free = free && taken[t] != peer_dev[k];
        if (free)
            return peer_dev[k];
    }
    return first;
}

/* spread: prefill rank i on GPU i mod n, decode on the last D GPUs;
 * same: everything on GPU 0;
 * affine: where P != D, the side with more ranks as spread, and each rank of
 * the other on the GPU of its first peer in the plan (P > D: decode rank j
 * on its first sender's GPU; P < D: prefill rank i on its first receiver's),
 * so a share of every rank's KV never crosses a link; where P == D, spread. */
static int place(bench_t *b, int n_dev)
{
    bool same = strcmp(b->variant, "same") == 0;
    bool affine = strcmp(b->variant, "affine") == 0 && b->P != b->D;
    duet_slice_plan_t *plan;
    for (int i = 0; i < b->P; i++)
        b->pdev[i] = same ? 0 : i % n_dev;
    for (int j = 0; j < b->D; j++)
        b->ddev[j] = same ? 0 : (((n_dev - b->D) % n_dev + n_dev) % n_dev + j) % n_dev;
    /* as node/link.c decides it from the Bootstrap reply */
    if (duet_slice_plan_create(b->P, b->D, G_HEADS, &plan) != DUET_OK)
        return 1;
    if (affine && b->P > b->D) {
        for (int j = 0; j < b->D; j++)
            b->ddev[j] = affine_gpu(b->pdev, b->P, b->ddev, j, plan, true);
    } else if (affine) {
        for (int j = 0; j < b->D; j++)
            b->ddev[j] = j % n_dev;
        for (int i = 0; i < b->P; i++)
            b->pdev[i] = affine_gpu(b->ddev, b->D, b->pdev, i, plan, false);
    }
    b->shares_gpu = false;
    for (int j = 0; j < b->D; j++)
        for (int i = 0; i < b->P; i++)
            if ((duet_slice_plan_sender_mask(plan, j) >> i & 1u) && b->pdev[i] == b->ddev[j])
                b->shares_gpu = true;
    duet_slice_plan_destroy(plan);
    return 0;
}

static int run_baseline(bench_t *b)
{
    int fds[2], rc;
    pid_t pid;
    void *msg = NULL;
    uint32_t len = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
        return 1;
    b->fd_d = fds[1];
    pid = duet_testkit_spawn("baseline", bench_baseline, b, &fds[0], 1);
    if (duet_testkit_chan_recv(fds[0], &msg, &len, 300000) == 0 && len == sizeof(b->base))
        memcpy(&b->base, msg, sizeof(b->base));
    else
        len = 0;
    duet_free(msg);
    if (duet_testkit_wait_all(&pid, 1, duet_deadline_in_ms(60000), &rc) != 0 || len == 0) {
        fprintf(stderr, "baseline copies failed (exit %d)\n", rc);
        rc = 1;
    }
    close(fds[0]);
    close(fds[1]);
    return rc;
}

int main(int argc, char **argv)
{
    char plans_buf[128] = "1x1,1x2,2x1", variants_buf[64] = "spread,same";
    const char *pool_desc;
    bench_t b;
    int bad = 0, usage = 0;
    bool done_set = false;
    memset(&b, 0, sizeof(b));
    b.cuda = true;
    b.tls = NULL; /* G_TLS, or G_TLS_DEVICE with --mirror device */
    b.rounds = 5;
    b.corrupt_put = -1;
    b.progress = 8;
    b.progress_auto = true;
    b.n_tokens = parse_ints("512,1024,2048,4096,8192", b.tokens, G_MAX_SIZES);
    for (int i = 1; i < argc && !usage; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--no-cuda") == 0) {
            b.cuda = false;
            continue;
        }
        if (strcmp(argv[i], "--checksum") == 0) {
            b.checksum = true;
            continue;
        }
        if (v == NULL)
            usage = 1;
        else if (strcmp(argv[i], "--plans") == 0)
            snprintf(plans_buf, sizeof(plans_buf), "%s", v);
        else if (strcmp(argv[i], "--variants") == 0)
            snprintf(variants_buf, sizeof(variants_buf), "%s", v);
        else if (strcmp(argv[i], "--tokens") == 0)
            b.n_tokens = parse_ints(v, b.tokens, G_MAX_SIZES);
        else if (strcmp(argv[i], "--rounds") == 0)
            b.rounds = atoi(v);
        else if (strcmp(argv[i], "--corrupt-put") == 0)
            b.corrupt_put = atol(v);
        else if (strcmp(argv[i], "--tls") == 0)
            b.tls = v;
        else if (strcmp(argv[i], "--progress") == 0) {
            b.progress_auto = strcmp(v, "auto") == 0;
            b.progress = b.progress_auto ? 8 : strcmp(v, "off") == 0 ? 0 : atoi(v);
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "ucx-alloc") == 0)
            b.registered = b.device = false;
        else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "registered") == 0) {
            b.registered = true;
            b.device = false;
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "device") == 0) {
            b.registered = false;
            b.device = true;
        } else if (strcmp(argv[i], "--layer-done") == 0 && strcmp(v, "event") == 0) {
            b.event_done = done_set = true;
            b.signal = false;
        } else if (strcmp(argv[i], "--layer-done") == 0 && strcmp(v, "signal") == 0) {
            b.event_done = b.signal = done_set = true;
        } else if (strcmp(argv[i], "--layer-done") == 0 && strcmp(v, "hostfn") == 0) {
            b.event_done = false;
            done_set = true;
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "packed") == 0) {
            b.registered = false;
            b.device = b.packed = true;
        } else if (strcmp(argv[i], "--mirror") == 0 && strcmp(v, "auto") == 0) {
            b.registered = false;
            b.device = b.auto_pack = true;
            if (!done_set)
                b.event_done = b.signal = true;
        } else
            usage = 1;
        i++;
    }
    if (!usage && b.event_done && !b.cuda) {
        fprintf(stderr, "--layer-done event needs CUDA streams: not with --no-cuda\n");
        usage = 1;
    }
    if (!usage && b.device && !b.cuda) {
        fprintf(stderr, "--mirror device needs CUDA device memory: not with --no-cuda\n");
        usage = 1;
    }
    if (usage || b.n_tokens <= 0 || b.rounds < 1 || b.rounds > G_MAX_ROUNDS || b.progress < 0 ||
        b.progress > G_LAYERS) {
        fprintf(stderr,
                "usage: %s [--plans 1x1,1x2,2x1] [--tokens 512,...,8192] [--variants spread,same] "
                "[--rounds 5] [--tls sm,self] [--mirror ucx-alloc|registered|device|packed|auto] "
                "[--layer-done hostfn|event|signal] [--no-cuda] "
                "[--corrupt-put N] [--checksum] [--progress auto|N|off]\n",
                argv[0]);
        return 2;
    }
    if (b.tls == NULL)
        b.tls = b.device ? G_TLS_DEVICE : G_TLS;
    pool_desc = b.device       ? "pool device (registered with UCX, no mirror)"
                : b.registered ? "mirror registered"
                               : "mirror ucx-alloc";
    duet_log_set_level(DUET_LOG_LEVEL_ERROR);
    duet_log_init_from_env();
    signal(SIGPIPE, SIG_IGN);
    printf("# Llama-3-8B KV (32 layers, 8 KV heads, head_dim 128, page 16, bf16, 128 KiB/token); "
           "UCX_TLS %s; %d CPUs; %s; checksums %s\n",
           b.tls, duet_cpu_count(), pool_desc,
           !b.checksum ? "off"
           : b.device  ? "on (CRC32C on the GPU: kv_crc)"
                       : "on (CRC32C on the CPU)");
    if (run_baseline(&b))
        return 1;
    if (b.device && !b.base.ucx_cuda) {
        printf("# --mirror device: this UCX build has no CUDA transports (UCX_TLS %s): "
               "nothing measured\n",
               b.tls);
        return 0;
    }
    if (b.device)
        printf("# device-direct: e2e: first layer's host function queued on prefill (no export "
               "copy) -> every decode rank notified (no import copy); export: the host functions "
               "ran, import 0; medians of %d after a warm-up;\n"
               "# put: one put of the same bytes device pool -> device pool + flush; model: put, "
               "the path with nothing but its puts;\n",
               b.rounds);
    else
        printf("# e2e: first device->host copy issued on prefill -> last host->device copy landed "
               "on decode; export/puts/import: the stages in turn; medians of %d after a warm-up;\n"
               "# put: one host put of the same bytes mirror -> mirror + flush; model: "
               "1/(1/min(d2h, put) + 1/h2d), the staged path with perfect overlap;\n",
               b.rounds);
    printf("# ref: cudaMemcpyPeer GPU 0 -> 1 (spread, affine) or device -> device on GPU 0 (same), "
           "same size; every destination byte verified after every transfer; launch: when the "
           "last prefill rank had queued its layers (--layer-done event)\n");
    if (b.packed || b.auto_pack) {
        if (b.progress > 0)
            printf("# packed: progress every %d layers%s, decode unpacks what landed as it comes; "
                   "import: the end -> the last unpack landed\n",
                   b.progress,
                   b.progress_auto ? " (auto: from 512 MiB of KV where a decode rank shares a "
                                     "sender's GPU)"
                                   : "");
        else
            printf("# packed: progress off, decode unpacks every layer after the end\n");
    }
    printf("%-7s %2s %2s %6s %7s %9s %9s %8s %9s %9s %9s %9s %8s %7s %9s\n", "# var", "P", "D",
           "tokens", "MiB", "e2e_GB/s", "export_ms", "puts_ms", "import_ms", "put_GB/s", "model",
           "ref", "e2e/ref", "puts", "launch_ms");
    for (char *vsave = NULL, *var = strtok_r(variants_buf, ",", &vsave); var != NULL;
         var = strtok_r(NULL, ",", &vsave)) {
        char plans[128];
        if (strcmp(var, "spread") != 0 && strcmp(var, "same") != 0 && strcmp(var, "affine") != 0) {
            fprintf(stderr, "unknown variant '%s'\n", var);
            return 2;
        }
        if (strcmp(var, "same") != 0 && b.base.n_dev < 2) {
            printf("# %s: skipped, %d GPU\n", var, b.base.n_dev);
            continue;
        }
        b.variant = var;
        snprintf(plans, sizeof(plans), "%s", plans_buf);
        for (char *psave = NULL, *pl = strtok_r(plans, ",", &psave); pl != NULL;
             pl = strtok_r(NULL, ",", &psave)) {
            int fds[2], rc[2];
            pid_t pids[2];
            if (sscanf(pl, "%dx%d", &b.P, &b.D) != 2 || b.P < 1 || b.D < 1 || b.P > G_MAX_TP ||
                b.D > G_MAX_TP || G_HEADS % b.P || G_HEADS % b.D) {
                fprintf(stderr, "bad plan '%s' (P and D must divide %d)\n", pl, G_HEADS);
                return 2;
            }
            if (b.auto_pack)
                b.packed = b.P != b.D;
            if (place(&b, b.base.n_dev))
                return 1;
            if (b.packed && b.progress > 0)
                printf("# %s %dx%d: progress every %d layers%s\n", var, b.P, b.D, b.progress,
                       !b.progress_auto || !b.shares_gpu
                           ? ""
                           : " from 512 MiB of KV (a decode rank shares a sender's GPU)");
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
                return 1;
            b.fd_p = fds[0];
            b.fd_d = fds[1];
            pids[0] = duet_testkit_spawn("prefill", bench_prefill, &b, &fds[1], 1);
            pids[1] = duet_testkit_spawn("decode", bench_decode, &b, &fds[0], 1);
            if (duet_testkit_wait_all(pids, 2, duet_deadline_in_ms(600000), rc) != 0) {
                fprintf(stderr, "%s %s: prefill exit %d, decode exit %d\n", var, pl, rc[0], rc[1]);
                bad++;
            }
            close(fds[0]);
            close(fds[1]);
        }
    }
    printf("# %s\n", bad ? "FAILED" : "all transfers verified");
    return bad ? 1 : 0;
}
