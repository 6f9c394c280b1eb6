#!/usr/bin/python3
"""Drains that move work (docs/migration.md "Drains"): one prefill, two
decodes and the router on loopback, streams as in test_router_migrate.py
(greedy, seeded, n = 2 with logprobs over HTTP SSE; greedy, seeded with
logprobs, n = 2 over gRPC).  Every stream runs on d1 (d2 down), d2 comes
up, d1 gets SIGTERM mid-stream: d1 hands every stream back ("decode
draining"), the router continues each on d2 (migrations_total{reason=
"drain"}), every stream ends normally equal to the undisturbed run, and d1
exits 0 within seconds -- long before its streams would have ended.

usage: test_router_drain.py BUILD_DIR SOURCE_DIR
"""
import signal
import time

from router_cluster import Cluster, check, main
from test_router_migrate import (DECODES, N_TOK, STEP_MS, all_on_d1, compare, run_all,
                                 start_decode, wait_healthy, wait_unhealthy)


def drains(cl):
    return cl.metrics().get('duet_router_migrations_total{reason="drain"}', 0)


def test(build, src):
    cl = Cluster(build, src, prefill=[("p1", 1)], decode=[("d1", 1), ("d2", 1)],
                 router={"health_interval_ms": 200, "policy": "round_robin", "migrate_max": 3,
                         "max_prompt_tokens": 8})
    try:
        cl.start("p1")
        cl.wait_worker("p1")
        for d in DECODES:
            start_decode(cl, d)
        cl.start_router()
        wait_healthy(cl, ["p1"] + list(DECODES))
        solo = run_all(cl)

        n_jobs = 9  # 4 HTTP requests and 3 gRPC calls, one of each n = 2
        cl.stop("d2")
        wait_unhealthy(cl, "d2")
        drain = {}

        def sigterm(cl):
            all_on_d1(cl, n_jobs)
            start_decode(cl, "d2")
            wait_healthy(cl, ["d2"])
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
        print("SIGTERM d1 with %d streams on it: d1 exited %s after %.2f s (a stream alone "
              "takes >= %.1f s); every stream equal to the undisturbed run in %.1f s; %d "
              "migrations (reason drain)" % (n_jobs, drain["rc"], drain["s"], stream_s,
                                             time.time() - t0, n))
        check(drain["rc"] == 0, "d1 exited %s:\n%s" % (drain["rc"], cl.procs["d1"].log()))
        check(drain["s"] < stream_s / 2, "the drain took %.2f s" % drain["s"])
        check(n == n_jobs, "drain migrations counted: %s" % n)
        check("handed back to their router" in cl.procs["d1"].log(None), "no drain log line")
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
