#!/usr/bin/python3
"""Regression cases from a review of the prefill and decode daemons.  Each
one failed before its fix (some only under ASan: run with an ASan build
dir to see them fail).

  send_fails_mid_compute   a prefill send ends (deadline) while the batch
                           is still computing: the request must not be
                           released under the scheduler (ASan: use after
                           free), the prefill keeps serving
  pages_wake               prefill with room for one request at a time:
                           the queued one starts when the first's pages
                           come back (it stalled when the scheduler woke
                           before they did)
  stale_prefill_write      decode gives up on a request and reuses its
                           pages; the prefill daemon, which took the
                           request but had not begun it, must not write
                           into them afterwards (it corrupted the next
                           request's KV)
  sigterm_while_booting    SIGTERM while a bootstrap call is outstanding:
                           decode exits 0 (it freed the gRPC client under
                           the bootstrap worker)
  idle_without_spinning    an idle decode sleeps (its scheduler waited
                           with a CLOCK_MONOTONIC deadline on a
                           CLOCK_REALTIME condition variable: it spun)
  stop_without_spinning    decode waiting at shutdown for a Prefill call
                           to return sleeps instead of spinning a core

usage: test_review.py BUILD_DIR SOURCE_DIR [case ...]
"""
import json
import os
import signal
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duet_cluster import Cluster, mkmodel, run_cases, stubs  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
STORIES = os.path.join(SRC, "models", "stories260K")
PROMPT = [1, 403, 407, 261, 378, 429, 285, 342, 318, 376, 267, 298]
_SLOW = None


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def consume(it):
    try:
        for _ in it:
            pass
    except grpc.RpcError:
        pass


def slow_model():
    """A model whose prefill and decode take measurable time on a CPU."""
    global _SLOW
    if _SLOW is None:
        _SLOW = mkmodel(BUILD, os.path.join(tempfile.mkdtemp(), "slow"), layers=6, hidden=512,
                        heads=8, kv_heads=4, head_dim=64, intermediate=1536, vocab=512, seed=5)
    return _SLOW


class ReviewCluster(Cluster):
    """Cluster with a configurable control-plane timeout."""

    def __init__(self, *a, rpc_timeout_ms=10000, **kw):
        self.rpc_timeout_ms = rpc_timeout_ms
        super().__init__(*a, **kw)

    def write_config(self):
        super().write_config()
        with open(self.config) as f:
            cfg = json.load(f)
        cfg["transfer"]["rpc_timeout_ms"] = self.rpc_timeout_ms
        with open(self.config, "w") as f:
            json.dump(cfg, f, indent=1)


def alive(c, name):
    d = c.daemons[name]
    expect(d.proc.poll() is None, "%s died (exit %s):\n%s" % (name, d.proc.returncode, c.log(name)))


def send_fails_mid_compute():
    # 600 tokens of the slow model: the forward outlasts the 1 s transfer
    # deadline under ASan, so the sends fail while the batch computes
    c = Cluster(BUILD, SRC, slow_model(), prefill=[("p0", 1)], decode=[("d0", 1)],
                transfer_timeout_ms=1000)
    try:
        c.start_all()
        prompt = [1] + [3 + i % 500 for i in range(599)]
        try:
            c.generate("d0", prompt, max_tokens=2, timeout=60)
        except grpc.RpcError as e:
            print("  long prefill -> %s: %s" % (e.code().name, e.details()[:100]))
        deadline = time.time() + 120
        while time.time() < deadline:
            alive(c, "p0")
            if not c.info("p0").running:
                break
            time.sleep(0.1)
        time.sleep(1)
        try:
            ids, _, _ = c.generate("d0", PROMPT, max_tokens=4, ignore_eos=True, timeout=60)
        except grpc.RpcError as e:
            alive(c, "p0")
            raise AssertionError("prefill stopped serving: %s" % e.details())
        expect(len(ids) == 4, "prefill stopped serving")
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back at baseline: %s" % bad)
    finally:
        c.close()


def pages_wake():
    # 20-token prompts need 2 pages; the prefill pool has 2
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1, {"n_pages": 2})], decode=[("d0", 1)],
                transfer_timeout_ms=3000)
    try:
        c.start_all()
        prompt = [1] + [300 + i for i in range(19)]
        for rnd in range(30):
            errors = []

            def one():
                try:
                    c.generate("d0", prompt, max_tokens=2, timeout=20)
                except grpc.RpcError as e:
                    errors.append("%s: %s" % (e.code().name, e.details()))
            ts = [threading.Thread(target=one) for _ in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(30)
            expect(not errors, "round %d: %s" % (rnd, errors))
    finally:
        c.close()


def stale_prefill_write():
    # p0 holds every batch 5 s before it runs it; d0 gives up on the request
    # after the transfer timeout and frees its pages when its Prefill call
    # times out (transfer + rpc timeout = 2.5 s); transfer.on_failure fail:
    # the held request fails (recompute would complete it, after the same
    # quiesce: tests/integration/daemons/test_failures.py)
    T, R, HOLD, PS = 1000, 1500, 5000, 16
    # queue_timeout_ms 0: the transfer deadline counts from registration, as
    # it did before prefill announced its start (the held batch waits in
    # p0's queue, docs/migration.md "Overload")
    c = ReviewCluster(BUILD, SRC, slow_model(), prefill=[("p0", 1), ("p1", 1)],
                      decode=[("d0", 1)], transfer_timeout_ms=T, rpc_timeout_ms=R,
                      on_failure="fail", transfer={"queue_timeout_ms": 0})
    victim = [1] + [40 + i for i in range(19)]   # 20 tokens
    stale = [1] + [200 + i for i in range(39)]   # 40 tokens
    try:
        c.start("p0", env={"DUET_FAULTS": "prefill.delay_ms=%d" % HOLD, "DUET_LOG_LEVEL": "debug"})
        c.start("p1")
        c.start("d0")
        # time the decode: the victim must still be decoding when p0 writes,
        # HOLD - (T + R) after the pages came back
        c.generate("d0", victim, max_tokens=2, prefill="p1")
        t0 = time.time()
        c.generate("d0", victim, max_tokens=40, prefill="p1", ignore_eos=True)
        per_token = (time.time() - t0) / 40
        n = max(50, min(2000, int(6.0 / per_token)))
        # a pool of exactly the victim's pages: both requests get all of it
        pages = (len(victim) + n - 1 + PS - 1) // PS
        print("  %.2f ms per token: the victim generates %d tokens in %d pages" %
              (per_token * 1000, n, pages))
        c.kill("d0")
        c.daemons["d0"].extra["n_pages"] = pages
        c.write_config()
        c.start("d0")
        ref, _, _ = c.generate("d0", victim, max_tokens=n, prefill="p1", ignore_eos=True,
                               timeout=120)

        t_stale = time.time()
        try:
            c.generate("d0", stale, max_tokens=n - (len(stale) - len(victim)), prefill="p0",
                       ignore_eos=True, timeout=30)
            raise AssertionError("the held request succeeded")
        except grpc.RpcError as e:
            print("  held request -> %s after %.1fs" % (e.code().name, time.time() - t_stale))
        bad = c.pages_at_baseline(["d0"], timeout=(T + R) / 1000.0 + 5)
        expect(not bad, "d0 did not release the held request: %s" % bad)
        print("  d0 released its pages %.1fs in; p0 runs the held batch at %.1fs" %
              (time.time() - t_stale, HOLD / 1000.0))
        expect(time.time() - t_stale < HOLD / 1000.0 - 1, "too slow to test")
        ids, _, _ = c.generate("d0", victim, max_tokens=n, prefill="p1", ignore_eos=True,
                               timeout=120)
        print("  victim ended %.1fs in" % (time.time() - t_stale))
        same = 0
        while same < len(ids) and same < len(ref) and ids[same] == ref[same]:
            same += 1
        expect(ids == ref, "victim's tokens differ from position %d of %d: its KV was "
               "overwritten" % (same, len(ref)))
        bad = c.pages_at_baseline(timeout=HOLD / 1000.0 + 5)
        expect(not bad, "pages not back at baseline: %s" % bad)
        # d0 asked p0 to abort once its expectations timed out (1 s in, before
        # its Prefill call's deadline cancels the call at 2.5 s), so p0 dropped
        # the held request before running it
        log = c.log("p0")
        expect("Abort from" in log and ": found" in log and "aborted before it ran" in log,
               "p0 was not told to abort the held request:\n%s" % log[-3000:])
    finally:
        c.close()


def sigterm_while_booting():
    # prefill addresses whose Bootstrap takes 3 s to answer
    import concurrent.futures
    pb = stubs(SRC)

    class SlowPrefill(pb["prefill_grpc"].PrefillServicer):
        def Bootstrap(self, request, context):
            time.sleep(3)
            context.abort(grpc.StatusCode.UNAVAILABLE, "slow bootstrap")

    srv = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    pb["prefill_grpc"].add_PrefillServicer_to_server(SlowPrefill(), srv)
    ports = [srv.add_insecure_port("127.0.0.1:0") for _ in range(2)]
    srv.start()
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1), ("p1", 1)],
                decode=[("d0", 1, {"drain_timeout_ms": 300})])
    try:
        c.start("d0")
        # two links: the second bootstrap waits behind the first one
        for name, port in zip(("p0", "p1"), ports):
            c.daemons[name].address = "127.0.0.1:%d" % port
            it = c.stream("d0", PROMPT, max_tokens=4, timeout=20, prefill=name)
            threading.Thread(target=consume, args=(it,), daemon=True).start()
        time.sleep(0.5)
        d0 = c.daemons["d0"].proc
        d0.send_signal(signal.SIGTERM)
        try:
            rc = d0.wait(timeout=20)
        except Exception:  # noqa: BLE001
            d0.kill()
            raise AssertionError("decode hung at SIGTERM:\n%s" % c.log("d0"))
        expect(rc == 0, "decode exited %d:\n%s" % (rc, c.log("d0")))
    finally:
        c.close()
        srv.stop(0)


def _cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_without_spinning():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)],
                decode=[("d0", 1, {"drain_timeout_ms": 200})])
    try:
        c.start("p0", env={"DUET_FAULTS": "prefill.delay_ms=4000"})
        c.start("d0")
        it = c.stream("d0", PROMPT, max_tokens=4, timeout=20)
        threading.Thread(target=consume, args=(it,), daemon=True).start()
        time.sleep(0.5)
        d = c.daemons["d0"]
        cpu0, t0 = _cpu_s(d.proc.pid), time.time()
        d.proc.send_signal(signal.SIGTERM)
        _, status, ru = os.wait4(d.proc.pid, 0)
        d.proc.returncode = os.waitstatus_to_exitcode(status)
        wall, cpu = time.time() - t0, ru.ru_utime + ru.ru_stime - cpu0
        print("  decode stopped in %.1fs using %.1fs of CPU" % (wall, cpu))
        expect(d.proc.returncode == 0, "decode exited %d" % d.proc.returncode)
        expect(wall > 2.0, "decode did not wait for the Prefill call (%.1fs)" % wall)
        expect(cpu < 0.5 * wall, "decode burnt %.1fs of CPU in %.1fs of shutdown" % (cpu, wall))
    finally:
        c.close()


def idle_without_spinning():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 1)])
    try:
        c.start_all()
        c.generate("d0", PROMPT, max_tokens=2)
        time.sleep(0.5)
        cpu = {n: _cpu_s(c.daemons[n].proc.pid) for n in ("p0", "d0")}
        time.sleep(3)
        for n in ("p0", "d0"):
            used = _cpu_s(c.daemons[n].proc.pid) - cpu[n]
            print("  %s idle for 3s used %.2fs of CPU" % (n, used))
            expect(used < 0.5, "%s spins while idle: %.1fs of CPU in 3s" % (n, used))
    finally:
        c.close()


CASES = [idle_without_spinning, send_fails_mid_compute, pages_wake, stale_prefill_write, sigterm_while_booting,
         stop_without_spinning]


def main():
    run_cases(CASES, sys.argv[3:], "review")


if __name__ == "__main__":
    main()
