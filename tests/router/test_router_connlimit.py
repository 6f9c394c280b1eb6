#!/usr/bin/python3
"""Connection exhaustion (issue 25 item 4, docs/security.md "Connection
limits"): a real cluster (prefill TP=1, decode TP=1, stories260K, CPU) and
routers on HTTP and HTTPS.

- 4,200 idle TCP connections from one peer (source address 127.0.0.2) leave
  a well-behaved client (curl from 127.0.0.1) served at once, on HTTP and on
  HTTPS, with the default limits: the peer keeps at most
  router.http_max_connections_per_client of them (before: libmicrohttpd's
  4,096 in total, all taken, the next client waited in the backlog);
- the header timeout: a connection that sends nothing, one that stops in the
  middle of its header and a keep-alive connection idle after its request
  are closed after router.http_header_timeout_s; a request whose header is
  complete is not (a body sent after the header timeout is still read);
- the limits are derived from RLIMIT_NOFILE and logged; a limit above it, or
  a per-client cap above the total, is a start-up error naming the key;
- gRPC (router and decode): a connection that never completes its handshake
  is closed after 10 s (gRPC's default was 120 s).

usage: test_router_connlimit.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time

from router_cluster import Cluster, check, free_port, main

N_ATTACK = 4200
PEER = "127.0.0.2"  # the attacker's source address; curl comes from 127.0.0.1


def raise_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            print("SKIP: this test needs %d descriptors, the hard RLIMIT_NOFILE is %d"
                  % (need, hard))
            sys.exit(77)
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def flood(port, n, src=PEER):
    """Open n idle connections from src; the sockets that connected."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            socks.append(s)
        except OSError:
            s.close()
    return socks


def still_open(socks, wait=0.0):
    """The sockets the server has not closed (after wait seconds); what the
    server sent (gRPC's SETTINGS, an error response) is read and dropped."""
    time.sleep(wait)
    alive = []
    for s in socks:
        s.setblocking(False)
        try:
            while s.recv(65536):
                pass
        except BlockingIOError:
            alive.append(s)
        except OSError:
            pass
    return alive


def close_all(socks):
    for s in socks:
        s.close()


def curl(url, body, timeout=8, extra=()):
    t0 = time.time()
    p = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time",
                        str(timeout), "-H", "Content-Type: application/json", "-d",
                        json.dumps(body)] + list(extra) + [url],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.decode(errors="replace")
    code = out.rsplit("\n", 1)[-1] if p.returncode == 0 else "curl exit %d" % p.returncode
    return code, out, time.time() - t0


def limits_from_log(log):
    m = re.findall(r"at most (\d+) connections, (\d+) per client address, header timeout (\d+) s "
                   r"\(RLIMIT_NOFILE (\d+)\)", log)
    check(m, "the router did not log its connection limits:\n" + log[-2000:])
    return [int(x) for x in m[-1]]


def attack(cl, name, scheme, port, extra=()):
    t0 = time.time()
    socks = flood(port, N_ATTACK)
    print("%s: %d of %d connections from %s opened in %.1f s"
          % (name, len(socks), N_ATTACK, PEER, time.time() - t0))
    try:
        # the router accepts (and closes) what is over the cap in the order
        # the kernel queued it: let it reach the end of the flood (slow
        # under sanitizers, TLS) before the well-behaved client comes
        last, deadline = -1, time.time() + 20
        while time.time() < deadline:
            n = len(still_open(socks, 0.5))
            if n == last:
                break
            last = n
        code, out, took = curl("%s://127.0.0.1:%d/v1/completions" % (scheme, port),
                               {"prompt": "Once upon a time", "max_tokens": 4}, extra=extra)
        held = len(still_open(socks))
        print("%s: curl got %s in %.2f s while the peer holds %d connections"
              % (name, code, took, held))
        check(code == "200", "%s: a well-behaved client was not served: %s" % (name, out[-400:]))
        total, per_client, _, nofile = limits_from_log(cl.procs[name].log(100000))
        check(total < nofile, "%s: %d connections allowed with RLIMIT_NOFILE %d"
              % (name, total, nofile))
        check(per_client < N_ATTACK, "%s: per-client cap %d" % (name, per_client))
        check(held <= per_client, "%s: the peer holds %d connections, more than its cap %d"
              % (name, held, per_client))
        check(held >= min(per_client, len(socks)) // 2,
              "%s: the peer holds only %d connections (cap %d): the cap was not what let curl in"
              % (name, held, per_client))
    finally:
        close_all(socks)


def header_timeout(cl, port):
    """Router 'router-t': header timeout 1 s."""
    idle = flood(port, 4)
    partial = flood(port, 2)
    for s in partial:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # no end of header
    keep = socket.create_connection(("127.0.0.1", port))
    keep.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    keep.settimeout(5)
    check(keep.recv(65536).startswith(b"HTTP/1.1 200"), "keep-alive request not answered")
    # a request whose header is complete: its body comes after 2 s
    body = json.dumps({"prompt": "Once", "max_tokens": 2}).encode()
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body))
    left = still_open(idle + partial + [keep], 3.0)
    check(not left, "%d of 7 connections without a complete request still open after 3 s "
          "(header timeout 1 s)" % len(left))
    slow.sendall(body)
    slow.settimeout(20)
    resp = slow.recv(65536)
    check(resp.startswith(b"HTTP/1.1 200"),
          "a request whose body came after the header timeout: %r" % resp[:200])
    print("ok header timeout: 7 idle/partial/keep-alive connections closed, the slow body served")
    close_all(idle + partial + [keep, slow])


def startup_errors(cl):
    exe = os.path.join(cl.build, "router", "duet-router")

    def start(router, nofile=None):
        cfg = cl.write_config(os.path.join(cl.tmp, "bad.json"), router=router)

        def lower():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        p = subprocess.run([exe, "--config", cfg], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30, preexec_fn=lower)
        return p.returncode, p.stdout.decode(errors="replace")

    cases = [
        ({"http_max_connections": 2000}, 1024, "router.http_max_connections"),
        ({"http_max_connections": 100, "http_max_connections_per_client": 200}, None,
         "router.http_max_connections_per_client"),
        ({"http_max_connections_per_client": -1}, None, "http_max_connections_per_client"),
        ({"http_header_timeout_s": 0}, None, "http_header_timeout_s"),
        ({"http_header_timeout_s": "10"}, None, "http_header_timeout_s"),
    ]
    for router, nofile, key in cases:
        rc, out = start(dict(router, http="127.0.0.1:0", grpc=""), nofile)
        check(rc != 0 and key in out, "%s: exit %d, %r" % (router, rc, out[-400:]))
        print("ok start-up error: %s" % out.strip().splitlines()[-1][:160])


def test(build, src):
    raise_nofile(N_ATTACK + 1024)
    cl = Cluster(build, src, prefill=[("prefill-0", 1)], decode=[("decode-0", 1)])
    try:
        cl.start_workers()
        # gRPC: raw connections that never speak, to decode and to the router
        cl.start_router()
        grpc_ports = [int(cl.address("decode-0").rsplit(":", 1)[1]), cl.grpc_port]
        g_socks = [s for port in grpc_ports for s in flood(port, 20, src="127.0.0.1")]
        g_t0 = time.time()
        attack(cl, "router", "http", cl.http_port)

        # HTTPS: a self-signed certificate
        key, cert = os.path.join(cl.tmp, "https.key"), os.path.join(cl.tmp, "https.pem")
        subprocess.check_call(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                               "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                               "-days", "1", "-subj", "/CN=127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        https_port = free_port()
        cfg = cl.write_config(os.path.join(cl.tmp, "https.json"),
                              router={"http": "127.0.0.1:%d" % https_port, "grpc": "",
                                      "https_cert": cert, "https_key": key})
        cl.start("router-s", config=cfg)
        deadline = time.time() + 60
        while time.time() < deadline:
            code, _, _ = curl("https://127.0.0.1:%d/health" % https_port, {}, timeout=2,
                              extra=["-k", "-X", "GET"])
            if code == "200":
                break
            time.sleep(0.2)
        attack(cl, "router-s", "https", https_port, extra=["-k"])

        t_port = free_port()
        cfg = cl.write_config(os.path.join(cl.tmp, "timeout.json"),
                              router={"http": "127.0.0.1:%d" % t_port, "grpc": "",
                                      "http_header_timeout_s": 1})
        cl.start_router("router-t", config=cfg, port=t_port)
        header_timeout(cl, t_port)

        startup_errors(cl)

        left = still_open(g_socks, max(0.0, 12.0 - (time.time() - g_t0)))
        check(not left, "gRPC: %d of %d connections that never sent a preface still open after "
              "12 s" % (len(left), len(g_socks)))
        print("ok gRPC: %d silent connections closed by the handshake timeout" % len(g_socks))
        close_all(g_socks)
        cl.stop_all()
    except BaseException:
        for name, p in cl.procs.items():
            print("---- %s log ----\n%s" % (name, p.log()))
        cl.kill_all()
        raise


if __name__ == "__main__":
    main(test)
