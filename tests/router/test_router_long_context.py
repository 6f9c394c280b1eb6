#!/usr/bin/python3
"""A prompt of more than 32K tokens through duet-router (issue 27 item 3):
a tiny synthetic Llama-3.1-style model (llama3 RoPE scaling,
original_max_position_embeddings 8192, max_position_embeddings 40960), a
prefill TP 2 and a decode TP 1 on the CPU backend.

  grpc     a 33000-token prompt as token ids through the router's
           duet.v1.Generate: the greedy tokens equal `duet generate --tp 1`
  http     the same prompt as token ids through POST /v1/completions (a
           body of ~150 KB): 200, usage counts 33000 prompt tokens
  limits   /v1/models reports the context from config.json (40960); a
           prompt of 40961 ids is 400 context_length_exceeded naming it;
           prompt + max_tokens past the context is capped, not refused
           (40900 + 8000: 60 tokens, finish_reason length; max_tokens
           limit 8192 here); pages back at baseline

usage: test_router_long_context.py BUILD_DIR SOURCE_DIR
"""
import os
import subprocess
import tempfile
import time

from router_cluster import Cluster, check, main

N_LONG = 33000
SCALING = ('{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, '
           '"high_freq_factor": 4.0, "original_max_position_embeddings": 8192}')


def ids(n, salt):
    return [1] + [(i * 37 + salt * 11 + 3) % 509 + 3 for i in range(n - 1)]


def test(build, src):
    tmp = tempfile.mkdtemp(prefix="duet_router_long_")
    model = os.path.join(tmp, "model")
    duet = os.path.join(build, "tools", "duet")
    subprocess.check_call([duet, "mkmodel", "--out", model, "--layers", "2", "--hidden", "64",
                           "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
                           "--vocab", "512", "--max-pos", "40960", "--rope-theta", "500000",
                           "--rope-scaling", SCALING], stdout=subprocess.DEVNULL)
    prompt = ids(N_LONG, 1)
    path = os.path.join(tmp, "prompt.txt")
    with open(path, "w") as f:
        f.write(" ".join(map(str, prompt)))
    want = [int(x) for x in subprocess.check_output(
        [duet, "generate", "--model", model, "--prompt-ids", "@" + path, "--max-tokens", "8",
         "--temperature", "0", "--output", "ids", "--threads", "1", "--ignore-eos"],
        stderr=subprocess.DEVNULL, text=True).split()]
    cl = Cluster(build, src, prefill=[("prefill-0", 2, {"max_batch_tokens": 4096})],
                 decode=[("decode-0", 1, {"max_batch_tokens": 4096})], model=model,
                 n_pages=2600, router={"max_tokens_limit": 8192},
                 transfer={"timeout_ms": 120000, "rpc_timeout_ms": 120000})
    try:
        cl.start_workers()
        cl.start_router()
        t0 = time.time()
        got = []
        stub = cl.router_stub()
        for r in stub.Generate(cl.gen_request(prompt, max_tokens=8, ignore_eos=True),
                               timeout=300):
            if r.HasField("chunk"):
                got += list(r.chunk.ids)
        print("grpc: %d prompt tokens in %.1fs: %s" % (N_LONG, time.time() - t0, got))
        check(got == want, "router gRPC: %s, duet generate %s" % (got, want))

        st, _, r = cl.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 8,
                                                    "temperature": 0, "ignore_eos": True},
                                timeout=300)
        check(st == 200, "HTTP: %d %s" % (st, r))
        check(r["usage"]["prompt_tokens"] == N_LONG and r["usage"]["completion_tokens"] == 8,
              "HTTP usage: %s" % r["usage"])
        print("http: 200, usage %s" % r["usage"])

        st, _, r = cl.http("GET", "/v1/models")
        check(st == 200 and b"40960" in r, "/v1/models: %d %r" % (st, r[:300]))
        st, _, r = cl.post_json("/v1/completions", {"prompt": ids(40961, 2), "max_tokens": 1})
        check(st == 400 and r["error"]["code"] == "context_length_exceeded" and
              "40960" in r["error"]["message"], "over the context: %d %s" % (st, r))
        print("over the context: 400 %s" % r["error"]["message"])
        # capped at the context: 40900 + 8000 > 40960 stops at the context
        st, _, r = cl.post_json("/v1/completions", {"prompt": ids(40900, 3), "max_tokens": 8000,
                                                    "temperature": 0, "ignore_eos": True},
                                timeout=300)
        check(st == 200 and r["choices"][0]["finish_reason"] == "length" and
              60 <= r["usage"]["completion_tokens"] <= 61,
              "capped max_tokens: %d %s" % (st, r.get("usage", r)))
        print("capped at the context: %s" % r["usage"])
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    except BaseException:
        for name, p in cl.procs.items():
            print("---- %s log ----\n%s" % (name, p.log()[-3000:]))
        cl.kill_all()
        raise


if __name__ == "__main__":
    main(test)
