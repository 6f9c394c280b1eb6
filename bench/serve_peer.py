#!/usr/bin/python3
"""duet against llama.cpp's llama-server on the same cores, weights and
workloads: the CPU peer of issue 14.

Systems, each started fresh for its turn and stopped after it:

  llama-server   one process, the model converted by bench/peer/st_to_gguf.py
                 (f32, same weights), -t/-tb THREADS, -np SLOTS parallel
                 slots, -c SLOTS*512 (llama-server splits -c over its slots),
                 continuous batching, flash attention (-fa; see docs)
  disaggregated, colocated, conditional
                 duet's local clusters exactly as bench/serve_modes.py starts
                 them (two engine threads in each)

Workloads and load: bench/serve_modes.py's `bench()` (the same `duet
bench-serve` arguments: random 128/32 +- 50 % and the scaled Mooncake trace,
Poisson arrivals at each --rates value, --requests per rate, seed 1, SLO
TTFT <= 100 ms and TPOT <= 2 ms, --ignore-eos, token-id prompts).

Fairness: this process pins itself to --cpus before starting anything, so
every server, daemon, router and the bench-serve client runs on the same
cores for every system; the systems run in --rounds rounds, the order
reversed every other round (llama-server first, then last, ...), and the
reported value of a metric is its median over the rounds (the JSON keeps
each round, and the load average before and after each system's turn).

usage: bench/serve_peer.py BUILD_DIR --llama-server BIN [--gguf FILE]
           [--rates 10,50,100,200] [--requests 200] [--rounds 3]
           [--threads 2] [--slots 8] [--cpus 0,1] [--out DIR]
           [--result FILE]
       bench/serve_peer.py --table RESULT.json [MODE,...]   (the table in docs/performance.md)
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "peer"))

import serve_modes  # noqa: E402  (puts tests/router and tests/pylib on sys.path)
from llama_server import LlamaServer, version  # noqa: E402
from ports import free_port  # noqa: E402
from router_cluster import Cluster  # noqa: E402

SUMMARY_KEYS = ["request_rate", "duration", "completed", "failed", "good_requests",
                "total_input_tokens", "total_output_tokens", "request_throughput",
                "request_goodput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
                "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms"]
# the ratios reported (duet / llama-server); for latencies below 1 is better
RATIO_KEYS = ["request_throughput", "output_throughput", "request_goodput", "median_ttft_ms",
              "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms"]


class _Port:
    """What serve_modes.bench() needs of a cluster: the HTTP port."""

    def __init__(self, port):
        self.http_port = port


def run_llama(a, build, workloads, round_no):
    srv = LlamaServer(a.llama_server, a.gguf, free_port(), threads=a.threads, slots=a.slots,
                      extra=["-fa"], log_path=os.path.join(a.out, "llama-server-r%d.log" % round_no))
    out = {}
    with srv:
        for wl in workloads:
            out[wl] = serve_modes.bench(build, _Port(srv.port), wl, a.rates, a.requests,
                                        os.path.join(a.out, "llama-server-%s-r%d.json"
                                                     % (wl, round_no)))
    return out, srv.argv


def run_duet(a, build, mode, workloads, round_no):
    name, pre, dec = mode
    cl = Cluster(build, SRC, pre, dec)
    out = {}
    try:
        cl.start_workers()
        cl.start_router()
        for wl in workloads:
            out[wl] = serve_modes.bench(build, cl, wl, a.rates, a.requests,
                                        os.path.join(a.out, "%s-%s-r%d.json" % (name, wl, round_no)))
    finally:
        cl.stop_all()
    return out


def summarize(runs):
    return [{k: r.get(k) for k in SUMMARY_KEYS} for r in runs]


def median_over_rounds(per_round):
    """per_round: [[summary per rate] per round] -> [median summary per rate]
    (each metric on its own: a round disturbed by other work on a shared
    machine does not move it when there are three or more rounds)."""
    out = []
    for i, first in enumerate(per_round[0]):
        m = {"request_rate": first["request_rate"]}
        for k in SUMMARY_KEYS[1:]:
            vals = [r[i][k] for r in per_round if r[i].get(k) is not None]
            m[k] = statistics.median(vals) if vals else None
        out.append(m)
    return out


def loadavg():
    """The 1-minute load average: the machine may be shared while measuring."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def git_head():
    r = subprocess.run(["git", "-C", SRC, "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True)
    return r.stdout.strip() or "unknown"


def ratio(x):
    """A duet / llama-server ratio: "2.1" above 1, "1/530" below."""
    if x is None:
        return "–"
    if x >= 1:
        return "%.2g" % x if x < 10 else "%.0f" % x
    inv = 1.0 / x
    return "1/%s" % ("%.2g" % inv if inv < 10 else "%d" % float("%.2g" % inv))


def table(path, modes=None):
    """The docs/performance.md table (Markdown) from a result JSON of this script."""
    doc = json.load(open(path))
    med, rat = doc["median"], doc["duet_over_llama"]
    duet = modes or [s for s in med if s != "llama-server"]
    tok = all(abs(rat[d][wl][i]["request_throughput"] - rat[d][wl][i]["output_throughput"])
              < 0.02 * rat[d][wl][i]["request_throughput"]
              for d in duet for wl in rat[d] for i in range(len(rat[d][wl])))
    print("| workload, offered | llama-server req/s (out tok/s) | its TTFT p50 / p99 (ms) | "
          "its TPOT p50 / p99 (ms) | duet%s ÷ llama-server: req/s%s | TTFT p50 | TTFT p99 | "
          "TPOT p50 | TPOT p99 |" % (" (" + " · ".join(duet) + ")" if len(duet) > 1 else
                                     " " + duet[0], " = out tok/s" if tok else ""))
    print("|---" * 9 + "|")
    names = {"random": "random 128/32", "trace": "trace (scaled)"}
    for wl in med["llama-server"]:
        for i, l in enumerate(med["llama-server"][wl]):
            cells = [" · ".join(ratio(rat[d][wl][i][k]) for d in duet)
                     for k in ("request_throughput", "median_ttft_ms", "p99_ttft_ms",
                               "median_tpot_ms", "p99_tpot_ms")]
            print("| %s, %s/s | %.1f (%.0f) | %.0f / %.0f | %.1f / %.1f | %s |"
                  % (names.get(wl, wl), l["request_rate"], l["request_throughput"],
                     l["output_throughput"], l["median_ttft_ms"], l["p99_ttft_ms"],
                     l["median_tpot_ms"], l["p99_tpot_ms"], " | ".join(cells)))


def main():
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--table":
        table(sys.argv[2], sys.argv[3].split(",") if len(sys.argv) == 4 else None)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--gguf", help="the converted model (default: convert models/stories260K "
                                   "into --out)")
    ap.add_argument("--rates", default="10,50,100,200")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t/-tb")
    ap.add_argument("--slots", type=int, default=8, help="llama-server -np")
    ap.add_argument("--cpus", default=None, help="CPU list for everything (default: all)")
    ap.add_argument("--workloads", default="random,trace")
    ap.add_argument("--modes", default="disaggregated,colocated,conditional")
    ap.add_argument("--local-max", type=int, default=128)
    ap.add_argument("--out", default="/tmp/serve_peer")
    ap.add_argument("--result", help="write the summary JSON here (e.g. docs/results/...)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.makedirs(a.out, exist_ok=True)
    if not os.access(a.llama_server, os.X_OK):
        raise SystemExit("--llama-server %s is not an executable (build it with "
                         "bench/peer/build_llama_server.sh)" % a.llama_server)
    cpus = sorted(os.sched_getaffinity(0))
    if a.cpus:
        cpus = sorted({int(c) for c in a.cpus.split(",")})
        os.sched_setaffinity(0, cpus)  # inherited by every process started below
    if not a.gguf:
        a.gguf = os.path.join(a.out, "stories260K-f32.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "peer", "st_to_gguf.py"),
                        os.path.join(SRC, "models", "stories260K"), a.gguf], check=True)
    workloads = a.workloads.split(",")
    modes = [m for m in serve_modes.modes(a.local_max) if m[0] in a.modes.split(",")]
    systems = ["llama-server"] + [m[0] for m in modes]
    results = {s: {wl: [] for wl in workloads} for s in systems}
    llama_argv = None
    loads = []
    for rnd in range(a.rounds):
        order = systems if rnd % 2 == 0 else list(reversed(systems))
        for s in order:
            load_before = loadavg()
            if s == "llama-server":
                got, llama_argv = run_llama(a, build, workloads, rnd)
            else:
                got = run_duet(a, build, next(m for m in modes if m[0] == s), workloads, rnd)
            loads.append({"round": rnd, "system": s, "loadavg_before": load_before,
                          "loadavg_after": loadavg()})
            for wl in workloads:
                results[s][wl].append(summarize(got[wl]))
                for r in got[wl]:
                    print("round %d %-13s %-6s %5s/s: %6.1f req/s, goodput %6.1f, TTFT p50/p99 "
                          "%8.1f / %8.1f ms, TPOT p50/p99 %6.2f / %6.2f ms"
                          % (rnd, s, wl, r["request_rate"], r["request_throughput"],
                             r["request_goodput"], r["median_ttft_ms"], r["p99_ttft_ms"],
                             r["median_tpot_ms"], r["p99_tpot_ms"]), flush=True)

    means = {s: {wl: median_over_rounds(results[s][wl]) for wl in workloads} for s in systems}
    ratios = {}
    for s in systems[1:]:
        ratios[s] = {}
        for wl in workloads:
            rows = []
            for d, l in zip(means[s][wl], means["llama-server"][wl]):
                rows.append({"request_rate": d["request_rate"],
                             **{k: (d[k] / l[k] if d[k] is not None and l[k] else None)
                                for k in RATIO_KEYS}})
            ratios[s][wl] = rows
    commit_file = a.llama_server + ".commit"
    llama_commit = open(commit_file).read().strip() if os.path.exists(commit_file) else "unknown"
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus_used": cpus, "nproc": os.cpu_count(), "platform": platform.platform(),
                    "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                                 if ln.startswith("model name")), "unknown")},
        "duet_commit": git_head(),
        "llama_server": {"commit": llama_commit, "version": version(a.llama_server),
                         "argv": [os.path.basename(x) if os.path.isabs(x) else x
                                  for x in (llama_argv or [])],
                         "threads": a.threads, "slots": a.slots, "ctx_per_slot": 512},
        "bench": {"rates": a.rates, "requests_per_rate": a.requests, "rounds": a.rounds,
                  "workloads": workloads, "seed": 1, "slo_ttft_ms": 100, "slo_tpot_ms": 2,
                  "bench_args": "bench/serve_modes.py bench()"},
        "median": means, "duet_over_llama": ratios, "per_round": results,
        "loadavg": loads,
    }
    path = a.result or os.path.join(a.out, "summary.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", path)
    for wl in workloads:
        for i, l in enumerate(means["llama-server"][wl]):
            print("%-6s %5s/s llama-server %6.1f req/s TTFT p50/p99 %7.1f/%8.1f TPOT %5.2f/%6.2f | "
                  % (wl, l["request_rate"], l["request_throughput"], l["median_ttft_ms"],
                     l["p99_ttft_ms"], l["median_tpot_ms"], l["p99_tpot_ms"]) +
                  "  ".join("%s x%.2f req/s, TTFT p50 x%.2f p99 x%.2f, TPOT p50 x%.2f p99 x%.2f"
                            % (s[:5], ratios[s][wl][i]["request_throughput"],
                               ratios[s][wl][i]["median_ttft_ms"], ratios[s][wl][i]["p99_ttft_ms"],
                               ratios[s][wl][i]["median_tpot_ms"], ratios[s][wl][i]["p99_tpot_ms"])
                            for s in systems[1:]))


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:  # llama-server did not start: its log tail is in the message
        sys.exit("serve_peer.py: %s" % e)
