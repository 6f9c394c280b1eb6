#!/usr/bin/python3
"""Does llama-server, given our GGUF of a model, compute what duet computes?

  bench/peer/check_greedy.py BUILD_DIR LLAMA_SERVER MODEL.gguf
                             [--model-dir DIR] [--tokens N] [--out FILE]

1. Tokenization: every case of tests/data/tokenizers/ref_stories260K.json
   (the reference ids duet's tokenizer is tested against) through
   llama-server's /tokenize (add_special: BOS as the tokenizer says).
2. Greedy generation: each prompt below through llama-server's /completion
   (temperature 0, ignore_eos, N tokens) and `duet generate --tp 1
   --ignore-eos --output ids`; prints how many leading tokens agree.

Exit status 0 when every case and every token agrees, 1 otherwise.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "pylib"))

from llama_server import LlamaServer  # noqa: E402
from ports import free_port  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "Lily and Tom went to the park. They saw a big dog.",
    "The cat sat on the mat and",
    "One day, a little boy named Tim found a shiny red ball in the garden.",
    "She was happy because",
    "Café au lait, 3 apples and 12 pears!",
    "\"Why are you sad?\" asked the bird.",
    "Spot",
]


def duet_ids(build, model_dir, prompt, n):
    r = subprocess.run([os.path.join(build, "tools", "duet"), "generate", "--model",
                        model_dir, "--tp", "1", "--prompt", prompt, "--max-tokens", str(n),
                        "--ignore-eos", "--output", "ids"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit("duet generate failed: %s" % r.stderr)
    return [int(x) for x in r.stdout.split()]


def agree(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("llama_server")
    ap.add_argument("gguf")
    ap.add_argument("--model-dir", default=os.path.join(SRC, "models", "stories260K"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    ref = json.load(open(os.path.join(SRC, "tests", "data", "tokenizers", "ref_stories260K.json")))
    ok = True
    res = {"tokenize": {}, "generate": []}
    with LlamaServer(a.llama_server, a.gguf, free_port(), threads=1, slots=1) as srv:
        same, diff = 0, []
        for c in ref["cases"]:
            got = srv.post("/tokenize", {"content": c["text"], "add_special": True})["tokens"]
            if got == c["ids"]:
                same += 1
            else:
                diff.append({"text": c["text"], "duet": c["ids"], "llama": got})
        res["tokenize"] = {"cases": len(ref["cases"]), "equal": same, "differ": diff}
        print("tokenize: %d of %d reference cases give duet's ids" % (same, len(ref["cases"])))
        for d in diff[:10]:
            print("  differs: %r\n    duet  %s\n    llama %s" % (d["text"][:60], d["duet"][:24],
                                                                d["llama"][:24]))
        ok &= not diff
        total, agreeing = 0, 0
        for p in PROMPTS:
            body = {"prompt": p, "n_predict": a.tokens, "temperature": 0, "ignore_eos": True,
                    "return_tokens": True, "cache_prompt": False, "samplers": ["temperature"]}
            lt = srv.post("/completion", body)["tokens"]
            dt = duet_ids(build, a.model_dir, p, a.tokens)
            n = agree(lt, dt)
            total += a.tokens
            agreeing += n
            res["generate"].append({"prompt": p, "duet": dt, "llama": lt, "agree": n})
            print("generate %-45r %d/%d tokens agree%s" % (p[:45], n, a.tokens,
                                                           "" if n == a.tokens else
                                                           " (first difference at %d)" % n))
            ok &= n == a.tokens == len(lt) == len(dt)
        res["generate_agree"] = [agreeing, total]
        print("generate: %d of %d greedy tokens agree over %d prompts" % (agreeing, total,
                                                                          len(PROMPTS)))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:  # llama-server did not start: its log tail is in the message
        sys.exit("check_greedy.py: %s" % e)
