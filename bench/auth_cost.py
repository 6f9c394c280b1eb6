#!/usr/bin/python3
"""The cost of authentication (docs/security.md "Authentication"): two local
clusters of the same shape (deploy/configs/local.json: prefill TP=2, decode
TP=4, CPU, stories260K) run side by side, one with auth off and one with
mutual TLS + the shared secret on every gRPC hop and HTTPS on the router.
Rounds alternate between them so both see the same machine load.

Per round and cluster:
  bench_router   gRPC latency p50/p99 (decode direct, through the router)
                 and throughput through the router (bench/bench_router.c,
                 with --ca/--cert/--key/--secret-file for the auth cluster)
  curl           HTTP vs HTTPS latency of /v1/completions on one keep-alive
                 connection (curl's time_total per request)

usage: bench/auth_cost.py [BUILD_DIR] [--rounds N] [--requests N] [--seconds S]
       [--concurrency C]
"""
import argparse
import json
import os
import signal
import socket
import statistics
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
    def __init__(self, build, tmp, name, auth_dir):
        self.build, self.name, self.auth = build, name, auth_dir
        with open(os.path.join(SRC, "deploy", "configs", "local.json")) as f:
            cfg = json.load(f)
        cfg["model"] = os.path.join(SRC, "models", "stories260K")
        self.http, self.grpc = free_port(), free_port()
        cfg["router"]["http"] = "127.0.0.1:%d" % self.http
        cfg["router"]["grpc"] = "127.0.0.1:%d" % self.grpc
        for role in ("prefill", "decode"):
            for e in cfg[role]:
                e["address"] = "127.0.0.1:%d" % free_port()
        if auth_dir:
            cfg["auth"] = {"ca": os.path.join(auth_dir, "ca.pem"),
                           "cert": os.path.join(auth_dir, "node.pem"),
                           "key": os.path.join(auth_dir, "node.key"),
                           "secret_file": os.path.join(auth_dir, "secret")}
            cfg["router"]["https_cert"] = os.path.join(auth_dir, "node.pem")
            cfg["router"]["https_key"] = os.path.join(auth_dir, "node.key")
        self.cfg = cfg
        self.path = os.path.join(tmp, name + ".json")
        with open(self.path, "w") as f:
            json.dump(cfg, f)
        self.procs = []
        self.tmp = tmp

    def start(self):
        env = dict(os.environ, DUET_LOG_LEVEL="warn")
        for role in ("prefill", "decode"):
            for e in self.cfg[role]:
                self._spawn([os.path.join(self.build, role, "duet-" + role), "--config", self.path,
                             "--name", e["name"]], e["name"], env)
        self._spawn([os.path.join(self.build, "router", "duet-router"), "--config", self.path],
                    "router", env)

    def _spawn(self, cmd, name, env):
        log = open(os.path.join(self.tmp, "%s-%s.log" % (self.name, name)), "wb")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))

    def scheme(self):
        return "https" if self.auth else "http"

    def curl_base(self):
        c = ["curl", "-s"]
        if self.auth:
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
        if not self.auth:
            return []
        return ["--ca", os.path.join(self.auth, "ca.pem"), "--cert",
                os.path.join(self.auth, "node.pem"), "--key", os.path.join(self.auth, "node.key"),
                "--secret-file", os.path.join(self.auth, "secret")]

    def bench_router(self, a):
        cmd = [os.path.join(self.build, "bench", "bench_router"),
               "--router", "127.0.0.1:%d" % self.grpc, "--http", "",
               "--decode", self.cfg["decode"][0]["address"],
               "--prefill", self.cfg["prefill"][0]["address"],
               "--requests", str(a.requests), "--seconds", str(a.seconds),
               "--concurrency", str(a.concurrency)] + self.auth_args()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            sys.exit("%s: bench_router failed:\n%s%s" % (self.name, r.stdout, r.stderr))
        out = {}
        for line in r.stdout.splitlines():
            words = line.split()
            if "p50" in words and "req/s" not in words and "direct" in line:
                out["direct"] = (float(words[words.index("p50") + 1]),
                                 float(words[words.index("p99") + 1]))
            elif "p50" in words and "req/s" not in words and "router gRPC" in line:
                out["router"] = (float(words[words.index("p50") + 1]),
                                 float(words[words.index("p99") + 1]))
            elif "req/s" in words and "router gRPC" in line:
                out["rps"] = float(words[words.index("req/s") - 1])
        return out

    def curl_latency(self, n):
        body = json.dumps({"prompt": [1, 403, 407, 261, 378], "max_tokens": 4,
                           "temperature": 0, "ignore_eos": True})
        url = "%s://127.0.0.1:%d/v1/completions" % (self.scheme(), self.http)
        cmd = self.curl_base() + ["-w", "%{http_code} %{time_total}\n", "-H",
                                  "Content-Type: application/json", "-d", body]
        for _ in range(n + 5):
            cmd += ["-o", "/dev/null", url]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        vals = []
        for line in r.stdout.splitlines()[5:]:  # warm-up: the connection, the handshake
            code, t = line.split()
            if code != "200":
                sys.exit("%s: HTTP %s" % (self.name, code))
            vals.append(float(t) * 1e6)
        vals.sort()
        return vals[len(vals) // 2], vals[min(len(vals) - 1, int(0.99 * (len(vals) - 1) + 0.5))]

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
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tmp = tempfile.mkdtemp(prefix="duet-auth-cost-")
    auth = os.path.join(tmp, "auth")
    subprocess.run([os.path.join(SRC, "scripts", "gen-auth.sh"), auth], check=True)
    plain, secure = Cluster(build, tmp, "plain", None), Cluster(build, tmp, "auth", auth)
    res = {"plain": [], "auth": []}
    try:
        plain.start()
        secure.start()
        plain.wait()
        secure.wait()
        for r in range(a.rounds):
            order = (plain, secure) if r % 2 == 0 else (secure, plain)
            for c in order:
                b = c.bench_router(a)
                b["http"] = c.curl_latency(a.requests)
                res[c.name].append(b)
                print("round %d %-5s direct p50 %6.0f p99 %6.0f | router gRPC p50 %6.0f p99 %6.0f"
                      " %6.1f req/s | %-5s p50 %6.0f p99 %6.0f us" %
                      (r + 1, c.name, *b["direct"], *b["router"], b["rps"],
                       c.scheme().upper(), *b["http"]), flush=True)
    finally:
        plain.stop()
        secure.stop()

    def med(name, key, i=None):
        v = [x[key] if i is None else x[key][i] for x in res[name]]
        return statistics.median(v)

    print("\nmedian of %d rounds (us; throughput with %d clients for %d s)" %
          (a.rounds, a.concurrency, a.seconds))
    print("%-28s %10s %10s %8s" % ("", "auth off", "auth on", "cost"))
    for label, key, i in (("decode direct gRPC p50", "direct", 0),
                          ("decode direct gRPC p99", "direct", 1),
                          ("router gRPC p50", "router", 0), ("router gRPC p99", "router", 1),
                          ("router HTTP(S) p50", "http", 0), ("router HTTP(S) p99", "http", 1),
                          ("router gRPC req/s", "rps", None)):
        p, s = med("plain", key, i), med("auth", key, i)
        print("%-28s %10.1f %10.1f %+7.1f%%" % (label, p, s, 100.0 * (s - p) / p))


if __name__ == "__main__":
    main()
