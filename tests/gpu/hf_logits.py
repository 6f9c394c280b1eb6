#!/usr/bin/env python3
"""An independent reference on the GPU host (issue 27): Hugging Face
transformers computes the logits of every prompt position for the same
synthetic checkpoints the numpy reference uses (every architecture and
RoPE scaling type duet reads: tests/integration/test_forward_reference.py
MODELS), and duet's cpu backend (fp32) and cuda backend (bf16) must agree
with it.

Tolerances (max |duet - hf| <= atol * (1 + max |hf|), and the same argmax
per position):
  cpu  vs hf (fp32 on both sides)               atol 2e-4 (the numpy test's)
  cuda vs hf (bf16 weights and activations)     atol 0.06, rel_l2 <= 0.03
                                                (compare_backends.py's)
transformers runs in float32 on the GPU (TF32 matmuls off).

usage: hf_logits.py DUET [--cuda] [--models name,name]
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "ref", os.path.join(SRC, "tests", "integration", "test_forward_reference.py"))
REF = importlib.util.module_from_spec(spec)
sys.argv, _argv = [sys.argv[0], "", SRC], sys.argv  # the module reads BUILD, SRC at import
spec.loader.exec_module(REF)
sys.argv = _argv

CPU_TOL, CUDA_TOL, CUDA_L2 = 2e-4, 0.06, 0.03


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("FAIL: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout


def duet_logits(duet, mdir, prompt, backend, tmp, n, vocab):
    out = os.path.join(tmp, "duet-%s.f32" % backend)
    cmd = [duet, "generate", "--model", mdir, "--prompt-ids", prompt, "--max-tokens", "1",
           "--backend", backend, "--tp", "1", "--page-size", "4", "--dump-logits", out,
           "--output", "ids"]
    if backend == "cpu":
        cmd += ["--threads", "4"]
    run(cmd)
    got = np.fromfile(out, dtype=np.float32).astype(np.float64)
    return got[:n * vocab].reshape(n, vocab)


def hf_logits(mdir, prompt):
    model = transformers.AutoModelForCausalLM.from_pretrained(mdir, torch_dtype=torch.float32)
    model = model.to("cuda").eval()
    ids = torch.tensor([[int(t) for t in prompt.split()]], device="cuda")
    with torch.no_grad():
        out = model(ids).logits[0].double().cpu().numpy()
    del model
    torch.cuda.empty_cache()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("duet")
    p.add_argument("--cuda", action="store_true", help="also the cuda backend")
    p.add_argument("--models", default="")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    want = set(a.models.split(",")) if a.models else None
    print("transformers %s, torch %s, %s" % (transformers.__version__, torch.__version__,
                                             torch.cuda.get_device_name(0)))
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in REF.MODELS:
            if want is not None and name not in want:
                continue
            if args is None:
                mdir = os.path.join(SRC, "models", "stories260K")
            else:
                mdir = os.path.join(tmp, name)
                run([a.duet, "mkmodel", "--out", mdir] + args)
            for prompt in REF.PROMPTS:
                try:
                    ref = hf_logits(mdir, prompt)
                except Exception as e:  # a config transformers cannot load
                    print("%-18s transformers cannot run it: %s" % (name, e))
                    failures += 1
                    break
                n, vocab = ref.shape
                sides = [("cpu", CPU_TOL, None)]
                if a.cuda:
                    sides.append(("cuda", CUDA_TOL, CUDA_L2))
                for backend, atol, l2 in sides:
                    got = duet_logits(a.duet, mdir, prompt, backend, tmp, n, vocab)
                    err = np.abs(got - ref).max()
                    bound = atol * (1.0 + np.abs(ref).max())
                    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
                    same = (got.argmax(-1) == ref.argmax(-1)).mean()
                    ok = err <= bound and (l2 is None or rel <= l2)
                    if backend == "cpu":
                        ok = ok and same == 1.0
                    print("%-18s %-4s n=%2d max|diff|=%.3g bound=%.3g rel_l2=%.2g argmax %.0f%% %s"
                          % (name, backend, n, err, bound, rel, 100 * same,
                             "ok" if ok else "FAIL"))
                    failures += not ok
    if failures:
        sys.exit("FAIL: %d comparisons out of tolerance" % failures)
    print("every model matches transformers")


if __name__ == "__main__":
    main()
