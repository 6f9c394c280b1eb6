#!/usr/bin/python3
"""Prefix caching and KV-aware routing on the CPU (issue 15): one local
cluster of 2 prefill + 2 decode instances (TP 1, one engine thread each,
stories260K) per configuration, and the same `duet bench-serve` workloads
against each:

  off-<base>    no prefix cache, router policy --baseline (round_robin)
  off-cache_aware  no prefix cache, router policy cache_aware
  on-<base>     prefix_cache: true on every instance, the baseline policy
  on-cache_aware   prefix_cache: true, cache_aware routing

Configurations with the cache need the daemons' per-instance
`prefix_cache` key; when the cluster config does not accept it (checked
with `duet-router --check-config`) they are reported as not supported yet
and skipped.

Workloads:
  shared  bench-serve's shared-prefix dataset: --num-prefixes system prompts
          of --prefix-len tokens, each request one of them plus a unique
          suffix (the shared-system-prompt case);
  trace   the Mooncake conversation trace (../shared/traces), scaled to the
          512-token model as docs/bench-serve.md does;
  multiturn  conversations (bench/multi_turn.py): --requests / --turns
          sessions, each turn's prompt the previous prompt + its output ids +
          --new-len new tokens, after a --first-len first prompt, --out-len
          output tokens a turn; each rate is sessions/s.  Shows decode keeping the
          pages of generated tokens (docs/prefix-cache.md "Generated pages").
Poisson arrivals at each --rates value.  One row per (configuration,
workload, rate): TTFT p50/p99, goodput, and the hit rate -- from the
daemons' Info when they report cache counters (every numeric Info field
named *cache* or *hit* is shown as its change over the run), and the
router's own estimate under cache_aware (duet_router_cache_aware_*:
prompt tokens it had already sent to the chosen instance).  Every
bench-serve JSON and a summary.json go under --out.

usage: bench/prefix_serve.py BUILD_DIR [--rates 50] [--requests 400] [--turns 5]
           [--configs off-round_robin,off-cache_aware,on-round_robin,on-cache_aware]
           [--workloads shared,trace,multiturn] [--baseline round_robin] [--out DIR]
           [--cache-aware '{"balance_abs_threshold": 4}']
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "router"))
sys.path.insert(0, os.path.join(SRC, "tests", "pylib"))

from router_cluster import Cluster  # noqa: E402

import bench_serve_run  # noqa: E402
import multi_turn  # noqa: E402

TRACE = bench_serve_run.TRACE
CACHE_WORDS = ("cache", "hit")


def cluster(build, cache, policy, cache_aware=None):
    extra = {"prefix_cache": bool(cache)}  # (on by default: off must say so)
    router = {"policy": policy}
    if cache_aware:
        router["cache_aware"] = cache_aware
    return Cluster(build, SRC, [("p0", 1, dict(extra)), ("p1", 1, dict(extra))],
                   [("d0", 1, dict(extra)), ("d1", 1, dict(extra))], router=router)


def cache_supported(build):
    """(True, "") when the cluster config accepts prefix_cache, else (False, why)."""
    cl = cluster(build, True, "round_robin")
    try:
        r = subprocess.run([os.path.join(build, "router", "duet-router"), "--config", cl.config,
                            "--check-config"], capture_output=True, text=True, timeout=120)
    finally:
        cl.stop_all()
    if r.returncode == 0:
        return True, ""
    msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
    return False, msg[-1] if msg else "duet-router --check-config exited %d" % r.returncode


def cache_counters(cl):
    """{instance: {field: value}} for the numeric Info fields about caching."""
    out = {}
    for _, e in cl.instances:
        info = cl.info(e["name"])
        out[e["name"]] = {f.name: v for f, v in info.ListFields()
                          if isinstance(v, (int, float)) and not isinstance(v, bool) and
                          any(w in f.name for w in CACHE_WORDS)}
    return out


def counter_delta(before, after):
    d = {}
    for inst, fields in after.items():
        for k, v in fields.items():
            if v != before.get(inst, {}).get(k, 0):
                d["%s.%s" % (inst, k)] = v - before.get(inst, {}).get(k, 0)
    return d


def router_estimate(cl):
    """{role: matched/prompt tokens} and {instance: routed} from the
    cache_aware metrics (router)."""
    m = cl.metrics()
    est, routed = {}, {}
    for k, v in m.items():
        if k.startswith("duet_router_cache_aware_routed_total{"):
            name = k.split('name="', 1)[1].split('"', 1)[0]
            routed[name] = routed.get(name, 0) + int(v)
    for role in ("prefill", "decode"):
        matched = sum(v for k, v in m.items()
                      if k.startswith("duet_router_cache_aware_matched_tokens_total{") and
                      'role="%s"' % role in k)
        prompt = sum(v for k, v in m.items()
                     if k.startswith("duet_router_cache_aware_prompt_tokens_total{") and
                     'role="%s"' % role in k)
        if prompt:
            est[role] = matched / prompt
    return est, routed


def bench(build, cl, workload, rate, n, a, out):
    if workload == "multiturn":
        runs = multi_turn.run(cl, float(rate), max(1, n // a.turns), turns=a.turns,
                              first_len=a.first_len, new_len=a.new_len, out_len=a.out_len,
                              slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms)
        with open(out, "w") as f:
            json.dump({"runs": runs}, f, indent=1)
        return runs
    if workload == "shared":
        ds = ["--dataset", "shared-prefix", "--prefix-len", str(a.prefix_len),
              "--suffix-len", str(a.suffix_len), "--num-prefixes", str(a.num_prefixes),
              "--output-len", "32"]
    else:
        ds = bench_serve_run.TRACE_ARGS
    return bench_serve_run.run(build, cl.http_port, ds, rate, n, out, a.slo_ttft_ms,
                               a.slo_tpot_ms, ["--no-progress"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rates", default="50")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--baseline", default="round_robin",
                    help="the cache-oblivious policy compared with cache_aware")
    ap.add_argument("--configs", default=None,
                    help="comma list of off-<policy> / on-<policy> (default: off and on with "
                         "the baseline and with cache_aware)")
    ap.add_argument("--workloads", default="shared,trace")
    ap.add_argument("--cache-aware", default=None, metavar="JSON",
                    help='router.cache_aware for the cache_aware runs, e.g. '
                         '\'{"balance_abs_threshold": 4}\'')
    ap.add_argument("--prefix-len", type=int, default=256)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--num-prefixes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5, help="multiturn: turns per session")
    ap.add_argument("--first-len", type=int, default=60, help="multiturn: first prompt")
    ap.add_argument("--new-len", type=int, default=12, help="multiturn: new tokens a turn")
    ap.add_argument("--out-len", type=int, default=64, help="multiturn: output tokens a turn")
    ap.add_argument("--slo-ttft-ms", type=float, default=100)
    ap.add_argument("--slo-tpot-ms", type=float, default=5)
    ap.add_argument("--out", default="/tmp/prefix_serve")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    if not os.path.exists(TRACE) and "trace" in a.workloads.split(","):
        raise SystemExit("%s: not found (the Mooncake trace; or pass --workloads shared)" % TRACE)
    configs = (a.configs or "off-{b},off-cache_aware,on-{b},on-cache_aware").format(
        b=a.baseline).split(",")
    os.makedirs(a.out, exist_ok=True)
    supported, why = (True, "")
    if any(c.startswith("on-") for c in configs):
        supported, why = cache_supported(build)
        if not supported:
            print("prefix_cache is not supported by this build yet (%s): skipping %s" %
                  (why, ", ".join(c for c in configs if c.startswith("on-"))), flush=True)
    rows = []
    for conf in configs:
        state, _, policy = conf.partition("-")
        if state not in ("off", "on") or not policy:
            raise SystemExit("--configs: '%s' is not off-<policy> or on-<policy>" % conf)
        if state == "on" and not supported:
            continue
        cl = cluster(build, state == "on", policy,
                     json.loads(a.cache_aware) if a.cache_aware and policy == "cache_aware"
                     else None)
        try:
            cl.start_workers()
            for wl in a.workloads.split(","):
                for rate in a.rates.split(","):
                    # a fresh router per run: its cache_aware index and counters
                    # start empty (the daemons' caches, if any, do not)
                    cl.start_router()
                    before = cache_counters(cl)
                    runs = bench(build, cl, wl, rate, a.requests, a,
                                 os.path.join(a.out, "%s-%s-%s.json" % (conf, wl, rate)))
                    delta = counter_delta(before, cache_counters(cl))
                    est, routed = router_estimate(cl) if policy == "cache_aware" else ({}, {})
                    cl.stop("router")
                    for r in runs:
                        rows.append({"config": conf, "workload": wl, "daemon_cache": delta,
                                     "router_estimate": est, "routed": routed,
                                     **{k: v for k, v in r.items() if not isinstance(v, list)}})
                        later = (" (later turns %.1f / %.1f)" %
                                 (r["later_turns_median_ttft_ms"], r["later_turns_p99_ttft_ms"])
                                 if "later_turns_median_ttft_ms" in r else "")
                        print("%-18s %-6s %5s/s: %6.1f req/s, goodput %6.1f, TTFT p50/p99 "
                              "%7.1f / %7.1f ms%s, TPOT p50 %5.2f ms  daemons %s  router est. %s"
                              " routed %s"
                              % (conf, wl, r["request_rate"], r["request_throughput"],
                                 r["request_goodput"], r["median_ttft_ms"], r["p99_ttft_ms"],
                                 later, r["median_tpot_ms"], delta or "-",
                                 {k: round(v, 3) for k, v in est.items()} or "-",
                                 routed or "-"), flush=True)
        finally:
            cl.stop_all()
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"skipped": None if supported else why, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
