#!/usr/bin/python3
"""duet-router with colocated decodes and conditional disaggregation
(issue 14; docs/design-notes.md "Colocated mode and conditional
disaggregation"):

  colocated    no prefill instance at all, decodes of TP 1 and 2 with
               prefill_local "always": the router starts, every output
               equals `duet generate --tp 1`, /workers shows each decode's
               mode and its local prefills, /metrics counts colocated
               routes, pages back at baseline; one decode SIGKILLed under
               streaming load with migration off (router.migrate_max 0;
               test_router_migrate.py has it on): its streams end with an
               error event, the
               other's finish, new requests go to the survivor, whose
               pages come back
  conditional  a prefill and a decode with prefill_local "auto": a short
               prompt is prefilled on the decode, a long one on the
               prefill (the decode's Info and /workers count each); with
               the prefill SIGKILLed, the router routes whole requests to
               the decode, which prefills them itself

usage: test_router_colocated.py BUILD_DIR SOURCE_DIR
"""
import json
import signal
import threading
import time

from router_cluster import Cluster, check, completion, detok, main, oracle, run_batch

SHORT = ("Once upon a time", 8)
LONG = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
        "in the sun with her dog", 8)


def expected(cl, build, prompts):
    out = {}
    for text, n in prompts:
        ids, _ = oracle(build, cl.model, prompt=text, max_tokens=n)
        out[text] = (ids, detok(cl.model, ids))
    return out


def workers(cl):
    st, _, data = cl.http("GET", "/workers")
    check(st == 200, "/workers status %d" % st)
    return {w["name"]: w for w in json.loads(data)["workers"]}


def wait_for(what, pred, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    check(False, "timed out waiting for " + what)


def colocated(build, src):
    always = {"prefill_local": "always"}
    cl = Cluster(build, src, prefill=[], decode=[("d1", 1, always), ("d2", 2, always)],
                 env={"DUET_FAULTS": "decode.step_delay_ms=10"}, router={"migrate_max": 0})
    try:
        exp = expected(cl, build, [SHORT, LONG])
        cl.start_workers()
        cl.start_router(args=["--policy", "round_robin"])
        run_batch(cl, [SHORT, LONG], exp, 2, 2)
        n = 4
        m = cl.metrics()
        check(m.get('duet_router_routes_total{route="colocated"}') == n and
              m.get('duet_router_routes_total{route="disaggregated"}') == 0,
              "routes: %s" % {k: v for k, v in m.items() if "routes" in k})
        w = wait_for("/workers to show the local prefills",
                     lambda: (lambda w: w if w["d1"]["prefills_local"] +
                              w["d2"]["prefills_local"] == n else None)(workers(cl)))
        check(w["d1"]["prefill_local"] == "always" and w["d2"]["prefills_remote"] == 0,
              "/workers: %s" % w)
        check(m.get('duet_router_worker_prefills_local{role="decode",name="d1"}') is not None,
              "no worker_prefills_local gauge")
        m = wait_for("the decodes' step timing in /metrics",
                     lambda: (lambda m: m if (m.get('duet_router_worker_decode_steps'
                                                    '{role="decode",name="d1"}') or 0) > 0
                              else None)(cl.metrics()))
        check(m.get('duet_router_worker_decode_forward_seconds{role="decode",name="d1"}', 0) > 0,
              "no decode forward time: %s" % {k: v for k, v in m.items() if "decode_" in k})
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        print("colocated: %d requests, no prefill instance" % n)
        kill_under_load(cl, exp)
        cl.stop_all()
    finally:
        cl.kill_all()


def kill_under_load(cl, exp):
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
    cl.procs["d1"].proc.send_signal(signal.SIGKILL)
    cl.procs["d1"].proc.wait()
    for t in ts:
        t.join(60)
    check(not any(t.is_alive() for t in ts), "a streaming client hung after the kill")
    n_err = n_done = 0
    for st, ev, raw in results:
        check(st == 200, "stream status %d" % st)
        if ev and ev[-1] == "[DONE]":
            n_done += 1
            continue
        check(isinstance(ev[-1], dict) and "error" in ev[-1],
              "stream ended without [DONE] or an error event: %s" % raw[-300:])
        n_err += 1
    check(n_err > 0 and n_done > 0, "kill: %d errors, %d finished" % (n_err, n_done))
    wait_for("the router to see d1 down", lambda: not workers(cl)["d1"]["healthy"])
    run_batch(cl, [SHORT, LONG], exp, 1, 2)
    bad = cl.pages_at_baseline()
    check(not bad, "survivor's pages not back: %s" % bad)
    print("kill: %d streams ended with an error event, %d finished" % (n_err, n_done))


def conditional(build, src):
    auto = {"prefill_local": "auto", "prefill_local_max_tokens": 8}
    cl = Cluster(build, src, prefill=[("p1", 1)], decode=[("d0", 2, auto)])
    try:
        exp = expected(cl, build, [SHORT, LONG])
        cl.start_workers()
        cl.start_router()
        for text, n in (SHORT, LONG):
            st, r = completion(cl, text, n)
            check(st == 200 and r["choices"][0]["text"] == exp[text][1],
                  "%s: %d %s" % (text, st, json.dumps(r)[:300]))
        i = cl.info("d0")
        check(i.prefills_local == 1 and i.prefills_remote == 1,
              "short local, long remote: got %d local, %d remote" %
              (i.prefills_local, i.prefills_remote))
        check(cl.metrics().get('duet_router_routes_total{route="disaggregated"}') == 2,
              "disaggregated routes")
        # the prefill dies: whole requests go to the decode, which prefills
        cl.procs["p1"].proc.send_signal(signal.SIGKILL)
        cl.procs["p1"].proc.wait()
        wait_for("the router to see p1 down", lambda: not workers(cl)["p1"]["healthy"])
        st, r = completion(cl, LONG[0], LONG[1])
        check(st == 200 and r["choices"][0]["text"] == exp[LONG[0]][1],
              "without a prefill: %d %s" % (st, json.dumps(r)[:300]))
        i = cl.info("d0")
        check(i.prefills_local == 2 and i.prefills_remote == 1,
              "after the prefill died: %d local, %d remote" %
              (i.prefills_local, i.prefills_remote))
        check(cl.metrics().get('duet_router_routes_total{route="colocated"}') == 1,
              "colocated route not counted")
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        print("conditional: short local, long remote, colocated once the prefill died")
        cl.stop_all()
    finally:
        cl.kill_all()


def test(build, src):
    colocated(build, src)
    conditional(build, src)


if __name__ == "__main__":
    main(test)
