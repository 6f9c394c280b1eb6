#!/usr/bin/python3
"""duet-router discover groups, with real processes and a real resolver.

The cluster config has a static prefill (`address`) and two discover groups,
`"duet-prefill.test:PORT_P"` and `"duet-decode.test:PORT_D"`.  Their
daemons all run with the same config and --name (as a StatefulSet's pods
do), each listening on its own loopback address with the group's port
(127.0.0.2:PORT, 127.0.0.3:PORT, [::1]:PORT ...).  The names resolve through
Debian's nss_wrapper (LD_PRELOAD=libnss_wrapper.so, NSS_WRAPPER_HOSTS): the
router's getaddrinfo reads a hosts file that the test rewrites, like
Kubernetes updating a headless Service's records.  NSS_WRAPPER_HOSTNAME
gives each daemon its own host name (decode daemons introduce themselves to
prefill as name@host).

  start      one instance per group: the router finds them, /workers and
             /metrics show each with the TP its Info reports (not the
             config's), requests equal `duet generate --tp 1`
  scale up   an address in DNS whose daemon is not up yet gets no traffic
             (checked before use); once up, it and a new prefill are used
  scale down streams running on a decode whose address leaves DNS finish
             correctly; new requests go elsewhere; if the address returns
             meanwhile the same worker comes back; the worker is removed
             after its last request
  restart    a prefill and a decode restarted at the same address (new
             instance_id) are replaced and requests stay correct
  NXDOMAIN   the group's workers are kept for the grace period (logged
             once), then dropped (503), and come back with the name
  config     --check-config accepts discover entries, rejects bad ones

usage: test_router_discovery.py BUILD_DIR SOURCE_DIR
"""
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc

from router_cluster import Cluster, check, completion, detok, fail, main, oracle, run_batch

NSS_LIBS = ["/usr/lib/x86_64-linux-gnu/libnss_wrapper.so",
            "/usr/lib/aarch64-linux-gnu/libnss_wrapper.so", "/usr/lib/libnss_wrapper.so"]
PROMPTS = [("Once upon a time", 16), ("The little dog", 12), ("Lily and Tom", 10),
           ("One day, a bird", 8)]
P_NAME, D_NAME = "duet-prefill.test", "duet-decode.test"


def nss_wrapper():
    for p in NSS_LIBS:
        if os.path.exists(p):
            return p
    found = ctypes.util.find_library("nss_wrapper")
    return found


def can_bind(ip, port=0):
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, port))
        return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()


def group_port(ips):
    """A port free on every ip."""
    for _ in range(50):
        port = can_bind(ips[0])
        if port and all(can_bind(ip, port) for ip in ips[1:]):
            return port
    fail("no port free on all of %s" % ips)


def target(ip, port):
    return "[%s]:%d" % (ip, port) if ":" in ip else "%s:%d" % (ip, port)


class Hosts:
    """The hosts file nss_wrapper serves.  Rewritten by rename with a fresh
    mtime each time: nss_wrapper reloads when the file's mtime changes."""

    def __init__(self, path):
        self.path, self.stamp = path, int(time.time()) - 100000
        self.names = {}

    def set(self, name, ips):
        self.names[name] = list(ips)
        tmp = self.path + ".new"
        with open(tmp, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for n, lst in self.names.items():
                for ip in lst:
                    f.write("%s %s\n" % (ip, n))
        self.stamp += 1
        os.utime(tmp, (self.stamp, self.stamp))
        os.rename(tmp, self.path)


class Pod:
    """One daemon of a discover group."""

    def __init__(self, cl, role, group, ip, port, tp, host, env):
        self.cl, self.role, self.group, self.ip, self.port = cl, role, group, ip, port
        self.tp, self.host, self.env = tp, host, env
        self.addr = target(ip, port)
        self.proc, self.ch = None, None
        self.log_path = os.path.join(cl.tmp, "%s.log" % host)

    def start(self):
        exe = os.path.join(self.cl.build, self.role, "duet-" + self.role)
        env = dict(self.cl.env)
        env.update(self.env)
        # prefill: only the host name (it resolves nothing by name, and
        # nss_wrapper breaks under concurrent lookups while the hosts file
        # changes); decode resolves the prefill discover names, one lookup
        # at a time on its worker thread, to accept only prefill_targets
        # that are instances of the group (docs/security.md)
        if self.role != "decode":
            env.pop("NSS_WRAPPER_HOSTS", None)
        env["NSS_WRAPPER_HOSTNAME"] = self.host
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([exe, "--config", self.cl.config, "--name", self.group,
                                      "--listen", self.addr, "--tp", str(self.tp)],
                                     stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        log.close()
        self.close_channel()
        return self

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def close_channel(self):
        if self.ch is not None:
            self.ch.close()
        self.ch = None

    def info(self, timeout=5):
        if self.ch is None:
            self.ch = grpc.insecure_channel(self.addr)
        pb = self.cl.pb
        stub = (pb["decode_grpc"].DecodeStub if self.role == "decode"
                else pb["prefill_grpc"].PrefillStub)(self.ch)
        return stub.Info(pb["common"].InfoRequest(), timeout=timeout)

    def wait_ready(self, timeout=90):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                fail("%s exited with %s:\n%s" % (self.host, self.proc.returncode, self.log()))
            try:
                socket.create_connection((self.ip, self.port), timeout=1).close()
                return self.info(timeout=1)
            except (OSError, grpc.RpcError):
                self.close_channel()
                time.sleep(0.05)
        fail("%s not ready after %ss:\n%s" % (self.host, timeout, self.log()))

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            fail("%s did not exit within %ss:\n%s" % (self.host, timeout, self.log()))
        self.close_channel()
        return rc


def workers(cl):
    st, _, data = cl.http("GET", "/workers")
    check(st == 200, "/workers status %d" % st)
    return json.loads(data)["workers"]


def row(cl, name, instance=None):
    """The /workers row of a worker in the table (not removed), or None."""
    for w in workers(cl):
        if w["name"] == name and w["last_error"] != "removed" and \
                (instance is None or w["instance_id"] == instance):
            return w
    return None


def wait_for(what, cond, timeout=20, poll=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    fail("timed out after %ss waiting for %s" % (timeout, what))


def wait_healthy(cl, pod_or_name, tp=None, instance=None, timeout=20):
    name = pod_or_name if isinstance(pod_or_name, str) else \
        "%s/%s" % (pod_or_name.group, pod_or_name.ip)

    def ok():
        r = row(cl, name, instance)
        return r if r and r["healthy"] and (tp is None or r["tp"] == tp) else None
    try:
        return wait_for("%s healthy (tp %s)" % (name, tp), ok, timeout)
    except AssertionError:
        fail("%s not healthy: %s\nrouter log:\n%s" % (name, workers(cl),
                                                      cl.procs["router"].log()))


def totals(cl, pods):
    out = {p.host: p.info().requests_total for p in pods}
    out["p0"] = cl.info("p0").requests_total
    return out


def delta(before, after):
    return {k: after[k] - before[k] for k in after}


def metrics_unique(cl):
    """Every /metrics series appears once (a duplicate breaks a scrape)."""
    st, _, data = cl.http("GET", "/metrics")
    check(st == 200, "/metrics status %d" % st)
    seen = set()
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            key = line.rsplit(" ", 1)[0]
            check(key not in seen, "/metrics has %s twice" % key)
            seen.add(key)


def router_log(cl):
    with open(cl.procs["router"].log_path, errors="replace") as f:
        return f.read()


def check_config(cl, build):
    exe = os.path.join(build, "router", "duet-router")
    r = subprocess.run([exe, "--config", cl.config, "--check-config"], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0 and "ok" in r.stdout, "--check-config rejected discover entries: "
          "%s %s" % (r.stdout, r.stderr))
    with open(cl.config) as f:
        cfg = json.load(f)
    bad = [("duet-decode.test", "decode[0].discover: 'duet-decode.test': expected"),
           ("duet-decode.test:0", "1..65535"),
           ("::1:9200", "brackets"),
           ("[::1]", "[ipv6]:port")]
    for value, want in bad:
        cfg["decode"][0]["discover"] = value
        path = os.path.join(cl.tmp, "bad.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        r = subprocess.run([exe, "--config", path, "--check-config"], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode == 1 and want in r.stderr,
              "--check-config with discover %r: rc %d, %r (want %r)" % (value, r.returncode,
                                                                        r.stderr, want))
    print("check-config: discover entries accepted, %d bad ones rejected" % len(bad))


def long_streams(cl, n, max_tokens):
    results, firsts = [None] * n, [threading.Event() for _ in range(n)]

    def stream(i):
        results[i] = cl.sse_incremental("/v1/completions", {
            "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "temperature": 0}, first_event=firsts[i], timeout=120)
    ts = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    return ts, results, firsts


def test(build, src):
    lib = nss_wrapper()
    if lib is None:
        print("SKIP: libnss_wrapper.so not found: install Debian's libnss-wrapper package "
              "(scripts/install-deps.sh) for the DNS discovery test")
        sys.exit(77)
    if not can_bind("127.0.0.2") or not can_bind("127.0.0.3"):
        print("SKIP: cannot bind 127.0.0.2/127.0.0.3 (loopback is not 127.0.0.0/8)")
        sys.exit(77)
    v6 = can_bind("::1") is not None
    pb_ip = "::1" if v6 else "127.0.0.4"
    port_p = group_port(["127.0.0.2", pb_ip])
    port_d = group_port(["127.0.0.2", "127.0.0.3"])

    cl = Cluster(build, src, prefill=[("p0", 1)], decode=[],
                 router={"health_interval_ms": 200, "policy": "round_robin"})
    hosts = Hosts(os.path.join(cl.tmp, "hosts"))
    hosts.set(P_NAME, ["127.0.0.2"])
    hosts.set(D_NAME, ["127.0.0.2"])
    sanitized = False
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            sanitized = "DUET_SANITIZE:BOOL=ON" in f.read()
    except OSError:
        pass
    nss = {"LD_PRELOAD": lib, "NSS_WRAPPER_HOSTS": hosts.path,
           # an ASan runtime must otherwise come first in the library list
           "ASAN_OPTIONS": (os.environ.get("ASAN_OPTIONS", "") +
                            ":verify_asan_link_order=0").lstrip(":")}
    if sanitized:
        nss["NSS_WRAPPER_DISABLE_DEEPBIND"] = "1"
    common = {"threads": 1, "n_pages": 512, "max_seqs": 32, "drain_timeout_ms": 5000}
    pg = dict(common, name="prefill", discover="%s:%d" % (P_NAME, port_p), tp=1)
    dg = dict(common, name="decode", discover="%s:%d" % (D_NAME, port_d), tp=1)
    cl.instances += [("prefill", pg), ("decode", dg)]
    cl.write_config()
    pa = Pod(cl, "prefill", "prefill", "127.0.0.2", port_p, 2, "prefill-0", nss)
    pb = Pod(cl, "prefill", "prefill", pb_ip, port_p, 1, "prefill-1", nss)
    da = Pod(cl, "decode", "decode", "127.0.0.2", port_d, 1, "decode-0", nss)
    # decode-1 steps no faster than every 8 ms, so its long streams outlast
    # the DNS changes below on any machine
    db = Pod(cl, "decode", "decode", "127.0.0.3", port_d, 2, "decode-1",
             dict(nss, DUET_FAULTS="decode.step_delay_ms=8"))
    pods = [pa, pb, da, db]
    try:
        exp = {}
        for text, n in PROMPTS:
            ids, _ = oracle(build, cl.model, prompt=text, max_tokens=n)
            exp[text] = (ids, detok(cl.model, ids))
        long_ids, _ = oracle(build, cl.model, prompt="Once upon a time", max_tokens=480,
                             extra=["--ignore-eos"])
        check_config(cl, build)

        # ---- start: one instance per group, TP from Info ----
        cl.start("p0")
        pa.start()
        da.start()
        cl.wait_worker("p0")
        ia, ida = pa.wait_ready(), da.wait_ready()
        cl.start_router(args=["--discovery-grace-ms", "2500"], env=dict(nss,
                        NSS_WRAPPER_HOSTNAME="router-0"))
        r = wait_healthy(cl, pa, tp=2)
        check(r["address"] == pa.addr and r["instance_id"] == ia.instance_id,
              "prefill/127.0.0.2 row: %s (Info %s)" % (r, ia.instance_id))
        r = wait_healthy(cl, da, tp=1)
        check(r["address"] == da.addr and r["instance_id"] == ida.instance_id,
              "decode/127.0.0.2 row: %s" % r)
        wait_healthy(cl, "p0", tp=1)
        m = cl.metrics()
        key = 'duet_router_worker_tp{role="prefill",name="prefill/127.0.0.2"}'
        check(m.get(key) == 2, "/metrics %s = %s" % (key, m.get(key)))
        check(m.get("duet_router_workers_joined_total") == 2, "joined_total %s" %
              m.get("duet_router_workers_joined_total"))
        before = totals(cl, [pa, da])
        run_batch(cl, PROMPTS, exp, 2)
        d = delta(before, totals(cl, [pa, da]))
        check(d["p0"] > 0 and d["prefill-0"] > 0 and d["decode-0"] == 2 * len(PROMPTS),
              "start: spread %s" % d)
        print("start: discovered prefill tp 2 and decode tp 1, mixed with a static "
              "prefill: %s" % d)
        # decode dials only prefills of the group: an address the name does
        # not resolve to, or another port of one it does, is refused before
        # any connection (docs/security.md)
        dstub = cl.pb["decode_grpc"].DecodeStub(da.ch or grpc.insecure_channel(da.addr))
        for bad in (target("127.0.0.9", port_p), target("127.0.0.2", port_p + 1)):
            try:
                for _ in dstub.Generate(cl.pb["decode"].DecodeGenerateRequest(
                        request=cl.gen_request("Hi", max_tokens=2), prefill_target=bad),
                        timeout=15):
                    pass
                fail("decode accepted prefill_target %s" % bad)
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                      "is not a prefill instance" in e.details(),
                      "prefill_target %s: %s %s" % (bad, e.code(), e.details()))

        # ---- scale up: db is in DNS before it is up: no traffic until checked ----
        retries0 = cl.metrics()["duet_router_retries_total"]
        hosts.set(D_NAME, ["127.0.0.2", "127.0.0.3"])
        wait_for("decode/127.0.0.3 in /workers", lambda: row(cl, "decode/127.0.0.3"))
        time.sleep(0.5)  # a few failed checks
        r = row(cl, "decode/127.0.0.3")
        check(not r["healthy"] and "health check" in r["last_error"],
              "an address with no daemon behind it: %s" % r)
        run_batch(cl, PROMPTS, exp, 1, threads=1)
        check(cl.metrics()["duet_router_retries_total"] == retries0,
              "requests were sent to the unchecked worker (retries %s -> %s)" %
              (retries0, cl.metrics()["duet_router_retries_total"]))
        db.start()
        pb.start()
        db.wait_ready()
        pb.wait_ready()
        hosts.set(P_NAME, ["127.0.0.2", pb_ip])
        wait_healthy(cl, db, tp=2)
        wait_healthy(cl, pb, tp=1)
        before = totals(cl, pods)
        run_batch(cl, PROMPTS, exp, 3)
        d = delta(before, totals(cl, pods))
        check(all(v > 0 for v in d.values()), "scale up: an instance got nothing: %s" % d)
        check(d["decode-0"] + d["decode-1"] == 3 * len(PROMPTS), "decode counts %s" % d)
        print("scale up: %s joined (%s), every instance used: %s" % (
            db.addr, pb.addr, d))

        # ---- scale down: db leaves DNS with streams running on it ----
        ts, results, firsts = long_streams(cl, 4, 480)
        for e in firsts:
            check(e.wait(30), "a long stream got no first token")
        check(db.info().running > 0, "nothing running on decode-1 before it leaves DNS")
        hosts.set(D_NAME, ["127.0.0.2"])
        wait_for("decode/127.0.0.3 out of rotation",
                 lambda: not (row(cl, "decode/127.0.0.3") or {}).get("healthy", False))
        r = row(cl, "decode/127.0.0.3")
        check(r is not None and r["inflight"] > 0 and "leaving" in r["last_error"] and
              r.get("state", "leaving") == "leaving",
              "decode/127.0.0.3 should be leaving with streams in flight: %s" % r)
        metrics_unique(cl)
        check(db.info().running > 0, "the streams on decode-1 ended before it left DNS "
              "(too fast to test)")
        n_db = db.info().requests_total
        run_batch(cl, PROMPTS, exp, 1)
        check(db.info().requests_total == n_db, "new requests went to decode-1 after it left DNS")
        # back in DNS while its streams run: the same worker returns (checked
        # first), then leaves again
        hosts.set(D_NAME, ["127.0.0.2", "127.0.0.3"])
        r = wait_healthy(cl, db, tp=2)
        check(r["inflight"] > 0 and db.info().running > 0,
              "decode-1's streams ended before it came back (too fast to test): %s" % r)
        check("decode/127.0.0.3 (%s) is back in" % db.addr in router_log(cl),
              "decode/127.0.0.3 came back as a new worker, not the leaving one")
        metrics_unique(cl)
        hosts.set(D_NAME, ["127.0.0.2"])
        wait_for("decode/127.0.0.3 out of rotation again",
                 lambda: not (row(cl, "decode/127.0.0.3") or {}).get("healthy", False))
        for t in ts:
            t.join(120)
        check(not any(t.is_alive() for t in ts), "a long stream hung")
        want = detok(cl.model, long_ids)
        for st, ev, raw in results:
            check(st == 200 and ev and ev[-1] == "[DONE]", "a stream on the leaving decode was "
                  "cut: %s" % raw[-300:])
            text = "".join(e["choices"][0]["text"] for e in ev[:-1] if e.get("choices"))
            check(text == want, "stream text differs from the oracle: %r" % text[:200])
        wait_for("decode/127.0.0.3 removed", lambda: row(cl, "decode/127.0.0.3") is None)
        metrics_unique(cl)
        check(db.info().running == 0, "decode-1 still runs something")
        check(db.stop() == 0, "decode-1 exit after scale down:\n%s" % db.log())
        print("scale down: 4 streams (2 on the leaving decode) finished with [DONE]; new "
              "requests avoided it; back in DNS meanwhile it came back; removed after them")

        # ---- restart at the same address: new instance_id, new worker ----
        old = pa.info().instance_id
        pa.stop(signal.SIGKILL)
        pa.start()
        new = pa.wait_ready().instance_id
        check(new != old, "instance_id did not change on restart")
        wait_healthy(cl, pa, tp=2, instance=new, timeout=30)
        check("restarted: instance_id %s, was %s" % (new, old) in router_log(cl),
              "no restart line in the router log")
        n_pa = pa.info().requests_total
        run_batch(cl, PROMPTS, exp, 2)  # decode-0 meets the restarted prefill-0
        check(pa.info().requests_total > n_pa, "the restarted prefill-0 got no request")
        old_d = da.info().instance_id
        check(da.stop() == 0, "decode-0 exit on SIGTERM")
        da.start()
        new_d = da.wait_ready().instance_id
        wait_healthy(cl, da, tp=1, instance=new_d, timeout=30)
        check(new_d != old_d, "decode instance_id did not change")
        metrics_unique(cl)
        before = totals(cl, [pa, pb, da])
        run_batch(cl, PROMPTS, exp, 2)
        d = delta(before, totals(cl, [pa, pb, da]))
        check(d["prefill-0"] > 0 and d["decode-0"] == 2 * len(PROMPTS),
              "after the restarts: %s" % d)
        print("restart: prefill-0 and decode-0 replaced (%s -> %s), requests correct: %s" %
              (old, new, d))

        # ---- NXDOMAIN: kept for the grace period, then dropped, then back ----
        hosts.set(D_NAME, [])
        t0 = time.time()
        time.sleep(0.8)
        check(row(cl, "decode/127.0.0.2")["healthy"], "decode dropped before the grace period")
        run_batch(cl, PROMPTS, exp, 1, threads=1)
        check(time.time() - t0 < 2.2, "the batch took too long to test the grace period")
        wait_for("decode/127.0.0.2 dropped after the grace period",
                 lambda: not (row(cl, "decode/127.0.0.2") or {}).get("healthy", False),
                 timeout=10)
        check(time.time() - t0 > 2.0, "dropped after %.1f s, before the 2.5 s grace" %
              (time.time() - t0))
        time.sleep(1.0)  # more failed lookups: logged once all the same
        st, _, _ = cl.http("GET", "/health")
        check(st == 503, "/health with no decode: %d" % st)
        st, r = completion(cl, "Once upon a time", 4)
        check(st == 503, "a request with no decode worker: %d %s" % (st, r))
        lines = router_log(cl).splitlines()
        failing = [l for l in lines if "discover decode decode" in l and "lookup failed" in l]
        dropped = [l for l in lines if "discover decode decode" in l and "dropping" in l]
        check(len(failing) == 1 and len(dropped) == 1 and "EAI_NONAME" in failing[0],
              "NXDOMAIN should be logged once, then its drop once: %s" % (failing + dropped))
        check(cl.metrics()["duet_router_discovery_lookup_failures_total"] >= 5,
              "lookup failures not counted")
        hosts.set(D_NAME, ["127.0.0.2"])
        wait_healthy(cl, da, tp=1)
        cl.wait_router()
        run_batch(cl, PROMPTS, exp, 1)
        check(any("resolves again" in l for l in router_log(cl).splitlines()),
              "no recovery line in the router log")
        metrics_unique(cl)
        print("NXDOMAIN: kept %.1f s, dropped (503), logged once, back when it resolves" % 2.5)

        deadline = time.time() + 10
        while True:
            i = da.info()
            if i.free_pages == i.total_pages and not i.running and not i.queue_depth:
                break
            check(time.time() < deadline, "decode-0 pages not back: %s" % i)
            time.sleep(0.1)
        check(cl.stop("router") == 0, "router exit:\n%s" % cl.procs["router"].log())
        for p in pods:
            rc = p.stop()
            check(rc == 0, "%s exit %s:\n%s" % (p.host, rc, p.log()))
        cl.stop_all()
    finally:
        for p in pods:
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        cl.kill_all()


if __name__ == "__main__":
    main(test)
