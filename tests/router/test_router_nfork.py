#!/usr/bin/python3
"""n > 1 with fork-style sharing of the prompt's pages, on HTTP and gRPC
(issue 15; docs/api-logprobs.md "Fork-style sharing"), through real
duet-prefill / duet-decode / duet-router processes on stories260K:

  one prefill (TP 1), two decodes (TP 1), the router round-robin -- so
  without pinning the choices of one request would spread over both
  decodes and each would need its own prefill.

  http n=8     greedy, a fresh 40-token prompt (2 full pages before its last
               token): the daemons' counters show ONE prompt prefill (the
               prefill's requests and computed tokens), the other 7 choices
               served by the same decode from its prefix cache (its hits
               7 x 32 tokens, 7 local prefills of the last page, the other
               decode untouched); every choice equals n=1 and `duet
               generate --tp 1`
  seeded n=4   temperature 1 with a seed: reproducible, choice 0 equals n=1
               with the seed, one prefill again; streamed n=3: one prefill,
               per-index text = non-streamed; echo + logprobs n=2 (prompt
               logprobs skip the cache): both choices prefilled, both answered
  grpc n=3     seeded, streamed: every chunk and Finished carries its index,
               request ids <id>-<i>, equal to HTTP n=3 with the seed, twice
               equal, choice 0 = gRPC n=1; one prefill; n=1 unchanged (no
               index, one Finished)
  bad n        gRPC n=17 -> INVALID_ARGUMENT naming n; Decode.Generate with
               n=2 -> INVALID_ARGUMENT naming n
  cancel       a gRPC n=4 stream cancelled while choices 1..3 wait for
               choice 0's prompt (prefill held by a fault delay), an HTTP
               n=4 client gone while they wait, a gRPC stream cancelled
               mid-stream: the router's in-flight gauges and every
               worker's count back to 0, decode pages at baseline (free +
               cached + in use = total, none in use)

usage: test_router_nfork.py BUILD_DIR SOURCE_DIR
"""
import time

import grpc

from router_cluster import Cluster, check, main, oracle

PAGE = 16


def counters(cl):
    p = cl.info("p1")
    out = {"p_requests": p.requests_total,
           "p_computed": p.cache_lookup_tokens - p.cache_hit_tokens}
    for d in ("d1", "d2"):
        i = cl.info(d)
        out[d] = {"requests": i.requests_total, "local": i.prefills_local,
                  "remote": i.prefills_remote, "hit_tokens": i.cache_hit_tokens}
    return out


def delta(a, b):
    out = {"p_requests": b["p_requests"] - a["p_requests"],
           "p_computed": b["p_computed"] - a["p_computed"]}
    for d in ("d1", "d2"):
        out[d] = {k: b[d][k] - a[d][k] for k in a[d]}
    return out


def check_one_prefill(dl, n, n_prompt, what):
    """n choices of an n_prompt-token prompt: one prefill, n-1 cache hits on
    the decode that served choice 0."""
    hit = (n_prompt - 1) // PAGE * PAGE
    check(dl["p_requests"] == 1 and dl["p_computed"] == n_prompt,
          "%s: the prefill computed %d requests / %d tokens, want 1 / %d (%s)" %
          (what, dl["p_requests"], dl["p_computed"], n_prompt, dl))
    used = [d for d in ("d1", "d2") if dl[d]["requests"]]
    check(len(used) == 1, "%s: the choices went to %s, not to one decode (%s)" % (what, used, dl))
    d = dl[used[0]]
    check(d["requests"] == n and d["remote"] == 1 and d["local"] == n - 1 and
          d["hit_tokens"] == (n - 1) * hit,
          "%s: decode %s: %s, want %d requests, 1 remote prefill, %d local, %d hit tokens" %
          (what, used[0], d, n, n - 1, (n - 1) * hit))
    return used[0]


def texts(r):
    return [c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])]


def http_greedy(cl, build):
    prompt = [1] + list(range(400, 439))  # 40 tokens: 2 full pages before the last
    before = counters(cl)
    st, _, r = cl.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 8, "n": 8,
                                                "temperature": 0})
    check(st == 200 and len(r["choices"]) == 8, "n=8: %d %s" % (st, r))
    d = check_one_prefill(delta(before, counters(cl)), 8, len(prompt), "HTTP n=8")
    _, ref_text = oracle(build, cl.model, prompt_ids=prompt, max_tokens=8)
    st, _, one = cl.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 8,
                                                  "temperature": 0})
    check(texts(r) == [ref_text] * 8 and one["choices"][0]["text"] == ref_text,
          "greedy n=8 %s, n=1 %r, duet generate %r" % (texts(r), one["choices"][0]["text"],
                                                       ref_text))
    check(r["usage"]["prompt_tokens"] == len(prompt) and
          r["usage"]["completion_tokens"] == 8 * 8, "usage %s" % r["usage"])
    print("HTTP n=8 greedy: 1 prefill of %d tokens, 7 choices from %s's cache; all equal "
          "duet generate" % (len(prompt), d))


def http_seeded(cl):
    prompt = [1] + list(range(200, 249))  # 50 tokens: 3 full pages
    body = {"prompt": prompt, "max_tokens": 10, "n": 4, "temperature": 1.0, "seed": 4242}
    before = counters(cl)
    st, _, a = cl.post_json("/v1/completions", body)
    check(st == 200, "seeded n=4: %d %s" % (st, a))
    check_one_prefill(delta(before, counters(cl)), 4, len(prompt), "HTTP seeded n=4")
    _, _, b = cl.post_json("/v1/completions", body)
    _, _, one = cl.post_json("/v1/completions", dict(body, n=1))
    check(texts(a) == texts(b), "seeded n=4 not reproducible: %s vs %s" % (texts(a), texts(b)))
    check(len(set(texts(a))) > 1, "seeded n=4: the sampled choices are all equal: %s" % texts(a))
    check(texts(one) == texts(a)[:1], "choice 0 %r differs from n=1 %r" % (texts(a)[0],
                                                                         texts(one)))
    print("HTTP n=4 seeded: reproducible, choice 0 = n=1, one prefill")


def http_stream_and_rule(cl):
    """Streamed n=3 follows choice 0 too; echo with logprobs (prompt
    logprobs skip the cache) starts every choice at once."""
    prompt = [1] + list(range(250, 290))
    body = {"prompt": prompt, "max_tokens": 6, "n": 3, "temperature": 1.0, "seed": 5}
    before = counters(cl)
    st, events, raw = cl.sse("/v1/completions", dict(body, stream=True))
    check(st == 200 and events[-1] == "[DONE]", "stream n=3: %d %s" % (st, raw[-300:]))
    check_one_prefill(delta(before, counters(cl)), 3, len(prompt), "HTTP stream n=3")
    text, fins = {}, {}
    for e in events[:-1]:
        for ch in e["choices"]:
            text[ch["index"]] = text.get(ch["index"], "") + ch["text"]
            if ch["finish_reason"]:
                fins[ch["index"]] = ch["finish_reason"]
    _, _, r = cl.post_json("/v1/completions", body)
    check([text.get(i) for i in range(3)] == texts(r) and sorted(fins) == [0, 1, 2],
          "stream n=3 %s vs %s (finish %s)" % (text, texts(r), fins))
    before = counters(cl)
    st, _, r = cl.post_json("/v1/completions", {"prompt": prompt[:-1] + [7], "max_tokens": 1,
                                                "n": 2, "temperature": 0, "echo": True,
                                                "logprobs": 1})
    dl = delta(before, counters(cl))
    check(st == 200 and len(r["choices"]) == 2 and dl["p_requests"] == 2,
          "echo + logprobs n=2: %d, %d prefills (both choices compute the prompt): %s" %
          (st, dl["p_requests"], dl))
    print("HTTP stream n=3: one prefill, = non-streamed; echo + logprobs n=2: each choice prefilled")


def grpc_choices(cl, prompt, n, seed, max_tokens=10, stream_first=None):
    """A gRPC Generate: {index: (ids, text, finished)} and the messages."""
    req = cl.gen_request(prompt, max_tokens=max_tokens, temperature=1.0, n=n)
    req.sampling.seed, req.sampling.has_seed = seed, True
    out, msgs = {}, []
    for m in cl.router_stub().Generate(req, timeout=60):
        msgs.append(m)
        if m.WhichOneof("kind") == "chunk":
            i = m.chunk.index
            ids, text, fin = out.get(i, ([], "", None))
            check(fin is None, "index %d: a chunk after its Finished" % i)
            out[i] = (ids + list(m.chunk.ids), text + m.chunk.text, None)
        else:
            i = m.finished.index
            check(i in out and out[i][2] is None, "index %d: Finished twice or first" % i)
            out[i] = (out[i][0], out[i][1], m.finished)
    return out, msgs


def grpc_n(cl):
    prompt = [1] + list(range(100, 136))  # 37 tokens: 2 full pages
    before = counters(cl)
    a, msgs = grpc_choices(cl, prompt, 3, 99)
    check_one_prefill(delta(before, counters(cl)), 3, len(prompt), "gRPC n=3")
    check(sorted(a) == [0, 1, 2] and all(a[i][2] for i in a), "gRPC n=3: %s" % a)
    ids = {a[i][2].request_id for i in a}
    base = a[0][2].request_id.rsplit("-", 1)[0]
    check(ids == {"%s-%d" % (base, i) for i in range(3)}, "request ids %s" % ids)
    for i in a:
        check(a[i][2].completion_tokens == len(a[i][0]) == 10 and
              a[i][2].prompt_tokens == len(prompt), "choice %d: %s" % (i, a[i][2]))
    check(msgs[-1].WhichOneof("kind") == "finished", "the stream does not end with a Finished")
    b, _ = grpc_choices(cl, prompt, 3, 99)
    check({i: a[i][0] for i in a} == {i: b[i][0] for i in b},
          "gRPC n=3 seeded not reproducible")
    check(len({tuple(a[i][0]) for i in a}) > 1, "gRPC n=3: the sampled choices are all equal")
    st, _, h = cl.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 10, "n": 3,
                                                "temperature": 1.0, "seed": 99})
    check(texts(h) == [a[i][1] for i in range(3)], "gRPC n=3 %s vs HTTP n=3 %s" %
          ([a[i][1] for i in range(3)], texts(h)))
    one, msgs1 = grpc_choices(cl, prompt, 0, 99)  # n unset: one choice, as before
    check(list(one) == [0] and one[0][0] == a[0][0],
          "gRPC n=1 %s vs choice 0 %s" % (one.get(0), a[0][0]))
    check(sum(m.WhichOneof("kind") == "finished" for m in msgs1) == 1,
          "n=1: %d Finished" % sum(m.WhichOneof("kind") == "finished" for m in msgs1))
    print("gRPC n=3 seeded: indexed chunks and Finished, reproducible, = HTTP, choice 0 = n=1, "
          "one prefill")


def bad_n(cl):
    try:
        list(cl.router_stub().Generate(cl.gen_request("Once upon a time", n=17), timeout=30))
        check(False, "gRPC n=17 accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "n must be" in e.details(),
              "gRPC n=17: %s %s" % (e.code(), e.details()))
    stub = cl.pb["decode_grpc"].DecodeStub(cl.channel(cl.address("d1")))
    req = cl.pb["decode"].DecodeGenerateRequest(
        request=cl.gen_request([1, 300, 301], request_id="direct-n2", n=2),
        prefill_target=cl.address("p1"))
    try:
        list(stub.Generate(req, timeout=30))
        check(False, "Decode.Generate n=2 accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("n:"),
              "Decode.Generate n=2: %s %s" % (e.code(), e.details()))
    print("bad n: gRPC n=17 and Decode.Generate n=2 are INVALID_ARGUMENT naming n")


def at_rest(cl, what):
    deadline = time.time() + 10
    while True:
        m = cl.metrics()
        busy = {k: v for k, v in m.items() if v and (
            k in ("duet_router_inflight_requests", "duet_router_queue_depth") or
            k.startswith("duet_router_worker_inflight"))}
        if not busy or time.time() > deadline:
            break
        time.sleep(0.1)
    check(not busy, "%s: the router still counts %s" % (what, busy))
    bad = cl.pages_at_baseline()
    check(not bad, "%s: pages not back: %s" % (what, bad))


def cancels(cl):
    prompt = [1] + list(range(300, 340))
    # while choices 1..3 wait: choice 0 sits in the prefill (fault delay)
    before = counters(cl)
    req = cl.gen_request(prompt, max_tokens=400, temperature=1.0, n=4, ignore_eos=True)
    call = cl.router_stub().Generate(req, timeout=60)
    time.sleep(0.1)
    call.cancel()
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.CANCELLED, "cancel while waiting: %s" % e.code())
    at_rest(cl, "cancelled while choices wait")
    dl = delta(before, counters(cl))
    check(dl["d1"]["requests"] + dl["d2"]["requests"] <= 1,
          "cancelled while waiting: followers reached a decode: %s" % dl)

    # an HTTP client leaving while choices wait
    import json
    import socket
    body = json.dumps({"prompt": prompt[:-1] + [9], "max_tokens": 400, "ignore_eos": True,
                       "temperature": 1.0, "n": 4, "stream": True})
    sock = socket.create_connection(("127.0.0.1", cl.http_port), timeout=30)
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  "application/json\r\nContent-Length: %d\r\n\r\n%s" %
                  (len(body), body)).encode())
    time.sleep(0.1)
    sock.close()
    at_rest(cl, "HTTP client gone while choices wait")

    # mid-stream: chunks of several choices came
    call = cl.router_stub().Generate(cl.gen_request(prompt + [5], max_tokens=400, temperature=1.0,
                                                    n=4, ignore_eos=True), timeout=60)
    seen = set()
    for m in call:
        if m.WhichOneof("kind") == "chunk":
            seen.add(m.chunk.index)
        if len(seen) >= 3:
            break
    call.cancel()
    check(len(seen) >= 3, "mid-stream: chunks of %s only" % seen)
    at_rest(cl, "cancelled mid-stream")
    print("cancel: while waiting and mid-stream (choices %s streaming): nothing left in flight, "
          "pages at baseline" % sorted(seen))


def test(build, src):
    # a held prefill batch (150 ms) leaves time to cancel while choices wait;
    # a slow decode step (5 ms) keeps the mid-stream cancel's stream going
    cl = Cluster(build, src, prefill=[("p1", 1)], decode=[("d1", 1), ("d2", 1)],
                 env={"DUET_FAULTS": "prefill.delay_ms=150,decode.step_delay_ms=5"})
    try:
        cl.start_workers()
        cl.start_router(args=["--policy", "round_robin"])
        http_greedy(cl, build)
        http_seeded(cl)
        http_stream_and_rule(cl)
        grpc_n(cl)
        bad_n(cl)
        cancels(cl)
        at_rest(cl, "the end")
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
