#!/usr/bin/python3
"""Drains under load (docs/migration.md "Drains"): two prefills, two
decodes (steps slowed by decode.step_delay_ms) and the router on loopback,
a bounded loop of streaming HTTP clients (greedy and seeded sampling, each
compared with its undisturbed run, which for greedy also equals `duet
generate`):

  rolling  every decode in turn gets SIGTERM, exits, is started again and
           waits until the router has it back in rotation: 0 failed
           requests, every text equal; each decode's drain time is printed
           (its streams move to the other decode make-before-break,
           migrations_total{reason="drain"});
  decodes  both decodes get SIGTERM at once: nowhere to move a stream, so
           each drain finishes its streams; no stream the router accepted
           is cut (requests refused once no decode is left are counted);
  fleet    the router, both prefills and both decodes get SIGTERM at once
           (what `podman kube down` does, ops.kube.down), ROUNDS times: no
           accepted stream is cut, every process exits 0.

usage: test_router_rolling.py BUILD_DIR SOURCE_DIR
"""
import http.client
import os
import random
import signal
import threading
import time

from router_cluster import Cluster, check, detok, main, oracle
from test_router_migrate import wait_healthy

STEP_MS = 15
N_TOK = 100
PROMPTS = ["Once upon a time", "The little dog", "One day, a girl"]
CLIENTS = 4
ROUNDS = int(os.environ.get("DUET_ROLLING_FLEET_ROUNDS", "3"))
FAULTS = {"DUET_FAULTS": "decode.step_delay_ms=%d" % STEP_MS}


def cases():
    out = []
    for p in PROMPTS:
        out.append(("greedy:" + p, {"prompt": p, "max_tokens": N_TOK, "ignore_eos": True,
                                    "stream": True, "temperature": 0}))
        out.append(("seeded:" + p, {"prompt": p, "max_tokens": N_TOK, "ignore_eos": True,
                                    "stream": True, "temperature": 0.9, "top_p": 0.95,
                                    "seed": 3}))
    return out


def stream(cl, body):
    """('ok', text) | ('refused', why) | ('cut', why): cut is a stream the
    router accepted (HTTP 200) that did not end with [DONE] and no error."""
    try:
        st, events, raw = cl.sse_incremental("/v1/completions", body, timeout=60)
    except (OSError, http.client.HTTPException) as e:
        return "refused", repr(e)
    if st != 200:
        return "refused", "HTTP %d %s" % (st, raw[:200])
    text = ""
    for ev in events:
        if ev == "[DONE]":
            continue
        if "error" in ev:
            return "cut", "error event %s after %r" % (ev, text)
        for c in ev.get("choices", []):
            text += c["text"]
    if not events or events[-1] != "[DONE]":
        return "cut", "no [DONE] after %r" % text
    return "ok", text


class Load:
    """CLIENTS threads streaming the cases until stopped (bounded)."""

    def __init__(self, cl, want, rounds=400):
        self.cl, self.want, self.rounds = cl, want, rounds
        self.stop, self.results, self.lock = threading.Event(), [], threading.Lock()
        self.ts = [threading.Thread(target=self.loop, args=(i,)) for i in range(CLIENTS)]
        for t in self.ts:
            t.start()

    def loop(self, idx):
        cs = cases()
        for i in range(self.rounds):
            if self.stop.is_set():
                return
            name, body = cs[(idx + i) % len(cs)]
            kind, what = stream(self.cl, body)
            if kind == "ok" and what != self.want[name]:
                kind, what = "wrong", "%s: %r != %r" % (name, what, self.want[name])
            with self.lock:
                self.results.append((kind, name, what))
            if kind == "refused":
                time.sleep(0.1)

    def count(self):
        with self.lock:
            return sum(1 for r in self.results if r[0] == "ok")

    def end(self):
        self.stop.set()
        for t in self.ts:
            t.join(90)
        check(not any(t.is_alive() for t in self.ts), "a client hung")
        counts = {}
        for kind, _, _ in self.results:
            counts[kind] = counts.get(kind, 0) + 1
        return counts, [r for r in self.results if r[0] in ("cut", "wrong")]


def drains(cl):
    return cl.metrics().get('duet_router_migrations_total{reason="drain"}', 0)


def wait_streams(cl, names, n=1, timeout=10):
    """Each of names decodes at least n streams (best effort)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if all(cl.info(d).running >= n for d in names):
                return
        except Exception:  # noqa: BLE001 (a decode restarting)
            pass
        time.sleep(0.02)


def start_all(cl, faults=FAULTS):
    for p in ("p1", "p2"):
        cl.start(p)
    for d in ("d1", "d2"):
        cl.start(d, env=faults)
    for n in ("p1", "p2", "d1", "d2"):
        cl.wait_worker(n)
    cl.start_router()
    wait_healthy(cl, ["p1", "p2", "d1", "d2"])


def test(build, src):
    cl = Cluster(build, src, prefill=[("p1", 1), ("p2", 1)], decode=[("d1", 1), ("d2", 1)],
                 router={"health_interval_ms": 200, "policy": "round_robin", "migrate_max": 3,
                         "max_prompt_tokens": 8}, env={"DUET_LOG_LEVEL": "info"})
    try:
        start_all(cl)
        want = {}
        for name, body in cases():
            kind, text = stream(cl, body)
            check(kind == "ok", "undisturbed %s: %s %s" % (name, kind, text))
            want[name] = text
        for p in PROMPTS:
            ids, _ = oracle(build, cl.model, prompt=p, max_tokens=N_TOK,
                            extra=("--ignore-eos",))
            check(detok(cl.model, ids) == want["greedy:" + p],
                  "greedy %r differs from duet generate" % p)

        # rolling restart of every decode under load
        load = Load(cl, want)
        t0 = time.time()
        for d in ("d1", "d2"):
            wait_streams(cl, [d])
            n = cl.info(d).running
            t = time.time()
            rc = cl.stop(d)
            took = time.time() - t
            check(rc == 0, "%s exited %s:\n%s" % (d, rc, cl.procs[d].log()))
            print("rolling: %s drained %d stream(s) in %.2f s (a stream takes >= %.1f s)"
                  % (d, n, took, N_TOK * STEP_MS / 1000.0))
            cl.start(d, env=FAULTS)
            cl.wait_worker(d)
            wait_healthy(cl, [d])
        before = load.count()
        while load.count() < before + 2 * CLIENTS and time.time() - t0 < 60:
            time.sleep(0.1)
        counts, bad = load.end()
        moved = drains(cl)
        print("rolling restart of d1, d2 in %.1f s under %d clients: %s, %d streams moved "
              "(reason drain)" % (time.time() - t0, CLIENTS, counts, moved))
        check(not bad, "streams cut or wrong: %s" % bad[:5])
        check(counts.get("refused", 0) == 0, "requests failed: %s" %
              [r for r in load.results if r[0] == "refused"][:5])
        check(moved > 0, "no stream moved off a draining decode")

        # every decode at once: the drains finish the streams
        load = Load(cl, want)
        wait_streams(cl, ["d1", "d2"])
        t = time.time()
        for d in ("d1", "d2"):
            cl.procs[d].proc.send_signal(signal.SIGTERM)
        rcs = {d: cl.procs[d].proc.wait(timeout=30) for d in ("d1", "d2")}
        took = time.time() - t
        counts, bad = load.end()
        print("both decodes SIGTERMed at once under load: exited %s in %.2f s; %s"
              % (rcs, took, counts))
        check(rcs == {"d1": 0, "d2": 0}, "decode exits %s" % rcs)
        check(not bad, "accepted streams cut: %s" % bad[:5])
        check(counts.get("ok", 0) > 0, "nothing finished")
        cl.stop("router")
        cl.stop("p1")
        cl.stop("p2")

        # the whole fleet at once (podman kube down)
        for r in range(ROUNDS):
            # (odd rounds: decode at full speed, many short requests)
            start_all(cl, FAULTS if r % 2 == 0 else {})
            load = Load(cl, want)
            # a stream decodes (so one at least must finish), then at a
            # different point of the streams' lives each round: in the
            # router's queue, at a prefill, decoding
            deadline = time.time() + 30
            while time.time() < deadline and \
                    cl.info("d1").running + cl.info("d2").running == 0:
                time.sleep(0.02)
            time.sleep(random.uniform(0, 1.0))
            t = time.time()
            for n in ("router", "p1", "p2", "d1", "d2"):
                cl.procs[n].proc.send_signal(signal.SIGTERM)
            rcs = {n: cl.procs[n].proc.wait(timeout=60)
                   for n in ("router", "p1", "p2", "d1", "d2")}
            took = time.time() - t
            counts, bad = load.end()
            print("fleet round %d: router, prefills and decodes SIGTERMed at once under load: "
                  "all exited in %.2f s; %s" % (r, took, counts))
            check(all(v == 0 for v in rcs.values()), "exits %s" % rcs)
            check(not bad, "accepted streams cut: %s\nrouter log:\n%s"
                  % (bad[:5], cl.procs["router"].log(6000)))
            check(counts.get("ok", 0) > 0, "nothing finished")
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
