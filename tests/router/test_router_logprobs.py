#!/usr/bin/python3
"""logprobs, echo, n > 1 and several prompts (issue 15; docs/api-logprobs.md)
through real duet-prefill / duet-decode / duet-router processes:

  one cluster: a prefill (TP 1) and a decode (TP 2) -- disaggregated --
  and a decode (TP 1) with prefill_local "always" -- colocated --, the
  router round-robin over the decodes (both paths are counted at the end).

  reference    gRPC Generate with logprobs, top_logprobs and prompt_logprobs:
               every generated and prompt token's logprob and its top 5
               agree with the independent numpy reference
               (tests/reference/llama_ref.py, float64) within LP_TOL
  completions  logprobs=5: tokens / token_logprobs / top_logprobs /
               text_offset equal the gRPC values; echo with logprobs=1 and
               max_tokens=1 (what lm-evaluation-harness sends): the prompt's
               tokens come first, the first with null; streaming the same
  chat         logprobs + top_logprobs=3: content entries with token,
               logprob, bytes (the token's UTF-8) and top_logprobs
  n / prompts  n=3 with a seed: reproducible, choice 0 equals n=1 with the
               same seed; 2 prompts x n=2: 4 choices, index = prompt*n + j,
               each equal to its own single request (greedy); streamed
               n=2: per-index text and logprobs equal the non-streaming
  bad input    400 with the field named: logprobs 6, chat logprobs 2,
               top_logprobs 21 / without logprobs, n 17, best_of != n,
               chat echo, n x prompts > 64; gRPC top_logprobs 21 ->
               INVALID_ARGUMENT
  disconnect   a client leaving an n=4 stream: every choice cancelled
  openai npm   the openai 6.49.0 client reads completion and chat logprobs
  pages        back at baseline on both decodes

usage: test_router_logprobs.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from router_cluster import Cluster, check, free_port, main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import llama_ref  # noqa: E402

# duet computes in fp32 on the CPU, the reference in float64: the logits
# differ by ~1e-5 on stories260K; a logprob is a difference of two such
# values, so 2e-3 is a wide margin that still catches any wrong row,
# token or normalisation (those are off by >= 0.1).
LP_TOL = 2e-3
# the same logprob from two requests: round-robin sends them to decodes of
# TP 1 and 2, whose fp32 sums run in different orders (~1e-6 apart)
CROSS_TOL = 1e-4
PROMPT = "Once upon a time, there was a little"


class Ref:
    def __init__(self, model):
        self.cfg, self.t = llama_ref.load_model(model)

    def logprobs(self, ids):
        """log-softmax rows [len(ids)][vocab]: row i predicts ids[i + 1]."""
        x = llama_ref.forward(self.cfg, self.t, ids)
        m = x.max(axis=1, keepdims=True)
        return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def check_entry(row, tok, lp, tops, what):
    """tok's logprob lp and tops [(id, lp)] against a reference row."""
    check(abs(row[tok] - lp) <= LP_TOL, "%s: token %d logprob %.6f, reference %.6f" %
          (what, tok, lp, row[tok]))
    kth = np.sort(row)[::-1][len(tops) - 1] if tops else 0
    for i, (t, v) in enumerate(tops):
        check(abs(row[t] - v) <= LP_TOL, "%s: top %d (token %d) %.6f, reference %.6f" %
              (what, i, t, v, row[t]))
        check(row[t] >= kth - LP_TOL, "%s: top %d token %d (%.6f) is not among the %d most "
              "likely (k-th %.6f)" % (what, i, t, row[t], len(tops), kth))
        if i > 0:
            check(v <= tops[i - 1][1], "%s: tops not sorted" % what)


def grpc_generate(cl, prompt, **kw):
    chunks = list(cl.router_stub().Generate(cl.gen_request(prompt, **kw), timeout=60))
    ids, lps, plps = [], [], []
    for c in chunks:
        if c.WhichOneof("kind") == "chunk":
            ids += list(c.chunk.ids)
            lps += list(c.chunk.logprobs)
            plps += list(c.chunk.prompt_logprobs)
    return ids, lps, plps, chunks[-1].finished


def reference(cl, ref, prompt_ids):
    """gRPC with every logprob option, twice (both decodes), vs the reference."""
    for attempt in range(2):
        ids, lps, plps, fin = grpc_generate(cl, prompt_ids, max_tokens=8, logprobs=True,
                                            top_logprobs=5, prompt_logprobs=True)
        check(len(lps) == len(ids) == fin.completion_tokens, "%d logprobs for %d ids" %
              (len(lps), len(ids)))
        check(len(plps) == len(prompt_ids) - 1, "%d prompt logprobs for %d prompt tokens" %
              (len(plps), len(prompt_ids)))
        rows = ref.logprobs(prompt_ids + ids)
        for i, e in enumerate(plps):
            check(e.id == prompt_ids[i + 1], "prompt logprob %d is for token %d" % (i, e.id))
            check(len(e.top) == 5, "prompt logprob %d has %d alternatives" % (i, len(e.top)))
            check_entry(rows[i], e.id, e.logprob, [(t.id, t.logprob) for t in e.top],
                        "prompt token %d" % (i + 1))
        for i, e in enumerate(lps):
            check(e.id == ids[i], "logprob %d is for token %d, generated %d" % (i, e.id, ids[i]))
            check_entry(rows[len(prompt_ids) - 1 + i], e.id, e.logprob,
                        [(t.id, t.logprob) for t in e.top], "generated token %d" % i)
            check(e.top[0].id == e.id, "greedy token %d is not the most likely" % i)
    print("reference: generated and prompt logprobs within %g of float64" % LP_TOL)
    return ids, lps


def completions(cl, prompt_ids, g_ids, g_lps):
    st, _, r = cl.post_json("/v1/completions", {"prompt": prompt_ids, "max_tokens": 8,
                                                "temperature": 0, "logprobs": 5})
    check(st == 200, "logprobs=5: %d %s" % (st, r))
    c = r["choices"][0]
    lp = c["logprobs"]
    check(set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
          "completions logprobs keys %s" % list(lp))
    n = len(g_ids)
    check(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) ==
          len(lp["text_offset"]) == n, "lengths: %s" % {k: len(v) for k, v in lp.items()})
    for i in range(n):
        check(abs(lp["token_logprobs"][i] - g_lps[i].logprob) < CROSS_TOL,
              "token %d: HTTP %s, gRPC %s" % (i, lp["token_logprobs"][i], g_lps[i].logprob))
        check(len(lp["top_logprobs"][i]) <= 5 and
              max(lp["top_logprobs"][i].values()) == lp["token_logprobs"][i],
              "top_logprobs %d: %s" % (i, lp["top_logprobs"][i]))
    check(lp["text_offset"][0] == 0 and
          all(lp["text_offset"][i + 1] == lp["text_offset"][i] +
              len(lp["tokens"][i].encode()) for i in range(n - 1)),
          "text_offset %s for tokens %s" % (lp["text_offset"], lp["tokens"]))
    check("".join(lp["tokens"]) == c["text"], "tokens %s vs text %r" % (lp["tokens"], c["text"]))

    # echo + logprobs=1 + max_tokens=1: the log-likelihood request
    st, _, r = cl.post_json("/v1/completions", {"prompt": prompt_ids, "max_tokens": 1,
                                                "temperature": 0, "logprobs": 1, "echo": True})
    check(st == 200, "echo: %d %s" % (st, r))
    lp = r["choices"][0]["logprobs"]
    check(len(lp["tokens"]) == len(prompt_ids) + 1, "echo: %d tokens" % len(lp["tokens"]))
    check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None,
          "echo: the first prompt token has a logprob: %s" % lp["token_logprobs"][:2])
    check(all(len(t) == 1 for t in lp["top_logprobs"][1:]), "echo: top_logprobs sizes")
    check(abs(lp["token_logprobs"][-1] - g_lps[0].logprob) < CROSS_TOL,
          "echo: the generated token's logprob %s vs %s" % (lp["token_logprobs"][-1],
                                                            g_lps[0].logprob))
    check(r["choices"][0]["text"].endswith(lp["tokens"][-1]), "echo text %r" %
          r["choices"][0]["text"])
    echo_lp = lp

    # the same streamed: the first event carries the prompt
    st, events, raw = cl.sse("/v1/completions", {"prompt": prompt_ids, "max_tokens": 1,
                                                 "temperature": 0, "logprobs": 1, "echo": True,
                                                 "stream": True})
    check(st == 200 and events[-1] == "[DONE]", "echo stream: %d %s" % (st, raw[-300:]))
    toks, tlps = [], []
    for e in events[:-1]:
        for ch in e["choices"]:
            if ch["logprobs"]:
                toks += ch["logprobs"]["tokens"]
                tlps += ch["logprobs"]["token_logprobs"]
    check(toks == echo_lp["tokens"] and tlps[0] is None and
          all(abs(a - b) < CROSS_TOL for a, b in zip(tlps[1:], echo_lp["token_logprobs"][1:])),
          "echo stream: %s vs %s" % (tlps, echo_lp["token_logprobs"]))
    print("completions: logprobs=5 equal gRPC; echo (non-stream and stream) with prompt logprobs")


def chat(cl):
    st, _, r = cl.post_json("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 6,
        "temperature": 0, "logprobs": True, "top_logprobs": 3})
    check(st == 200, "chat logprobs: %d %s" % (st, r))
    lp = r["choices"][0]["logprobs"]
    content = lp["content"]
    check(len(content) == r["usage"]["completion_tokens"], "chat: %d entries for %d tokens" %
          (len(content), r["usage"]["completion_tokens"]))
    for e in content:
        check(set(e) == {"token", "logprob", "bytes", "top_logprobs"}, "chat entry %s" % e)
        check(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["logprob"] == e["logprob"],
              "chat top_logprobs %s" % e)
        check(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"], "chat bytes %s" % e)
    st, events, raw = cl.sse("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 6,
        "temperature": 0, "logprobs": True, "top_logprobs": 3, "stream": True})
    check(st == 200 and events[-1] == "[DONE]", "chat stream: %d %s" % (st, raw[-300:]))
    toks = [e["token"] for ev in events[:-1] for ch in ev["choices"] if ch["logprobs"]
            for e in ch["logprobs"]["content"]]
    check(toks == [e["token"] for e in content], "chat stream tokens %s vs %s" %
          (toks, [e["token"] for e in content]))
    print("chat: %d logprob entries with 3 alternatives each, streamed the same" % len(content))


def fanout(cl, prompt_ids):
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 1234,
            "n": 3}
    st, _, a = cl.post_json("/v1/completions", body)
    st2, _, b = cl.post_json("/v1/completions", body)
    check(st == 200 and st2 == 200, "n=3: %d %d" % (st, st2))
    ta = [c["text"] for c in sorted(a["choices"], key=lambda c: c["index"])]
    tb = [c["text"] for c in sorted(b["choices"], key=lambda c: c["index"])]
    check([c["index"] for c in a["choices"]] == [0, 1, 2], "n=3 indices %s" % a["choices"])
    check(ta == tb, "n=3 with a seed is not reproducible: %s vs %s" % (ta, tb))
    check(len(set(ta)) > 1, "n=3 sampled choices all equal: %s" % ta)
    st, _, one = cl.post_json("/v1/completions", dict(body, n=1))
    check(one["choices"][0]["text"] == ta[0], "choice 0 differs from n=1 with the same seed")
    check(a["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"],
          "n=3 counts the prompt more than once: %s" % a["usage"])

    prompts = ["Once upon a time", prompt_ids]
    st, _, r = cl.post_json("/v1/completions", {"prompt": prompts, "max_tokens": 6,
                                                "temperature": 0, "n": 2, "logprobs": 2})
    check(st == 200 and len(r["choices"]) == 4, "2 prompts x n=2: %d %s" % (st, r))
    singles = []
    for p in prompts:
        _, _, s = cl.post_json("/v1/completions", {"prompt": p, "max_tokens": 6,
                                                   "temperature": 0, "logprobs": 2})
        singles.append(s["choices"][0])
    for c in r["choices"]:
        s = singles[c["index"] // 2]
        check(c["text"] == s["text"] and c["logprobs"]["tokens"] == s["logprobs"]["tokens"],
              "choice %d: %r vs its single request %r" % (c["index"], c["text"], s["text"]))
    check(r["usage"]["prompt_tokens"] == sum(s_["usage"]["prompt_tokens"] for s_ in [
        cl.post_json("/v1/completions", {"prompt": p, "max_tokens": 1})[2] for p in prompts]),
        "usage of 2 prompts: %s" % r["usage"])

    # streamed: per-index text and logprobs equal the non-streaming ones
    st, events, raw = cl.sse("/v1/completions", {"prompt": prompts, "max_tokens": 6,
                                                 "temperature": 0, "n": 2, "logprobs": 2,
                                                 "stream": True,
                                                 "stream_options": {"include_usage": True}})
    check(st == 200 and events[-1] == "[DONE]", "stream fan-out: %d %s" % (st, raw[-300:]))
    text, toks, fins = {}, {}, {}
    for e in events[:-1]:
        for ch in e["choices"]:
            i = ch["index"]
            text[i] = text.get(i, "") + ch["text"]
            if ch["logprobs"]:
                toks[i] = toks.get(i, []) + ch["logprobs"]["tokens"]
            if ch["finish_reason"]:
                fins[i] = ch["finish_reason"]
    check(events[-2]["usage"] == r["usage"], "stream usage %s vs %s" % (events[-2], r["usage"]))
    for c in r["choices"]:
        i = c["index"]
        check(text.get(i) == c["text"] and toks.get(i) == c["logprobs"]["tokens"] and
              fins.get(i) == c["finish_reason"], "stream choice %d: %r vs %r" %
              (i, text.get(i), c["text"]))
    print("fan-out: n=3 seeded reproducible; 2 prompts x n=2 (stream and not) equal singles")


def disconnect(cl):
    """A client that goes away mid-stream of an n=4 request: every choice's
    decode request is cancelled and the pages come back."""
    import socket
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                       "temperature": 1.0, "n": 4, "logprobs": 1, "stream": True})
    sock = socket.create_connection(("127.0.0.1", cl.http_port), timeout=30)
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  "application/json\r\nContent-Length: %d\r\n\r\n%s" %
                  (len(body), body)).encode())
    got = b""
    while got.count(b"data: ") < 8:
        d = sock.recv(65536)
        check(d, "stream ended early: %r" % got[-300:])
        got += d
    check(b" 200 " in got.split(b"\r\n", 1)[0], "n=4 stream: %r" % got[:200])
    busy = sum(cl.info(n).running for n in ("d2", "dl"))
    sock.close()
    bad_pages = cl.pages_at_baseline()
    check(not bad_pages, "after a disconnect of an n=4 stream: %s" % bad_pages)
    print("disconnect: an n=4 stream (%d running) cancelled, pages back" % busy)


def bad(cl):
    cases = [
        ("/v1/completions", {"prompt": "a", "logprobs": 6}, "logprobs"),
        ("/v1/completions", {"prompt": "a", "logprobs": True}, "logprobs"),
        ("/v1/completions", {"prompt": "a", "top_logprobs": 2}, "top_logprobs"),
        ("/v1/completions", {"prompt": "a", "n": 17}, "n"),
        ("/v1/completions", {"prompt": "a", "n": 2, "best_of": 3}, "best_of"),
        ("/v1/completions", {"prompt": ["a"] * 5, "n": 16}, "n"),
        ("/v1/completions", {"prompt": ["a", 7]}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "logprobs": 2}, "logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                  "echo": True}, "echo"),
    ]
    for path, body, param in cases:
        st, _, r = cl.post_json(path, body)
        check(st == 400 and r["error"]["param"] == param and r["error"]["message"],
              "%s %s: %d %s" % (path, body, st, r))
    import grpc
    try:
        grpc_generate(cl, "a", logprobs=True, top_logprobs=21)
        check(False, "gRPC top_logprobs 21 accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_logprobs" in e.details(),
              "gRPC top_logprobs 21: %s %s" % (e.code(), e.details()))
    print("bad input: %d HTTP 400s naming the field, gRPC INVALID_ARGUMENT" % len(cases))


def npm_client(cl, src):
    node = shutil.which("node")
    if not node or not os.path.isdir(os.path.join(src, "tests", "clients", "node_modules",
                                                  "openai")):
        print("SKIP part: node or tests/clients/node_modules/openai missing")
        return
    spec = {"base_url": "http://127.0.0.1:%d/v1" % cl.http_port, "model": "stories-chat"}
    path = os.path.join(cl.tmp, "logprobs_spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([node, os.path.join(src, "tests", "clients", "router_logprobs.mjs"), path],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "openai client: %s%s" % (r.stdout, r.stderr))
    print("openai npm client:", r.stdout.strip().splitlines()[-1])


def chat_model(cl):
    """The stories260K tokenizer with a chat template, for the router only."""
    mdir = os.path.join(cl.tmp, "chat_model")
    os.makedirs(mdir)
    for f in ("config.json", "tokenizer.json"):
        os.symlink(os.path.join(cl.model, f), os.path.join(mdir, f))
    with open(os.path.join(cl.model, "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc["chat_template"] = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: "
                           "{{ m['content'] | trim }}\n{% endfor %}"
                           "{% if add_generation_prompt %}assistant:{% endif %}")
    with open(os.path.join(mdir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    cfg = cl.write_config(os.path.join(cl.tmp, "router.json"),
                          {"served_model_name": "stories-chat"})
    with open(cfg) as f:
        c = json.load(f)
    c["model"] = mdir
    with open(cfg, "w") as f:
        json.dump(c, f)
    return cfg


def test(build, src):
    # a slow decode step (5 ms) keeps the disconnect case's stream going
    cl = Cluster(build, src, prefill=[("p1", 1)],
                 decode=[("d2", 2), ("dl", 1, {"prefill_local": "always"})],
                 env={"DUET_FAULTS": "decode.step_delay_ms=5"})
    try:
        ref = Ref(cl.model)
        cl.start_workers()
        cl.start_router(args=["--policy", "round_robin"], config=chat_model(cl))
        prompt_ids = [1] + list(range(300, 311))
        g_ids, g_lps = reference(cl, ref, prompt_ids)
        completions(cl, prompt_ids, g_ids, g_lps)
        chat(cl)
        fanout(cl, prompt_ids)
        bad(cl)
        disconnect(cl)
        npm_client(cl, src)
        local = cl.info("dl")
        remote = cl.info("d2")
        check(local.prefills_local > 0 and remote.prefills_remote > 0,
              "both paths: local %d remote %d" % (local.prefills_local, remote.prefills_remote))
        bad_pages = cl.pages_at_baseline()
        check(not bad_pages, "pages not back: %s" % bad_pages)
        print("paths: %d colocated, %d disaggregated requests" % (local.prefills_local,
                                                                  remote.prefills_remote))
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
