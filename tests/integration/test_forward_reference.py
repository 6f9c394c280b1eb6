#!/usr/bin/python3
"""Forward correctness: duet's CPU logits against the independent numpy
reference (tests/reference/llama_ref.py) on stories260K and synthetic
models of several shapes and dtypes (Qwen2 q/k/v biases, a Llama with
attention_bias: q/k/v and o_proj biases, Qwen3 q/k norms, RoPE scaling
linear / llama3 / yarn / dynamic, with original_max_position_embeddings below the
prompt length so that positions past it are checked), at TP 1 and 2; and
Llama-3.1's own scaling (factor 8, original_max_position_embeddings 8192,
theta 500000, head_dim 64) on a prompt of 8256 tokens (every row) and of
33000 tokens (the last 64 rows), so that positions past the original
context and past 32K are checked at the sizes real checkpoints use.

Tolerance: max |duet - ref| <= 2e-4 * (1 + max |ref|) over every position
of the prompt and every vocab entry.  duet computes in float32, the
reference in float64 from the same stored weights, so the difference is
float32 rounding alone (observed ~1e-6 relative; at 8K positions ~1e-4,
from the float32 RoPE angles pos * inv_freq, as transformers computes
them).  Greedy argmax must agree on every row; on the 8256-token prompt a
row may differ only at a near-tie, where the reference's logits of both
tokens are within the bound of each other (DESIGN §10).

usage: test_forward_reference.py BUILD_DIR SOURCE_DIR
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BUILD, SRC = sys.argv[1], sys.argv[2]
DUET = os.path.join(BUILD, "tools", "duet")
REF = os.path.join(SRC, "tests", "reference", "llama_ref.py")
TOL = 2e-4

MODELS = [
    # name, mkmodel args (None: shipped stories260K)
    ("stories260K", None),
    ("llama-f32-gqa", ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                       "--intermediate", "96", "--vocab", "300", "--seed", "7"]),
    ("llama-bf16-mqa", ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "1",
                        "--intermediate", "80", "--vocab", "300", "--dtype", "bf16", "--seed", "8"]),
    ("llama-f16-tied-hd", ["--layers", "3", "--hidden", "48", "--heads", "4", "--kv-heads", "4",
                           "--head-dim", "16", "--intermediate", "100", "--vocab", "280", "--tied",
                           "--dtype", "f16", "--seed", "9"]),
    ("qwen2-bias", ["--arch", "qwen2", "--layers", "2", "--hidden", "64", "--heads", "8",
                    "--kv-heads", "2", "--intermediate", "128", "--vocab", "320",
                    "--rope-theta", "1000000", "--seed", "10"]),
    ("llama-attn-bias", ["--attention-bias", "--layers", "2", "--hidden", "64", "--heads", "4",
                         "--kv-heads", "2", "--intermediate", "96", "--vocab", "300",
                         "--dtype", "bf16", "--seed", "12"]),
    # llama3 scaling with a small original context: the 24-token prompt
    # runs past it, and head_dim 16 at theta 1e4 puts frequencies in all
    # three bands (kept, interpolated, divided by the factor)
    ("llama3-scaled", ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                       "--intermediate", "96", "--vocab", "300", "--seed", "13",
                       "--rope-scaling", '{"rope_type": "llama3", "factor": 8.0, '
                       '"low_freq_factor": 1.0, "high_freq_factor": 4.0, '
                       '"original_max_position_embeddings": 16}']),
    ("qwen2-yarn", ["--arch", "qwen2", "--layers", "2", "--hidden", "64", "--heads", "4",
                    "--kv-heads", "2", "--intermediate", "96", "--vocab", "300", "--seed", "14",
                    "--rope-theta", "1000000", "--dtype", "bf16",
                    "--rope-scaling", '{"type": "yarn", "factor": 4.0, '
                    '"original_max_position_embeddings": 64}']),
    # dynamic NTK: transformers' formula in the reference; duet keeps plain
    # RoPE, which is what it gives for every context up to max_pos
    ("llama-dynamic", ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                       "--intermediate", "96", "--vocab", "300", "--seed", "18", "--max-pos", "24",
                       "--rope-scaling", '{"type": "dynamic", "factor": 4.0}']),
    ("llama-linear", ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "4",
                      "--intermediate", "96", "--vocab", "300", "--seed", "15",
                      "--rope-scaling", '{"type": "linear", "factor": 2.5}']),
    # Qwen3: head_dim 32 != hidden / heads, tied embeddings, q/k norms
    ("qwen3-tied", ["--arch", "qwen3", "--layers", "2", "--hidden", "64", "--heads", "4",
                    "--kv-heads", "2", "--head-dim", "32", "--intermediate", "96",
                    "--vocab", "300", "--tied", "--rope-theta", "1000000", "--seed", "16"]),
    ("qwen3-yarn-bf16", ["--arch", "qwen3", "--layers", "2", "--hidden", "48", "--heads", "4",
                         "--kv-heads", "1", "--head-dim", "16", "--intermediate", "64",
                         "--vocab", "290", "--dtype", "bf16", "--seed", "17",
                         "--rope-scaling", '{"rope_type": "yarn", "factor": 8.0, '
                         '"original_max_position_embeddings": 20, "beta_fast": 16}']),
    ("mistral-sharded", ["--arch", "mistral", "--layers", "2", "--hidden", "64", "--heads", "8",
                         "--kv-heads", "8", "--intermediate", "64", "--vocab", "290",
                         "--shards", "3", "--seed", "11"]),
]

PROMPTS = ["1 45 76 270 3 17 99 250 4 4 4 12 200 33 7 1 2 3 5 8 13 21 34 55",
           "1 12"]

# name, mkmodel args, prompt, rows compared (None: all): one layer and
# two heads keep the float64 reference at 8256 tokens to seconds; at 33000
# tokens it computes the last 64 rows' queries alone (llama_ref.py LAST)
LLAMA31 = ["--layers", "1", "--hidden", "128", "--heads", "2", "--kv-heads", "1",
           "--intermediate", "128", "--vocab", "300", "--seed", "19",
           "--max-pos", "131072", "--rope-theta", "500000",
           "--rope-scaling", '{"rope_type": "llama3", "factor": 8.0, '
           '"low_freq_factor": 1.0, "high_freq_factor": 4.0, '
           '"original_max_position_embeddings": 8192}']


def long_prompt(n):
    return " ".join(["1"] + [str((i * 37 + 5) % 297 + 3) for i in range(n - 1)])


LONG = [("llama31-8k", LLAMA31, long_prompt(8256), None),
        ("llama31-33k", LLAMA31, long_prompt(33000), 64)]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("FAIL: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, args, prompts, last in [(m, a, PROMPTS, None) for m, a in MODELS] + \
                [(m, a, [p], k) for m, a, p, k in LONG]:
            if args is None:
                mdir = os.path.join(SRC, "models", "stories260K")
            else:
                mdir = os.path.join(tmp, name)
                if not os.path.exists(mdir):
                    run([DUET, "mkmodel", "--out", mdir] + args)
            vocab = None
            for prompt in prompts:
                n = len(prompt.split())
                ids_arg = prompt
                if n > 1000:  # through a file: it outgrows the command line
                    ids_arg = os.path.join(tmp, "prompt.txt")
                    with open(ids_arg, "w") as f:
                        f.write(prompt)
                    ids_arg = "@" + ids_arg
                rows_n = last or n
                ref_path = os.path.join(tmp, "ref.f32")
                run([REF, mdir, ids_arg, ref_path] + ([str(last)] if last else []))
                ref = np.fromfile(ref_path, dtype=np.float32).astype(np.float64)
                vocab = ref.size // rows_n
                ref = ref.reshape(rows_n, vocab)
                for tp in (1, 2):
                    out = os.path.join(tmp, "duet.f32")
                    run([DUET, "generate", "--model", mdir, "--prompt-ids", ids_arg,
                         "--max-tokens", "1", "--tp", str(tp), "--threads", "1",
                         "--page-size", "4", "--dump-logits", out, "--output", "ids"])
                    got = np.fromfile(out, dtype=np.float32).astype(np.float64)
                    got = got[:n * vocab].reshape(n, vocab)[n - rows_n:]
                    err = np.abs(got - ref).max()
                    bound = TOL * (1.0 + np.abs(ref).max())
                    diff = np.where(got.argmax(-1) != ref.argmax(-1))[0]
                    rows = np.arange(rows_n)
                    gap = np.abs(ref[rows, ref.argmax(-1)] - ref[rows, got.argmax(-1)])
                    ties = n > 1000 and (gap[diff] <= bound).all()
                    ok = err <= bound and (len(diff) == 0 or ties)
                    print("%-18s tp=%d n=%5d%s max|diff|=%.3g bound=%.3g %s%s" %
                          (name, tp, n, " (last %d rows)" % last if last else "", err, bound,
                           "ok" if ok else "FAIL",
                           " (%d near-tie rows)" % len(diff) if len(diff) else ""))
                    failures += not ok
    if failures:
        sys.exit("FAIL: %d comparisons out of tolerance" % failures)
    print("all forward passes match the reference")


if __name__ == "__main__":
    main()
