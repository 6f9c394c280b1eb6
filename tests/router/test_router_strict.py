#!/usr/bin/python3
"""Strict HTTP/1.1 framing (issue 25 item 5, docs/security.md "Strict HTTP/1.1
framing"): a real cluster (prefill TP=1, decode TP=1, stories260K, CPU) and
a router with an API key; every request over a raw socket, on HTTP and on
HTTPS.

Each refused case carries a hidden second request after the body the router
would frame (a GET the router answers 200 when it reaches it): the case
passes when the answer is one 400 (bad_framing) and the connection is closed
-- the hidden request is never answered.  Cases: whitespace before the colon
(Transfer-Encoding : chunked + Content-Length), obs-fold (Transfer-Encoding:
CRLF SP chunked + Content-Length), two Host headers, Transfer-Encoding
"chunked, identity", two Transfer-Encoding headers, Transfer-Encoding in
HTTP/1.0, bare LF ending a header line, the request line or the header
section, NUL and other control bytes in a header value, and
`Authorization: Bearer <key>\\0junk` (never taken as the key).  Bare LF in
chunk lines: libmicrohttpd 0.9.75 decodes it without telling the router, so
the router closes every connection after a chunked request: the hidden
request is not answered there either.

Still accepted (200, keep-alive as before): no OWS, extra OWS and tabs
around a value, an empty value, `Chunked` in another case, a well-formed
chunked upload, HTTP/1.0 without Host, two pipelined requests.

usage: test_router_strict.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import socket
import ssl
import subprocess
import time

from router_cluster import Cluster, check, free_port, main

KEY = "sk-strict-0123456789"
BODY = b'{"prompt": "Once", "max_tokens": 2}'
HIDDEN = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
AUTH = b"Authorization: Bearer " + KEY.encode() + b"\r\n"


def exchange(port, data, timeout=20, quiet=1.5):
    """Send data, read until the server closes, or goes quiet for `quiet`
    seconds after its first bytes: (responses, raw bytes, closed by the
    server)."""
    tls = isinstance(port, tuple)  # ("https", port)
    s = socket.create_connection(("127.0.0.1", port[1] if tls else port), timeout=timeout)
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(s)
    s.sendall(data)
    got, closed = b"", False
    deadline = time.time() + timeout
    while time.time() < deadline:
        s.settimeout(quiet if got else max(0.1, deadline - time.time()))
        try:
            d = s.recv(65536)
        except socket.timeout:
            break
        except OSError:
            closed = True
            break
        if not d:
            closed = True
            break
        got += d
    s.close()
    return len(re.findall(rb"(?:^|\n)HTTP/1\.[01] \d{3} ", got)), got, closed


def chunked(body, eol=b"\r\n"):
    return b"%x" % len(body) + eol + body + eol + b"0" + eol + eol


def post(headers, payload=BODY, version=b"HTTP/1.1", eol=b"\r\n"):
    return b"POST /v1/completions " + version + eol + headers + eol + payload


def refused(port, what, data):
    n, got, closed = exchange(port, data + HIDDEN)
    check(got.startswith(b"HTTP/1.1 400") and b"bad_framing" in got,
          "%s: not a 400 bad_framing: %r" % (what, got[:400]))
    check(n == 1, "%s: %d responses, the hidden request was answered: %r" % (what, n, got))
    check(closed, "%s: the connection stayed open" % what)
    msg = got.split(b'"message":"', 1)[-1].split(b'"', 1)[0].decode(errors="replace")
    print("ok %-42s 400, one response, closed: %s" % (what, msg))


def test_cases(port):
    ct = b"Content-Type: application/json\r\n"
    cl = b"Content-Length: %d\r\n" % len(BODY)
    te_body = chunked(BODY)
    cases = [
        ("whitespace before the colon (TE + CL)",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding : chunked\r\n"
              + b"Content-Length: %d\r\n" % len(te_body), te_body)),
        ("tab before the colon", post(b"Host: x\r\n" + AUTH + ct + b"X-Y\t: 1\r\n" + cl)),
        ("obs-fold (TE + CL)",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding:\r\n chunked\r\n"
              + b"Content-Length: %d\r\n" % len(te_body), te_body)),
        ("obs-fold of another header",
         post(b"Host: x\r\n" + AUTH + ct + b"X-Long: a\r\n\tb\r\n" + cl)),
        ("two Host headers", post(b"Host: x\r\nHost: y\r\n" + AUTH + ct + cl)),
        ("Transfer-Encoding: chunked, identity",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding: chunked, identity\r\n", te_body)),
        ("Transfer-Encoding: chunked + trailing SP",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding: chunked \r\n", te_body)),
        ("Transfer-Encoding: identity",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding: identity\r\n" + cl)),
        ("two Transfer-Encoding headers",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding: chunked\r\n"
              + b"Transfer-Encoding: chunked\r\n", te_body)),
        ("Transfer-Encoding in HTTP/1.0",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding: chunked\r\n", te_body,
              version=b"HTTP/1.0")),
        ("Transfer-Encoding with Content-Length",
         post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding: chunked\r\n"
              + b"Content-Length: %d\r\n" % len(te_body), te_body)),
        ("bare LF ending a header line", post(b"Host: x\n" + AUTH + ct + cl)),
        ("bare LF ending the request line",
         b"POST /v1/completions HTTP/1.1\nHost: x\r\n" + AUTH + ct + cl + b"\r\n" + BODY),
        ("bare LF ending the header section",
         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + ct + cl + b"\n" + BODY),
        ("NUL in a header value", post(b"Host: x\r\n" + AUTH + ct + b"X-Y: a\x00b\r\n" + cl)),
        ("NUL at the end of a header value",
         post(b"Host: x\r\n" + AUTH + ct + b"X-Y: ab\x00\r\n" + cl)),
        ("NUL in the last header value", post(b"Host: x\r\n" + AUTH + ct + cl[:-2] + b"\x00z\r\n")),
        ("control byte 0x01 in a header value",
         post(b"Host: x\r\n" + AUTH + ct + b"X-Y: a\x01b\r\n" + cl)),
        ("DEL in a header value", post(b"Host: x\r\n" + AUTH + ct + b"X-Y: a\x7fb\r\n" + cl)),
        ("CR inside a header value", post(b"Host: x\r\n" + AUTH + ct + b"X-Y: a\rb\r\n" + cl)),
        ("Authorization: Bearer <key>\\0junk",
         post(b"Host: x\r\nAuthorization: Bearer " + KEY.encode() + b"\x00junk\r\n" + ct + cl)),
    ]
    for what, data in cases:
        refused(port, what, data)

    # bare LF in chunk lines: decoded by libmicrohttpd, so not refusable here;
    # the connection closes after the answer and the hidden request dies
    n, got, closed = exchange(port, post(b"Host: x\r\n" + AUTH + ct
                                         + b"Transfer-Encoding: chunked\r\n",
                                         chunked(BODY, eol=b"\n")) + HIDDEN)
    check(n == 1 and closed, "bare-LF chunk lines: %d responses, closed %s: %r" % (n, closed, got))
    print("ok %-42s %s, one response, closed" % ("bare LF in chunk lines",
                                                 got.split(b"\r\n", 1)[0].decode()))


def test_accepted(port):
    ct = b"Content-Type: application/json\r\n"
    cl = b"Content-Length: %d\r\n" % len(BODY)
    ok = [
        ("no OWS", post(b"Host:x\r\n" + b"Authorization:Bearer " + KEY.encode() + b"\r\n"
                        + b"Content-Type:application/json\r\nContent-Length:%d\r\n" % len(BODY))),
        ("extra OWS and tabs", post(b"Host: \t x \t\r\n" + AUTH + ct + b"X-Pad:\t a b \t\r\n"
                                    + b"Content-Length:   %d\r\n" % len(BODY))),
        ("an empty value", post(b"Host: x\r\n" + AUTH + ct + b"X-Empty:\r\n" + cl)),
        ("chunked upload", post(b"Host: x\r\n" + AUTH + ct + b"Transfer-Encoding: chunked\r\n",
                                chunked(BODY))),
        ("Transfer-Encoding: Chunked", post(b"Host: x\r\n" + AUTH + ct
                                            + b"Transfer-Encoding: Chunked\r\n", chunked(BODY))),
        ("HTTP/1.0 without Host", post(AUTH + ct + cl, version=b"HTTP/1.0")),
        # libmicrohttpd grows its read buffer in place while the header comes
        ("24 KiB of header fields", post(b"Host: x\r\n" + AUTH + ct + b"".join(
            b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(24)) + cl)),
        ("GET with a query, cookies, Expect", b"GET /v1/models?x=1&y=%41 HTTP/1.1\r\nHost: x\r\n"
         + AUTH + b"Cookie: a=b; c=\"d e\"\r\nExpect: 100-continue\r\nAccept: */*\r\n\r\n"),
    ]
    for what, data in ok:
        n, got, _ = exchange(port, data)
        check(got.startswith(b"HTTP/1.1 200"), "%s: %r" % (what, got[:400]))
        print("ok %-42s 200" % what)
    # keep-alive and pipelining as before: two requests, two answers
    two = post(b"Host: x\r\n" + AUTH + ct + cl) + HIDDEN
    n, got, closed = exchange(port, two)
    check(n == 2 and len(re.findall(rb"(?:^|\n)HTTP/1\.1 200 ", got)) == 2,
          "two pipelined requests: %r" % got[:600])
    print("ok %-42s 2 x 200" % "two pipelined requests")
    # no key, a wrong key: 401 as before
    n, got, _ = exchange(port, post(b"Host: x\r\nAuthorization: Bearer nope\r\n" + ct + cl))
    check(got.startswith(b"HTTP/1.1 401"), "a wrong key: %r" % got[:200])


def test(build, src):
    cl = Cluster(build, src, prefill=[("prefill-0", 1)], decode=[("decode-0", 1)],
                 router={"api_key": KEY})
    try:
        cl.start_workers()
        cl.start_router()
        test_accepted(cl.http_port)
        test_cases(cl.http_port)
        # the same over HTTPS (libmicrohttpd parses what TLS decrypted alike)
        key, cert = os.path.join(cl.tmp, "https.key"), os.path.join(cl.tmp, "https.pem")
        subprocess.check_call(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                               "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                               "-days", "1", "-subj", "/CN=127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = free_port()
        cfg = cl.write_config(os.path.join(cl.tmp, "https.json"),
                              router={"http": "127.0.0.1:%d" % port, "grpc": "",
                                      "https_cert": cert, "https_key": key})
        cl.start("router-s", config=cfg)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if exchange(("https", port), b"GET /health HTTP/1.1\r\nHost: x\r\n"
                            b"Connection: close\r\n\r\n", timeout=2)[1].startswith(
                                b"HTTP/1.1 200"):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        print("---- HTTPS ----")
        test_accepted(("https", port))
        test_cases(("https", port))
        cl.stop_all()
    except BaseException:
        for name, p in cl.procs.items():
            print("---- %s log ----\n%s" % (name, p.log()))
        cl.kill_all()
        raise


if __name__ == "__main__":
    main(test)
