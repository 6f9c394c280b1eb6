#!/usr/bin/python3
"""Long contexts end to end (issue 27 item 3) on real duet-prefill /
duet-decode processes, with a tiny synthetic Llama-3.1-style model
(llama3 RoPE scaling, original_max_position_embeddings 8192,
max_position_embeddings 40960) so that a prompt of more than 32K tokens
takes seconds on one core.

  disagg       a 33000-token prompt: greedy tokens through a prefill TP 2 x
               decode TP 1 pair (per-page transfer) equal `duet generate
               --tp 1` (positions far beyond original_max_position_embeddings)
  prefix       a second prompt sharing the first 32000 tokens: the prefix
               caches of decode and prefill hit (Info cache_hit_tokens), and
               its greedy tokens equal `duet generate --tp 1`
  chunked      packed transfers (DUET_KV_TRANSFER_PACK=on) with staging
               arenas far smaller than the request (stage_pages 160 of
               2304): the KV moves in arena-sized chunks
               (docs/design-notes.md "Chunked packed transfers"), never page by page
               (Info kv_transfers_unstaged stays 0), and the tokens equal
               `duet generate --tp 1`; with transfer.checksum (CRC32C of
               every chunk, both sides)
  chunk_failures  the chunked path when a chunk is in flight (fault
               prefill.chunk_delay_ms: 2000 tokens in 16 chunks of 8 pages,
               300 ms apart): the client cancels -> CANCELLED, and every
               page and staging unit comes back on both daemons (the next
               request is chunked again and right); the prefill
               is killed -> decode recomputes the prompt itself
               (transfer.on_failure recompute) and the tokens still equal
               `duet generate --tp 1`
  limits       a prompt over the context is OUT_OF_RANGE naming it; a
               request whose prompt + max_tokens can never fit the decode's
               pool is INVALID_ARGUMENT naming the pool (refused up front,
               not queued); kv.max_context lowers the context below the
               model's (Info max_context, and a prompt over it refused)

After every case the pages are back at their baseline on every daemon.

usage: test_long_context.py BUILD_DIR SOURCE_DIR [case ...]
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duet_cluster import Cluster, mkmodel, run_cases  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
PAGE = 16
GEN = 8
N_LONG = 33000   # > 32K, and > 4 x original_max_position_embeddings
N_SHARED = 32000  # the prefix the second prompt shares (2000 pages)
N_PAGES = 2304   # holds one long request and the second's new pages
SCALING = ('{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, '
           '"high_freq_factor": 4.0, "original_max_position_embeddings": 8192}')
TMP = tempfile.mkdtemp(prefix="duet_longctx_")
MODEL = mkmodel(BUILD, os.path.join(TMP, "model"), layers=2, hidden=64, heads=4, kv_heads=2,
                intermediate=128, vocab=512, max_pos=40960, rope_theta=500000,
                rope_scaling=SCALING)
_REFS = {}


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def ids(n, salt):
    return [1] + [(i * 37 + salt * 11 + 3) % 509 + 3 for i in range(n - 1)]


def ref(prompt, n=GEN):
    """duet generate --tp 1, the prompt through a file (it outgrows argv)."""
    key = (tuple(prompt), n)
    if key not in _REFS:
        path = os.path.join(TMP, "prompt.txt")
        with open(path, "w") as f:
            f.write(" ".join(map(str, prompt)))
        t0 = time.time()
        out = subprocess.check_output(
            [os.path.join(BUILD, "tools", "duet"), "generate", "--model", MODEL, "--prompt-ids",
             "@" + path, "--max-tokens", str(n), "--temperature", "0", "--output", "ids",
             "--threads", "1", "--ignore-eos"], stderr=subprocess.DEVNULL, text=True)
        print("  duet generate --tp 1: %d prompt tokens in %.1fs" % (len(prompt),
                                                                   time.time() - t0))
        _REFS[key] = [int(x) for x in out.split()]
    return _REFS[key]


def gen(c, prompt, n=GEN, **kw):
    t0 = time.time()
    out, _, fin = c.generate("d0", prompt, max_tokens=n, ignore_eos=True, timeout=300, **kw)
    print("  disaggregated: %d prompt tokens in %.1fs" % (len(prompt), time.time() - t0))
    expect(fin.prompt_tokens == len(prompt), "prompt_tokens %d" % fin.prompt_tokens)
    return out


def cluster(env=None, extra=None, **kw):
    extra = dict({"max_batch_tokens": 4096}, **(extra or {}))
    c = Cluster(BUILD, SRC, MODEL, prefill=[("p0", 2, extra)], decode=[("d0", 1, extra)],
                page_size=PAGE, n_pages=N_PAGES, transfer_timeout_ms=120000, env=env, **kw)
    c.start_all()
    return c


def finish(c):
    try:
        bad = c.pages_at_baseline()
        expect(not bad, "pages not at baseline: %s" % bad)
    finally:
        c.close()


def disagg():
    c = cluster()
    try:
        p = ids(N_LONG, 1)
        got = gen(c, p)
        expect(got == ref(p), "33000-token prompt: %s != duet generate %s" % (got, ref(p)))
        expect(c.info("d0").max_context == 40960, "max_context %d" % c.info("d0").max_context)
    finally:
        finish(c)


def prefix():
    c = cluster()
    try:
        a = ids(N_LONG, 1)
        b = a[:N_SHARED] + ids(N_LONG - N_SHARED, 7)[1:] + [5]
        expect(gen(c, a) == ref(a), "first prompt differs from duet generate")
        hits0 = c.info("d0").cache_hit_tokens
        got = gen(c, b)
        expect(got == ref(b), "shared-prefix prompt: %s != duet generate %s" % (got, ref(b)))
        hit = c.info("d0").cache_hit_tokens - hits0
        print("  decode prefix cache: %d of %d prompt tokens hit" % (hit, len(b)))
        expect(hit >= N_SHARED, "decode hit %d tokens, want >= %d" % (hit, N_SHARED))
    finally:
        finish(c)


def chunked():
    # 160 staging units: a 33000-token request (2063 pages) needs 13 times
    # more on either side, so it moves in chunks
    c = cluster(env={"DUET_KV_TRANSFER_PACK": "on", "DUET_KV_TRANSFER_PROGRESS": "off"},
                extra={"stage_pages": 160}, checksum=True)
    try:
        expect(c.info("d0").transfer_packed, "decode does not ask for packed transfers")
        p = ids(N_LONG, 3)
        got = gen(c, p)
        expect(got == ref(p), "chunked: %s != duet generate %s" % (got, ref(p)))
        info = c.info("d0")
        expect(info.kv_transfers_unstaged == 0,
               "%d requests moved page by page" % info.kv_transfers_unstaged)
        expect(info.kv_transfers_chunked == 1, "chunked %d" % info.kv_transfers_chunked)
        # and a short one still moves whole, in one chunk
        q = ids(100, 4)
        expect(gen(c, q) == ref(q), "short packed request differs")
        expect(c.info("d0").kv_transfers_chunked == 1, "the short request went in chunks")
    finally:
        finish(c)


def chunk_failures():
    env = {"DUET_KV_TRANSFER_PACK": "on", "DUET_KV_TRANSFER_PROGRESS": "off"}
    # distinct prompts: a repeated one would hit decode's prefix cache
    p, p2, p3 = ids(2000, 5), ids(2000, 6), ids(2000, 7)
    c = cluster(env=env, extra={"stage_pages": 16})
    try:
        c.kill("p0")
        c.start("p0", env={"DUET_FAULTS": "prefill.chunk_delay_ms=300"})
        try:
            c.generate("d0", p, max_tokens=GEN, ignore_eos=True, timeout=1.5)
            raise AssertionError("the cancelled request finished")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, "cancel: %s" % e.code())
        time.sleep(1)  # the prefill's chunk in flight ends; its abort lands
        i = c.info("d0")
        expect(i.kv_transfers_chunked == 1, "not chunked: %s" % str(i).replace("\n", " "))
        bad = c.pages_at_baseline(timeout=20)
        expect(not bad, "after the cancel, pages not at baseline: %s" % bad)
        # both staging arenas came back: the next one is chunked again
        got = c.generate("d0", p2, max_tokens=GEN, ignore_eos=True, timeout=120)[0]
        expect(got == ref(p2), "after the cancel: %s != %s" % (got, ref(p2)))
        expect(c.info("d0").kv_transfers_chunked == 2, "not chunked after the cancel")
        # the prefill dies mid-transfer: decode recomputes the prompt
        result = {}

        def one():
            try:
                result["ids"] = c.generate("d0", p3, max_tokens=GEN, ignore_eos=True,
                                           timeout=120)[0]
            except grpc.RpcError as e:
                result["err"] = "%s: %s" % (e.code(), e.details())
        t = threading.Thread(target=one)
        t.start()
        time.sleep(1.5)
        c.kill("p0")
        t.join(150)
        expect("ids" in result, "prefill killed mid-transfer: %s" % result.get("err"))
        expect(result["ids"] == ref(p3), "recomputed: %s != %s" % (result["ids"], ref(p3)))
        i = c.info("d0")
        expect(i.kv_transfers_chunked == 3, "not chunked: %d chunked, %d unstaged" % (i.kv_transfers_chunked, i.kv_transfers_unstaged))
        c.start("p0")
    finally:
        finish(c)


def limits():
    S = grpc.StatusCode

    def refused(c, code, what, prompt, n, needle):
        try:
            c.generate("d0", prompt, max_tokens=n, timeout=60)
        except grpc.RpcError as e:
            print("  %-28s -> %s: %s" % (what, e.code().name, e.details()[:110]))
            expect(e.code() == code, "%s: %s, want %s" % (what, e.code(), code))
            expect(needle in e.details(), "%s: %r does not name %r" % (what, e.details(), needle))
            return
        raise AssertionError("%s: accepted" % what)

    c = cluster(extra={"n_pages": 2100})
    try:
        refused(c, S.OUT_OF_RANGE, "prompt over the context", ids(40961, 1), 4,
                "at most 40960")
        # 33000 + 2000 tokens: 2188 pages, the decode holds 2100
        refused(c, S.INVALID_ARGUMENT, "never fits the decode pool", ids(N_LONG, 1), 2000,
                "2100 pages of 16 tokens")
    finally:
        finish(c)
    c = Cluster(BUILD, SRC, MODEL, prefill=[("p0", 1)], decode=[("d0", 1)], page_size=PAGE,
                n_pages=N_PAGES)
    try:
        with open(c.config) as f:
            cfg = json.load(f)
        cfg["kv"]["max_context"] = 16384
        with open(c.config, "w") as f:
            json.dump(cfg, f)
        c.start_all()
        expect(c.info("d0").max_context == 16384, "max_context %d" % c.info("d0").max_context)
        refused(c, S.OUT_OF_RANGE, "prompt over kv.max_context", ids(16385, 1), 4,
                "kv.max_context")
    finally:
        finish(c)


if __name__ == "__main__":
    run_cases([disagg, prefix, chunked, chunk_failures, limits], sys.argv[3:], "long-context")
