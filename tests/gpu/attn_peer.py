#!/usr/bin/env python3
"""The decode-attention peer: PyTorch's scaled_dot_product_attention on the
same shapes as bench/bench_attention.c (one query row per sequence, GQA,
contiguous bf16 KV), per backend (cuDNN, flash; the memory-efficient one takes
no GQA), KV bytes
read per second against a device-to-device copy measured in the same run.

    tests/gpu/attn_peer.py [--heads 32/8] [--head-dim 128] [--batches 1,16,64]
                           [--ctx 1024,4096,8192] [--reps 50]

Prints one line per (backend, batch, ctx) in bench_attention's format, so
one log holds both side by side.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def copy_bandwidth():
    n = 1 << 29  # bf16 elements: 1 GiB
    a = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(20):
        (a if i % 2 else b).copy_(b if i % 2 else a)
    e1.record()
    torch.cuda.synchronize()
    return 2.0 * 2 * n * 20 / (e0.elapsed_time(e1) / 1e3) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--ctx", default="1024,4096,8192")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    nq, nkv = (int(x) for x in a.heads.split("/"))
    hd = a.head_dim
    bw = copy_bandwidth()
    print(f"attn_peer: {torch.cuda.get_device_name()} torch {torch.__version__}, "
          f"heads {nq}/{nkv} head_dim {hd}")
    print(f"  HBM copy bandwidth {bw:.0f} GB/s (1 GiB D2D, read + write)")
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]
    for name, be in backends:
        for B in (int(x) for x in a.batches.split(",")):
            for ctx in (int(x) for x in a.ctx.split(",")):
                q = torch.randn(B, nq, 1, hd, dtype=torch.bfloat16, device="cuda")
                k = torch.randn(B, nkv, ctx, hd, dtype=torch.bfloat16, device="cuda")
                v = torch.randn(B, nkv, ctx, hd, dtype=torch.bfloat16, device="cuda")
                try:
                    with sdpa_kernel([be]):
                        for _ in range(3):
                            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        torch.cuda.synchronize()
                        e0 = torch.cuda.Event(enable_timing=True)
                        e1 = torch.cuda.Event(enable_timing=True)
                        e0.record()
                        for _ in range(a.reps):
                            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        e1.record()
                        torch.cuda.synchronize()
                except RuntimeError as ex:
                    print(f"  {name:<9} batch {B:<3} ctx {ctx:<6} unavailable: "
                          f"{str(ex).splitlines()[0][:80]}")
                    continue
                us = e0.elapsed_time(e1) * 1e3 / a.reps
                kv_bytes = B * ctx * nkv * hd * 2 * 2
                gbs = kv_bytes / (us * 1e-6) / 1e9
                print(f"  {name:<9} batch {B:<3} ctx {ctx:<6} {us:9.1f} us  "
                      f"KV {kv_bytes / 1e6:8.1f} MB  {gbs:7.0f} GB/s  {gbs / bw:.2f} of copy")
                del q, k, v
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
