#!/usr/bin/python3
"""Colocated mode and conditional disaggregation (issue 14;
docs/design-notes.md "Colocated mode and conditional disaggregation"):
real duet-decode (and duet-prefill) processes.

  colocated_stories    decodes of TP 1, 2 and 4 with prefill_local "always"
  colocated_synthetic  and no prefill instance at all give the greedy tokens
                       of `duet generate --tp 1` (stories260K; a synthetic
                       model with 2 KV heads), also TP 4 with chunks of 8
                       prompt tokens; Info counts every prefill as local
                       and every chunk, pages back at baseline
  conditional          prefill_local "auto": a short prompt is prefilled
                       locally, a long one on the prefill instance, both
                       equal the reference; a decode whose running limit is
                       0 sends even a short prompt to prefill; Info counts
                       each decision; a request asking for a local prefill
                       (DecodeGenerateRequest.prefill_local) gets one, or
                       FAILED_PRECONDITION from a decode with it "off"
  concurrent_mixed     24 concurrent requests of mixed lengths on an "auto"
                       decode (TP 2, max_batch_tokens 64: local prefills
                       batched and split over passes) with a prefill: both
                       paths taken, every output equals the reference,
                       pages back
  cancel_local         a locally-prefilled stream cancelled mid-stream:
                       pages back, the decode keeps serving
  drain_local          SIGTERM while a locally-prefilled stream runs: it
                       finishes, new requests are refused, exit 0
  config_errors        a bad prefill_local value, or one on a prefill
                       instance, or a bad prefill_chunk_tokens stops
                       start-up naming the key
  chunked_equivalence  chunked prefill (prefill_chunk_tokens 16, TP 2 and
                       TP 1): long prompts computed over many decode steps
                       while other streams keep decoding (they receive
                       tokens between the long request's arrival and its
                       first token), and one whose prefix is cached
                       (chunks start after it): the tokens of `duet
                       generate --tp 1` and of a decode with chunking off;
                       Info counts the chunks; pages back
  chunked_logprobs     a long prompt with prompt logprobs and logprobs,
                       chunked, equals the same request on a decode of the
                       same TP with chunking off, value for value
  chunked_abort        a client cancel and a deadline while a long prompt
                       is mid-chunk (slow steps): pages back at once, no
                       leak, the decode keeps serving

usage: test_colocated.py BUILD_DIR SOURCE_DIR [case ...]
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
PAGE = 16
GEN = 10
ALWAYS = {"prefill_local": "always"}


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def prompts(vocab):
    def ids(n, salt):
        return [1] + [(i * 37 + salt * 11 + 3) % (vocab - 3) + 3 for i in range(n - 1)]
    return {"short": ids(5, 1), "one-page": ids(PAGE, 2), "many-pages": ids(7 * PAGE + 3, 3)}


def check_colocated(model, vocab):
    ps = prompts(vocab)
    refs = {k: reference_ids(BUILD, model, p, GEN, ignore_eos=True) for k, p in ps.items()}
    # no prefill instance: each decode prefills with its own TP group
    # (d4c: TP 4 with chunks of 8 prompt tokens, the many-pages prompt in 15)
    c = Cluster(BUILD, SRC, model, prefill=[],
                decode=[("d1", 1, ALWAYS), ("d2", 2, ALWAYS), ("d4", 4, ALWAYS),
                        ("d4c", 4, dict(ALWAYS, prefill_chunk_tokens=8))],
                page_size=PAGE, n_pages=128)
    try:
        c.start_all()
        for d in ("d1", "d2", "d4", "d4c"):
            expect(c.info(d).prefill_local == "always", "%s Info.prefill_local" % d)
            for k, p in ps.items():
                ids, _, fin = c.generate(d, p, max_tokens=GEN, ignore_eos=True)
                expect(ids == refs[k] and fin.completion_tokens == GEN,
                       "%s %s: got %s want %s" % (d, k, ids, refs[k]))
            i = c.info(d)
            expect(i.prefills_local == len(ps) and i.prefills_remote == 0,
                   "%s: %d local, %d remote prefills" % (d, i.prefills_local, i.prefills_remote))
            chunks = sum((len(p) + 7) // 8 for p in ps.values()) if d == "d4c" else len(ps)
            expect(i.prefill_chunks_local == chunks,
                   "%s: %d chunks, want %d" % (d, i.prefill_chunks_local, chunks))
            # step timing: every generated token after the first is a step;
            # a cycle (start to start) holds the forward that began it
            expect(i.decode_steps >= len(ps) * (GEN - 1) and i.decode_forward_ns > 0 and
                   i.decode_cycles >= len(ps) * (GEN - 2) and
                   i.decode_cycle_ns / i.decode_cycles >=
                   0.5 * i.decode_forward_ns / i.decode_steps,
                   "%s: step timing %d steps %d ns, %d cycles %d ns" %
                   (d, i.decode_steps, i.decode_forward_ns, i.decode_cycles, i.decode_cycle_ns))
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back: %s" % bad)
    finally:
        c.close()


def colocated_stories():
    check_colocated(STORIES, 512)


def colocated_synthetic():
    model = mkmodel(BUILD, os.path.join(tempfile.mkdtemp(prefix="duet_coloc_"), "kv2"), layers=2,
                    hidden=64, heads=8, kv_heads=2, head_dim=8, intermediate=96, vocab=300,
                    max_pos=512, seed=42)
    check_colocated(model, 300)


def conditional():
    ps = prompts(512)
    refs = {k: reference_ids(BUILD, STORIES, ps[k], GEN, ignore_eos=True)
            for k in ("short", "many-pages")}
    auto = {"prefill_local": "auto", "prefill_local_max_tokens": 2 * PAGE,
            "prefill_local_max_running": 4}
    busy = dict(auto, prefill_local_max_running=0)
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)],
                decode=[("d0", 2, auto), ("d1", 1, busy), ("d2", 1)], page_size=PAGE,
                n_pages=128)
    try:
        c.start_all()
        for k in ("short", "many-pages"):
            ids, _, _ = c.generate("d0", ps[k], max_tokens=GEN, ignore_eos=True, prefill="p0")
            expect(ids == refs[k], "d0 %s: got %s want %s" % (k, ids, refs[k]))
        i = c.info("d0")
        expect(i.prefill_local == "auto", "Info.prefill_local %r" % i.prefill_local)
        expect(i.prefills_local == 1 and i.prefills_remote == 1,
               "d0: short prompt local, long remote: got %d local, %d remote" %
               (i.prefills_local, i.prefills_remote))
        # without a target in the request, the config's prefill is known
        ids, _, _ = c.generate("d1", ps["short"], max_tokens=GEN, ignore_eos=True)
        expect(ids == refs["short"], "d1 short: got %s want %s" % (ids, refs["short"]))
        i = c.info("d1")
        expect(i.prefills_local == 0 and i.prefills_remote == 1,
               "d1 (running limit 0): got %d local, %d remote" %
               (i.prefills_local, i.prefills_remote))
        # asked to prefill locally (the router does so when no prefill is
        # healthy): d1 (auto) does, d2 (off) refuses
        req = c.request(ps["many-pages"], max_tokens=GEN, ignore_eos=True)
        req.prefill_local = True
        stub = c.pb["decode_grpc"].DecodeStub(c.channel("d1"))
        ids = [i for r in stub.Generate(req, timeout=60) if r.HasField("chunk")
               for i in r.chunk.ids]
        expect(ids == refs["many-pages"], "d1 asked local: got %s" % ids)
        expect(c.info("d1").prefills_local == 1, "d1 did not prefill locally when asked")
        try:
            list(c.pb["decode_grpc"].DecodeStub(c.channel("d2")).Generate(req, timeout=30))
            raise AssertionError("a decode with prefill_local off prefilled locally")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.FAILED_PRECONDITION and
                   "prefill_local" in e.details(), "d2: %s %s" % (e.code(), e.details()))
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back: %s" % bad)
    finally:
        c.close()


def concurrent_mixed():
    reqs = []
    for i in range(24):
        n = [1, 3, 15, 16, 17, 40, 90][i % 7] + i % 5
        reqs.append([1] + [(j * 13 + i * 7 + 5) % 509 + 3 for j in range(n - 1)])
    refs = [reference_ids(BUILD, STORIES, p, 8, ignore_eos=True) for p in reqs]
    auto = {"prefill_local": "auto", "prefill_local_max_tokens": 24,
            "prefill_local_max_running": 64, "max_batch_tokens": 64}
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 2, auto)],
                page_size=PAGE, n_pages=256)
    results = [None] * len(reqs)
    try:
        c.start_all()

        def run(i):
            try:
                results[i] = c.generate("d0", reqs[i], max_tokens=8, ignore_eos=True)[0]
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = e
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        wrong = ["%d (%d tokens): got %s want %s" % (i, len(reqs[i]), results[i], refs[i])
                 for i in range(len(reqs)) if results[i] != refs[i]]
        expect(not wrong, "wrong: " + "; ".join(wrong))
        i = c.info("d0")
        expect(i.prefills_local > 0 and i.prefills_remote > 0 and
               i.prefills_local + i.prefills_remote == len(reqs),
               "%d local, %d remote prefills" % (i.prefills_local, i.prefills_remote))
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back: %s" % bad)
    finally:
        c.close()


def cancel_local():
    c = Cluster(BUILD, SRC, STORIES, prefill=[], decode=[("d0", 2, ALWAYS)])
    try:
        c.start_all()
        it = c.stream("d0", [1, 403, 407, 261, 378, 429, 285], max_tokens=400, ignore_eos=True)
        got = 0
        for _ in it:
            got += 1
            if got == 3:
                it.cancel()
                break
        expect(got == 3, "stream ended early")
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back after the cancel: %s" % bad)
        ids, _, _ = c.generate("d0", [1, 403, 407], max_tokens=8, ignore_eos=True)
        expect(len(ids) == 8, "no tokens after a cancel")
        expect(c.info("d0").prefills_local == 2, "not prefilled locally")
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back: %s" % bad)
    finally:
        c.close()


def drain_local():
    c = Cluster(BUILD, SRC, STORIES, prefill=[], decode=[("d0", 1, ALWAYS)],
                env={"DUET_FAULTS": "decode.step_delay_ms=20"})
    try:
        c.start_all()
        it = c.stream("d0", [1, 5, 6, 7], max_tokens=60, ignore_eos=True)
        first = next(it)
        expect(first.HasField("chunk"), "no first chunk")
        c.daemons["d0"].proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:
            c.generate("d0", [1, 5], max_tokens=2, timeout=5)
            raise AssertionError("a draining decode accepted a request")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.UNAVAILABLE, "status %s" % e.code())
        fin = None
        for r in it:
            if not r.HasField("chunk"):
                fin = r.finished
        expect(fin is not None and fin.completion_tokens == 60, "the stream did not finish")
        rc = c.daemons["d0"].proc.wait(timeout=30)
        expect(rc == 0, "decode exited %d" % rc)
    finally:
        c.close()


def config_errors():
    cases = [
        ([], [("d0", 1, {"prefill_local": "sometimes"})], "d0",
         "decode[0].prefill_local: 'sometimes' is not off, always or auto"),
        ([("p0", 1, {"prefill_local": "always"})], [("d0", 1)], "p0",
         "prefill[0].prefill_local: only decode instances prefill locally"),
    ]
    for prefill, decode, name, want in cases:
        c = Cluster(BUILD, SRC, STORIES, prefill=prefill, decode=decode)
        d = c.daemons[name]
        exe = os.path.join(BUILD, d.role, "duet-" + d.role)
        r = subprocess.run([exe, "--config", c.config, "--name", name], capture_output=True,
                           text=True, timeout=30)
        expect(r.returncode != 0 and want in r.stderr,
               "%s: exit %d, stderr %r; want %r" % (name, r.returncode, r.stderr[-300:], want))
    # chunked prefill's budget
    c = Cluster(BUILD, SRC, STORIES, prefill=[],
                decode=[("d0", 1, dict(ALWAYS, prefill_chunk_tokens=-1))])
    exe = os.path.join(BUILD, "decode", "duet-decode")
    r = subprocess.run([exe, "--config", c.config, "--name", "d0"], capture_output=True,
                       text=True, timeout=30)
    want = "decode[0].prefill_chunk_tokens: -1 is out of range 0..1048576"
    expect(r.returncode != 0 and want in r.stderr,
           "prefill_chunk_tokens: exit %d, stderr %r" % (r.returncode, r.stderr[-300:]))
    # an override is checked too
    c = Cluster(BUILD, SRC, STORIES, prefill=[], decode=[("d0", 1)])
    exe = os.path.join(BUILD, "decode", "duet-decode")
    r = subprocess.run([exe, "--config", c.config, "--name", "d0", "--prefill-local", "yes"],
                       capture_output=True, text=True, timeout=30)
    expect(r.returncode != 0 and "prefill_local: 'yes' is not off, always or auto" in r.stderr,
           "override: exit %d, stderr %r" % (r.returncode, r.stderr[-300:]))


def long_prompt(n, salt):
    return [1] + [(i * 29 + salt * 17 + 5) % 509 + 3 for i in range(n - 1)]


def chunked_equivalence():
    """Long prompts chunked over many decode steps while other streams
    decode: the oracle's tokens, and the unchunked decode's."""
    chunked = dict(ALWAYS, prefill_chunk_tokens=16)
    whole = dict(ALWAYS, prefill_chunk_tokens=0)
    longs = [long_prompt(300, 1), long_prompt(181, 2), long_prompt(97, 3)]
    # shares the first 12 pages of longs[0]: its chunks start after them
    shared = longs[0][:12 * PAGE + 5] + long_prompt(90, 4)[1:]
    refs = [reference_ids(BUILD, STORIES, p, GEN, ignore_eos=True) for p in longs + [shared]]
    bg_prompts = [[1, 403, 407, 261], [1, 33, 44, 55, 66]]
    bg_refs = [reference_ids(BUILD, STORIES, p, 120, ignore_eos=True) for p in bg_prompts]
    c = Cluster(BUILD, SRC, STORIES, prefill=[],
                decode=[("d0", 2, chunked), ("d1", 1, chunked), ("d2", 1, whole)],
                page_size=PAGE, n_pages=256, env={"DUET_FAULTS": "decode.step_delay_ms=5"})
    try:
        c.start_all()
        # the unchunked decode: the same tokens
        whole_out = [c.generate("d2", p, max_tokens=GEN, ignore_eos=True)[0]
                     for p in longs + [shared]]
        expect(whole_out == refs, "unchunked decode: got %s want %s" % (whole_out, refs))
        expect(c.info("d2").prefill_chunks_local == c.info("d2").prefills_local,
               "unchunked: a whole prompt is one chunk")
        for d in ("d0", "d1"):
            i0 = c.info(d)
            bg_times = [[] for _ in bg_prompts]
            bg_out = [None] * len(bg_prompts)

            def background(k):
                ids = []
                for r in c.stream(d, bg_prompts[k], max_tokens=120, ignore_eos=True):
                    if r.HasField("chunk"):
                        ids += list(r.chunk.ids)
                        bg_times[k].append(time.time())
                bg_out[k] = ids
            bgs = [threading.Thread(target=background, args=(k,)) for k in range(len(bg_prompts))]
            for t in bgs:
                t.start()
            while not all(bg_times):
                time.sleep(0.01)
            results, firsts = [None] * len(longs), [None] * len(longs)
            t_sent = time.time()

            def run(k):
                ids = []
                for r in c.stream(d, longs[k], max_tokens=GEN, ignore_eos=True):
                    if r.HasField("chunk"):
                        if not ids:
                            firsts[k] = time.time()
                        ids += list(r.chunk.ids)
                results[k] = ids
            ts = [threading.Thread(target=run, args=(k,)) for k in range(len(longs))]
            for t in ts:
                t.start()
            for t in ts + bgs:
                t.join(120)
            expect(results == refs[:len(longs)],
                   "%s chunked: got %s want %s" % (d, results, refs[:len(longs)]))
            expect(bg_out == bg_refs, "%s: the background streams' tokens" % d)
            # the running streams kept decoding while the long prompts ran
            during = [sum(1 for t in bg_times[k] if t_sent < t < firsts[0])
                      for k in range(len(bg_prompts))]
            expect(min(during) >= 5, "%s: background tokens while 300 prompt tokens were "
                   "prefilled in chunks: %s" % (d, during))
            i1 = c.info(d)
            # 300, 181, 97 tokens in chunks of at most 16
            n_chunks = i1.prefill_chunks_local - i0.prefill_chunks_local
            expect(n_chunks >= 19 + 12 + 7 and
                   i1.prefills_local - i0.prefills_local == len(longs) + len(bg_prompts),
                   "%s: %d chunks for %d prefills" % (d, n_chunks,
                                                      i1.prefills_local - i0.prefills_local))
            # a cached prefix, then chunks of the rest
            h = i1.cache_hit_pages
            ids, _, _ = c.generate(d, shared, max_tokens=GEN, ignore_eos=True)
            expect(ids == refs[-1], "%s shared prefix: got %s want %s" % (d, ids, refs[-1]))
            expect(c.info(d).cache_hit_pages - h == 12,
                   "%s: %d cached pages hit" % (d, c.info(d).cache_hit_pages - h))
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back: %s" % bad)
    finally:
        c.close()


def lp_tuple(lp):
    return (lp.id, lp.logprob, tuple((t.id, t.logprob) for t in lp.top))


def chunked_logprobs():
    """Prompt logprobs and logprobs of a chunked prompt equal the unchunked
    decode's of the same TP, value for value."""
    c = Cluster(BUILD, SRC, STORIES, prefill=[],
                decode=[("d0", 2, dict(ALWAYS, prefill_chunk_tokens=16)),
                        ("d1", 2, dict(ALWAYS, prefill_chunk_tokens=0))],
                page_size=PAGE, n_pages=128)
    try:
        c.start_all()
        prompt = long_prompt(150, 5)
        want = reference_ids(BUILD, STORIES, prompt, GEN, ignore_eos=True)
        got = {}
        for d in ("d0", "d1"):
            req = c.request(prompt, max_tokens=GEN, ignore_eos=True)
            req.request.logprobs = True
            req.request.top_logprobs = 3
            req.request.prompt_logprobs = True
            stub = c.pb["decode_grpc"].DecodeStub(c.channel(d))
            ids, lps, plps = [], [], []
            for r in stub.Generate(req, timeout=60):
                if r.HasField("chunk"):
                    ids += list(r.chunk.ids)
                    lps += [lp_tuple(x) for x in r.chunk.logprobs]
                    plps += [lp_tuple(x) for x in r.chunk.prompt_logprobs]
            expect(ids == want, "%s: got %s want %s" % (d, ids, want))
            expect(len(plps) == len(prompt) - 1 and len(lps) == GEN,
                   "%s: %d prompt logprobs, %d logprobs" % (d, len(plps), len(lps)))
            expect([p[0] for p in plps] == prompt[1:], "%s: prompt logprobs' ids" % d)
            got[d] = (lps, plps)
        expect(c.info("d0").prefill_chunks_local >= 10, "d0 did not chunk the prompt")
        expect(got["d0"] == got["d1"], "chunked logprobs differ from unchunked: first "
               "difference at %s" % next((i for i, (a, b) in enumerate(zip(got["d0"][1],
                                                                           got["d1"][1]))
                                          if a != b), "the output logprobs"))
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back: %s" % bad)
    finally:
        c.close()


def chunked_abort():
    """A cancel and a deadline mid-chunk release everything."""
    c = Cluster(BUILD, SRC, STORIES, prefill=[],
                decode=[("d0", 1, dict(ALWAYS, prefill_chunk_tokens=8))], page_size=PAGE,
                n_pages=128, env={"DUET_FAULTS": "decode.step_delay_ms=30"})
    prompt = long_prompt(400, 6)  # 50 chunks of 8: 1.5 s at 30 ms a step
    try:
        c.start_all()
        i0 = c.info("d0")
        it = c.stream("d0", prompt, max_tokens=GEN, ignore_eos=True)
        got = []

        def consume():
            try:
                for r in it:
                    got.append(r)
            except grpc.RpcError as e:
                got.append(e.code())
        t = threading.Thread(target=consume)
        t.start()
        time.sleep(0.4)
        mid = c.info("d0")
        chunks = mid.prefill_chunks_local - i0.prefill_chunks_local
        expect(0 < chunks < 50 and mid.running == 1 and mid.free_pages < mid.total_pages,
               "not mid-chunk: %d chunks, %d running, %d/%d pages free" %
               (chunks, mid.running, mid.free_pages, mid.total_pages))
        it.cancel()
        t.join(30)
        expect(got == [grpc.StatusCode.CANCELLED], "the cancelled stream got %s" % got)
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back after a cancel mid-chunk: %s" % bad)
        after = c.info("d0").prefill_chunks_local - i0.prefill_chunks_local
        time.sleep(0.2)
        expect(c.info("d0").prefill_chunks_local - i0.prefill_chunks_local == after,
               "chunks still running after the cancel")
        # a deadline that passes mid-chunk
        t0 = time.time()
        try:
            c.generate("d0", prompt, max_tokens=GEN, ignore_eos=True, timeout=0.5)
            raise AssertionError("a 400-token prompt at 30 ms per 8 tokens beat 0.5 s")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, "deadline: %s" % e.code())
        expect(time.time() - t0 < 5, "the deadline took %.1fs" % (time.time() - t0))
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back after a deadline mid-chunk: %s" % bad)
        # still serving, and right
        short = [1, 403, 407, 261, 378]
        ids, _, _ = c.generate("d0", short, max_tokens=GEN, ignore_eos=True)
        expect(ids == reference_ids(BUILD, STORIES, short, GEN, ignore_eos=True),
               "after the aborts: %s" % ids)
        bad = c.pages_at_baseline()
        expect(not bad, "pages not back: %s" % bad)
    finally:
        c.close()


CASES = [colocated_stories, colocated_synthetic, conditional, concurrent_mixed, cancel_local, drain_local,
         config_errors, chunked_equivalence, chunked_logprobs, chunked_abort]

if __name__ == "__main__":
    run_cases(CASES, sys.argv[3:], "colocated/conditional")
