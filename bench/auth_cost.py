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
  CPU            bench_router --seconds 0 (latency only) once more, with
                 each daemon's CPU time (/proc/PID/task/*/schedstat) read
                 before and after: CPU microseconds per request of the
                 router, the decode and the prefill in A and in B

usage: bench/auth_cost.py [BUILD_DIR] [--rounds N] [--requests N] [--seconds S]
       [--concurrency C] [--tp N] [--max-tokens N] [--perf]
"""
import argparse
import json
import os
import re
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

    def curl_batch(self, n, max_tokens=4):
        """n requests on one keep-alive connection; the latencies (us) of all
        but the first (which pays the connection and the TLS handshake)."""
        body = json.dumps({"prompt": [1, 403, 407, 261, 378], "max_tokens": max_tokens,
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

    def cpu_ns(self):
        """CPU time (ns) of each process so far: {"prefill-0": ns, ...}."""
        out = {}
        names = [e["name"] for r in ("prefill", "decode") for e in self.cfg[r]] + ["router"]
        for p, name in zip(self.procs, names):
            tot = 0
            tdir = "/proc/%d/task" % p.pid
            for t in os.listdir(tdir):
                try:
                    with open(os.path.join(tdir, t, "schedstat")) as f:
                        tot += int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    pass  # a thread that just ended
            out[name] = tot
        return out

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
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--perf", action="store_true",
                    help="perf record every daemon during the CPU pass and print where B's "
                    "extra CPU goes (libssl, libcrypto, AES-GCM itself)")
    ap.add_argument("--tp", type=int, default=0,
                    help="TP of every instance (default: local.json's, prefill 2 and decode 4)")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    tmp = tempfile.mkdtemp(prefix="duet-auth-cost-")
    auth = os.path.join(tmp, "auth")
    with open(os.path.join(SRC, "deploy", "configs", "local.json")) as f:
        local = json.load(f)
    summary = []
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
                   "--requests", str(a.requests), "--max-tokens", str(a.max_tokens),
                   "--concurrency", str(a.concurrency)] + secure.auth_args()
            out = subprocess.run(cmd + ["--seconds", str(a.seconds)], capture_output=True,
                                 text=True, timeout=900)
            print("round %d (A = auth off, B = %s)" % (r + 1, a.mode))
            print(out.stdout.rstrip(), flush=True)
            if out.returncode != 0:
                sys.exit("bench_router failed:\n" + out.stderr)
            # HTTP vs HTTPS: alternating batches on fresh keep-alive connections
            lat = {"plain": [], "auth": []}
            for k in range(20):
                for c in ((plain, secure) if k % 2 == 0 else (secure, plain)):
                    lat[c.name] += c.curl_batch(max(1, a.requests // 20), a.max_tokens)
            x, y = pct(lat["plain"]), pct(lat["auth"])
            what = "router HTTP vs HTTPS" if secure.tls else "router HTTP"
            print("  %-22s p50 %10.0f %10.0f %+7.1f%%  (us, curl, keep-alive)" %
                  (what, x[0], y[0], 100.0 * (y[0] - x[0]) / x[0]))
            print("  %-22s p99 %10.0f %10.0f %+7.1f%%" %
                  (what, x[1], y[1], 100.0 * (y[1] - x[1]) / x[1]), flush=True)
            summary.append(parse_round(out.stdout, x, y))
            # CPU per request: a latency-only pass (no throughput slices), so
            # each cluster gets exactly 2 * (requests + 5) calls: half
            # straight to decode, half through the router
            perfs = start_perf(tmp, r, (plain, secure)) if a.perf else []
            c0 = {c.name: c.cpu_ns() for c in (plain, secure)}
            out = subprocess.run(cmd + ["--seconds", "0"], capture_output=True, text=True,
                                 timeout=900)
            c1 = {c.name: c.cpu_ns() for c in (plain, secure)}
            stop_perf(perfs)
            if out.returncode != 0:
                sys.exit("bench_router failed:\n" + out.stderr)
            n_all, n_router = 2 * (a.requests + 5), a.requests + 5
            print("  CPU per request (us, latency pass: %d calls, %d through the router)" %
                  (n_all, n_router))
            cpu = {}
            for name in c0["plain"]:
                n = n_router if name == "router" else n_all
                x = (c1["plain"][name] - c0["plain"][name]) / 1e3 / n
                y = (c1["auth"][name] - c0["auth"][name]) / 1e3 / n
                cpu[name] = (x, y)
                print("  %-22s     %10.1f %10.1f %+7.1f%%" % (name, x, y, 100.0 * (y - x) / x),
                      flush=True)
            summary[-1]["cpu"] = cpu
            if perfs:
                summary[-1]["perf"] = report_perf(perfs)
        print_summary(summary, a.mode)
    finally:
        plain.stop()
        secure.stop()


PERF_HZ = 2000
LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
# the AES-GCM work itself: libcrypto's exported GCM/CTR entry points, and its
# unexported assembly (aesni_gcm_*, gcm_ghash_*), found by its instructions
AES_CORE = re.compile(r"^(CRYPTO_gcm128|CRYPTO_ctr128|aesni_|gcm_|ossl_aes|ossl_gcm|AES_)")


def start_perf(tmp, rnd, clusters):
    """perf record (cpu-clock, PERF_HZ) on every daemon of both clusters."""
    out = []
    for c in clusters:
        names = [e["name"] for r in ("prefill", "decode") for e in c.cfg[r]] + ["router"]
        for p, name in zip(c.procs, names):
            f = os.path.join(tmp, "perf-%d-%s-%s.data" % (rnd, c.name, name))
            out.append((c.name, name, f, subprocess.Popen(
                ["perf", "record", "-q", "-F", str(PERF_HZ), "-o", f, "-p", str(p.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    time.sleep(1.0)  # perf attaches
    return out


def stop_perf(perfs):
    for _, _, _, p in perfs:
        p.send_signal(signal.SIGINT)
    for _, _, _, p in perfs:
        p.wait()


def _aes_addr(addr, cache={}):
    """An unexported libcrypto address inside AES-NI / carry-less multiply code."""
    if addr not in cache:
        out = subprocess.run(["objdump", "-d", "--start-address=%#x" % (addr - 96),
                              "--stop-address=%#x" % (addr + 32), LIBCRYPTO],
                             capture_output=True, text=True).stdout
        cache[addr] = bool(re.search(r"\s(v?aes(enc|dec)\w*|v?pclmul\w*)\s", out))
    return cache[addr]


def perf_split(f):
    """Samples of one perf file: total, libssl, libcrypto, AES-GCM core."""
    out = subprocess.run(["perf", "report", "-i", f, "--no-children", "--sort", "dso,sym",
                          "--stdio", "-g", "none", "-n", "--percent-limit", "0"],
                         capture_output=True, text=True).stdout
    tot = ssl = cry = core = 0
    for line in out.splitlines():
        p = line.split()
        if line.startswith("#") or len(p) < 4 or not p[1].isdigit():
            continue
        n, dso, sym = int(p[1]), p[2], p[-1]
        tot += n
        if dso.startswith("libssl"):
            ssl += n
        elif dso.startswith("libcrypto"):
            cry += n
            if AES_CORE.match(sym) or (sym.startswith("0x") and _aes_addr(int(sym, 16))):
                core += n
    return tot, ssl, cry, core


def report_perf(perfs):
    """Per daemon: CPU ms sampled in A and B, and B's libssl, libcrypto and
    AES-GCM shares (libcrypto in A: grants, ids, prefix hashes)."""
    got = {(c, n): perf_split(f) for c, n, f, _ in perfs}
    print("  perf (cpu-clock %d Hz, same pass): ms sampled A, B; B's libssl, libcrypto, "
          "AES-GCM core (ms)" % PERF_HZ)
    ms = lambda v: 1e3 * v / PERF_HZ
    for (c, n), (tot, ssl, cry, core) in got.items():
        if c != "auth":
            continue
        a = got[("plain", n)]
        print("  %-22s %8.0f %8.0f   ssl %5.0f  crypto %5.0f (A %4.0f)  AES-GCM %4.0f" %
              (n, ms(a[0]), ms(tot), ms(ssl), ms(cry), ms(a[2]), ms(core)), flush=True)
    return {n: [ms(v) for v in (got[("plain", n)][0], got[("auth", n)][0], got[("auth", n)][1],
                                got[("auth", n)][2], got[("plain", n)][2], got[("auth", n)][3])]
            for c, n in got if c == "auth"}


def parse_round(text, http_a, http_b):
    """The p50 rows of bench_router's output and curl's: {what: (A, B)}."""
    res = {}
    for line in text.splitlines():
        f = line.split()
        if "p50" in f and len(f) >= 5:
            i = f.index("p50")
            what = " ".join(f[:i]) + (" under load" if "load)" in line else "")
            res[what] = (float(f[i + 1]), float(f[i + 2]))
    res["router HTTP(S) curl"] = (http_a[0], http_b[0])
    return res


def print_summary(rounds, mode):
    """Median over rounds of each p50 and of B - A."""
    if not rounds:
        return
    med = lambda v: sorted(v)[len(v) // 2]
    print("median of %d rounds (A = auth off, B = %s)" % (len(rounds), mode))
    for what in rounds[0]:
        if what in ("cpu", "perf"):
            continue
        xs = [r[what][0] for r in rounds]
        ys = [r[what][1] for r in rounds]
        ds = [100.0 * (r[what][1] - r[what][0]) / r[what][0] for r in rounds]
        print("  %-28s p50 %8.0f %8.0f   B-A %+6.0f us  %+6.1f%% (rounds %s)" %
              (what, med(xs), med(ys), med([y - x for x, y in zip(xs, ys)]), med(ds),
               " ".join("%+.1f" % d for d in ds)))
    for name in rounds[0].get("cpu", {}):
        xs = [r["cpu"][name][0] for r in rounds]
        ys = [r["cpu"][name][1] for r in rounds]
        print("  CPU/request %-16s     %8.1f %8.1f   B-A %+6.1f us" %
              (name, med(xs), med(ys), med([y - x for x, y in zip(xs, ys)])))
    for name in rounds[0].get("perf", {}):
        v = [r["perf"][name] for r in rounds]
        col = lambda i: med([x[i] for x in v])
        extra = med([x[1] - x[0] for x in v])
        tls = med([x[2] + x[3] - x[4] for x in v])
        print("  perf %-22s ms A %5.0f B %5.0f  B-A %+5.0f; B-A in libssl+libcrypto %+4.0f "
              "(AES-GCM %3.0f)" % (name, col(0), col(1), extra, tls, col(5)))
    sys.stdout.flush()


def pct(v):
    v = sorted(v)
    return v[len(v) // 2], v[min(len(v) - 1, int(0.99 * (len(v) - 1) + 0.5))]


if __name__ == "__main__":
    main()
