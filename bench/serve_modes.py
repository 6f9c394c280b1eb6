#!/usr/bin/python3
"""Disaggregated vs colocated vs conditional serving on the same cores:
three local clusters (CPU backend, stories260K, router `least_load`), one
after the other, each given the same two engine threads, and the same
`duet bench-serve` workloads against each:

  disaggregated  prefill TP=1 + decode TP=1 (prefill_local off)
  colocated      two decodes TP=1, prefill_local always, no prefill
  conditional    prefill TP=1 + decode TP=1 with prefill_local auto
                 (prompts up to --local-max tokens prefilled on decode while
                 fewer than 8 sequences decode)

Workloads: random (input 128 +- 50 %, output 32 +- 50 %, --ignore-eos) and
the Mooncake conversation trace scaled to the model (as docs/bench-serve.md),
Poisson arrivals at each --rates value.  Prints one table row per (mode,
workload, rate) and writes every bench-serve JSON under --out.

usage: bench/serve_modes.py BUILD_DIR [--rates 50,100,200] [--requests 400]
                            [--out DIR] [--local-max 128]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "router"))
sys.path.insert(0, os.path.join(SRC, "tests", "pylib"))

from router_cluster import Cluster  # noqa: E402

import bench_serve_run  # noqa: E402

TRACE = bench_serve_run.TRACE


def modes(local_max):
    auto = {"prefill_local": "auto", "prefill_local_max_tokens": local_max}
    return [
        ("disaggregated", [("p0", 1)], [("d0", 1)]),
        ("colocated", [], [("d0", 1, {"prefill_local": "always"}),
                           ("d1", 1, {"prefill_local": "always"})]),
        ("conditional", [("p0", 1)], [("d0", 1, auto)]),
    ]


def bench(build, cl, workload, rates, n, out):
    if workload == "random":
        ds = ["--dataset", "random", "--random-input-len", "128", "--random-output-len", "32",
              "--range-ratio", "0.5"]
    else:
        ds = bench_serve_run.TRACE_ARGS
    return bench_serve_run.run(build, cl.http_port, ds, rates, n, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rates", default="50,100,200")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--out", default="/tmp/serve_modes")
    ap.add_argument("--local-max", type=int, default=128)
    ap.add_argument("--workloads", default="random,trace")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for name, pre, dec in modes(a.local_max):
        cl = Cluster(build, SRC, pre, dec)
        try:
            cl.start_workers()
            cl.start_router()
            for wl in a.workloads.split(","):
                runs = bench(build, cl, wl, a.rates, a.requests,
                             os.path.join(a.out, "%s-%s.json" % (name, wl)))
                counts = {}
                for d in [e["name"] for _, e in cl.instances if _ == "decode"]:
                    i = cl.info(d)
                    counts[d] = (getattr(i, "prefills_local", 0), getattr(i, "prefills_remote", 0))
                for r in runs:
                    rows.append((name, wl, r))
                    print("%-13s %-6s %5s/s: %6.1f req/s, goodput %6.1f, TTFT p50/p99 %7.1f / %7.1f"
                          " ms, TPOT p50/p99 %5.2f / %5.2f ms  (local/remote prefills %s)"
                          % (name, wl, r["request_rate"], r["request_throughput"],
                             r["request_goodput"], r["median_ttft_ms"], r["p99_ttft_ms"],
                             r["median_tpot_ms"], r["p99_tpot_ms"], counts), flush=True)
        finally:
            cl.stop_all()
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump([{"mode": m, "workload": w, **{k: v for k, v in r.items()
                                                 if not isinstance(v, list)}}
                   for m, w, r in rows], f, indent=1)


if __name__ == "__main__":
    main()
