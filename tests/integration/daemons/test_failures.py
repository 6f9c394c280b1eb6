#!/usr/bin/python3
"""Failure semantics of the daemons (issue: prefill and decode daemons):
each case runs real processes, checks the client sees a clear status within
the deadline, that the survivors keep serving, and that every daemon's Info
shows its KV pages back at baseline afterwards (no leaks).

  cancel_mid_stream      client cancels while tokens stream
  cancel_during_prefill  client cancels while decode waits for KV: decode
                         tells prefill (Abort), both release their pages
  prefill_killed         prefill SIGKILLed while a request waits for KV
                         (transfer.on_failure fail: the request fails)
  prefill_killed_recompute  the same with the default on_failure
                         (recompute): decode prefills the prompt itself and
                         the request equals the reference
  queued_timeout_keeps_link  requests wait in a slow prefill's queue
                         (prefill.delay_ms, one per batch) longer than
                         transfer.timeout_ms: each transfer's deadline
                         counts from prefill's start, so they complete;
                         those that wait past transfer.queue_timeout_ms
                         fail alone (on_failure fail), the link stays up
                         for the others (docs/migration.md "Overload")
  decode_killed          decode SIGKILLed while prefill computes/sends
  prefill_restart        prefill restarts: the next request re-bootstraps
  decode_restart         decode restarts: it bootstraps under a new id
  model_mismatch         prefill and decode serve different models
  sigterm_drain          SIGTERM finishes in-flight streams, refuses new
                         ones, exits 0
  decode_engine_fails    a decode rank's collective fails (TP=2, host comm
                         fault injection): the request gets an error, the
                         decode exits 70 naming the failure, a restarted
                         one serves again
  prefill_engine_fails   the same on a prefill (TP=2): the request fails
                         (on_failure fail; retry: UNAVAILABLE, which the
                         router retries), the prefill exits 70, decode
                         serves through another prefill; with on_failure
                         recompute the request completes, equal to the
                         reference
  bad_progress_env       a bad DUET_KV_TRANSFER_PROGRESS stops start-up
  unstaged               (packed) a request larger than a staging arena
                         moves in chunks, right; with no room for two
                         chunks, page by page, right, counted and warned
  kv_copy_fails          decode's KV copy fails after the first token went
                         out (fault injection): the stream ends INTERNAL
                         after it, a 1-token request completes and caches
                         nothing, pages back at baseline

usage: test_failures.py BUILD_DIR SOURCE_DIR [case ...]
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duet_cluster import Cluster, mkmodel, reference_ids, run_cases  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
STORIES = os.path.join(SRC, "models", "stories260K")
PROMPT = [1, 403, 407, 261, 378, 429, 285, 342, 318, 376, 267, 298]
TRANSFER_TIMEOUT_MS = 4000


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def baseline(c, names=None):
    bad = c.pages_at_baseline(names)
    expect(not bad, "pages not back at baseline: %s" % bad)


def cancel_mid_stream():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 2)])
    try:
        c.start_all()
        it = c.stream("d0", PROMPT, max_tokens=400, ignore_eos=True)
        got = 0
        for r in it:
            got += 1
            if got == 3:
                it.cancel()
                break
        expect(got == 3, "stream ended early")
        baseline(c)
        # the daemons keep serving
        ids, _, _ = c.generate("d0", PROMPT, max_tokens=8, ignore_eos=True)
        expect(len(ids) == 8, "no tokens after a cancel")
        baseline(c)
    finally:
        c.close()


def cancel_during_prefill():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 2)], decode=[("d0", 1)])
    try:
        c.start("p0", env={"DUET_FAULTS": "prefill.delay_ms=1500"})
        c.start("d0")
        it = c.stream("d0", PROMPT, max_tokens=8)
        t = threading.Timer(0.4, it.cancel)
        t.start()
        try:
            for _ in it:
                pass
            raise AssertionError("the stream was not cancelled")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.CANCELLED, "got %s" % e.code())
        baseline(c, ["d0", "p0"])
        info = c.info("p0")
        expect(info.requests_failed >= 1, "prefill did not see the abort")
    finally:
        c.close()


def prefill_killed():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1), ("p1", 2)], decode=[("d0", 2)],
                transfer_timeout_ms=TRANSFER_TIMEOUT_MS, on_failure="fail")
    try:
        c.start("p0", env={"DUET_FAULTS": "prefill.delay_ms=5000"})
        c.start("p1")
        c.start("d0")
        # bootstrap first so the kill hits a request waiting for its KV
        c.generate("d0", PROMPT, max_tokens=2, prefill="p1")
        it = c.stream("d0", PROMPT, max_tokens=8, prefill="p0")
        threading.Timer(0.5, lambda: c.kill("p0")).start()
        t0 = time.time()
        try:
            for _ in it:
                pass
            raise AssertionError("the request succeeded without its prefill")
        except grpc.RpcError as e:
            took = time.time() - t0
            print("  prefill killed -> %s after %.2fs: %s" % (e.code(), took, e.details()))
            expect(e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED),
                   "status %s" % e.code())
            expect(took < TRANSFER_TIMEOUT_MS / 1000.0 + 2, "took %.1fs" % took)
        ref = reference_ids(BUILD, STORIES, PROMPT, 8)
        ids, _, _ = c.generate("d0", PROMPT, max_tokens=8, prefill="p1")
        expect(ids == ref, "decode did not keep serving: %s" % ids)
        baseline(c, ["d0", "p1"])
    finally:
        c.close()


def prefill_killed_recompute():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1), ("p1", 2)], decode=[("d0", 2)],
                transfer_timeout_ms=TRANSFER_TIMEOUT_MS)
    try:
        c.start("p0", env={"DUET_FAULTS": "prefill.delay_ms=5000"})
        c.start("p1")
        c.start("d0")
        c.generate("d0", PROMPT, max_tokens=2, prefill="p1")
        ref = reference_ids(BUILD, STORIES, PROMPT, 8)
        done = []
        threading.Timer(0.5, lambda: c.kill("p0")).start()
        t0 = time.time()
        ids = [i for r in c.stream("d0", PROMPT, max_tokens=8, prefill="p0")
               if r.HasField("chunk") for i in r.chunk.ids]
        done.append(time.time() - t0)
        print("  prefill killed -> recomputed on decode in %.2fs: %s" % (done[0], ids))
        expect(ids == ref, "recomputed request: %s != %s" % (ids, ref))
        expect(c.info("d0").prefills_local == 1, "no local prefill counted")
        expect("recomputing its prompt here" in c.log("d0"), "no recompute log line")
        baseline(c, ["d0", "p1"])
    finally:
        c.close()


def queued_timeout_keeps_link():
    # prefill holds every batch 1 s and runs one request per batch; the
    # transfer itself takes milliseconds.  Request k starts ~k+1 s after
    # its registration: k = 0, 1 start within queue + transfer (2.5 s),
    # later ones are given up while queued (decode's deadline, then
    # prefill refuses to start them).  Before the fix the transfer deadline
    # (1.5 s) counted from registration: k = 1 timed out, and the cut link
    # failed every request on it.
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1, {"max_seqs": 1})], decode=[("d0", 1)],
                transfer_timeout_ms=1500, on_failure="fail",
                transfer={"queue_timeout_ms": 1000})
    ref = reference_ids(BUILD, STORIES, PROMPT, 8)
    try:
        c.start("p0", env={"DUET_FAULTS": "prefill.delay_ms=1000"})
        c.start("d0")
        c.generate("d0", PROMPT, max_tokens=2, prefill="p0")  # bootstrap first
        results = [None] * 5

        def one(k):
            try:
                results[k] = c.generate("d0", PROMPT, max_tokens=8, prefill="p0")[0]
            except grpc.RpcError as e:
                results[k] = e

        ts = []
        for k in range(len(results)):
            ts.append(threading.Thread(target=one, args=(k,)))
            ts[-1].start()
            time.sleep(0.05)  # in this order in prefill's queue
        for t in ts:
            t.join(60)
        print("  queued past the deadline: %s" % [
            r.code().name if isinstance(r, grpc.RpcError) else "ok" for r in results])
        for k in (0, 1):
            expect(results[k] == ref, "request %d (queued %d s, within the queue timeout): %s"
                   % (k, k + 1, results[k]))
        for k, r in enumerate(results):
            if isinstance(r, grpc.RpcError):
                expect(k >= 2 and r.code() == grpc.StatusCode.DEADLINE_EXCEEDED and
                       "disconnected" not in r.details() and "failed:" not in r.details(),
                       "request %d: %s %s" % (k, r.code(), r.details()))
            else:
                expect(r == ref, "request %d: %s" % (k, r))
        expect(any(isinstance(r, grpc.RpcError) for r in results[2:]),
               "no request waited past the queue timeout")
        log = c.log("d0")
        expect("cutting the link" not in log and "bootstraps again" not in log,
               "the link was cut:\n%s" % log)
        # the same link serves on
        expect(c.generate("d0", PROMPT, max_tokens=8, prefill="p0")[0] == ref, "after")
        baseline(c, ["d0", "p0"])
    finally:
        c.close()


def decode_killed():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 2)], decode=[("d0", 2), ("d1", 1)],
                transfer_timeout_ms=TRANSFER_TIMEOUT_MS)
    try:
        c.start("p0", env={"DUET_FAULTS": "prefill.delay_ms=1000"})
        c.start("d0")
        c.start("d1")
        it = c.stream("d0", PROMPT, max_tokens=8, prefill="p0")

        def kill_when_prefill_has_it():
            # not a fixed delay: a bootstrap's descriptor probe takes longer
            # on a loaded machine, and the kill must find the request at p0
            t_end = time.time() + 10
            while time.time() < t_end:
                i = c.info("p0")
                if i.queue_depth + i.running >= 1:
                    break
                time.sleep(0.02)
            c.kill("d0")

        killer = threading.Thread(target=kill_when_prefill_has_it)
        killer.start()
        try:
            for _ in it:
                pass
        except grpc.RpcError:
            pass
        killer.join()
        t0 = time.time()
        # prefill drops the request within the deadline and frees its KV
        baseline(c, ["p0"])
        info = c.info("p0")
        print("  decode killed -> prefill released its pages %.2fs later, %d failed" %
              (time.time() - t0, info.requests_failed))
        expect(info.requests_failed >= 1, "prefill did not fail the request")
        ref = reference_ids(BUILD, STORIES, PROMPT, 8)
        ids, _, _ = c.generate("d1", PROMPT, max_tokens=8, prefill="p0")
        expect(ids == ref, "prefill did not keep serving: %s" % ids)
        baseline(c, ["p0", "d1"])
    finally:
        c.close()


def prefill_restart():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 2)], decode=[("d0", 4)])
    ref = reference_ids(BUILD, STORIES, PROMPT, 8)
    try:
        c.start_all()
        expect(c.generate("d0", PROMPT, max_tokens=8)[0] == ref, "before restart")
        c.kill("p0")
        c.start("p0")
        ids, _, _ = c.generate("d0", PROMPT, max_tokens=8)
        expect(ids == ref, "after prefill restart: %s" % ids)
        baseline(c)
    finally:
        c.close()


def decode_restart():
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 2)])
    ref = reference_ids(BUILD, STORIES, PROMPT, 8)
    try:
        c.start_all()
        expect(c.generate("d0", PROMPT, max_tokens=8)[0] == ref, "before restart")
        c.kill("d0")
        c.start("d0")
        ids, _, _ = c.generate("d0", PROMPT, max_tokens=8)
        expect(ids == ref, "after decode restart: %s" % ids)
        baseline(c)
    finally:
        c.close()


def model_mismatch():
    other = mkmodel(BUILD, os.path.join(tempfile.mkdtemp(), "other"), layers=5, hidden=64,
                    heads=8, kv_heads=4, head_dim=8, intermediate=172, vocab=512, seed=3)
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 1)])
    try:
        c.start("p0", args=["--model", other])
        c.start("d0")
        try:
            c.generate("d0", PROMPT, max_tokens=4)
            raise AssertionError("a mismatched model was accepted")
        except grpc.RpcError as e:
            print("  mismatch -> %s: %s" % (e.code(), e.details()))
            expect(e.code() == grpc.StatusCode.FAILED_PRECONDITION, "status %s" % e.code())
            expect("fingerprint" in e.details(), "message: %s" % e.details())
        baseline(c)
    finally:
        c.close()


def sigterm_drain():
    model = mkmodel(BUILD, os.path.join(tempfile.mkdtemp(), "slow"), layers=6, hidden=512,
                    heads=8, kv_heads=4, head_dim=64, intermediate=1536, vocab=512, seed=5)
    c = Cluster(BUILD, SRC, model, prefill=[("p0", 1)], decode=[("d0", 1)])
    try:
        c.start_all()
        it = c.stream("d0", [1, 5, 6, 7], max_tokens=120, ignore_eos=True)
        first = next(it)
        expect(first.HasField("chunk"), "no first chunk")
        c.daemons["d0"].proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:
            c.generate("d0", [1, 5], max_tokens=2, timeout=5)
            raise AssertionError("a draining decode accepted a request")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.UNAVAILABLE, "status %s" % e.code())
        n, fin = 1, None
        for r in it:
            if r.HasField("chunk"):
                n += 1
            else:
                fin = r.finished
        expect(fin is not None and fin.completion_tokens == 120,
               "the in-flight stream did not finish: %d chunks" % n)
        rc = c.daemons["d0"].proc.wait(timeout=30)
        expect(rc == 0, "decode exited %d" % rc)
        baseline(c, ["p0"])
    finally:
        c.close()


ENGINE_FAILED_EXIT = 70  # node/node.h DUET_NODE_EXIT_ENGINE_FAILED
EXIT_DEADLINE_S = 15


def expect_engine_exit(c, name):
    """name exits ENGINE_FAILED_EXIT within the deadline, its log naming
    the failure and the injected fault."""
    d = c.daemons[name]
    t0 = time.time()
    try:
        rc = d.proc.wait(timeout=EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("%s still runs %ds after its engine failed:\n%s" %
                             (name, EXIT_DEADLINE_S, c.log(name)))
    c.channels.pop((name, d.port), None)
    log = c.log(name)
    print("  %s exited %d %.1fs after the error" % (name, rc, time.time() - t0))
    expect(rc == ENGINE_FAILED_EXIT, "%s exited %d, want %d:\n%s" %
           (name, rc, ENGINE_FAILED_EXIT, log))
    expect("engine failed:" in log and "fault injection" in log and
           "exiting so the orchestrator restarts this instance" in log,
           "%s's log does not name the failure:\n%s" % (name, log))


def decode_engine_fails():
    # 12 collectives per step (stories260K: 5 layers x 2 all-reduces, the
    # logits' all-gather, the sampled tokens' broadcast): the 41st is in
    # step 4, after a few tokens were streamed
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 2)])
    ref = reference_ids(BUILD, STORIES, PROMPT, 8)
    try:
        c.start("p0")
        c.start("d0", env={"DUET_FAULTS": "comm.fail_after=40"})
        try:
            c.generate("d0", PROMPT, max_tokens=64, ignore_eos=True, timeout=30)
            raise AssertionError("the request succeeded on a failed engine")
        except grpc.RpcError as e:
            print("  decode engine failed -> %s: %s" % (e.code(), e.details()[:120]))
            expect(e.code() == grpc.StatusCode.INTERNAL, "status %s" % e.code())
            expect("engine failed" in e.details(), "message: %s" % e.details())
        expect_engine_exit(c, "d0")
        # the orchestrator's restart: a new decode serves with the same prefill
        c.start("d0")
        ids, _, _ = c.generate("d0", PROMPT, max_tokens=8)
        expect(ids == ref, "after the restart: %s" % ids)
        baseline(c)
    finally:
        c.close()


def prefill_engine_fails():
    ref = reference_ids(BUILD, STORIES, PROMPT, 8)
    for on_failure in ("fail", "retry", "recompute"):
        c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 2), ("p1", 1)], decode=[("d0", 1)],
                    on_failure=on_failure)
        try:
            c.start("p0", env={"DUET_FAULTS": "comm.fail_after=3"})
            c.start("p1")
            c.start("d0")
            if on_failure == "recompute":
                ids, _, _ = c.generate("d0", PROMPT, max_tokens=8, prefill="p0", timeout=30)
                print("  prefill engine failed -> recomputed on decode: %s" % ids)
                expect(ids == ref, "recomputed request: %s != %s" % (ids, ref))
                expect(c.info("d0").prefills_local == 1, "no local prefill counted")
            else:
                try:
                    c.generate("d0", PROMPT, max_tokens=8, prefill="p0", timeout=30)
                    raise AssertionError("the request succeeded on a failed prefill engine")
                except grpc.RpcError as e:
                    print("  prefill engine failed (%s) -> %s: %s" %
                          (on_failure, e.code(), e.details()[:120]))
                    expect(e.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE),
                           "status %s" % e.code())
                    # retry: UNAVAILABLE, so the router retries on another pair
                    expect(on_failure != "retry" or e.code() == grpc.StatusCode.UNAVAILABLE,
                           "on_failure retry: status %s" % e.code())
            expect_engine_exit(c, "p0")
            ids, _, _ = c.generate("d0", PROMPT, max_tokens=8, prefill="p1")
            expect(ids == ref, "decode did not keep serving: %s" % ids)
            baseline(c, ["d0", "p1"])
        finally:
            c.close()


def bad_progress_env():
    """A bad DUET_KV_TRANSFER_PROGRESS stops the daemon at start-up, naming it."""
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 1)])
    try:
        for bad in ("7x", "0", "99"):
            d = c.start("d0", env={"DUET_KV_TRANSFER_PROGRESS": bad}, wait=False)
            rc = d.proc.wait(timeout=60)
            log = c.log("d0")
            print("  DUET_KV_TRANSFER_PROGRESS=%s -> exit %d" % (bad, rc))
            expect(rc != 0, "the daemon started with DUET_KV_TRANSFER_PROGRESS=%s" % bad)
            expect("DUET_KV_TRANSFER_PROGRESS=%s: expected auto, off or a layer count 1..5" % bad
                   in log, "the start-up error does not name the setting: %s" % log[-400:])
    finally:
        c.close()


def unstaged():
    """Packed: a request larger than a staging arena moves in arena-sized
    chunks (docs/design-notes.md "Chunked packed transfers") and is still right: a
    prefill arena of 2 units, then a decode arena of 2 units (two halves of
    one page), for a 5-page prompt; Info kv_transfers_chunked counts it.
    With no run of two units (a decode arena of 1) it moves unpacked, page
    by page, still right; decode counts it and warns once."""
    if os.environ.get("DUET_KV_TRANSFER_PACK") != "on":
        print("  (packed transfers off: nothing to check)")
        return
    prompt = (PROMPT * 7)[:80]
    ref = reference_ids(BUILD, STORIES, prompt, 6, ignore_eos=True)
    for side, units in (("prefill", 2), ("decode", 2), ("decode", 1)):
        small = {"stage_pages": units}
        c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1, small if side == "prefill" else {})],
                    decode=[("d0", 2, small if side == "decode" else {})])
        try:
            c.start_all()
            ids, _, _ = c.generate("d0", prompt, max_tokens=6, ignore_eos=True)
            expect(ids == ref, "%s arena too small: %s, want %s" % (side, ids, ref))
            info = c.info("d0")
            n, k = info.kv_transfers_unstaged, info.kv_transfers_chunked
            print("  %s arena of %d units: right tokens, %d moved unpacked, %d in chunks" %
                  (side, units, n, k))
            if units == 1:
                expect(n == 1 and k == 0, "Info kv_transfers_unstaged %d (want 1), chunked %d "
                       "(want 0)" % (n, k))
                expect("moves unpacked, page by page" in c.log("d0"),
                       "no warning in the decode log")
            else:
                expect(n == 0 and k == 1, "Info kv_transfers_unstaged %d (want 0), chunked %d "
                       "(want 1)" % (n, k))
            baseline(c)
        finally:
            c.close()


def kv_copy_fails():
    """Decode sends the first token before it unpacks or imports the KV;
    when that copy fails (DUET_FAULTS=decode.kv_copy_fail=1), a request with
    more to generate ends INTERNAL after exactly that token, one whose first
    token was its last completes and leaves nothing in the prefix cache, and
    every page comes back.  The control: the same decode without the fault
    caches the prompt's pages."""
    prompt = (PROMPT * 4)[:48]  # 3 pages of 16: 2 complete pages to cache
    ref = reference_ids(BUILD, STORIES, prompt, 8, ignore_eos=True)
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 2)])
    try:
        c.start("p0")
        c.start("d0", env={"DUET_FAULTS": "decode.kv_copy_fail=1"})
        got = []
        try:
            for r in c.stream("d0", prompt, max_tokens=8, ignore_eos=True):
                if r.HasField("chunk"):
                    got += list(r.chunk.ids)
            raise AssertionError("the stream ended normally after %s" % got)
        except grpc.RpcError as e:
            print("  copy failed after token 1 -> %s: %s" % (e.code(), e.details()[:80]))
            expect(e.code() == grpc.StatusCode.INTERNAL, "status %s" % e.code())
            expect("fault injection: the KV copy failed" in e.details(),
                   "message: %s" % e.details())
        expect(got == ref[:1], "tokens before the failure: %s, want %s" % (got, ref[:1]))
        baseline(c)
        ids, _, fin = c.generate("d0", prompt, max_tokens=1, ignore_eos=True)
        expect(ids == ref[:1], "a 1-token request: %s, want %s" % (ids, ref[:1]))
        i = c.info("d0")
        print("  1-token request: %s, %d pages cached" % (ids, i.cached_pages))
        expect(i.cached_pages == 0, "%d pages cached from a failed copy" % i.cached_pages)
        baseline(c)
        c.stop("d0")
        c.start("d0")
        ids, _, _ = c.generate("d0", prompt, max_tokens=1, ignore_eos=True)
        i = c.info("d0")
        print("  control, no fault: %s, %d pages cached" % (ids, i.cached_pages))
        expect(ids == ref[:1] and i.cached_pages > 0,
               "without the fault: %s, %d pages cached" % (ids, i.cached_pages))
        baseline(c)
    finally:
        c.close()


CASES = [cancel_mid_stream, cancel_during_prefill, prefill_killed, prefill_killed_recompute,
         queued_timeout_keeps_link, decode_killed,
         prefill_restart, decode_restart, model_mismatch, sigterm_drain, decode_engine_fails,
         prefill_engine_fails, bad_progress_env, unstaged, kv_copy_fails]


def main():
    run_cases(CASES, sys.argv[3:], "failure")


if __name__ == "__main__":
    main()
