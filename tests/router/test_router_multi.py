#!/usr/bin/python3
"""duet-router over two prefill (TP 1 and 2) and two decode (TP 2 and 4)
instances: every policy spreads requests over both of each role and every
output equals `duet generate --tp 1` (greedy); a decode killed under load
ends its clients' streams with an error event (no client hangs) when
migration is off (router.migrate_max 0; test_router_migrate.py has it on)
and traffic moves to the other; a decode that dies unnoticed by the health
checks costs no request: the first failure (before any token) is retried
on the other pair.

usage: test_router_multi.py BUILD_DIR SOURCE_DIR
"""
import json
import signal
import threading
import time

from router_cluster import Cluster, check, detok, main, oracle, run_batch

PROMPTS = [("Once upon a time", 20), ("The little dog", 12), ("Lily and Tom", 16),
           ("One day, a bird", 8)]


def expected(cl, build):
    out = {}
    for text, n in PROMPTS:
        ids, _ = oracle(build, cl.model, prompt=text, max_tokens=n)
        out[text] = (ids, detok(cl.model, ids))
    return out


def totals(cl, names):
    return {n: cl.info(n).requests_total for n in names}


def policies(cl, exp):
    dec, pre = ["d2", "d4"], ["p1", "p2"]
    for policy, threads in (("round_robin", 1), ("least_load", 4), ("power_of_two", 4)):
        cl.start_router(args=["--policy", policy])
        before = totals(cl, dec + pre)
        run_batch(cl, PROMPTS, exp, 3, threads)
        after = totals(cl, dec + pre)
        delta = {n: after[n] - before[n] for n in after}
        n_req = 3 * len(PROMPTS)
        check(delta["d2"] + delta["d4"] == n_req and delta["p1"] + delta["p2"] == n_req,
              "%s: %s requests counted for %d sent" % (policy, delta, n_req))
        if policy == "round_robin":
            check(delta == {"d2": n_req // 2, "d4": n_req // 2, "p1": n_req // 2,
                            "p2": n_req // 2}, "round_robin spread %s" % delta)
        else:
            check(all(v > 0 for v in delta.values()), "%s: a worker got nothing: %s" %
                  (policy, delta))
        print("policy %s: %s" % (policy, delta))
        check(cl.stop("router") == 0, "router exit")


def kill_under_load(cl, exp):
    """Streams in flight on a decode that is SIGKILLed end with an error
    event (migration off); new requests go to the other decode."""
    cfg = cl.write_config(cl.tmp + "/no_migration.json", {"migrate_max": 0})
    cl.start_router(config=cfg, args=["--policy", "round_robin"])
    results = [None] * 6
    firsts = [threading.Event() for _ in results]

    def stream(i):
        results[i] = cl.sse_incremental("/v1/completions", {
            "prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True,
            "stream": True, "temperature": 0}, first_event=firsts[i], timeout=60)
    ts = [threading.Thread(target=stream, args=(i,)) for i in range(len(results))]
    for t in ts:
        t.start()
    for e in firsts:  # every stream has its first token: no retry any more
        check(e.wait(20), "a stream got no first token")
    d4 = cl.info("d4")
    check(d4.running + d4.queue_depth > 0, "nothing running on d4 before the kill: %s" % d4)
    cl.procs["d4"].proc.send_signal(signal.SIGKILL)
    cl.procs["d4"].proc.wait()
    for t in ts:
        t.join(60)
    check(not any(t.is_alive() for t in ts), "a streaming client hung after the kill")
    n_err = 0
    for st, ev, raw in results:
        check(st == 200, "stream status %d" % st)
        if ev and ev[-1] == "[DONE]":
            continue
        last = ev[-1]
        check(isinstance(last, dict) and set(last.get("error", {})) ==
              {"message", "type", "param", "code"}, "stream ended without [DONE] or an error "
              "event: %s" % raw[-300:])
        n_err += 1
    check(n_err > 0, "no stream saw the kill (all %d finished)" % len(results))
    print("kill: %d of %d streams ended with an error event" % (n_err, len(results)))
    run_batch(cl, PROMPTS, exp, 2, 2)
    st, _, data = cl.http("GET", "/workers")
    w = {x["name"]: x for x in json.loads(data)["workers"]}
    check(not w["d4"]["healthy"] and w["d2"]["healthy"], "/workers after the kill: %s" % w)
    check(cl.stop("router") == 0, "router exit")


def unnoticed_death(cl, exp):
    """A decode that dies between health checks: the request that meets it
    is retried before its first token and succeeds."""
    cl.start("d4")
    cl.wait_worker("d4")
    cfg = cl.write_config(cl.tmp + "/slow_checks.json", {"health_interval_ms": 600000,
                                                         "policy": "round_robin"})
    cl.start_router(config=cfg)
    # /health needs one healthy worker of each role: wait for all of them
    deadline = time.time() + 10
    while True:
        st, _, data = cl.http("GET", "/workers")
        if all(x["healthy"] for x in json.loads(data)["workers"]) or time.time() > deadline:
            break
        time.sleep(0.05)
    check(all(x["healthy"] for x in json.loads(data)["workers"]), "not all healthy: %s" % data)
    cl.procs["d4"].proc.send_signal(signal.SIGKILL)
    cl.procs["d4"].proc.wait()
    run_batch(cl, PROMPTS, exp, 1, 1)  # 4 sequential requests: round robin meets d4
    # and over gRPC
    ids, _ = oracle(cl.build, cl.model, prompt="The little dog", max_tokens=12)
    for _ in range(2):
        got = []
        for r in cl.router_stub().Generate(cl.gen_request("The little dog", max_tokens=12),
                                           timeout=30):
            if r.HasField("chunk"):
                got += list(r.chunk.ids)
        check(got == ids, "grpc after the kill: %s != %s" % (got, ids))
    m = cl.metrics()
    check(m["duet_router_retries_total"] >= 1, "no retry counted: %s" %
          m["duet_router_retries_total"])
    print("unnoticed death: %d retries, all requests served" % m["duet_router_retries_total"])
    check(cl.stop("router") == 0, "router exit")


def drain(cl, exp):
    """SIGTERM on a decode: its in-flight streams finish ([DONE], full
    length), it leaves the router's rotation (health NOT_SERVING) so new
    requests all go to the other decode, and it exits 0."""
    cl.start("d4")
    cl.wait_worker("d4")
    cl.start_router(args=["--policy", "round_robin"])
    deadline = time.time() + 10
    while True:
        st, _, data = cl.http("GET", "/workers")
        if all(x["healthy"] for x in json.loads(data)["workers"]) or time.time() > deadline:
            break
        time.sleep(0.05)
    results = [None] * 4
    firsts = [threading.Event() for _ in results]

    def stream(i):
        results[i] = cl.sse_incremental("/v1/completions", {
            "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True,
            "stream": True, "temperature": 0}, first_event=firsts[i], timeout=60)
    ts = [threading.Thread(target=stream, args=(i,)) for i in range(len(results))]
    for t in ts:
        t.start()
    for e in firsts:
        check(e.wait(20), "a stream got no first token")
    d4 = cl.info("d4")
    check(d4.running > 0, "nothing running on d4 before SIGTERM: %s" % d4)
    cl.procs["d4"].proc.send_signal(signal.SIGTERM)
    # new traffic while d4 drains: every request must succeed elsewhere
    run_batch(cl, PROMPTS, exp, 1, 2)
    for t in ts:
        t.join(60)
    for st, ev, raw in results:
        check(st == 200 and ev and ev[-1] == "[DONE]",
              "a stream on the draining decode did not finish: %s" % raw[-300:])
    rc = cl.procs["d4"].proc.wait(timeout=30)
    check(rc == 0, "draining decode exited %d" % rc)
    print("drain: %d streams finished during d4's drain, d4 exit 0" % len(results))
    check(cl.stop("router") == 0, "router exit")


def test(build, src):
    cl = Cluster(build, src, prefill=[("p1", 1), ("p2", 2)], decode=[("d2", 2), ("d4", 4)],
                 router={"health_interval_ms": 300})
    try:
        exp = expected(cl, build)
        cl.start_workers()
        policies(cl, exp)
        kill_under_load(cl, exp)
        unnoticed_death(cl, exp)
        drain(cl, exp)
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
