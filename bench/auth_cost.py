#!/usr/bin/python3
"""The cost of authentication (docs/security.md "Authentication"): two local
clusters of the same shape (deploy/configs/local.json: prefill TP=2, decode
TP=4, CPU, stories260K) run side by side, one with auth off and one with
mutual TLS + the shared secret on every gRPC hop and HTTPS on the router.
Requests alternate between them so both see the same machine load.

Per round:
  bench_router --compare   gRPC latency p50/p99 (decode direct, through the
                 router), the two clusters interleaved request by request,
                 and router throughput in alternating slices (A = auth off,
                 B = --ca/--cert/--key/--secret-file)
  curl           HTTP vs HTTPS latency of /v1/completions, alternating
                 batches on keep-alive connections (curl's time_total; the
                 first request of a batch, which pays the handshake, is
                 left out)

usage: bench/auth_cost.py [BUILD_DIR] [--rounds N] [--requests N] [--seconds S]
       [--concurrency C] [--tp N]
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, build, tmp, name, auth_dir, tp, mode="mtls+secret"):
        self.build, self.name, self.auth, self.mode = build, name, auth_dir, mode
        self.tls = auth_dir is not None and "mtls" in mode
        with open(os.path.join(SRC, "deploy", "configs", "local.json")) as f:
            cfg = json.load(f)
        cfg["model"] = os.path.join(SRC, "models", "stories260K")
        self.http, self.grpc = free_port(), free_port()
        cfg["router"]["http"] = "127.0.0.1:%d" % self.http
        cfg["router"]["grpc"] = "127.0.0.1:%d" % self.grpc
        for role in ("prefill", "decode"):
            for e in cfg[role]:
                e["address"] = "127.0.0.1:%d" % free_port()
                if tp:
                    e["tp"] = tp
        if auth_dir:
            cfg["auth"] = {}
            if "secret" in mode:
                cfg["auth"]["secret_file"] = os.path.join(auth_dir, "secret")
            if self.tls:
                # every process its own certificate (flags in start()); this
                # script calls decode directly as the client "bench"
                cfg["auth"].update({"ca": os.path.join(auth_dir, "ca.pem"),
                                    "cert": os.path.join(auth_dir, "node.pem"),
                                    "key": os.path.join(auth_dir, "node.key"),
                                    "clients": "bench"})
                cfg["router"]["https_cert"] = os.path.join(auth_dir, "node.pem")
                cfg["router"]["https_key"] = os.path.join(auth_dir, "node.key")
        self.cfg = cfg
        self.path = os.path.join(tmp, name + ".json")
        with open(self.path, "w") as f:
            json.dump(cfg, f)
        self.procs = []
        self.tmp = tmp

    def own(self, role, name):
        if not self.tls:
            return []
        f = os.path.join(self.auth, "%s-%s" % (role, name))
        return ["--auth-cert", f + ".pem", "--auth-key", f + ".key"]

    def start(self):
        env = dict(os.environ, DUET_LOG_LEVEL="warn")
        for role in ("prefill", "decode"):
            for e in self.cfg[role]:
                self._spawn([os.path.join(self.build, role, "duet-" + role), "--config", self.path,
                             "--name", e["name"]] + self.own(role, e["name"]), e["name"], env)
        self._spawn([os.path.join(self.build, "router", "duet-router"), "--config", self.path] +
                    self.own("router", "router"), "router", env)

    def _spawn(self, cmd, name, env):
        log = open(os.path.join(self.tmp, "%s-%s.log" % (self.name, name)), "wb")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))

    def scheme(self):
        return "https" if self.tls else "http"

    def curl_base(self):
        c = ["curl", "-s"]
        if self.tls:
            c += ["--cacert", os.path.join(self.auth, "ca.pem")]
        return c

    def wait(self, timeout=180):
        deadline = time.time() + timeout
        url = "%s://127.0.0.1:%d/health" % (self.scheme(), self.http)
        while time.time() < deadline:
            if any(p.poll() is not None for p in self.procs):
                sys.exit("%s: a process exited at start-up (logs in %s)" % (self.name, self.tmp))
            r = subprocess.run(self.curl_base() + ["-o", "/dev/null", "-w", "%{http_code}", url],
                               capture_output=True, text=True)
            if r.stdout == "200":
                return
            time.sleep(0.3)
        sys.exit("%s: not ready (logs in %s)" % (self.name, self.tmp))

    def auth_args(self):
        out = []
        if self.tls:
            out += ["--ca", os.path.join(self.auth, "ca.pem"), "--cert",
                    os.path.join(self.auth, "client-bench.pem"), "--key",
                    os.path.join(self.auth, "client-bench.key")]
        if self.auth and "secret" in self.mode:
            out += ["--secret-file", os.path.join(self.auth, "secret")]
        return out

    def curl_batch(self, n):
        """n requests on one keep-alive connection; the latencies (us) of all
        but the first (which pays the connection and the TLS handshake)."""
        body = json.dumps({"prompt": [1, 403, 407, 261, 378], "max_tokens": 4,
                           "temperature": 0, "ignore_eos": True})
        url = "%s://127.0.0.1:%d/v1/completions" % (self.scheme(), self.http)
        cmd = self.curl_base() + ["-w", "%{http_code} %{time_total}\n", "-H",
                                  "Content-Type: application/json", "-d", body]
        for _ in range(n + 1):
            cmd += ["-o", "/dev/null", url]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        vals = []
        for line in r.stdout.splitlines()[1:]:
            code, t = line.split()
            if code != "200":
                sys.exit("%s: HTTP %s" % (self.name, code))
            vals.append(float(t) * 1e6)
        return vals

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(SRC, "build", "release"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--mode", default="mtls+secret", choices=["mtls+secret", "mtls", "secret"],
                    help="what cluster B turns on (HTTPS comes with mtls)")
    ap.add_argument("--tp", type=int, default=0,
                    help="TP of every instance (default: local.json's, prefill 2 and decode 4)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tmp = tempfile.mkdtemp(prefix="duet-auth-cost-")
    auth = os.path.join(tmp, "auth")
    with open(os.path.join(SRC, "deploy", "configs", "local.json")) as f:
        local = json.load(f)
    ids = ["router/router", "client/bench"] + ["%s/%s" % (r, e["name"])
                                               for r in ("prefill", "decode") for e in local[r]]
    subprocess.run([os.path.join(SRC, "scripts", "gen-auth.sh"), auth] + ids, check=True)
    plain = Cluster(build, tmp, "plain", None, a.tp)
    secure = Cluster(build, tmp, "auth", auth, a.tp, a.mode)
    try:
        plain.start()
        secure.start()
        plain.wait()
        secure.wait()
        for r in range(a.rounds):
            cmd = [os.path.join(build, "bench", "bench_router"),
                   "--router", "127.0.0.1:%d" % plain.grpc, "--http", "",
                   "--decode", plain.cfg["decode"][0]["address"],
                   "--prefill", plain.cfg["prefill"][0]["address"],
                   "--b-router", "127.0.0.1:%d" % secure.grpc,
                   "--b-decode", secure.cfg["decode"][0]["address"],
                   "--b-prefill", secure.cfg["prefill"][0]["address"],
                   "--requests", str(a.requests), "--seconds", str(a.seconds),
                   "--concurrency", str(a.concurrency)] + secure.auth_args()
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            print("round %d (A = auth off, B = %s)" % (r + 1, a.mode))
            print(out.stdout.rstrip(), flush=True)
            if out.returncode != 0:
                sys.exit("bench_router failed:\n" + out.stderr)
            # HTTP vs HTTPS: alternating batches on fresh keep-alive connections
            lat = {"plain": [], "auth": []}
            for k in range(20):
                for c in ((plain, secure) if k % 2 == 0 else (secure, plain)):
                    lat[c.name] += c.curl_batch(max(1, a.requests // 20))
            x, y = pct(lat["plain"]), pct(lat["auth"])
            what = "router HTTP vs HTTPS" if secure.tls else "router HTTP"
            print("  %-22s p50 %10.0f %10.0f %+7.1f%%  (us, curl, keep-alive)" %
                  (what, x[0], y[0], 100.0 * (y[0] - x[0]) / x[0]))
            print("  %-22s p99 %10.0f %10.0f %+7.1f%%" %
                  (what, x[1], y[1], 100.0 * (y[1] - x[1]) / x[1]), flush=True)
    finally:
        plain.stop()
        secure.stop()


def pct(v):
    v = sorted(v)
    return v[len(v) // 2], v[min(len(v) - 1, int(0.99 * (len(v) - 1) + 0.5))]


if __name__ == "__main__":
    main()
