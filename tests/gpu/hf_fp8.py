#!/usr/bin/env python3
"""FP8 checkpoints against an independent reference (GPU machine): Hugging
Face transformers computing the logits of the checkpoint's dequantization
(tests/pylib/fp8_ckpt.py: e4m3 * scale in float32, written as an F32
checkpoint without quantization_config) in float32 on the GPU, against
`duet generate --dump-logits` on the FP8 checkpoint itself:

 - cpu backend (dequantizes exactly at load, float32 throughout): max
   |duet - hf| <= 1e-3 (1 + max |hf|), rel_l2 <= 1e-4 -- the same numbers
   up to float32 summation order;
 - cuda backend with every matmul through the FP8 GEMV
   (DUET_CUDA_FP8_GEMM=0: e4m3 weights exact, bf16 activations): the bf16
   bound of compare_backends.py, 0.06 (1 + max |hf|), rel_l2 <= 0.03;
 - cuda backend as it serves (the prompt through cuBLASLt FP8, activations
   quantized per token to e4m3): 0.4 (1 + max |hf|), rel_l2 <= 0.3 -- a
   numpy simulation of per-token e4m3 activations on these synthetic
   models gives rel_l2 0.10-0.19 (random weights amplify the error;
   docs/fp8.md); a wrong scale or layout gives rel_l2 near 1.

Every prompt position's logits of a few prompts.  Needs torch and
transformers (the GPU host has them).

usage: hf_fp8.py DUET FP8_MODEL_DIR [FP8_MODEL_DIR...]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from fp8_ckpt import dequantize  # noqa: E402

PROMPTS = [[1, 45, 76, 270, 3, 17, 99, 250, 4, 4, 4, 12, 200, 33, 7, 1, 2, 3, 5, 8, 13, 21, 34,
            55] * 3, [1, 12, 7, 9, 100, 3]]
# name: (backend, extra environment, atol factor, rel_l2 bound)
RUNS = {"cpu": ("cpu", {}, 1e-3, 1e-4),
        "cuda-gemv": ("cuda", {"DUET_CUDA_FP8_GEMM": "0"}, 0.06, 0.03),
        "cuda": ("cuda", {}, 0.4, 0.3)}


def duet_logits(duet, mdir, prompt, backend, env, vocab, tmp):
    path = os.path.join(tmp, "logits.bin")
    cmd = [duet, "generate", "--model", mdir, "--prompt-ids", " ".join(map(str, prompt)),
           "--max-tokens", "1", "--backend", backend, "--output", "ids", "--ignore-eos",
           "--dump-logits", path]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=900, env=dict(os.environ, **env))
    if r.returncode != 0:
        sys.exit("FAIL: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return np.fromfile(path, dtype=np.float32).reshape(-1, vocab)[:len(prompt)]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    duet, failures = sys.argv[1], []
    torch.backends.cuda.matmul.allow_tf32 = False  # a float32 reference
    torch.backends.cudnn.allow_tf32 = False
    for mdir in sys.argv[2:]:
        with tempfile.TemporaryDirectory(prefix="duet_hf_fp8_") as tmp:
            deq = os.path.join(tmp, "deq")
            dequantize(mdir, deq)
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(deq, dtype=torch.float32)
            except TypeError:  # transformers before `dtype`
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    deq, torch_dtype=torch.float32)
            model = model.cuda().eval()
            vocab = model.config.vocab_size
            for p in PROMPTS:
                with torch.inference_mode():
                    ref = model(torch.tensor([p]).cuda()).logits[0].float().cpu().numpy()
                for name, (backend, env, atol, l2) in RUNS.items():
                    got = duet_logits(duet, mdir, p, backend, env, vocab, tmp)
                    err = np.abs(got - ref)
                    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                    lim = atol * (1 + float(np.abs(ref).max()))
                    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
                    ok = float(err.max()) <= lim and rel <= l2
                    print("%-24s %-9s prompt %-3d max|err| %.3g (<= %.3g) rel_l2 %.3g (<= %.3g) "
                          "argmax agrees %.0f%% %s" % (os.path.basename(mdir.rstrip("/")), name,
                                                      len(p), err.max(), lim, rel, l2,
                                                      100 * agree, "ok" if ok else "FAIL"))
                    if not ok:
                        failures.append((mdir, name, len(p)))
            del model
            torch.cuda.empty_cache()
    if failures:
        sys.exit("FAIL: %s" % failures)
    print("FP8 checkpoints: duet cpu and cuda logits within the stated bounds of transformers "
          "on the dequantized checkpoint")


if __name__ == "__main__":
    main()
