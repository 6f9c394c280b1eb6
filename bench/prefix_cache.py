#!/usr/bin/python3
"""The prefix cache on the CPU (docs/prefix-cache.md): one local cluster
(stories260K, prefill TP=1 + decode TP=1, router least_load) with
prefix_cache off on both daemons, then the same with it on, and the same
`duet bench-serve` workloads against each:

  shared-prefix  --prefix-len 384 --suffix-len 32 --num-prefixes 4, 16 output
                 tokens (a system prompt per tenant)
  trace          the Mooncake conversation trace scaled to the model (as
                 docs/bench-serve.md)

Poisson arrivals at each --rates value.  Prints one row per (cache,
workload, rate) with the token hit rate of decode and prefill (their Info
counters over that run) and writes the bench-serve JSONs and a summary.

usage: bench/prefix_cache.py BUILD_DIR [--rates 25,100] [--requests 300]
                             [--out FILE.json]
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


def bench(build, cl, workload, rate, n, out):
    if workload == "shared-prefix":
        ds = ["--dataset", "shared-prefix", "--prefix-len", "384", "--suffix-len", "32",
              "--num-prefixes", "4", "--output-len", "16"]
    else:
        ds = bench_serve_run.TRACE_ARGS
    return bench_serve_run.run(build, cl.http_port, ds, rate, n, out)[0]


def counters(cl):
    out = {}
    for name in ("p0", "d0"):
        i = cl.info(name)
        out[name] = (i.cache_lookup_tokens, i.cache_hit_tokens, i.cache_evictions)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rates", default="25,100")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--out", default="/tmp/prefix_cache.json")
    ap.add_argument("--workloads", default="shared-prefix,trace")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tmp = os.path.splitext(a.out)[0] + ".d"
    os.makedirs(tmp, exist_ok=True)
    rows = []
    for cache in (False, True):
        keys = {"prefix_cache": cache}
        for wl in a.workloads.split(","):
            for rate in a.rates.split(","):
                # a fresh cluster per run: every run starts with a cold cache
                cl = Cluster(build, SRC, [("p0", 1, keys)], [("d0", 1, keys)], n_pages=2048)
                try:
                    cl.start_workers()
                    cl.start_router()
                    r = bench(build, cl, wl, rate, a.requests,
                              os.path.join(tmp, "%s-%s-%s.json" % (
                                  "on" if cache else "off", wl, rate)))
                    c = counters(cl)
                finally:
                    cl.stop_all()
                hit = {k: (v[1] / v[0] if v[0] else 0.0) for k, v in c.items()}
                row = {"prefix_cache": cache, "workload": wl, "request_rate": r["request_rate"],
                       "decode_hit_rate": round(hit["d0"], 4),
                       "prefill_hit_rate": round(hit["p0"], 4),
                       "decode_evictions": c["d0"][2], "prefill_evictions": c["p0"][2],
                       **{k: v for k, v in r.items() if not isinstance(v, (list, dict))}}
                rows.append(row)
                print("cache %-3s %-13s %5s/s: hit d %4.0f%% p %4.0f%%, %6.1f req/s, goodput "
                      "%6.1f, TTFT p50/p99 %7.1f / %7.1f ms, TPOT p50 %5.2f ms"
                      % ("on" if cache else "off", wl, r["request_rate"], 100 * hit["d0"],
                         100 * hit["p0"], r["request_throughput"], r["request_goodput"],
                         r["median_ttft_ms"], r["p99_ttft_ms"], r["median_tpot_ms"]),
                      flush=True)
    with open(a.out, "w") as f:
        json.dump({"what": "bench/prefix_cache.py %s" % " ".join(sys.argv[2:]),
                   "model": "stories260K", "backend": "cpu", "layout": "prefill TP1 + decode TP1",
                   "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
