#!/usr/bin/python3
"""FP8 checkpoints (model/quant.h) on the CPU backend, end to end.

For synthetic FP8 checkpoints of every layout `duet mkmodel --fp8` writes
(compressed-tensors per channel and per tensor, fbgemm_fp8, fp8) over
several architectures:
 - the logits of `duet generate` (every prompt position and generated step)
   on the FP8 checkpoint equal, bit for bit, those on its dequantization
   written here with numpy as an F32 checkpoint (e4m3 -> float32 exactly,
   times the scale in float32: what the CPU backend does at load), at TP 1
   and TP 2;
 - a disaggregated duet-prefill (TP=P) + duet-decode (TP=D) on the FP8
   checkpoint gives the greedy tokens of `duet generate --tp 1` on it;
 - bad configs are start-up errors naming the key (duet generate exits 1).

usage: test_fp8.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duet_cluster import Cluster, mkmodel, reference_ids  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pylib"))
from fp8_ckpt import dequantize  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
DUET = os.path.join(BUILD, "tools", "duet")
GEN = 8


def logits(model, prompt, tp, tmp):
    path = os.path.join(tmp, "logits.bin")
    subprocess.check_call([DUET, "generate", "--model", model, "--prompt-ids",
                           " ".join(map(str, prompt)), "--max-tokens", str(GEN),
                           "--temperature", "0", "--output", "ids", "--ignore-eos",
                           "--tp", str(tp), "--threads", "1", "--dump-logits", path],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(path, "rb") as f:
        return f.read()


MODELS = [  # name, mkmodel options
    ("llama-ct-channel-bf16", dict(fp8="channel", dtype="bf16", seed=61)),
    ("qwen2-ct-tensor-f32", dict(arch="qwen2", fp8="tensor", seed=62)),
    ("qwen3-fbgemm-bf16", dict(arch="qwen3", head_dim=32, fp8="channel", fp8_format="fbgemm",
                               dtype="bf16", tied=True, seed=63)),
    ("mistral-fp8-tensor-f16", dict(arch="mistral", fp8="tensor", fp8_format="fp8", dtype="f16",
                                    seed=64)),
]


def main():
    tmp = tempfile.mkdtemp(prefix="duet_fp8_")
    failures = []
    prompt = [1] + [(i * 37 + 5) % 290 + 3 for i in range(40)]
    try:
        for name, kw in MODELS:
            fp8 = mkmodel(BUILD, os.path.join(tmp, name), layers=2, hidden=64, heads=4,
                          kv_heads=2, intermediate=96, vocab=300, max_pos=512, **kw)
            deq = os.path.join(tmp, name + "-deq")
            dequantize(fp8, deq)
            for tp in (1, 2):
                a, b = logits(fp8, prompt, tp, tmp), logits(deq, prompt, tp, tmp)
                ok = a == b and len(a) == 4 * 300 * (len(prompt) + GEN - 1)
                print("%-24s tp %d logits %s" % (name, tp, "equal" if ok else "DIFFER"))
                if not ok:
                    failures.append((name, "logits tp %d" % tp))
            ref = reference_ids(BUILD, fp8, prompt, GEN, ignore_eos=True)
            for P, D in ((1, 1), (2, 1), (1, 2)) if name.startswith("llama") else ((2, 2),):
                c = Cluster(BUILD, SRC, fp8, prefill=[("p0", P)], decode=[("d0", D)],
                            page_size=16, n_pages=64)
                try:
                    c.start_all()
                    ids = c.generate("d0", prompt, max_tokens=GEN, ignore_eos=True)[0]
                finally:
                    c.close()
                print("%-24s P=%d D=%d %s" % (name, P, D, "ok" if ids == ref else
                                               "FAIL got %s want %s" % (ids, ref)))
                if ids != ref:
                    failures.append((name, P, D))
        bad_configs(tmp, failures)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        sys.exit("FAIL: %s" % failures)
    print("FP8 checkpoints: logits equal their dequantization, disaggregated runs equal "
          "duet generate --tp 1, bad configs refused")


def bad_configs(tmp, failures):
    base = mkmodel(BUILD, os.path.join(tmp, "bad-base"), fp8="channel", dtype="bf16", seed=65)
    with open(os.path.join(base, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg["quantization_config"]
    w = qc["config_groups"]["group_0"]["weights"]
    cases = [
        ("unknown quant_method", dict(qc, quant_method="bitsandbytes"),
         "quantization_config.quant_method: bitsandbytes"),
        ("block strategy", dict(qc, config_groups={"group_0": {"weights": dict(w, strategy="block")}}),
         "quantization_config.config_groups.group_0.weights.strategy: block"),
        ("per-tensor config, per-channel scales",
         dict(qc, config_groups={"group_0": {"weights": dict(w, strategy="tensor")}}),
         "weight_scale: shape [64, 1] does not match the per-tensor strategy"),
        ("fp8 KV cache", dict(qc, kv_cache_scheme={"num_bits": 8, "type": "float"}),
         "quantization_config.kv_cache_scheme"),
    ]
    for what, q, want in cases:
        d = os.path.join(tmp, "bad")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(cfg, quantization_config=q), f)
        r = subprocess.run([DUET, "generate", "--model", d, "--prompt-ids", "1 2 3",
                            "--max-tokens", "1"], capture_output=True, text=True)
        ok = r.returncode != 0 and want in r.stderr
        print("bad config: %-40s %s" % (what, "refused" if ok else
                                        "FAIL rc %d: %s" % (r.returncode, r.stderr.strip())))
        if not ok:
            failures.append(("bad config", what))


if __name__ == "__main__":
    main()
