#!/usr/bin/python3
"""Input limits and bad input (issue 13, docs/security.md "Input limits"):
a real cluster (prefill TP=1, decode TP=1, stories260K, CPU) and router.

- the daemons enforce the router's caps on a Decode.Generate / Prefill.Prefill
  that bypasses the router (python3-grpcio straight at the daemon):
  max_tokens, stop strings, stop_token_ids, prompt length, message size;
- HTTP: trailing content after the JSON object, a NUL in the prompt,
  logit_bias, a chunked upload over max_body_bytes (413 before the end),
  ambiguous framing (two Content-Length, Content-Length + chunked; raw
  sockets: curl will not send those);
- router gRPC: stop_token_ids cap, NUL in text;
- a request whose prompt + max_tokens can never fit the largest decode KV
  pool (Info total_pages) is refused up front: HTTP 400 / gRPC
  INVALID_ARGUMENT naming the pool, nothing queued (pool_fit, a decode of
  24 pages).

usage: test_router_input.py BUILD_DIR SOURCE_DIR
"""
import json
import socket
import threading
import time

import grpc

from router_cluster import Cluster, check, main

LIMIT_MAX_TOKENS = 512
LIMIT_PROMPT = 256
MAX_BODY = 65536


def expect_rpc_error(fn, code, words, what):
    try:
        r = fn()
        if hasattr(r, "__iter__") and not hasattr(r, "ListFields"):
            r = list(r)
    except grpc.RpcError as e:
        check(e.code() == code, "%s: %s (%s), expected %s" % (what, e.code(), e.details(), code))
        for w in words:
            check(w in (e.details() or ""), "%s: %r does not say %r" % (what, e.details(), w))
        print("ok %s: %s %s" % (what, e.code().name, e.details()))
        return
    check(False, "%s: accepted (%s)" % (what, str(r)[:200]))


def decode_direct(cl):
    pb, c = cl.pb, cl.pb["common"]
    stub = pb["decode_grpc"].DecodeStub(cl.channel(cl.address("decode-0")))

    def gen(**kw):
        g = dict(request_id="direct-%d" % time.monotonic_ns(), max_tokens=4,
                 sampling=c.SamplingParams(temperature=0))
        if "token_ids" not in kw:
            g["text"] = "Once upon a time"
        g.update(kw)
        req = pb["decode"].DecodeGenerateRequest(request=pb["generate"].GenerateRequest(**g))
        return lambda: list(stub.Generate(req, timeout=30))

    # still served: a request within every limit
    out = gen(max_tokens=8)()
    check(out[-1].HasField("finished") and out[-1].finished.completion_tokens > 0,
          "a valid direct Decode.Generate: %s" % out[-1])
    bad = grpc.StatusCode.INVALID_ARGUMENT
    expect_rpc_error(gen(max_tokens=2000), bad, ["max_tokens", str(LIMIT_MAX_TOKENS)],
                     "decode max_tokens 2000")
    expect_rpc_error(gen(stop_token_ids=[5] * 5000), bad, ["stop_token_ids", "64"],
                     "decode 5000 stop ids")
    expect_rpc_error(gen(stop=["s%d" % i for i in range(17)]), bad, ["stop", "16"],
                     "decode 17 stop strings")
    expect_rpc_error(gen(token_ids=c.TokenIds(ids=[300] * (LIMIT_PROMPT + 1))),
                     grpc.StatusCode.OUT_OF_RANGE, ["token_ids", str(LIMIT_PROMPT)],
                     "decode prompt over max_prompt_tokens")
    expect_rpc_error(gen(text="Once upon\x00 a time"), bad, ["request.text", "NUL"],
                     "decode NUL in text")
    expect_rpc_error(gen(stop=["ok", "a\x00b"]), bad, ["request.stop", "NUL"],
                     "decode NUL in a stop string")
    expect_rpc_error(gen(text="x" * (400 << 10)), grpc.StatusCode.RESOURCE_EXHAUSTED, [],
                     "decode message of 400 KiB")
    # at the limits: accepted
    out = gen(max_tokens=LIMIT_MAX_TOKENS, stop_token_ids=[5] * 64,
              stop=["q%d" % i for i in range(16)], token_ids=c.TokenIds(ids=[300] * 8))()
    check(out[-1].HasField("finished"), "at the limits: %s" % out[-1])


def prefill_direct(cl):
    pb = cl.pb
    from duet.v1 import prefill_pb2
    stub = pb["prefill_grpc"].PrefillStub(cl.channel(cl.address("prefill-0")))

    def pre(**kw):
        m = dict(request_id="p-1", decode_id="nobody", prompt_ids=[300] * 4, dst_pages=[0],
                 transfer_id=7)
        m.update(kw)
        return lambda: list(stub.Prefill(prefill_pb2.PrefillRequest(**m), timeout=30))

    expect_rpc_error(pre(request_id="p\x00x"), grpc.StatusCode.INVALID_ARGUMENT,
                     ["request_id", "NUL"], "prefill NUL in request_id")
    expect_rpc_error(pre(prompt_ids=[300] * (LIMIT_PROMPT + 1), dst_pages=[0] * 17),
                     grpc.StatusCode.OUT_OF_RANGE, ["prompt_ids", str(LIMIT_PROMPT)],
                     "prefill prompt over max_prompt_tokens")
    expect_rpc_error(pre(prompt_ids=[300] * 200000), grpc.StatusCode.RESOURCE_EXHAUSTED, [],
                     "prefill message of ~600 KiB")


def router_grpc(cl):
    stub = cl.router_stub()
    bad = grpc.StatusCode.INVALID_ARGUMENT
    expect_rpc_error(lambda: list(stub.Generate(cl.gen_request("Once", stop_token_ids=[5] * 65),
                                                timeout=30)),
                     bad, ["stop_token_ids", "64"], "router gRPC 65 stop ids")
    expect_rpc_error(lambda: list(stub.Generate(cl.gen_request("Once\x00 upon"), timeout=30)),
                     bad, ["text", "NUL"], "router gRPC NUL in text")
    out = list(stub.Generate(cl.gen_request("Once", stop_token_ids=[5] * 64, max_tokens=4),
                             timeout=30))
    check(out[-1].HasField("finished"), "router gRPC 64 stop ids: %s" % out[-1])


def http_json(cl):
    def raw_post(body, path="/v1/completions"):
        st, _, data = cl.http("POST", path, body, headers={"Content-Type": "application/json"})
        try:
            return st, json.loads(data)
        except ValueError:
            check(False, "%s: not JSON (%d): %r" % (body[:60], st, data[:200]))

    st, r = raw_post('{"prompt": "Once", "max_tokens": 2} xyz')
    check(st == 400 and "after the JSON object" in r["error"]["message"],
          "trailing content: %d %s" % (st, r))
    st, r = raw_post('{"prompt": "Once", "max_tokens": 2}  \n')
    check(st == 200, "trailing whitespace: %d %s" % (st, r))
    st, r = raw_post('{"prompt": "Once\\u0000 upon", "max_tokens": 2}')
    check(st == 400 and '"prompt" has a NUL' in r["error"]["message"], "NUL: %d %s" % (st, r))
    st, r = raw_post('{"prompt": "Once", "max_tokens": 2, "logit_bias": {"50": 100}}')
    check(st == 400 and r["error"]["param"] == "logit_bias", "logit_bias: %d %s" % (st, r))
    st, r = raw_post('{"prompt": "Once", "max_tokens": 2, "logit_bias": {}}')
    check(st == 200, "logit_bias {}: %d %s" % (st, r))
    print("ok HTTP JSON checks")


def raw_http(cl, head, body=b"", chunks=None, timeout=20):
    """Send a raw request (body, or a generator of chunks sent while reading
    in another thread): (response bytes, body bytes the server took before
    the connection failed, whether all of it was sent)."""
    s = socket.create_connection(("127.0.0.1", cl.http_port), timeout=timeout)
    got, sent, done = [], [0], [False]

    def reader():
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    return
                got.append(d)
        except OSError:
            return
    t = threading.Thread(target=reader)
    t.start()
    try:
        s.sendall(head + body)
        for c in chunks or ():
            s.sendall(c)
            sent[0] += len(c)
        done[0] = True
    except OSError:
        pass
    t.join(timeout)
    s.close()
    return b"".join(got), sent[0], done[0]


def http_upload(cl):
    total = 10 << 20
    piece = b"a" * 65536

    def chunked():
        for _ in range(total // len(piece)):
            yield b"%x\r\n" % len(piece) + piece + b"\r\n"
        yield b"0\r\n\r\n"
    t0 = time.time()
    resp, sent, done = raw_http(cl, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Type: application/json\r\n"
                                    b"Transfer-Encoding: chunked\r\n\r\n", chunks=chunked())
    print("chunked 10 MiB: %d bytes sent before the server stopped it, %.2f s: %r"
          % (sent, time.time() - t0, resp[:120]))
    check(resp.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in resp,
          "chunked over the limit: %r" % resp[:300])
    check(not done, "the router read the whole 10 MiB chunked body before answering")
    # a declared Content-Length over the limit: 413 before any body
    resp, _, _ = raw_http(cl, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: %d\r\n\r\n" % total)
    check(resp.startswith(b"HTTP/1.1 413"), "declared length over the limit: %r" % resp[:200])


def http_framing(cl):
    body = b'{"prompt": "Once", "max_tokens": 2}'
    smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    cases = [
        ("two Content-Length", b"Content-Length: %d\r\nContent-Length: %d\r\n"
         % (len(body), len(body) + len(smuggled)), body + smuggled),
        ("Content-Length + chunked", b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n"
         % (len(body) + 5), b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n" + smuggled),
    ]
    for what, hdrs, payload in cases:
        resp, _, _ = raw_http(cl, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Type: application/json\r\n" + hdrs + b"\r\n", payload)
        check(resp.startswith(b"HTTP/1.1 400") and b"bad_framing" in resp,
              "%s: %r" % (what, resp[:300]))
        check(resp.count(b"HTTP/1.1 ") == 1, "%s: more than one response: %r" % (what, resp))
        print("ok %s: 400, one response, connection closed" % what)
    # the same length twice is one length (RFC 9112 section 6.3): accepted
    resp, _, _ = raw_http(cl, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                              b"Content-Length: %d\r\n\r\n" % (len(body), len(body)), body)
    check(resp.startswith(b"HTTP/1.1 200"), "identical Content-Length twice: %r" % resp[:300])


def pool_fit(build, src):
    cl = Cluster(build, src, prefill=[("prefill-0", 1)], decode=[("decode-0", 1, {"n_pages": 24})])
    try:
        cl.start_workers()
        cl.start_router()
        deadline = time.time() + 30
        while time.time() < deadline:  # the router knows the pool once Info came
            st, _, data = cl.http("GET", "/workers")
            if b'"total_pages":24' in data.replace(b" ", b""):
                break
            time.sleep(0.1)
        # 24 pages of 16 tokens: "Once" + 400 tokens can never fit
        st, _, r = cl.post_json("/v1/completions", {"prompt": "Once", "max_tokens": 400})
        check(st == 400 and "largest decode KV pool" in r["error"]["message"] and
              "24 pages of 16 tokens" in r["error"]["message"] and
              r["error"]["param"] == "max_tokens", "HTTP pool fit: %d %s" % (st, r))
        print("ok HTTP pool fit: %s" % r["error"]["message"])
        stub = cl.router_stub()
        expect_rpc_error(lambda: list(stub.Generate(cl.gen_request("Once", max_tokens=400),
                                                    timeout=30)),
                         grpc.StatusCode.INVALID_ARGUMENT, ["24 pages of 16 tokens"],
                         "router gRPC pool fit")
        st, _, r = cl.post_json("/v1/completions", {"prompt": "Once", "max_tokens": 300})
        check(st == 200, "a request that fits: %d %s" % (st, r))
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    except BaseException:
        for name, p in cl.procs.items():
            print("---- %s log ----\n%s" % (name, p.log()))
        cl.kill_all()
        raise


def test(build, src):
    cl = Cluster(build, src, prefill=[("prefill-0", 1)], decode=[("decode-0", 1)],
                 router={"max_tokens_limit": LIMIT_MAX_TOKENS, "max_prompt_tokens": LIMIT_PROMPT,
                         "max_body_bytes": MAX_BODY})
    try:
        cl.start_workers()
        cl.start_router()
        decode_direct(cl)
        prefill_direct(cl)
        router_grpc(cl)
        http_json(cl)
        http_upload(cl)
        http_framing(cl)
        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    except BaseException:
        for name, p in cl.procs.items():
            print("---- %s log ----\n%s" % (name, p.log()))
        cl.kill_all()
        raise
    pool_fit(build, src)


if __name__ == "__main__":
    main(test)
