#!/usr/bin/env python3
"""Peer baseline for bench_gpu: Hugging Face transformers + PyTorch, bf16,
on the same model directory and GPU (../shared/BENCHMARKS.md "GPU peers").

decode: B prompts of --ctx random ids; tok/s = B * (decode - 1) /
(time of generate(decode new tokens) - time of generate(1 new token)),
greedy, no early stop (min_new_tokens), the default KV cache and attention.
prefill: one prompt of P ids through model(ids, logits_to_keep=1), median
of --reps after a warm-up.

usage: hf_peer.py --model DIR [--batches 1,16,64] [--ctx 16] [--decode 128]
                  [--prompts 512,...] [--reps 3]
"""
import argparse
import statistics
import sys
import time

import torch
import transformers


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--ctx", type=int, default=16)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--prompts", default="512,1024,2048,4096,8192")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model,
                                                                  torch_dtype=torch.bfloat16)
    model = model.cuda().eval()
    cfg = model.config
    vocab = cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    print("hf_peer: %s on %s, transformers %s torch %s, attn %s" %
          (a.model, torch.cuda.get_device_name(0), transformers.__version__, torch.__version__,
           getattr(cfg, "_attn_implementation", "?")))
    with torch.inference_mode():
        for b in [int(x) for x in a.batches.split(",")]:
            ids = torch.randint(0, vocab - 2, (b, a.ctx), generator=gen).cuda()
            mask = torch.ones_like(ids)

            def run(n):
                return model.generate(ids, attention_mask=mask, max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False, pad_token_id=0)
            run(4)
            t1, _ = timed(lambda: run(1))
            tn, out = timed(lambda: run(a.decode))
            assert out.shape[1] == a.ctx + a.decode
            tps = b * (a.decode - 1) / (tn - t1)
            print("  decode batch %-3d        %8.1f tok/s  %7.2f ms/step" %
                  (b, tps, 1e3 * (tn - t1) / (a.decode - 1)))
            sys.stdout.flush()
        for n in [int(x) for x in a.prompts.split(",")]:
            ids = torch.randint(0, vocab - 2, (1, n), generator=gen).cuda()

            def fwd():
                try:
                    return model(ids, logits_to_keep=1)
                except TypeError:
                    return model(ids)
            fwd()
            ts = [timed(fwd)[0] for _ in range(a.reps)]
            t = statistics.median(ts)
            print("  prefill %-5d tokens     %8.0f tok/s  %7.1f ms" % (n, n / t, 1e3 * t))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
