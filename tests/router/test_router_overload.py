#!/usr/bin/python3
"""Overload is not failure (docs/migration.md "Overload"): one prefill that
holds every batch (prefill.delay_ms) and runs one prompt per batch, so it
serves a few requests a second; one decode; the router with admission
(router.prefill_wait_max_ms) and a short queue.  Requests offered at about
three times the prefill's capacity must each end as a completion equal to
the oracle or as a clean 429/503 with Retry-After -- none fails mid-way,
although transfer.queue_timeout_ms is short and transfer.on_failure is
fail (a request that waited too long in prefill's queue would fail).
Admission must have refused some and completed most of the rest.

usage: test_router_overload.py BUILD_DIR SOURCE_DIR
"""
import json
import threading
import time

from router_cluster import Cluster, check, detok, main, oracle

DELAY_MS = 300  # per prefill batch: ~3 requests/s
RATE = 10.0     # requests/s offered
SECONDS = 4.0
PROMPT = "Once upon a time"
N_TOK = 8


def offer(cl, n, rate):
    """n requests at a fixed rate, each on its own thread: [(status,
    headers, body)]."""
    out = [None] * n

    def one(k):
        try:
            out[k] = cl.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": N_TOK,
                                                      "temperature": 0}, timeout=60)
        except OSError as e:
            out[k] = (0, {}, {"error": str(e)})
    ts = []
    t0 = time.time()
    for k in range(n):
        time.sleep(max(0.0, t0 + k / rate - time.time()))
        ts.append(threading.Thread(target=one, args=(k,)))
        ts[-1].start()
    for t in ts:
        t.join(90)
    check(not any(t.is_alive() for t in ts), "a client hung")
    return out


def test(build, src):
    cl = Cluster(build, src, prefill=[("p1", 1, {"max_seqs": 1})], decode=[("d1", 1)],
                 router={"queue_limit": 4, "prefill_wait_max_ms": 1000},
                 transfer={"timeout_ms": 3000, "queue_timeout_ms": 3000, "on_failure": "fail"})
    try:
        cl.start("p1", env={"DUET_FAULTS": "prefill.delay_ms=%d" % DELAY_MS})
        cl.start("d1")
        cl.wait_worker("p1")
        cl.wait_worker("d1")
        cl.start_router()
        ids, _ = oracle(build, cl.model, prompt=PROMPT, max_tokens=N_TOK)
        want = detok(cl.model, ids)
        # a first request measures the prefill's rate (its Info)
        st, _, r = cl.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": N_TOK,
                                                    "temperature": 0})
        check(st == 200 and r["choices"][0]["text"] == want, "warm-up: %d %s" % (st, r))
        time.sleep(0.5)
        t0 = time.time()
        res = offer(cl, int(RATE * SECONDS), RATE)
        took = time.time() - t0
        counts = {}
        for k, (st, h, body) in enumerate(res):
            counts[st] = counts.get(st, 0) + 1
            if st == 200:
                check(body["choices"][0]["text"] == want,
                      "request %d: wrong text %s" % (k, json.dumps(body)[:300]))
            else:
                check(st in (429, 503) and "retry-after" in h,
                      "request %d: not a completion nor a clean refusal: %d %s %s" %
                      (k, st, h, json.dumps(body)[:300]))
        print("offered %d requests at %.0f/s to a prefill of ~%.1f/s: %s (%.1f s)" % (
            len(res), RATE, 1000.0 / DELAY_MS, counts, took))
        check(counts.get(200, 0) >= 8, "too few completions: %s" % counts)
        check(counts.get(429, 0) + counts.get(503, 0) >= 1, "admission refused nothing: %s" %
              counts)
        logs = cl.procs["d1"].log(None)
        check("cutting the link" not in logs, "decode cut its link")
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
