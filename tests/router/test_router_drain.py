#!/usr/bin/python3
"""Drains that move work (docs/migration.md "Drains"): one prefill, two
decodes and the router on loopback, streams as in test_router_migrate.py
(greedy, seeded, n = 2 with logprobs over HTTP SSE; greedy, seeded with
logprobs, n = 2 over gRPC), spread over both decodes.  d1 gets SIGTERM
mid-stream: it goes on generating, the router continues each stream on d2
and cancels it on d1 once d2 sent its first message (make-before-break,
migrations_total{reason="drain"}), every stream ends normally equal to
the undisturbed run, and d1 exits 0 within seconds -- long before its
streams would have ended.  Then d2 is the only decode: a
stream launched there is not handed back on SIGTERM (nowhere to go); the
drain finishes it, equal to an undisturbed run.

usage: test_router_drain.py BUILD_DIR SOURCE_DIR
"""
import json
import signal
import threading
import time

from router_cluster import Cluster, check, main
from test_router_migrate import (DECODES, N_TOK, PROMPT, STEP_MS, compare, run_all, run_http,
                                 start_decode, wait_healthy)


def wait_gone(cl, name, timeout=20):
    """name is out of the router's rotation."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, _, data = cl.http("GET", "/workers")
        if not {x["name"]: x["healthy"] for x in json.loads(data)["workers"]}[name]:
            return
        time.sleep(0.1)
    check(False, "%s still in rotation" % name)


def drains(cl):
    return cl.metrics().get('duet_router_migrations_total{reason="drain"}', 0)


def test(build, src):
    cl = Cluster(build, src, prefill=[("p1", 1)], decode=[("d1", 1), ("d2", 1)],
                 router={"health_interval_ms": 200, "policy": "round_robin", "migrate_max": 3,
                         "migrate_on_drain": True,
                         "max_prompt_tokens": 8})
    try:
        cl.start("p1")
        cl.wait_worker("p1")
        for d in DECODES:
            start_decode(cl, d)
        cl.start_router()
        wait_healthy(cl, ["p1"] + list(DECODES))
        solo = run_all(cl)

        drain = {}

        def sigterm(cl):
            deadline = time.time() + 5
            while cl.info("d1").running < 2 and time.time() < deadline:
                time.sleep(0.02)
            drain["n"] = cl.info("d1").running
            t0 = time.time()
            p = cl.procs["d1"].proc
            p.send_signal(signal.SIGTERM)
            drain["rc"] = p.wait(timeout=30)
            drain["s"] = time.time() - t0
        t0 = time.time()
        got = run_all(cl, sigterm)
        compare(solo, got, "drain")
        n = drains(cl)
        stream_s = N_TOK * STEP_MS / 1000.0
        print("SIGTERM d1 with %d streams decoding on it: d1 exited %s after %.2f s (a stream "
              "alone takes >= %.1f s); every stream equal to the undisturbed run in %.1f s; %d "
              "migrations (reason drain)" % (drain["n"], drain["rc"], drain["s"], stream_s,
                                             time.time() - t0, n))
        check(drain["n"] >= 2, "too few streams on d1: %d" % drain["n"])
        check(drain["rc"] == 0, "d1 exited %s:\n%s" % (drain["rc"], cl.procs["d1"].log()))
        check(drain["s"] < stream_s / 2, "the drain took %.2f s" % drain["s"])
        check(n >= drain["n"], "drain migrations counted: %s for %d streams" % (n, drain["n"]))
        check("handed back to their router" in cl.procs["d1"].log(None), "no drain log line")

        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)

        # d2 alone: nowhere to move a stream, the drain finishes it
        body = {"prompt": PROMPT, "max_tokens": 60, "ignore_eos": True, "stream": True,
                "temperature": 0}
        wait_gone(cl, "d1")
        alone = run_http(cl, body, None)
        first = threading.Event()
        out = {}
        t = threading.Thread(target=lambda: out.update(run_http(cl, body, first)))
        t.start()
        check(first.wait(30), "no first token")
        cl.procs["d2"].proc.send_signal(signal.SIGTERM)
        t.join(60)
        check(out == alone, "the stream on the only decode: %s != %s" % (out, alone))
        check(cl.procs["d2"].proc.wait(timeout=30) == 0, "d2 exit")
        check(drains(cl) == n, "a stream on the only decode was handed back")
        print("d2 alone: SIGTERM mid-stream, the drain finished the stream, equal")
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
