#!/usr/bin/env python3
"""duet bench-serve's Mooncake trace replay: bad lines fail with the file,
the line number and the field; a good trace is scaled (lengths, block
size, time) and its hash ids become shared prompt blocks, checked on what
the scripted server (fake_openai.py) received; every rate of a sweep sends
its own prompts unless --reuse-prompts.

    test_bench_serve_trace.py BUILD_DIR SOURCE_DIR
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

DUET = os.path.join(sys.argv[1], "tools", "duet")
TMP = tempfile.mkdtemp(prefix="duet_bench_trace_")
GOOD = {"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [0, 1]}


def check(cond, msg):
    if not cond:
        print("FAIL:", msg, flush=True)
        sys.exit(1)


def write(name, lines):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        for l in lines:
            f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
    return path


def run(path, *args, port=None):
    cmd = [DUET, "bench-serve", "--dataset", "trace", "--trace", path, "--no-progress",
           "--base-url", "http://127.0.0.1:%d" % (port or free_port())] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def bad(name, lines, *want):
    path = write(name, lines)
    p = run(path)
    check(p.returncode == 1, "%s: exit %d (want 1)\n%s" % (name, p.returncode, p.stderr))
    for w in want:
        check(w in p.stderr, "%s: %r not in the error: %s" % (name, w, p.stderr))
    check("connect" not in p.stderr, "%s: got as far as connecting: %s" % (name, p.stderr))


def blocks(prompts, n=8):
    """Every aligned n-token block of the prompts."""
    return {tuple(x[i:i + n]) for x in prompts for i in range(0, len(x) - n + 1, n)}


def sweep(srv, cmd, n):
    """Run a two-rate sweep; the prompts the server got from each rate."""
    srv.reset()
    p = subprocess.run(cmd + ["--request-rate", "1000,2000"], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0, p.stdout + p.stderr)
    reqs = srv.bench_requests()  # in arrival order: the second rate starts after the first
    check(len(reqs) == 2 * n, "%d requests in a sweep of 2 x %d" % (len(reqs), n))
    return [r[1]["prompt"] for r in reqs[:n]], [r[1]["prompt"] for r in reqs[n:]]


def sweeps_get_their_own_prompts(srv, port, trace, prompts):
    """Each rate of a sweep sends its own prompts (a prefix cache warmed by
    one rate must not serve the next): the same lengths and the same
    sharing within the rate, no block in common with another rate;
    --reuse-prompts sends the same ones."""
    url = ["--base-url", "http://127.0.0.1:%d" % port, "--no-progress"]
    tcmd = [DUET, "bench-serve", "--dataset", "trace", "--trace", trace, "--trace-len-scale",
            "0.25", "--trace-block-size", "8", "--max-context", "512"] + url
    first, second = sweep(srv, tcmd, 4)
    check(sorted(map(tuple, first)) == sorted(map(tuple, prompts)),
          "the first rate's prompts are not the trace's usual ones")
    check(sorted(map(len, first)) == sorted(map(len, second)), "lengths differ between rates")
    check(not blocks(first) & blocks(second), "two rates share prompt blocks")
    by_len = {len(x): x for x in second}
    a, b, c = by_len[24], by_len[16], by_len[20]
    check(a[:16] == b and a[:8] == c[:8] and a[8:16] != c[8:16],
          "the second rate lost the trace's shared blocks")
    first, second = sweep(srv, tcmd + ["--reuse-prompts"], 4)
    check(sorted(first) == sorted(second), "--reuse-prompts: the rates' prompts differ")

    scmd = [DUET, "bench-serve", "--dataset", "shared-prefix", "--prefix-len", "16",
            "--suffix-len", "8", "--num-prefixes", "2", "--output-len", "2", "--num-requests",
            "4"] + url
    first, second = sweep(srv, scmd, 4)
    check(not blocks(first) & blocks(second), "shared-prefix: two rates share prompt blocks")
    for rate in (first, second):
        heads = sorted(tuple(x[:16]) for x in rate)
        check(heads[0] == heads[1] and heads[2] == heads[3] and heads[1] != heads[2],
              "shared-prefix: not 2 prefixes of 2 requests each")
    rcmd = [DUET, "bench-serve", "--dataset", "random", "--random-input-len", "24",
            "--random-output-len", "2", "--num-requests", "3"] + url
    first, second = sweep(srv, rcmd, 3)
    check(not blocks(first) & blocks(second), "random: two rates share prompt blocks")
    first, second = sweep(srv, rcmd + ["--reuse-prompts"], 3)
    check(sorted(first) == sorted(second), "random --reuse-prompts: the rates' prompts differ")
    print("sweeps: every rate its own prompts; --reuse-prompts the same", flush=True)


def main():
    def without(k):
        return {x: v for x, v in GOOD.items() if x != k}

    bad("missing.jsonl", [GOOD, GOOD, without("input_length")], "missing.jsonl:3:",
        "'input_length'", "missing")
    bad("notjson.jsonl", [GOOD, '{"timestamp": 1, "input_length": 3'], "notjson.jsonl:2:",
        "not a JSON object")
    bad("negative.jsonl", [dict(GOOD, output_length=-5)], "negative.jsonl:1:",
        "'output_length'", "non-negative integer")
    bad("string.jsonl", [GOOD, "", dict(GOOD, timestamp="soon")], "string.jsonl:3:",
        "'timestamp'")  # the blank line 2 is skipped but counted
    bad("hash.jsonl", [dict(GOOD, hash_ids=[1, "x"])], "hash.jsonl:1:", "'hash_ids' element 1")
    bad("hashtype.jsonl", [dict(GOOD, hash_ids=7)], "hashtype.jsonl:1:", "'hash_ids'",
        "array")
    bad("nohash.jsonl", [without("hash_ids")], "nohash.jsonl:1:", "'hash_ids'", "missing")
    bad("zero.jsonl", [dict(GOOD, input_length=0)], "zero.jsonl:1:", "'input_length'")
    bad("empty.jsonl", [""], "empty.jsonl", "no requests")
    p = run(os.path.join(TMP, "absent.jsonl"))
    check(p.returncode == 1 and "absent.jsonl" in p.stderr, p.stderr)

    # a good trace, scaled by 1/4: 512-token blocks become 128, then cut to
    # blocks of 8 tokens (--trace-block-size); timestamps x 0.5
    trace = write("good.jsonl", [
        {"timestamp": 1000, "input_length": 96, "output_length": 20, "hash_ids": [5, 6, 7]},
        {"timestamp": 1400, "input_length": 64, "output_length": 8, "hash_ids": [5, 6]},
        {"timestamp": 2200, "input_length": 80, "output_length": 12, "hash_ids": [5, 9, 10]},
        {"timestamp": 2200, "input_length": 4000, "output_length": 4, "hash_ids": [11]},
    ])
    port = free_port()
    srv = FakeOpenAI(port, ttft_s=0.01, slow_ttft_s=0.01, itl_s=0.005)
    try:
        res = os.path.join(TMP, "r.json")
        for attempt in range(4):  # arrival times: again if a loaded machine stalled us
            srv.reset()
            p = run(trace, "--trace-len-scale", "0.25", "--trace-block-size", "8",
                    "--trace-time-scale", "0.5", "--max-context", "512", "--result-json", res,
                    port=port)
            check(p.returncode == 0, p.stdout + p.stderr)
            t = sorted(r[3] for r in srv.bench_requests())
            gaps = [(x - t[0]) * 1e3 for x in t]
            if all(want - 5 <= got <= want + 60 for got, want in zip(gaps, [0, 200, 600, 600])):
                break
            print("arrivals %s (want 0 200 600 600); again" % gaps, flush=True)
        else:
            check(False, "arrivals %s, want 0 200 600 600 (+60 ms)" % gaps)
        check("1 of 4 prompts cut" in p.stderr, p.stderr)
        reqs = srv.bench_requests()
        check(len(reqs) == 4, "%d requests" % len(reqs))
        prompts = [r[1]["prompt"] for r in reqs]
        by_len = {len(x): x for x in prompts}
        check(sorted(by_len) == [16, 20, 24, 511], "prompt lengths %s" % sorted(by_len))
        a, b, c = by_len[24], by_len[16], by_len[20]
        check(a[:16] == b, "hash ids 5,6 shared: first 16 tokens differ")
        check(a[:8] == c[:8] and a[8:16] != c[8:16], "hash 5 shared, 6 vs 9 not")
        check(c[16:20] != a[16:20], "block 10 is its own")
        check(by_len[511][:8] not in (a[:8], a[8:16], c[8:16]), "block 11 is its own")
        outs = {len(r[1]["prompt"]): r[1]["max_tokens"] for r in reqs}
        check(outs == {24: 5, 16: 2, 20: 3, 511: 1}, "max_tokens %s" % outs)
        with open(res) as f:
            r = json.load(f)
        check(r["dataset"] == "trace" and r["trace_times"] is True, r)
        check(r["runs"][0]["completed"] == 4, r["runs"][0]["errors"])
        # the same trace replayed gives the same prompts (deterministic content)
        srv.reset()
        p = run(trace, "--trace-len-scale", "0.25", "--trace-block-size", "8",
                "--trace-time-scale", "0", "--max-context", "512", port=port)
        check(p.returncode == 0, p.stderr)
        check(sorted(map(tuple, (r[1]["prompt"] for r in srv.bench_requests()))) ==
              sorted(map(tuple, prompts)), "prompts differ between two replays")
        sweeps_get_their_own_prompts(srv, port, trace, prompts)
    finally:
        srv.close()
    print("ok")


if __name__ == "__main__":
    main()
