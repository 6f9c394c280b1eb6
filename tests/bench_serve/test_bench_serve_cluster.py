#!/usr/bin/python3
"""duet bench-serve against a real local cluster (duet-prefill, duet-decode,
duet-router on 127.0.0.1, CPU backend, stories260K): over HTTP
(/v1/completions, SSE) in a closed loop and over gRPC (duet.v1.Generate) in
an open loop; every request completes with exactly the tokens asked for
(ignore_eos), which the router's own counters confirm, and the JSON is
written.  A chat run fails at setup with the router's error (stories260K
has no chat template).

usage: test_bench_serve_cluster.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "router"))
from router_cluster import Cluster, check, main  # noqa: E402


def bench(cl, build, *args, expect_rc=0):
    res = os.path.join(cl.tmp, "bench.json")
    if os.path.exists(res):
        os.unlink(res)
    cmd = [os.path.join(build, "tools", "duet"), "bench-serve", "--no-progress",
           "--result-json", res, "--ignore-eos", "--max-context", "512"] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print(p.stdout[-1500:], flush=True)
    check(p.returncode == expect_rc, "exit %d (want %d): %s\n%s" % (
        p.returncode, expect_rc, cmd, p.stderr[-2000:]))
    if expect_rc != 0:
        return p, None
    with open(res) as f:
        return p, json.load(f)


def check_run(run, n, what):
    check(run["completed"] == n and run["failed"] == 0, "%s: %s" % (what, run["errors"]))
    check(run["output_lens"] == run["requested_output_lens"],
          "%s: output %s, asked %s" % (what, run["output_lens"], run["requested_output_lens"]))
    check(all(t > 0 for t in run["ttfts_ms"]) and run["mean_tpot_ms"] > 0 and
          run["mean_itl_ms"] > 0, "%s: timings %s" % (what, run["ttfts_ms"]))
    check(run["total_output_tokens"] == sum(run["requested_output_lens"]), what)


def generated(cl):
    return cl.metrics().get("duet_router_generation_tokens_total", 0)


def test(build, src):
    cl = Cluster(build, src, prefill=[("p0", 1)], decode=[("d0", 1)])
    try:
        cl.start_workers()
        cl.start_router()
        base = "http://127.0.0.1:%d" % cl.http_port

        # HTTP, closed loop, random lengths; the model name from /v1/models
        before = generated(cl)
        _, r = bench(cl, build, "--base-url", base, "--dataset", "random",
                     "--random-input-len", "24", "--random-output-len", "12",
                     "--range-ratio", "0.5", "--num-requests", "8", "--concurrency", "4")
        check(r["model"] == "stories260K", "model %r" % r["model"])
        run = r["runs"][0]
        check_run(run, 8, "http")
        check(all(12 <= x <= 36 for x in run["input_lens"]), "input lens %s" % run["input_lens"])
        after = generated(cl)
        # the router counted the same tokens (the setup probe asked for 2)
        check(after - before == run["total_output_tokens"] + 2,
              "router generated %d, bench-serve saw %d + 2" % (after - before,
                                                              run["total_output_tokens"]))

        # gRPC, open loop (Poisson 40/s), shared prefix
        _, r = bench(cl, build, "--backend", "grpc", "--grpc-target",
                     "127.0.0.1:%d" % cl.grpc_port, "--dataset", "shared-prefix",
                     "--prefix-len", "32", "--suffix-len", "8", "--output-len", "10",
                     "--num-requests", "8", "--request-rate", "40", "--seed", "3")
        run = r["runs"][0]
        check_run(run, 8, "grpc")
        check(run["input_lens"] == [40] * 8, "grpc input lens %s" % run["input_lens"])

        # chat: the router has no template for stories260K: a clear setup error
        p, _ = bench(cl, build, "--base-url", base, "--backend", "openai-chat",
                     "--num-requests", "2", expect_rc=1)
        check("HTTP 400" in p.stderr and "chat_template_unavailable" in p.stderr, p.stderr)

        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
