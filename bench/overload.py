#!/usr/bin/python3
"""Overload is not failure (issue 26 item 5): a router + prefill TP=1 +
decode TP=1 (one engine thread each, CPU backend) on the bench-124m
synthetic model (`duet mkmodel --preset bench-124m`), offered the Mooncake
conversation trace (lengths scaled by --len-scale, 1/16 by default, cut to
the model's context) with Poisson arrivals for --duration seconds at each
rate of --rates.  A rate "Nx" is N times the capacity of the single prefill
measured after the runs before it: its Info's prefill_tokens_per_s over
the mean prompt of the last run (Info's prompt_tokens_mean, a moving
average of batch means, when no run completed a request yet).  Each row
also reports the offered rate as a multiple of the capacity measured
after it ran.

Each response is a completion, a clean refusal (HTTP 429 or 503 before any
token) or a failure mid-request (anything else: an SSE error event, a
504, a stream without [DONE]); the target is 0 of the last.  Prints a row
per rate and writes the bench-serve JSONs and a summary under --out.

usage: bench/overload.py BUILD_DIR [--rates 1.5,2x] [--duration 60]
                         [--len-scale 0.0625] [--model DIR] [--out DIR]
                         [--router JSON]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "router"))
sys.path.insert(0, os.path.join(SRC, "tests", "pylib"))

from router_cluster import Cluster  # noqa: E402

from bench_serve_run import TRACE  # noqa: E402


def classify(err):
    """'ok', 'refused' (429/503 before any token) or 'failed'."""
    if not err:
        return "ok"
    if err.startswith("HTTP 429") or err.startswith("HTTP 503"):
        return "refused"
    return "failed"


def capacity(cl, mean=None):
    """(requests/s one prefill sustains at mean prompt tokens, its tokens/s,
    mean) from its Info (None before it measured anything)."""
    i = cl.info("p0", timeout=10)
    mean = mean or i.prompt_tokens_mean
    if not i.prefill_tokens_per_s or not mean:
        return None
    return i.prefill_tokens_per_s / mean, i.prefill_tokens_per_s, mean


def bench(build, cl, rate, duration, len_scale, max_ctx, out):
    n = max(1, int(round(rate * duration)))
    args = [os.path.join(build, "tools", "duet"), "bench-serve",
            "--base-url", "http://127.0.0.1:%d" % cl.http_port, "--ignore-eos",
            "--max-context", str(max_ctx), "--num-requests", str(n),
            "--duration", str(duration), "--request-rate", "%.3f" % rate, "--seed", "1",
            "--no-progress", "--result-json", out,
            "--dataset", "trace", "--trace", TRACE, "--trace-len-scale", str(len_scale),
            "--trace-output-scale", str(len_scale),
            "--trace-block-size", str(max(1, int(512 * len_scale)))]
    r = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit("bench-serve failed (%d):\n%s\n%s" % (r.returncode, r.stdout[-2000:],
                                                               r.stderr[-2000:]))
    with open(out) as f:
        run = json.load(f)["runs"][0]
    kinds = {"ok": 0, "refused": 0, "failed": 0}
    failed = []
    for e in run["errors"]:
        k = classify(e)
        kinds[k] += 1
        if k == "failed":
            failed.append(e)
    return {"rate": round(rate, 3), "requests": run["num_requests"], "completed": kinds["ok"],
            "refused_429_503": kinds["refused"], "failed_mid_request": kinds["failed"],
            "failures": failed[:20], "ttft_p50_ms": run.get("p50_ttft_ms"),
            "ttft_p99_ms": run.get("p99_ttft_ms"), "e2el_p99_ms": run.get("p99_e2el_ms"),
            "mean_input_tokens": round(run["total_input_tokens"] / max(1, kinds["ok"]), 1),
            "duration_s": round(run["duration"], 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rates", default="1.5,2x")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--len-scale", type=float, default=0.0625)
    ap.add_argument("--model", default=None, help="default: duet mkmodel --preset bench-124m")
    ap.add_argument("--out", default=None)
    ap.add_argument("--router", default="{}", help="JSON merged into the router section")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    cl = Cluster(build, SRC, [("p0", 1)], [("d0", 1)], router=json.loads(a.router),
                 n_pages=1024)
    model = a.model
    if model is None:
        model = os.path.join(cl.tmp, "bench-124m")
        subprocess.run([os.path.join(build, "tools", "duet"), "mkmodel", "--preset",
                        "bench-124m", "--out", model], check=True, capture_output=True)
    cl.model = os.path.abspath(model)
    cl.router_cfg.setdefault("max_tokens_limit", 2048)
    cl.write_config()
    with open(os.path.join(cl.model, "config.json")) as f:
        max_ctx = min(2048, json.load(f)["max_position_embeddings"])
    out = a.out or cl.tmp
    os.makedirs(out, exist_ok=True)
    rows = []
    try:
        cl.start_workers()
        cl.start_router()
        mean = None
        for spec in a.rates.split(","):
            cap = capacity(cl, mean)
            if spec.endswith("x"):
                if cap is None:
                    raise SystemExit("overload: %s needs a measured capacity: put a plain "
                                     "rate first" % spec)
                rate = float(spec[:-1]) * cap[0]
            else:
                rate = float(spec)
            t0 = time.time()
            row = bench(build, cl, rate, a.duration, a.len_scale, max_ctx,
                        os.path.join(out, "overload-%s.json" % spec))
            row["offered"] = spec
            row["capacity_before"] = None if cap is None else {
                "req_per_s": round(cap[0], 3), "prefill_tok_per_s": round(cap[1], 1),
                "prompt_tokens_mean": round(cap[2], 1)}
            row["wall_s"] = round(time.time() - t0, 1)
            if row["completed"]:
                mean = row["mean_input_tokens"]
            after = capacity(cl, mean)
            row["capacity_after"] = None if after is None else {
                "req_per_s": round(after[0], 3), "prefill_tok_per_s": round(after[1], 1),
                "prompt_tokens_mean": round(after[2], 1)}
            row["x_capacity_after"] = None if after is None else round(rate / after[0], 2)
            rows.append(row)
            print("overload: %-5s %.2f req/s (%sx capacity after): %d requests, %d completed, "
                  "%d refused (429/503), %d failed mid-request; TTFT p50 %.0f ms p99 %.0f ms" % (
                      spec, rate, row["x_capacity_after"], row["requests"], row["completed"],
                      row["refused_429_503"], row["failed_mid_request"], row["ttft_p50_ms"] or 0,
                      row["ttft_p99_ms"] or 0), flush=True)
            for e in row["failures"][:5]:
                print("  failed:", e[:300], flush=True)
        link_cuts = cl.procs["d0"].log(None).count("cutting the link")
        summary = {"model": "bench-124m (duet mkmodel --preset bench-124m)",
                   "cluster": "router + prefill p0 TP=1 + decode d0 TP=1, 1 thread each, CPU",
                   "router": cl.router_cfg, "transfer": cl.transfer,
                   "len_scale": a.len_scale, "max_context": max_ctx,
                   "duration_s": a.duration, "runs": rows, "decode_link_cuts": link_cuts}
        with open(os.path.join(out, "overload.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print("overload: decode log 'cutting the link': %d; summary in %s" % (
            link_cuts, os.path.join(out, "overload.json")), flush=True)
    finally:
        cl.stop_all()
    sys.exit(1 if any(r["failed_mid_request"] for r in rows) else 0)


if __name__ == "__main__":
    main()
