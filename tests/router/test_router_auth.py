#!/usr/bin/python3
"""Authenticated daemons (docs/security.md "Authentication") on a real
cluster: prefill, decode and router with mutual TLS (a CA made by
scripts/gen-auth.sh) and a shared secret, the router's HTTP side on HTTPS.

- Debian's python3-grpcio calls each gRPC server (prefill, decode, the
  router's gRPC) with no client certificate, no secret, a wrong secret, a
  certificate from another CA, plaintext: all refused (UNAUTHENTICATED where
  a call exists; the TLS handshake fails for a foreign CA or plaintext), the
  refusal logged once with the peer address and rate-limited under a flood;
  with the right material every call works.
- A prefill started with the secret only (no TLS): no secret or a wrong one
  is UNAUTHENTICATED, the right one works.
- Tokens through the authenticated cluster (router gRPC, router HTTPS with
  curl --cacert, decode -> prefill directly, duet-client with its options)
  equal `duet generate --tp 1` (the oracle every unauthenticated test
  compares with).
- Start-up errors name the config key (missing file, bad PEM, key not
  matching, short secret, certificate of another CA).
- Identities and roles (issue 25 item 3): every process has its own
  certificate naming spiffe://duet/<role>/<name>; a prefill certificate
  calling Decode.Generate, a router certificate calling Prefill.Bootstrap,
  an unlisted client, a decode bootstrapping under another decode's name or
  id: PERMISSION_DENIED, logged with the identity; the listed client and
  the cluster itself work.  A daemon or router listening on a non-loopback
  address without TLS refuses to start unless auth.insecure.

usage: test_router_auth.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import re
import shutil
import subprocess
import time

import grpc

from router_cluster import Cluster, check, fail, main, oracle

PROMPT_IDS = [1, 300, 400, 350, 450]
N_TOKENS = 12


class AuthCluster(Cluster):
    """A Cluster whose config has an auth section and whose helpers use
    TLS + secret (self.auth_files: ca, cert, key, secret paths)."""

    def __init__(self, build, src, material, **kw):
        self.material = material
        self.ca = open(os.path.join(material, "ca.pem"), "rb").read()
        # the test's own calls: a client identity listed in auth.clients
        self.cert = open(os.path.join(material, "client-tester.pem"), "rb").read()
        self.key = open(os.path.join(material, "client-tester.key"), "rb").read()
        self.secret = open(os.path.join(material, "secret")).read().strip()
        super().__init__(build, src, **kw)

    def write_config(self, path=None, router=None):
        path = super().write_config(path, router)
        with open(path) as f:
            cfg = json.load(f)
        m = self.material
        cfg["auth"] = {"ca": os.path.join(m, "ca.pem"), "cert": os.path.join(m, "node.pem"),
                       "key": os.path.join(m, "node.key"),
                       "secret_file": os.path.join(m, "secret"), "clients": "tester"}
        cfg["router"]["https_cert"] = os.path.join(m, "node.pem")
        cfg["router"]["https_key"] = os.path.join(m, "node.key")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        return path

    def start(self, name, args=(), config=None, env=None):
        # each process its own certificate (gen-auth.sh ROLE/NAME); the
        # caller's args come after, so they can override it
        f = os.path.join(self.material, "%s-%s" % (self.role(name), name))
        own = ["--auth-cert", f + ".pem", "--auth-key", f + ".key"] if os.path.exists(
            f + ".pem") else []
        return super().start(name, own + list(args), config, env)

    def channel(self, address):
        if address not in self.channels:
            creds = grpc.ssl_channel_credentials(self.ca, self.key, self.cert)
            self.channels[address] = grpc.secure_channel(address, creds)
        return self.channels[address]

    def md(self):
        return [("x-duet-secret", self.secret)]

    def info(self, name, timeout=5):
        ch = self.channel(self.address(name))
        if self.role(name) == "decode":
            stub = self.pb["decode_grpc"].DecodeStub(ch)
        else:
            stub = self.pb["prefill_grpc"].PrefillStub(ch)
        return stub.Info(self.pb["common"].InfoRequest(), timeout=timeout, metadata=self.md())

    def http(self, method, path, body=None, headers=None, port=None, timeout=60):
        cmd = ["curl", "-s", "--cacert", os.path.join(self.material, "ca.pem"), "-o", "-",
               "-w", "\n%{http_code}", "-X", method,
               "https://127.0.0.1:%d%s" % (port or self.http_port, path)]
        for k, v in (headers or {}).items():
            cmd += ["-H", "%s: %s" % (k, v)]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary",
                    body if isinstance(body, str) else json.dumps(body)]
        r = subprocess.run(cmd, capture_output=True, timeout=timeout)
        out, _, code = r.stdout.decode(errors="replace").rpartition("\n")
        if r.returncode != 0 or code == "000":
            raise OSError("curl exit %d" % r.returncode)
        return int(code), {}, out.encode()


def rpc_code(fn):
    """Run fn(); the gRPC status code (OK when it returned) and details."""
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def refusal_matrix(cl, other):
    """Every server refuses every kind of wrong caller."""
    pb = cl.pb
    ca, cert, key = cl.ca, cl.cert, cl.key
    ocert = open(os.path.join(other, "node.pem"), "rb").read()
    okey = open(os.path.join(other, "node.key"), "rb").read()
    oca = open(os.path.join(other, "ca.pem"), "rb").read()
    targets = [("prefill p0", cl.address("p0"),
                lambda ch, md: pb["prefill_grpc"].PrefillStub(ch).Info(
                    pb["common"].InfoRequest(), timeout=5, metadata=md)),
               ("decode d0", cl.address("d0"),
                lambda ch, md: pb["decode_grpc"].DecodeStub(ch).Info(
                    pb["common"].InfoRequest(), timeout=5, metadata=md)),
               ("router grpc", "127.0.0.1:%d" % cl.grpc_port,
                lambda ch, md: list(pb["generate_grpc"].GenerateStub(ch).Generate(
                    cl.gen_request(PROMPT_IDS, max_tokens=2), timeout=20, metadata=md)))]
    health = lambda ch, md: pb["health_grpc"].HealthStub(ch).Check(  # noqa: E731
        pb["health"].HealthCheckRequest(service=""), timeout=5, metadata=md)
    unknown = lambda ch, md: ch.unary_unary("/duet.v1.Nope/Nothing")(  # noqa: E731
        b"", timeout=5, metadata=md)
    good_md = cl.md()
    cases = [
        # (what, channel credentials or None for plaintext, metadata, codes accepted)
        ("no client certificate, right secret",
         grpc.ssl_channel_credentials(ca), good_md, {grpc.StatusCode.UNAUTHENTICATED}),
        ("certificate, no secret",
         grpc.ssl_channel_credentials(ca, key, cert), [], {grpc.StatusCode.UNAUTHENTICATED}),
        ("certificate, wrong secret",
         grpc.ssl_channel_credentials(ca, key, cert), [("x-duet-secret", "x" * 64)],
         {grpc.StatusCode.UNAUTHENTICATED}),
        ("certificate, secret one byte short",
         grpc.ssl_channel_credentials(ca, key, cert), [("x-duet-secret", cl.secret[:-1])],
         {grpc.StatusCode.UNAUTHENTICATED}),
        # the handshake fails: no call reaches the server
        ("certificate of another CA, right secret",
         grpc.ssl_channel_credentials(ca, okey, ocert), good_md, {grpc.StatusCode.UNAVAILABLE}),
        ("plaintext, right secret", None, good_md, {grpc.StatusCode.UNAVAILABLE}),
        # the client refuses a server whose certificate another CA signed
        ("trusting another CA only", grpc.ssl_channel_credentials(oca, okey, ocert), good_md,
         {grpc.StatusCode.UNAVAILABLE}),
    ]
    for tname, addr, call in targets:
        for what, creds, md, codes in cases:
            ch = grpc.secure_channel(addr, creds) if creds else grpc.insecure_channel(addr)
            for fn_name, fn in (("call", call), ("health", health), ("unknown method", unknown)):
                code, details = rpc_code(lambda: fn(ch, md))
                check(code in codes, "%s %s with %s: %s %r (want %s)" %
                      (tname, fn_name, what, code, details, codes))
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    check("secret" in details or "certificate" in details,
                          "%s: message %r says nothing useful" % (tname, details))
            ch.close()
        # the right material works, health too
        ch = cl.channel(addr)
        code, details = rpc_code(lambda: call(ch, good_md))
        check(code == grpc.StatusCode.OK, "%s with the right material: %s %s" %
              (tname, code, details))
        code, details = rpc_code(lambda: health(ch, good_md))
        check(code == grpc.StatusCode.OK, "%s health: %s %s" % (tname, code, details))
    print("refusal matrix: 3 servers x %d wrong callers x 3 methods refused; right ones served"
          % len(cases))


def refusal_log(cl):
    """One line per refused call with the peer address; a flood is cut to a
    burst a second plus a count."""
    time.sleep(1.1)  # a fresh log window
    log0 = cl.procs["p0"].log_path
    n0 = len(open(log0, errors="replace").read().splitlines())
    ch = grpc.secure_channel(cl.address("p0"), grpc.ssl_channel_credentials(cl.ca, cl.key,
                                                                            cl.cert))
    stub = cl.pb["prefill_grpc"].PrefillStub(ch)
    t0 = time.time()
    for _ in range(200):
        rpc_code(lambda: stub.Info(cl.pb["common"].InfoRequest(), timeout=5,
                                   metadata=[("x-duet-secret", "wrong-secret-value")]))
    elapsed = time.time() - t0
    time.sleep(1.2)
    rpc_code(lambda: stub.Info(cl.pb["common"].InfoRequest(), timeout=5))  # flushes the count
    ch.close()
    lines = open(log0, errors="replace").read().splitlines()[n0:]
    refused = [l for l in lines if "unauthenticated call peer" in l]
    check(refused, "no refusal logged:\n" + "\n".join(lines[-20:]))
    check(all(re.search(r"peer ipv4:127\.0\.0\.1:\d+ method /duet\.v1\.Prefill/Info", l)
              for l in refused), "refusal lines lack the peer or method:\n" +
          "\n".join(refused[:5]))
    # at most 5 lines a second (a window may straddle the flood's ends)
    bound = 5 * (int(elapsed) + 3)
    check(len(refused) <= min(bound, 100), "flood not rate-limited: %d lines for 201 calls in "
          "%.1f s" % (len(refused), elapsed))
    check(any("more unauthenticated calls not logged" in l for l in lines),
          "no count of the calls not logged:\n" + "\n".join(lines[-10:]))
    print("refusal log: %d lines for 201 refused calls, peer and method named" % len(refused))


def secret_only(cl):
    """p1 runs with the secret only (TLS flags overridden to "")."""
    cl.start("p1", args=["--auth-ca", "", "--auth-cert", "", "--auth-key", ""])
    addr = cl.address("p1")
    pb = cl.pb
    deadline = time.time() + 60
    ch = grpc.insecure_channel(addr)
    stub = pb["prefill_grpc"].PrefillStub(ch)
    info = lambda md: stub.Info(pb["common"].InfoRequest(), timeout=2, metadata=md)  # noqa
    while True:
        code, details = rpc_code(lambda: info(cl.md()))
        if code == grpc.StatusCode.OK:
            break
        if not cl.procs["p1"].alive() or time.time() > deadline:
            fail("p1 (secret only) not serving: %s %s\n%s" % (code, details,
                                                              cl.procs["p1"].log()))
        time.sleep(0.1)
    for what, md in (("no secret", []), ("wrong secret", [("x-duet-secret", "y" * 64)]),
                     ("secret as a bearer token", [("authorization", "Bearer " + cl.secret)])):
        code, details = rpc_code(lambda: info(md))
        check(code == grpc.StatusCode.UNAUTHENTICATED, "p1 %s: %s %s" % (what, code, details))
    health = pb["health_grpc"].HealthStub(ch)
    code, _ = rpc_code(lambda: health.Check(pb["health"].HealthCheckRequest(), timeout=2))
    check(code == grpc.StatusCode.UNAUTHENTICATED, "p1 health without the secret: %s" % code)
    ch.close()
    check("auth secret" in cl.procs["p1"].log(), "p1 does not log its auth mode")
    cl.stop("p1")
    print("secret only: missing / wrong / misplaced secret UNAUTHENTICATED, right one served")


def equivalence(cl, build):
    """Tokens through every authenticated path equal the oracle."""
    exp, _ = oracle(build, cl.model, prompt_ids=PROMPT_IDS, max_tokens=N_TOKENS)
    pb = cl.pb
    # router gRPC -> decode -> prefill, all authenticated
    ids = []
    for r in cl.router_stub().Generate(cl.gen_request(PROMPT_IDS, max_tokens=N_TOKENS),
                                       timeout=60, metadata=cl.md()):
        if r.HasField("chunk"):
            ids += list(r.chunk.ids)
    check(ids == exp, "router gRPC %s != oracle %s" % (ids, exp))
    # decode directly, naming the prefill (decode dials it with its own auth)
    req = pb["decode"].DecodeGenerateRequest(
        request=cl.gen_request(PROMPT_IDS, max_tokens=N_TOKENS), prefill_target=cl.address("p0"))
    ids = []
    for r in pb["decode_grpc"].DecodeStub(cl.channel(cl.address("d0"))).Generate(
            req, timeout=60, metadata=cl.md()):
        if r.HasField("chunk"):
            ids += list(r.chunk.ids)
    check(ids == exp, "decode direct %s != oracle %s" % (ids, exp))
    # HTTPS with curl --cacert (cl.http)
    st, _, body = cl.http("POST", "/v1/completions",
                          {"prompt": PROMPT_IDS, "max_tokens": N_TOKENS, "temperature": 0})
    check(st == 200, "HTTPS completions %d %s" % (st, body[:200]))
    usage = json.loads(body)["usage"]
    check(usage["completion_tokens"] == len(exp), "HTTPS usage %s" % usage)
    # duet-client with its options, through the router and straight to decode
    dc = os.path.join(build, "tools", "duet-client")
    m = cl.material
    opts = ["--ca", os.path.join(m, "ca.pem"), "--cert", os.path.join(m, "client-tester.pem"),
            "--key", os.path.join(m, "client-tester.key"), "--secret-file",
            os.path.join(m, "secret")]
    ids_arg = " ".join(map(str, PROMPT_IDS))
    for target, extra in (("127.0.0.1:%d" % cl.grpc_port, ["--router"]),
                          (cl.address("d0"), ["--prefill", cl.address("p0")])):
        r = subprocess.run([dc, "--target", target, "--prompt-ids", ids_arg, "--max-tokens",
                            str(N_TOKENS), "--output", "ids"] + extra + opts,
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, "duet-client %s: %d %s" % (target, r.returncode, r.stderr))
        got = [int(x) for x in r.stdout.split()]
        check(got == exp, "duet-client %s %s != oracle %s" % (target, got, exp))
    r = subprocess.run([dc, "--target", cl.address("d0"), "--prompt-ids", ids_arg,
                        "--prefill", cl.address("p0"), "--ca", os.path.join(m, "ca.pem"),
                        "--cert", os.path.join(m, "node.pem"), "--key",
                        os.path.join(m, "node.key")], capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "UNAUTHENTICATED" in r.stderr,
          "duet-client without the secret: %d %s" % (r.returncode, r.stderr))
    for target in (cl.address("p0"), cl.address("d0"), "127.0.0.1:%d" % cl.grpc_port):
        r = subprocess.run([dc, "--target", target, "--health"] + opts, capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 0 and r.stdout.strip() == "SERVING",
              "duet-client --health %s: %d %s %s" % (target, r.returncode, r.stdout, r.stderr))
    print("equivalence: router gRPC, decode direct, HTTPS, duet-client == oracle %s" % exp)


def creds_of(cl, ident):
    f = os.path.join(cl.material, ident.replace("/", "-"))
    return grpc.ssl_channel_credentials(cl.ca, open(f + ".key", "rb").read(),
                                        open(f + ".pem", "rb").read())


def roles(cl):
    """The authorization table and the bootstrap identity check."""
    pb = cl.pb
    dgen = lambda ch: list(pb["decode_grpc"].DecodeStub(ch).Generate(  # noqa: E731
        pb["decode"].DecodeGenerateRequest(request=cl.gen_request(PROMPT_IDS, max_tokens=2)),
        timeout=20, metadata=cl.md()))
    dabort = lambda ch: pb["decode_grpc"].DecodeStub(ch).Abort(  # noqa: E731
        pb["common"].AbortRequest(request_id="x"), timeout=5, metadata=cl.md())
    pinfo = cl.info("p0")
    dinfo = cl.info("d0")

    def boot(name, decode_id="roles-test-id"):
        return lambda ch: pb["prefill_grpc"].PrefillStub(ch).Bootstrap(
            pb["prefill"].BootstrapRequest(
                decode_id=decode_id, decode_name=name, tp=1,
                model_fingerprint=pinfo.model_fingerprint, kv_heads=1,
                rank_descriptors=[b"\0" * 64], grant_key=b"k" * 32),
            timeout=10, metadata=cl.md())
    pabort = lambda ch: pb["prefill_grpc"].PrefillStub(ch).Abort(  # noqa: E731
        pb["common"].AbortRequest(request_id="x"), timeout=5, metadata=cl.md())
    d0, p0 = cl.address("d0"), cl.address("p0")
    denied = [
        ("prefill/p0", d0, "Decode.Generate", dgen, "router"),
        ("prefill/p0", d0, "Decode.Abort", dabort, "router"),
        ("decode/d1", d0, "Decode.Generate", dgen, "router"),
        ("client/stranger", d0, "Decode.Generate", dgen, "router"),
        ("router/router", p0, "Prefill.Bootstrap", boot("d0@x"), "decode"),
        ("router/router", p0, "Prefill.Abort", pabort, "decode"),
        ("prefill/p1", p0, "Prefill.Bootstrap", boot("p1@x"), "decode"),
        ("client/tester", p0, "Prefill.Bootstrap", boot("tester@x"), "decode"),
        # decode d1 under d0's name, and under its own name with d0's id
        ("decode/d1", p0, "Prefill.Bootstrap as d0", boot("d0@elsewhere"), "decode/d1"),
        ("decode/d1", p0, "Prefill.Bootstrap with d0's id",
         boot("d1@elsewhere", dinfo.instance_id), dinfo.instance_id),
    ]
    for ident, addr, what, fn, want in denied:
        ch = grpc.secure_channel(addr, creds_of(cl, ident))
        code, details = rpc_code(lambda: fn(ch))
        ch.close()
        check(code == grpc.StatusCode.PERMISSION_DENIED and want in details,
              "%s calling %s: %s %r (want PERMISSION_DENIED naming %r)" %
              (ident, what, code, details, want))
    # what the table allows gets past it: a node-wide certificate without an
    # identity may still call Info; a decode under its own name reaches the
    # descriptor checks; the listed client and the router run requests
    ch = grpc.secure_channel(p0, creds_of(cl, "node"))
    code, details = rpc_code(lambda: pb["prefill_grpc"].PrefillStub(ch).Info(
        pb["common"].InfoRequest(), timeout=5, metadata=cl.md()))
    check(code == grpc.StatusCode.OK, "Info with an identity-less certificate: %s %s" %
          (code, details))
    code, details = rpc_code(lambda: boot("d0@x")(ch))
    check(code == grpc.StatusCode.PERMISSION_DENIED and "names none" in details,
          "Bootstrap with an identity-less certificate: %s %r" % (code, details))
    ch.close()
    ch = grpc.secure_channel(p0, creds_of(cl, "decode/d1"))
    code, details = rpc_code(lambda: boot("d1@elsewhere")(ch))
    check(code not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.OK),
          "decode d1 bootstrapping as itself with a bad descriptor: %s %r" % (code, details))
    ch.close()
    code, details = rpc_code(lambda: dgen(cl.channel(d0)))
    check(code == grpc.StatusCode.OK, "listed client/tester Decode.Generate: %s %r" %
          (code, details))
    ids = []
    for r in cl.router_stub().Generate(cl.gen_request(PROMPT_IDS, max_tokens=N_TOKENS),
                                       timeout=60, metadata=cl.md()):
        if r.HasField("chunk"):
            ids += list(r.chunk.ids)
    check(len(ids) == N_TOKENS, "router after the refusals: %s" % ids)
    # refusals are logged with the identity
    time.sleep(0.3)
    dl, pl = cl.procs["d0"].log(None), cl.procs["p0"].log(None)
    check(re.search(r"permission denied peer ipv4:127\.0\.0\.1:\d+ identity prefill/p0 "
                    r"method /duet\.v1\.Decode/Generate", dl), "d0 log lacks the refusal:\n" +
          dl[-3000:])
    check(re.search(r"permission denied .* identity router/router method "
                    r"/duet\.v1\.Prefill/Bootstrap", pl), "p0 log lacks the refusal:\n" + pl[-2000:])
    check("bootstrap from decode/d1 refused" in pl, "p0 log lacks the bootstrap refusal")
    check("identity decode/d0" in dl, "d0 does not log its identity")
    print("roles: %d calls outside the table PERMISSION_DENIED and logged with the identity; "
          "allowed ones served" % (len(denied) + 1))


def insecure_listen(cl, build):
    """Without TLS, a non-loopback listen address is a start-up error naming
    auth.insecure; with auth.insecure: true it is accepted."""
    with open(cl.config) as f:
        base = json.load(f)
    for insecure in (False, True):
        cfg = json.loads(json.dumps(base))
        cfg["auth"] = {"secret_file": cfg["auth"]["secret_file"]}
        if insecure:
            cfg["auth"]["insecure"] = True
        cfg.pop("router", None)
        cfg["router"] = {"http": "0.0.0.0:0", "grpc": "127.0.0.1:0"}
        for e in cfg["prefill"]:
            if e["name"] == "p1":
                e["listen"] = "0.0.0.0:%s" % e["address"].rsplit(":", 1)[1]
        path = os.path.join(cl.tmp, "insecure%d.json" % insecure)
        with open(path, "w") as f:
            json.dump(cfg, f)
        for exe, extra, key in (("prefill/duet-prefill", ["--name", "p1"], "listen (prefill p1)"),
                                ("router/duet-router", [], "router.http")):
            r = subprocess.run([os.path.join(build, exe), "--config", path, "--check-config"] +
                               extra, capture_output=True, text=True, timeout=30)
            if insecure:
                check(r.returncode == 0, "%s with auth.insecure: %d %r" % (exe, r.returncode,
                                                                        r.stderr))
            else:
                check(r.returncode != 0 and key in r.stderr and "auth.insecure" in r.stderr,
                      "%s listening on 0.0.0.0 without TLS: %d %r" % (exe, r.returncode,
                                                                      r.stderr))
        if not insecure:
            # a real start fails the same way
            r = subprocess.run([os.path.join(build, "prefill/duet-prefill"), "--config", path,
                                "--name", "p1"], capture_output=True, text=True, timeout=60)
            check(r.returncode != 0 and "auth.insecure" in r.stderr + r.stdout,
                  "duet-prefill on 0.0.0.0 without TLS started: %d %r" % (r.returncode,
                                                                         r.stderr[-500:]))
    print("insecure listen: 0.0.0.0 without TLS refused (prefill, router), allowed with "
          "auth.insecure")


def https(cl):
    """HTTPS only: plain HTTP and an unknown CA fail; --cacert works."""
    url = "https://127.0.0.1:%d/health" % cl.http_port
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 60, "curl without --cacert: exit %d (want 60, certificate "
          "problem)" % r.returncode)
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                        "http://127.0.0.1:%d/health" % cl.http_port],
                       capture_output=True, text=True, timeout=30)
    check(r.stdout != "200", "plain HTTP to the HTTPS port answered 200")
    r = subprocess.run(["curl", "-s", "--cacert", os.path.join(cl.material, "ca.pem"), url],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, "curl --cacert: exit %d" % r.returncode)
    print("https: --cacert works, no CA exit 60, plaintext refused")


def startup_errors(cl, build, other):
    """Bad material: exit 1 (router) / 1 (daemons' --check-config) with the
    key named."""
    bad = os.path.join(cl.tmp, "bad")
    os.makedirs(bad)
    m = cl.material
    with open(os.path.join(bad, "short"), "w") as f:
        f.write("abc\n")
    with open(os.path.join(bad, "garbage.pem"), "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    os.mkfifo(os.path.join(bad, "fifo"))
    cases = [
        (["--auth-ca", os.path.join(bad, "missing.pem")], "auth.ca: "),
        (["--auth-ca", os.path.join(bad, "garbage.pem")], "auth.ca: "),
        (["--auth-ca", os.path.join(bad, "fifo")], "auth.ca: "),
        (["--auth-cert", os.path.join(m, "secret")], "auth.cert: "),
        (["--auth-key", os.path.join(other, "node.key")], "auth.key: "),
        (["--auth-cert", os.path.join(other, "node.pem"), "--auth-key",
          os.path.join(other, "node.key")], "auth.cert: "),
        (["--auth-secret-file", os.path.join(bad, "short")], "auth.secret_file: "),
        (["--auth-ca", ""], "auth.ca: required"),
        (["--auth-key", ""], "auth.key: required"),
    ]
    for args, want in cases:
        for exe, extra in (("prefill/duet-prefill", ["--name", "p0", "--check-config"]),
                           ("router/duet-router", ["--check-config"])):
            r = subprocess.run([os.path.join(build, exe), "--config", cl.config] + extra + args,
                               capture_output=True, text=True, timeout=30)
            check(r.returncode != 0 and want in r.stderr,
                  "%s %s: exit %d, stderr %r (want %r)" % (exe, args, r.returncode,
                                                           r.stderr.strip(), want))
    r = subprocess.run([os.path.join(build, "router/duet-router"), "--config", cl.config,
                        "--check-config", "--https-key", os.path.join(other, "node.key")],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and "router.https_key: " in r.stderr,
          "router https key mismatch: %d %r" % (r.returncode, r.stderr))
    print("start-up errors: %d bad materials named by key" % (len(cases) + 1))


def test(build, src):
    for tool in ("openssl", "curl"):
        if not shutil.which(tool):
            print("SKIP: %s is missing (scripts/install-deps.sh)" % tool)
            raise SystemExit(77)
    if not os.access(os.path.join(build, "tools", "duet-client"), os.X_OK):
        print("SKIP: tools/duet-client is not built")
        raise SystemExit(77)
    import tempfile
    tmp = tempfile.mkdtemp(prefix="duet_auth_")
    material, other = os.path.join(tmp, "auth"), os.path.join(tmp, "other")
    gen = os.path.join(src, "scripts", "gen-auth.sh")
    subprocess.run([gen, material, "router/router", "prefill/p0", "prefill/p1", "decode/d0",
                    "decode/d1", "client/tester", "client/stranger"], check=True)
    subprocess.run([gen, other], check=True)
    cl = AuthCluster(build, src, material,
                     prefill=[("p0", 1), ("p1", 1)], decode=[("d0", 1)])
    try:
        for name in ("p0", "d0"):
            cl.start(name)
        for name in ("p0", "d0"):
            cl.wait_worker(name)
        cl.start_router()
        startup_errors(cl, build, other)
        refusal_matrix(cl, other)
        refusal_log(cl)
        https(cl)
        equivalence(cl, build)
        roles(cl)
        insecure_listen(cl, build)
        secret_only(cl)
        check("auth mtls+secret" in cl.procs["d0"].log(None), "d0 does not log its auth mode")
        cl.stop_all()
    except BaseException:
        for p in cl.procs.values():
            print("---- %s log ----\n%s" % (p.name, p.log()))
        cl.kill_all()
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the generated keys


if __name__ == "__main__":
    main(test)
