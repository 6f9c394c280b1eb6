#!/usr/bin/python3
"""Client disconnects cancel the request downstream: the decode daemon's
KV pages return to their baseline (decode Info free_pages == total_pages)
long before the generation would have ended.  Covers an SSE stream cut
mid-way, an idle stream (decode frozen: keepalive comments flow, and the
router notices the client leaving), a non-streaming request whose client leaves while its connection
is suspended (the router watches the socket), a request that leaves while
queued in the router, and a gRPC stream cancelled by the client.  A
synthetic model (duet mkmodel, ~5 ms a token) keeps the streams open.

usage: test_router_disconnect.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import signal
import socket
import subprocess
import threading
import time

import grpc

from router_cluster import Cluster, check, main

LONG = 1500  # tokens: several seconds on this model


def make_model(build, tmp):
    out = os.path.join(tmp, "synth")
    subprocess.run([os.path.join(build, "tools", "duet"), "mkmodel", "--out", out, "--layers",
                    "6", "--hidden", "768", "--heads", "12", "--kv-heads", "4",
                    "--intermediate", "2048", "--vocab", "1024", "--max-pos", "2048"],
                   check=True, capture_output=True)
    return out


def raw_request(cl, body, port=None):
    s = socket.create_connection(("127.0.0.1", port or cl.http_port), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def pages_in_use(cl):
    i = cl.info("d0")
    return i.total_pages - i.free_pages


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return time.time()
        time.sleep(0.01)
        continue
    check(False, "timed out waiting for " + what)


def baseline_fast(cl, what, t_close, limit=3.0):
    t = wait_for(lambda: pages_in_use(cl) == 0 and cl.info("d0").running == 0, 10,
                 what + ": pages back to baseline")
    print("%s: pages back %.0f ms after the client left" % (what, (t - t_close) * 1000))
    check(t - t_close < limit, "%s: pages took %.1f s" % (what, t - t_close))


def test(build, src):
    import tempfile
    tmp = tempfile.mkdtemp(prefix="duet_router_disc_")
    model = make_model(build, tmp)
    cl = Cluster(build, src, prefill=[("p0", 1)], decode=[("d0", 2)], model=model,
                 n_pages=512, router={"max_concurrent": 1, "queue_limit": 4})
    try:
        cl.start_workers()
        cl.start_router(args=["--keepalive-ms", "200"])
        body = {"prompt": "hello there", "max_tokens": LONG, "ignore_eos": True}
        d0 = cl.info("d0")
        check(d0.free_pages == d0.total_pages, "pages in use at start")

        # 1. SSE stream cut after a few events
        s = raw_request(cl, dict(body, stream=True))
        buf = b""
        while buf.count(b"data: ") < 5:
            chunk = s.recv(4096)
            check(chunk, "stream closed early: %r" % buf[-300:])
            buf += chunk
        check(buf.startswith(b"HTTP/1.1 200") and b"text/event-stream" in buf, buf[:200])
        check(pages_in_use(cl) > 0, "no pages in use mid-stream")
        s.close()
        baseline_fast(cl, "sse stream", time.time())

        # 2. non-streaming: the client leaves while the router holds the
        # connection suspended (nothing is written to it until the end)
        s = raw_request(cl, body)
        wait_for(lambda: pages_in_use(cl) > 0, 10, "the request to start")
        time.sleep(0.3)
        s.close()
        baseline_fast(cl, "non-stream", time.time())

        # 3. a queued request whose client leaves (max_concurrent 1)
        first = threading.Event()
        out = {}

        def runner():
            out["a"] = cl.sse_incremental("/v1/completions", dict(body, stream=True,
                                                                  max_tokens=300),
                                          first_event=first)
        t = threading.Thread(target=runner)
        t.start()
        check(first.wait(20), "stream A did not start")
        s = raw_request(cl, body)
        wait_for(lambda: cl.metrics().get("duet_router_queue_depth") == 1, 5, "B to queue")
        s.close()
        wait_for(lambda: cl.metrics().get("duet_router_queue_depth") == 0, 3,
                 "B to leave the queue")
        t.join(60)
        check(out["a"][1][-1] == "[DONE]", "stream A: %s" % out["a"][2][-300:])
        baseline_fast(cl, "queued", time.time())

        # 4. gRPC: the client cancels its stream
        it = cl.router_stub().Generate(cl.gen_request("hello there", max_tokens=LONG,
                                                      ignore_eos=True), timeout=60)
        n = 0
        for r in it:
            n += 1
            if n == 5:
                break
        check(pages_in_use(cl) > 0, "no pages in use mid gRPC stream")
        it.cancel()
        baseline_fast(cl, "grpc cancel", time.time())

        # 5. an idle stream (decode frozen) carries ": keepalive" comments, and
        # a client that leaves then is noticed by the router at once
        s = raw_request(cl, dict(body, stream=True))
        buf = b""
        while buf.count(b"data: ") < 3:
            buf += s.recv(4096)
        dec = cl.procs["d0"].proc
        dec.send_signal(signal.SIGSTOP)
        try:
            s.settimeout(5)
            t0 = time.time()
            while b": keepalive\n\n" not in buf and time.time() - t0 < 5:
                buf += s.recv(4096)
            check(b": keepalive\n\n" in buf, "no keepalive while idle: %r" % buf[-300:])
            before = cl.metrics()["duet_router_client_disconnects_total"]
            s.close()
            wait_for(lambda: cl.metrics()["duet_router_client_disconnects_total"] > before, 5,
                     "the router to notice the client left (decode frozen)")
        finally:
            dec.send_signal(signal.SIGCONT)
        baseline_fast(cl, "idle stream", time.time())

        m = cl.metrics()
        check(m["duet_router_client_disconnects_total"] >= 5,
              "disconnects counted: %s" % m["duet_router_client_disconnects_total"])
        check(m["duet_router_inflight_requests"] == 0 and m["duet_router_queue_depth"] == 0,
              "router still busy")
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
