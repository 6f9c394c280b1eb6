#!/usr/bin/python3
"""The prefix cache (issue 15; docs/prefix-cache.md) on real duet-prefill /
duet-decode processes: greedy tokens with the cache on equal the cache off
and `duet generate --tp 1`, and the pages add up after every case.

Each cluster has a prefill and a decode with the cache on (p0: TP P, d0:
TP D; (P, D) = (2, 1) on stories260K, (1, 2) and (4, 2) on synthetic
models with 2 and 8 KV heads) and a prefill and a decode with it off (p1, d1: TP 1), so every
prompt runs through the four pairs: decode cache on/off x prefill cache
on/off (decode asks only for the pages after its cached prefix; prefill
reuses its own cache, or recomputes the prefix without sending it).

  sharing      prompts sharing 0 pages, 1 page, a page and a half (a partial
               page is computed), all but the last token (no prefill at
               all: decode computes the last page itself), the whole prompt,
               and exactly whole pages; hit counters in Info
  evictions    a small pool: more prompts than fit, LRU evictions counted,
               evicted prefixes recomputed correctly
  concurrent   12 concurrent requests sharing a cached 4-page prefix
  cancel       a long stream sharing its prefix with others is cancelled
               mid-stream: the others finish correctly, no page is freed
               while referenced (its prefix still hits), none leaks
  conditional_uncached  prefill_local "auto" counts only the uncached tokens
  multi_turn   (TP 1x2 and 2x1) turn 2 = turn 1's prompt + output + new
               tokens hits decode's pages of turn 1's output: with one new
               token no prefill is asked, with more prefill sends only the
               rest; same tokens through all four pairs; output logprobs
               keep their pages, prompt logprobs none; a stream cancelled
               after 36 tokens keeps the pages of what it computed
  conversation_evictions  a 6-page pool: eviction takes a conversation's
               last page first, and turn 2 still hits the rest
  config_error prefix_cache that is not a boolean stops start-up naming it

After every case, on every daemon: pool_free + cached_idle + in_use ==
total and nothing in use (duet_cluster.pages_at_baseline).

usage: test_prefix_cache.py BUILD_DIR SOURCE_DIR [case ...]
"""
import os
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
GEN = 8
OFF = {"prefix_cache": False}
_REFS = {}


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def ref(model, prompt, n=GEN):
    key = (model, tuple(prompt), n)
    if key not in _REFS:
        _REFS[key] = reference_ids(BUILD, model, prompt, n, ignore_eos=True)
    return _REFS[key]


def ids(vocab, n, salt):
    return [1] + [(i * 37 + salt * 11 + 3) % (vocab - 3) + 3 for i in range(n - 1)]


def cluster(model, P, D, n_pages=256):
    c = Cluster(BUILD, SRC, model, prefill=[("p0", P), ("p1", 1, OFF)],
                decode=[("d0", D), ("d1", 1, OFF)], page_size=PAGE, n_pages=n_pages)
    c.start_all()
    return c


def baseline(c):
    bad = c.pages_at_baseline()
    expect(not bad, "pages: " + "; ".join(bad))


def run(c, model, prompt, decodes=("d0", "d1"), prefills=("p0", "p1"), what=""):
    want = ref(model, prompt)
    for d in decodes:
        for p in prefills:
            got, _, fin = c.generate(d, prompt, max_tokens=GEN, ignore_eos=True, prefill=p)
            expect(got == want and fin.completion_tokens == GEN,
                   "%s via %s/%s: got %s want %s" % (what, d, p, got, want))


def sharing_on(model, vocab, P, D):
    c = cluster(model, P, D)
    try:
        base = ids(vocab, 5 * PAGE + 3, 1)            # 83 tokens, 5 full pages
        other = ids(vocab, 3 * PAGE + 5, 2)
        run(c, model, base, what="cold")
        i0 = c.info("d0")
        expect(i0.prefix_cache and not c.info("d1").prefix_cache, "Info.prefix_cache")
        expect(i0.cached_pages >= 5, "decode kept the prompt's 5 full pages: %d" % i0.cached_pages)
        expect(c.info("p0").cached_pages >= 5, "prefill kept them: %d" % c.info("p0").cached_pages)
        run(c, model, other, what="shares 0 pages")
        run(c, model, base[:PAGE] + ids(vocab, 40, 3)[1:], what="shares 1 page")
        run(c, model, base[:PAGE + PAGE // 2] + ids(vocab, 30, 4)[1:], what="shares 1.5 pages")
        baseline(c)
        # all but the last token: decode has every page it may use, so no
        # prefill instance is asked (prefill's request count stays)
        before = [c.info(n).requests_total for n in ("p0", "p1")]
        local0 = c.info("d0").prefills_local
        for what, prompt in (("all but one token", base[:-1] + [(base[-1] + 1) % vocab or 3]),
                             ("the same prompt", base),
                             ("exactly whole pages", base[:4 * PAGE])):
            run(c, model, prompt, decodes=("d0",), what=what)
        after = [c.info(n).requests_total for n in ("p0", "p1")]
        expect(after == before, "a prompt cached on decode went to prefill: %s -> %s" %
               (before, after))
        expect(c.info("d0").prefills_local - local0 == 6,
               "decode computed the last page itself 6 times: %d" %
               (c.info("d0").prefills_local - local0))
        i0, p0 = c.info("d0"), c.info("p0")
        expect(i0.cache_hit_tokens > 0 and i0.cache_hit_pages > 0 and i0.cache_lookups > 0,
               "decode hit counters: %s" % i0)
        expect(p0.cache_hit_tokens > 0 and p0.cache_hit_pages > 0, "prefill hit counters")
        expect(c.info("d1").cache_lookups == 0, "a decode with the cache off looked up")
        expect(c.info("p1").cache_lookups == 0, "a prefill with the cache off looked up")
        baseline(c)
    finally:
        c.close()


def sharing():
    sharing_on(STORIES, 512, 2, 1)


def sharing_synthetic():
    tmp = tempfile.mkdtemp(prefix="duet_pc_")
    model = mkmodel(BUILD, os.path.join(tmp, "kv2"), layers=2, hidden=64, heads=8, kv_heads=2,
                    head_dim=8, intermediate=96, vocab=300, max_pos=512, seed=42)
    sharing_on(model, 300, 1, 2)


def sharing_kv8():
    tmp = tempfile.mkdtemp(prefix="duet_pc_")
    model = mkmodel(BUILD, os.path.join(tmp, "kv8"), layers=2, hidden=64, heads=8, kv_heads=8,
                    head_dim=8, intermediate=96, vocab=300, max_pos=512, seed=48)
    sharing_on(model, 300, 4, 2)


def conditional_uncached():
    """prefill_local "auto" decides by the uncached length: a 94-token
    prompt is over the 40-token limit, but with 64 of its tokens cached on
    decode only 30 are left, and those are computed locally."""
    auto = {"prefill_local": "auto", "prefill_local_max_tokens": 40}
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 1, auto)],
                page_size=PAGE, n_pages=256)
    try:
        c.start_all()
        shared = ids(512, 4 * PAGE, 60)
        run(c, STORIES, shared + ids(512, 20, 61)[1:], decodes=("d0",), prefills=("p0",),
            what="cold")
        i = c.info("d0")
        expect((i.prefills_local, i.prefills_remote) == (0, 1),
               "83 uncached tokens went local: %s" % ((i.prefills_local, i.prefills_remote),))
        run(c, STORIES, shared + ids(512, 31, 62)[1:], decodes=("d0",), prefills=("p0",),
            what="warm")
        i = c.info("d0")
        expect((i.prefills_local, i.prefills_remote) == (1, 1),
               "30 uncached tokens of 94 did not go local: %s" %
               ((i.prefills_local, i.prefills_remote),))
        baseline(c)
    finally:
        c.close()


def gen(c, decode, prompt, n, prefill, **kw):
    """n greedy tokens of prompt on decode (a request built by hand for the
    logprob flags)."""
    req = c.request(prompt, max_tokens=n, ignore_eos=True, prefill=prefill)
    for k, v in kw.items():
        setattr(req.request, k, v)
    stub = c.pb["decode_grpc"].DecodeStub(c.channel(decode))
    out = []
    for r in stub.Generate(req, timeout=60):
        if r.HasField("chunk"):
            out += list(r.chunk.ids)
    return out


def multi_turn_on(P, D, cancel_case):
    """Generated pages (docs/prefix-cache.md "Generated pages"): turn 2 of
    a conversation is turn 1's prompt + turn 1's output + new tokens, and
    decode's cache holds the pages of turn 1's output too (all but the page
    of its last token, whose KV decode never computed)."""
    c = cluster(STORIES, P, D)
    try:
        p1 = ids(512, 2 * PAGE + 5, 70)                     # 37 tokens: 2 full pages
        out1 = ref(STORIES, p1, 40)
        i0 = c.info("d0")
        got = c.generate("d0", p1, max_tokens=40, ignore_eos=True, prefill="p0")[0]
        expect(got == out1, "turn 1: got %s want %s" % (got, out1))
        # (decode inserts the pages after the stream's last message: the
        # baseline waits for the request's release, which comes after)
        baseline(c)
        i1 = c.info("d0")
        # 37 + 39 tokens with KV: 4 full pages, 2 of the prompt and 2 more
        expect(i1.cache_inserted_pages - i0.cache_inserted_pages == 4,
               "decode kept %d pages of turn 1, not 4 (2 prompt + 2 generated)" %
               (i1.cache_inserted_pages - i0.cache_inserted_pages))
        # turn 2a: one new token: decode holds every page it may use (4 of
        # 78 // 16), so it computes the last page itself and asks no prefill
        t2a = p1 + out1 + [11]
        pf = [c.info(n).requests_total for n in ("p0", "p1")]
        got = gen(c, "d0", t2a, GEN, "p0")
        i2 = c.info("d0")
        expect(i2.cache_hit_pages - i1.cache_hit_pages == 4,
               "turn 2 hit %d pages on decode, not 4 (2 of them turn 1's output)" %
               (i2.cache_hit_pages - i1.cache_hit_pages))
        expect([c.info(n).requests_total for n in ("p0", "p1")] == pf,
               "turn 2 went to prefill though decode held all but its last page")
        expect(got == ref(STORIES, t2a), "turn 2a: got %s want %s" % (got, ref(STORIES, t2a)))
        # turn 2b: longer new text: prefill is asked for the pages after the
        # 4 cached ones (its own cache holds only turn 1's prompt pages);
        # through every pair: the same tokens with the caches on and off
        t2b = p1 + out1 + ids(512, 30, 71)[1:]
        run(c, STORIES, t2b, what="turn 2b")
        expect(c.info("d0").cache_hit_pages - i2.cache_hit_pages >= 4 + 6,
               "turn 2b's pages on decode: %d hits" % (c.info("d0").cache_hit_pages -
                                                        i2.cache_hit_pages))
        baseline(c)
        # logprobs of the output: its pages are kept as well; prompt
        # logprobs: nothing is kept (docs/prefix-cache.md "Limits")
        p3 = ids(512, PAGE + 3, 72)
        i3 = c.info("d0")
        expect(gen(c, "d0", p3, 40, "p0", logprobs=True) == ref(STORIES, p3, 40), "logprobs run")
        baseline(c)
        i4 = c.info("d0")
        expect(i4.cache_inserted_pages - i3.cache_inserted_pages == 3,
               "a logprobs request kept %d pages, not 1 + 2" %
               (i4.cache_inserted_pages - i3.cache_inserted_pages))
        p4 = ids(512, PAGE + 3, 73)
        expect(gen(c, "d0", p4, 40, "p0", prompt_logprobs=True, logprobs=True) ==
               ref(STORIES, p4, 40), "prompt logprobs run")
        baseline(c)
        expect(c.info("d0").cache_inserted_pages == i4.cache_inserted_pages,
               "a prompt-logprobs request left pages in the cache")
        baseline(c)
        if not cancel_case:
            return
        # a stream cancelled after some output keeps the pages of the
        # tokens it computed: a prompt continuing with the tokens received
        # hits them
        p5 = ids(512, PAGE + 9, 74)
        stream = c.stream("d0", p5, max_tokens=400, ignore_eos=True, prefill="p0")
        seen = []
        for r in stream:
            seen += list(r.chunk.ids)
            if len(seen) >= 36:
                break
        stream.cancel()
        expect(seen == ref(STORIES, p5, len(seen)), "the cancelled stream's tokens")
        baseline(c)
        t6 = p5 + seen + [13, 14]
        h = c.info("d0").cache_hit_pages
        got = gen(c, "d0", t6, GEN, "p0")
        want_hits = (len(p5) + len(seen) - 1) // PAGE
        expect(c.info("d0").cache_hit_pages - h >= want_hits,
               "after the cancel: %d hits, want >= %d" % (c.info("d0").cache_hit_pages - h,
                                                         want_hits))
        expect(got == ref(STORIES, t6), "after the cancel: got %s want %s" %
               (got, ref(STORIES, t6)))
        baseline(c)
    finally:
        c.close()


def conversation_evictions():
    """Decode releases a request's pages last first (kv/prefix_cache.h
    duet_kv_pool_release_chain), so eviction takes a conversation's last
    page before its first and the rest still matches.  A 6-page pool: turn
    1 (37 + 40 tokens) leaves 4 cached pages and 2 free; a 33-token request
    needs 3 pages and evicts one cached page -- turn 1's fourth; turn 2
    then hits its first 3 (released first page first, the evicted page
    would be the first and nothing would match)."""
    c = Cluster(BUILD, SRC, STORIES, prefill=[("p0", 1)], decode=[("d0", 1)], page_size=PAGE,
                n_pages=6)
    try:
        c.start_all()
        p1 = ids(512, 2 * PAGE + 5, 80)
        out1 = ref(STORIES, p1, 40)
        expect(gen(c, "d0", p1, 40, "p0") == out1, "turn 1")
        baseline(c)
        expect(c.info("d0").cached_pages == 4, "turn 1 left %d pages" % c.info("d0").cached_pages)
        other = ids(512, 2 * PAGE + 1, 81)
        expect(gen(c, "d0", other, GEN, "p0") == ref(STORIES, other), "the other request")
        expect(c.info("d0").cache_evictions == 1, "evictions: %d" % c.info("d0").cache_evictions)
        t2 = p1 + out1 + [11]
        h = c.info("d0").cache_hit_pages
        expect(gen(c, "d0", t2, GEN, "p0") == ref(STORIES, t2), "turn 2")
        expect(c.info("d0").cache_hit_pages - h == 3,
               "turn 2 hit %d pages, not 3 (the first 3 of turn 1's 4)" %
               (c.info("d0").cache_hit_pages - h))
        baseline(c)
    finally:
        c.close()


def multi_turn():
    multi_turn_on(1, 2, True)


def multi_turn_p2d1():
    multi_turn_on(2, 1, False)


def config_error():
    c = Cluster(BUILD, SRC, STORIES, prefill=[], decode=[("d0", 1, {"prefix_cache": "yes"})])
    exe = os.path.join(BUILD, "decode", "duet-decode")
    r = subprocess.run([exe, "--config", c.config, "--name", "d0"], capture_output=True,
                       text=True, timeout=30)
    expect(r.returncode != 0 and "prefix_cache" in r.stderr,
           "exit %d, stderr %r" % (r.returncode, r.stderr[-300:]))


def evictions():
    # 14 pages: one request of 83 + 8 tokens takes 6; prompts of 5 full
    # pages each cannot all stay
    c = cluster(STORIES, 2, 2, n_pages=14)
    try:
        prompts = [ids(512, 5 * PAGE + 3, 10 + k) for k in range(4)]
        for k, p in enumerate(prompts):
            run(c, STORIES, p, decodes=("d0",), prefills=("p0",), what="prompt %d" % k)
        for n in ("d0", "p0"):
            expect(c.info(n).cache_evictions > 0, "%s evicted nothing" % n)
        # the first ones were evicted: recomputed, still right; then hits
        for k, p in enumerate(prompts):
            run(c, STORIES, p, decodes=("d0",), prefills=("p0", "p1"), what="again %d" % k)
        baseline(c)
    finally:
        c.close()


def concurrent():
    c = cluster(STORIES, 2, 2)
    try:
        shared = ids(512, 4 * PAGE, 20)
        reqs = [shared + ids(512, 3 + 5 * i, 30 + i)[1:] for i in range(12)]
        for p in reqs:
            ref(STORIES, p)
        # (requests admitted together before any of them computed the
        # prefix each compute it; one request first makes it cached)
        run(c, STORIES, shared + [5], decodes=("d0",), prefills=("p0",), what="warm")
        hits = c.info("d0").cache_hit_pages
        results = [None] * len(reqs)

        def go(i):
            try:
                results[i] = c.generate("d0", reqs[i], max_tokens=GEN, ignore_eos=True,
                                        prefill="p0")[0]
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = e
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        wrong = [(i, results[i]) for i in range(len(reqs)) if results[i] != ref(STORIES, reqs[i])]
        expect(not wrong, "wrong: %s" % wrong)
        expect(c.info("d0").cache_hit_pages - hits >= 4 * len(reqs),
               "decode hits among requests sharing a cached prefix: %d" %
               (c.info("d0").cache_hit_pages - hits))
        baseline(c)
    finally:
        c.close()


def cancel():
    c = cluster(STORIES, 1, 1)
    try:
        shared = ids(512, 3 * PAGE, 40)
        long_p = shared + ids(512, 10, 41)[1:]
        run(c, STORIES, shared + [7], decodes=("d0",), prefills=("p0",), what="warm")
        stream = c.stream("d0", long_p, max_tokens=400, ignore_eos=True, prefill="p0")
        first = next(stream)  # running: it holds the shared pages
        expect(first is not None, "no first chunk")
        held = c.info("d0").shared_pages
        expect(held >= 3, "the running stream shares the cached pages: %d" % held)
        others = [shared + ids(512, 6 + i, 50 + i)[1:] for i in range(4)]
        results = [None] * len(others)

        def go(i):
            results[i] = c.generate("d0", others[i], max_tokens=GEN, ignore_eos=True,
                                    prefill="p0")[0]
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(others))]
        for t in threads:
            t.start()
        stream.cancel()
        for t in threads:
            t.join(120)
        for i, p in enumerate(others):
            expect(results[i] == ref(STORIES, p), "request %d after the cancel: %s" %
                   (i, results[i]))
        try:
            for _ in stream:
                pass
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.CANCELLED, "stream ended with %s" % e.code())
        baseline(c)
        # the shared pages survived the cancel: the prefix still hits
        hits = c.info("d0").cache_hit_pages
        run(c, STORIES, shared + [9, 9], decodes=("d0",), prefills=("p0",), what="after cancel")
        expect(c.info("d0").cache_hit_pages - hits == 3, "the shared prefix was lost")
        baseline(c)
    finally:
        c.close()


if __name__ == "__main__":
    t0 = time.time()
    run_cases([sharing, sharing_synthetic, sharing_kv8, evictions, concurrent, cancel,
               conditional_uncached, multi_turn, multi_turn_p2d1, conversation_evictions,
               config_error], sys.argv[3:],
              "prefix cache")
    print("%.0fs" % (time.time() - t0))
