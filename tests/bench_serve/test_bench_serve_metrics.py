#!/usr/bin/env python3
"""duet bench-serve's metric definitions against a scripted SSE server
(fake_openai.py): the first token after 150 ms (every second request:
450 ms), then one every 50 ms, 9 tokens.  So each request has TTFT 150 or
450 ms, TPOT = ITL = 50 ms, E2E = TTFT + 8 x 50 ms, and a TTFT SLO of
300 ms is met by exactly half of them.

The server records when it really sent each chunk, and bench-serve's
numbers are checked against those (a starved Python thread on a loaded
machine sends late; the truth is what was sent): every TTFT within
[-1, +40] ms of the server's, every TPOT within 5 ms, every ITL within
25 ms, E2E - TTFT within 25 ms, the duration within 100 ms, and goodput
exactly the count of requests whose true timings meet the SLOs.  A run
whose true timings strayed so far from the script that a request sits
near an SLO threshold (or the gaps are not ~50 ms) is repeated, up to 5
times.

    test_bench_serve_metrics.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
from fake_openai import FakeOpenAI  # noqa: E402
from ports import free_port  # noqa: E402

BUILD = sys.argv[1]
DUET = os.path.join(BUILD, "tools", "duet")
TMP = tempfile.mkdtemp(prefix="duet_bench_serve_")
N, OUT, IN = 6, 9, 32
FAST, SLOW, GAP = 150.0, 450.0, 50.0


class Mismatch(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Mismatch(msg)


def bench_once(port, *args, expect_rc=0, env=None):
    res = os.path.join(TMP, "r.json")
    if os.path.exists(res):
        os.unlink(res)
    cmd = [DUET, "bench-serve", "--base-url", "http://127.0.0.1:%d" % port,
           "--dataset", "random", "--random-input-len", str(IN), "--random-output-len", str(OUT),
           "--num-requests", str(N), "--result-json", res, "--no-progress"] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    check(p.returncode == expect_rc, "%s: exit %d\n%s\n%s" % (cmd, p.returncode, p.stdout,
                                                              p.stderr))
    if expect_rc != 0 or not os.path.exists(res):
        return p, None
    with open(res) as f:
        return p, json.load(f)


def bench(port, *args, srv=None, slo=(None, None), verify=None, expect_rc=0):
    """bench_once and verify(process, JSON, truth), repeated (up to 5 runs)
    while the true timings make the check ambiguous or verify fails: a
    wrong metric fails every time, a loaded machine not."""
    err = None
    for attempt in range(5):
        if srv is not None:
            srv.reset()
        p, r = bench_once(port, *args, expect_rc=expect_rc)
        if srv is None:
            return p, r, None
        truth = srv.truth()
        if not clear(truth, *slo):
            err = "true timings strayed from the script: %s" % truth
        else:
            try:
                if verify is not None:
                    verify(p, r, truth)
                return p, r, truth
            except Mismatch as e:
                err = str(e)
        print("run %d: %s; again" % (attempt + 1, err), flush=True)
    check(False, err)


def tpot(t):
    return sum(t["gaps"]) / len(t["gaps"])


def clear(truth, slo_ttft, slo_tpot):
    """The two TTFT groups, ~50 ms gaps, and no request near an SLO."""
    fast = sorted(t["ttft"] for t in truth)[:N // 2]
    slow = sorted(t["ttft"] for t in truth)[N // 2:]
    if len(truth) != N or max(fast) > FAST + 60 or min(slow) < SLOW - 5 or \
            max(slow) > SLOW + 60:
        return False
    if any(not 35 <= tpot(t) <= 70 for t in truth):
        return False
    if slo_ttft and any(slo_ttft - 45 <= t["ttft"] <= slo_ttft + 5 for t in truth):
        return False
    if slo_tpot and any(abs(tpot(t) - slo_tpot) <= 6 for t in truth):
        return False
    return True


def near(x, want, lo, hi, what):
    check(want - lo <= x <= want + hi, "%s = %.2f, want %.2f (-%g/+%g)" % (what, x, want, lo,
                                                                          hi))


def paired(got, want, lo, hi, what):
    """Sorted against sorted: the pairing with the smallest largest error."""
    check(len(got) == len(want), "%s: %d values, want %d" % (what, len(got), len(want)))
    for g, w in zip(sorted(got), sorted(want)):
        near(g, w, lo, hi, what)


def check_timings(run, truth, what):
    check(run["completed"] == N and run["failed"] == 0, "%s: %s" % (what, run["errors"]))
    check(run["total_output_tokens"] == N * OUT, "%s: output tokens %s" % (what,
                                                                          run["output_lens"]))
    paired(run["ttfts_ms"], [t["ttft"] for t in truth], 1, 40, what + " TTFT")
    near(run["mean_ttft_ms"], sum(t["ttft"] for t in truth) / N, 1, 40, what + " mean TTFT")
    # numpy's median of 6: halfway between the 3rd and 4th
    tt = sorted(t["ttft"] for t in truth)
    near(run["p50_ttft_ms"], (tt[2] + tt[3]) / 2, 1, 40, what + " p50 TTFT")
    near(run["p99_ttft_ms"], tt[4] + 0.95 * (tt[5] - tt[4]), 1, 40, what + " p99 TTFT")
    # TPOT excludes the first token: the mean gap, ~50 (with it: ~(TTFT + 400) / 9)
    paired(run["tpots_ms"], [tpot(t) for t in truth], 5, 5, what + " TPOT")
    itls = [x for per in run["itls_ms"] for x in per]
    paired(itls, [g for t in truth for g in t["gaps"]], 25, 25, what + " ITL")
    true_gaps = [g for t in truth for g in t["gaps"]]
    near(run["mean_itl_ms"], sum(true_gaps) / len(true_gaps), 5, 5, what + " mean ITL")
    paired([e - t for e, t in zip(run["e2els_ms"], run["ttfts_ms"])],
           [sum(t["gaps"]) for t in truth], 25, 25, what + " E2E - TTFT")
    # throughput: completed / duration, tokens / duration
    d = run["duration"]
    d_true = max(t["last"] for t in truth) - min(t["arrival"] for t in truth)
    near(d, d_true, 0.002, 0.1, what + " duration (s)")
    check(abs(run["request_throughput"] - N / d) < 1e-6, what + " request throughput")
    check(abs(run["output_throughput"] - N * OUT / d) < 1e-6, what + " output throughput")


def good(truth, slo_ttft, slo_tpot):
    return sum(1 for t in truth if t["ttft"] <= slo_ttft and tpot(t) <= slo_tpot)


def main():
    port = free_port()
    srv = FakeOpenAI(port, ttft_s=FAST / 1e3, slow_ttft_s=SLOW / 1e3, itl_s=GAP / 1e3)
    try:
        # all N at once: TTFT, TPOT, ITL, E2E, counts, and goodput with a TTFT
        # SLO between the two groups (half) and a TPOT SLO above 50 ms
        def first(p, r, truth):
            run = r["runs"][0]
            check_timings(run, truth, "completions")
            check(good(truth, 300, 70) == N // 2, "true timings: %s" % truth)
            check(run["good_requests"] == N // 2, "SLO 300/70: %d good, want %d" % (
                run["good_requests"], N // 2))
            check(abs(run["request_goodput"] - (N // 2) / run["duration"]) < 1e-6, "goodput")

        p, r, truth = bench(port, "--concurrency", str(N), "--ignore-eos", "--api-key", "sekrit",
                            "--slo-ttft-ms", "300", "--slo-tpot-ms", "70", srv=srv,
                            slo=(300, 70), verify=first)
        check("Request goodput (req/s):" in p.stdout and "Mean TPOT" in p.stdout, p.stdout)
        check(r["model"] == "fake-model", "model from /v1/models: %r" % r["model"])
        reqs = srv.bench_requests()
        check(len(reqs) == N, "%d requests reached the server" % len(reqs))
        for path, body, headers, _ in reqs:
            check(path == "/v1/completions", path)
            check(body["stream"] is True and body["stream_options"] == {"include_usage": True},
                  "stream fields: %s" % body)
            check(body["ignore_eos"] is True and body["max_tokens"] == OUT, body)
            check(body["model"] == "fake-model", body)
            check(len(body["prompt"]) == IN and all(3 <= t < 512 for t in body["prompt"]),
                  "prompt ids: %s" % body["prompt"])
            check(headers.get("Authorization") == "Bearer sekrit", headers)
        srv.reset()

        # the TTFT SLO above both groups: all good; a TPOT SLO under 50: none
        def goodput(slo_ttft, slo_tpot, want):
            def verify(p, r, truth):
                got = r["runs"][0]["good_requests"]
                check(good(truth, slo_ttft, slo_tpot) == want, "true timings: %s" % truth)
                check(got == want, "SLO %g/%g: %d good, want %d" % (slo_ttft, slo_tpot, got,
                                                                     want))
            bench(port, "--concurrency", str(N), "--slo-ttft-ms", str(slo_ttft), "--slo-tpot-ms",
                  str(slo_tpot), srv=srv, slo=(slo_ttft, slo_tpot), verify=verify)

        goodput(700, 70, N)
        goodput(700, 40, 0)

        # chat: delta.content chunks, text prompts
        bench(port, "--concurrency", str(N), "--backend", "openai-chat", "--model", "m1",
              srv=srv, verify=lambda p, r, truth: check_timings(r["runs"][0], truth, "chat"))
        for path, body, _, _ in srv.bench_requests():
            check(path == "/v1/chat/completions" and body["model"] == "m1", (path, body))
            words = body["messages"][0]["content"].split()
            check(len(words) == IN, "chat prompt of %d words" % len(words))
        srv.reset()

        # closed loop with 2 in flight: requests start as others finish
        _, r, _ = bench(port, "--concurrency", "2")
        run = r["runs"][0]
        check(run["completed"] == N, run["errors"])
        arrivals = sorted(t for *_, t in srv.bench_requests())
        check(arrivals[2] - arrivals[0] >= (FAST + (OUT - 1) * GAP) / 1e3 - 0.02,
              "closed loop: third request %.3f s after the first, before one finished" %
              (arrivals[2] - arrivals[0]))
        srv.reset()

        # --duration: no request starts after 0.5 s; those started finish
        _, r, _ = bench(port, "--request-rate", "20", "--num-requests", "500", "--duration",
                     "0.5", "--seed", "5")
        run = r["runs"][0]
        arrivals = sorted(t for *_, t in srv.bench_requests())
        check(2 <= run["num_requests"] < 40 and run["completed"] == run["num_requests"] and
              len(arrivals) == run["num_requests"], "duration: %d launched, %d completed, %d "
              "at the server" % (run["num_requests"], run["completed"], len(arrivals)))
        check(arrivals[-1] - arrivals[0] <= 0.5 + 0.05, "a request started %.3f s in" %
              (arrivals[-1] - arrivals[0]))
        srv.reset()

        # open loop sweep (Poisson; 2 rates) with plots
        plot = os.path.join(TMP, "plots")
        _, r, _ = bench(port, "--request-rate", "10,1000", "--seed", "7", "--slo-ttft-ms", "300",
                        "--plot", plot)
        check(len(r["runs"]) == 2 and [x["request_rate"] for x in r["runs"]] == [10, 1000],
              "sweep runs: %s" % [x["request_rate"] for x in r["runs"]])
        for x in r["runs"]:
            check(x["completed"] == N, x["errors"])
        for f in ("cdf.png", "goodput.png", "plot.gp", "ttft_0.dat", "tpot_1.dat",
                  "goodput.dat"):
            path = os.path.join(plot, f)
            check(os.path.exists(path) and os.path.getsize(path) > 0, "plot file %s" % f)
        with open(os.path.join(plot, "cdf.png"), "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "cdf.png is not a PNG")
        srv.reset()

        # no gnuplot on the PATH: a clear message, exit 1, the data still there
        plot2 = os.path.join(TMP, "plots2")
        p, r = bench_once(port, "--request-rate", "1000", "--plot", plot2, expect_rc=1,
                          env=dict(os.environ, PATH="/nonexistent"))
        check("gnuplot is not installed" in p.stderr and plot2 in p.stderr, p.stderr)
        check(os.path.exists(os.path.join(plot2, "plot.gp")) and
              os.path.exists(os.path.join(plot2, "ttft_0.dat")) and
              not os.path.exists(os.path.join(plot2, "cdf.png")), "plot files without gnuplot")
        check(os.path.exists(os.path.join(TMP, "r.json")), "no JSON when plotting failed")
        srv.reset()

        # --api-key is refused for gRPC; $OPENAI_API_KEY is not sent there
        p = subprocess.run([DUET, "bench-serve", "--backend", "grpc", "--grpc-target",
                            "127.0.0.1:1", "--api-key", "k"], capture_output=True, text=True)
        check(p.returncode == 2 and "--api-key" in p.stderr, p.stderr)
        p = subprocess.run([DUET, "bench-serve", "--request-rate", "fast"], capture_output=True,
                           text=True)
        check(p.returncode == 2 and "--request-rate fast" in p.stderr, p.stderr)
    finally:
        srv.close()

    # a server that refuses stream_options: counts come from the chunks
    port = free_port()
    srv = FakeOpenAI(port, ttft_s=FAST / 1e3, slow_ttft_s=SLOW / 1e3, itl_s=GAP / 1e3,
                     reject_stream_options=True)
    try:
        p, r, truth = bench(port, "--concurrency", str(N), srv=srv,
                            verify=lambda p, r, truth: check_timings(r["runs"][0], truth,
                                                                     "no usage"))
        check("stream_options" in p.stderr, "no note about stream_options: %s" % p.stderr)
        for _, body, _, _ in srv.bench_requests():
            check("stream_options" not in body, "stream_options still sent")
    finally:
        srv.close()

    # nothing listening: a clear error, exit 1
    p, _ = bench_once(free_port(), expect_rc=1)
    check("Could not connect" in p.stderr or "Couldn't connect" in p.stderr, p.stderr)
    print("ok")


if __name__ == "__main__":
    try:
        main()
    except Mismatch as e:
        print("FAIL:", e, flush=True)
        sys.exit(1)
