"""`duet bench-serve` against a local cluster, as the CPU serving benchmarks
run it (bench/serve_modes.py, bench/prefix_cache.py, bench/prefix_serve.py):
token-id prompts within the 512-token model's context, Poisson arrivals,
--ignore-eos, the result JSON's runs returned.  TRACE_ARGS replays the
Mooncake conversation trace scaled to that context (docs/bench-serve.md)."""
import json
import os
import subprocess

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE = os.path.join(os.path.dirname(SRC), "shared", "traces", "conversation_trace.jsonl")
TRACE_ARGS = ["--dataset", "trace", "--trace", TRACE, "--trace-len-scale", "0.015625",
              "--trace-output-scale", "0.0625", "--trace-block-size", "8"]


def run(build, port, dataset_args, rates, n, out, slo_ttft_ms=100, slo_tpot_ms=2, extra=()):
    """bench-serve with dataset_args at rates ("50,100") against
    127.0.0.1:port, n requests per rate; the result JSON goes to out.
    Returns its "runs"; exits naming bench-serve's output when it fails."""
    args = [os.path.join(build, "tools", "duet"), "bench-serve",
            "--base-url", "http://127.0.0.1:%d" % port, "--ignore-eos",
            "--max-context", "512", "--slo-ttft-ms", str(slo_ttft_ms),
            "--slo-tpot-ms", str(slo_tpot_ms), "--num-requests", str(n),
            "--request-rate", str(rates), "--seed", "1", "--result-json", out]
    args += list(extra) + list(dataset_args)
    r = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit("bench-serve failed (%d):\n%s\n%s" % (r.returncode, r.stdout[-2000:],
                                                               r.stderr[-2000:]))
    with open(out) as f:
        return json.load(f)["runs"]
