#!/usr/bin/python3
"""Chaos soak (issue 26 item 6): mixed streaming traffic through a local
cluster (router + 2 prefills + 2 decodes, TP=1, one thread each, CPU
backend, stories260K, decode steps slowed by decode.step_delay_ms so that
streams last long enough to be cut) while a supervisor, every few seconds,
picks a random prefill or decode that is not already under a fault and

  kill   SIGKILLs it, then restarts it after 0.5-3 s,
  stop   SIGSTOPs it for 1-8 s (some beyond router.stall_timeout_ms), then
         SIGCONTs it,
  term   SIGTERMs it (a drain; router.migrate_on_drain on), waits for its
         exit (which must be 0), then restarts it.

At most --max-faults instances are under a fault at once (default 2: both
decodes or both prefills can be down together, which is when client-visible
failures are allowed).

Traffic (--clients threads), each request a template drawn at random:
HTTP SSE greedy, seeded sampling (top-p), n = 2 seeded, gRPC Generate
greedy and seeded through the router (/usr/bin/python3 grpcio), and a fifth
of them cut by the client after a random number of events (cancel).  Every
template ran once on the quiet cluster before the first fault: the oracle.

Checks (exit 1 when one fails):
  * every completed greedy / seeded stream equals its oracle (ids, text,
    finish), and a cancelled one is a prefix of it;
  * a client-visible failure (non-200, SSE error event, no [DONE], a gRPC
    status other than the CANCELLED asked for, a timeout) only while no
    instance of a role was available: an instance is down from its fault
    until the router reports it healthy again;
  * at the end, with every instance back and traffic stopped: decode pages
    free (and the prefix cache's accounting), open file descriptors of each
    daemon that was never restarted equal to their baseline (taken on the
    quiet cluster after the oracle), every daemon exits 0 on SIGTERM.

Per fault it records kind, target, down time and time to recover (signal to
the router seeing it healthy again) and the time to the first request that
started after the fault and succeeded.

usage: bench/chaos_soak.py BUILD_DIR [--minutes 10] [--seed 1] [--out DIR]
                           [--clients 4] [--interval 4] [--max-faults 2]
"""
import argparse
import http.client
import json
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "router"))
sys.path.insert(0, os.path.join(SRC, "tests", "pylib"))

from router_cluster import Cluster  # noqa: E402
from soak import proc_stats  # noqa: E402

import grpc  # noqa: E402 (router_cluster exits 77 without it)

PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a boy named Tom"]
KINDS = ["sse-greedy", "sse-seeded", "sse-n2", "grpc-greedy", "grpc-seeded"]
PREFILLS = ["p0", "p1"]
DECODES = ["d0", "d1"]
STEP_MS = 8  # decode.step_delay_ms


def now():
    return time.monotonic()


class Template:
    """One request shape; its oracle result is filled in on the quiet
    cluster."""

    def __init__(self, idx, kind, prompt, max_tokens, seed):
        self.idx, self.kind, self.prompt = idx, kind, prompt
        self.max_tokens, self.seed = max_tokens, seed
        self.oracle = None

    def http_body(self):
        b = {"prompt": self.prompt, "max_tokens": self.max_tokens, "ignore_eos": True,
             "stream": True}
        if self.kind == "sse-greedy":
            b["temperature"] = 0
        elif self.kind == "sse-seeded":
            b.update(temperature=0.9, top_p=0.95, seed=self.seed)
        else:
            b.update(temperature=0.8, seed=self.seed, n=2)
        return b

    def grpc_req(self, cl):
        c = cl.pb["common"]
        if self.kind == "grpc-greedy":
            sp = c.SamplingParams(temperature=0)
        else:
            sp = c.SamplingParams(temperature=0.9, top_p=0.95, seed=self.seed, has_seed=True)
        return cl.gen_request(self.prompt, max_tokens=self.max_tokens, ignore_eos=True,
                              sampling=sp)


class Failure(Exception):
    pass


def run_sse(cl, body, cut_after, timeout=120):
    """{choice: [text, finish]} of one SSE stream; cut_after events then the
    client closes (None: read to [DONE]).  Raises Failure on anything a
    client would see as an error."""
    c = http.client.HTTPConnection("127.0.0.1", cl.http_port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise Failure("HTTP %d %s" % (r.status, r.read()[:200]))
        out, n_ev, done = {}, 0, False
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            d = line[6:].strip()
            if d == b"[DONE]":
                done = True
                break
            ev = json.loads(d)
            if "error" in ev:
                raise Failure("SSE error event: %s" % json.dumps(ev)[:300])
            for ch in ev.get("choices", []):
                o = out.setdefault(ch["index"], ["", None])
                o[0] += ch["text"]
                if ch.get("finish_reason"):
                    o[1] = ch["finish_reason"]
            n_ev += 1
            if cut_after is not None and n_ev >= cut_after:
                return out, True
        if not done:
            raise Failure("stream ended without [DONE] after %d events" % n_ev)
        return out, False
    except (OSError, http.client.HTTPException) as e:
        raise Failure("HTTP: %r" % e)
    finally:
        c.close()


def run_grpc(cl, req, cut_after, timeout=120):
    """{choice: [ids, text, (reason, completion_tokens)]}."""
    out, n = {}, 0
    call = cl.router_stub().Generate(req, timeout=timeout)
    try:
        for r in call:
            if r.HasField("chunk"):
                o = out.setdefault(r.chunk.index, [[], "", None])
                o[0] += list(r.chunk.ids)
                o[1] += r.chunk.text
            else:
                o = out.setdefault(r.finished.index, [[], "", None])
                o[2] = [r.finished.reason, r.finished.completion_tokens]
            n += 1
            if cut_after is not None and n >= cut_after:
                call.cancel()
                return out, True
    except grpc.RpcError as e:
        raise Failure("gRPC %s: %s" % (e.code().name, e.details()))
    return out, False


def run_template(cl, t, cut_after=None):
    if t.kind.startswith("sse"):
        out, cut = run_sse(cl, t.http_body(), cut_after)
    else:
        out, cut = run_grpc(cl, t.grpc_req(cl), cut_after)
    return {str(k): v for k, v in sorted(out.items())}, cut


def compare(t, got, cut):
    """None, or what differs from the oracle."""
    want = t.oracle
    if not cut:
        return None if got == want else "got %s\nwant %s" % (json.dumps(got)[:400],
                                                             json.dumps(want)[:400])
    for k, g in got.items():  # a cancelled stream: a prefix of each choice
        w = want.get(k)
        if w is None:
            return "choice %s not in the oracle" % k
        if t.kind.startswith("sse"):
            ok = w[0].startswith(g[0])
        else:
            ok = w[0][:len(g[0])] == g[0] and w[1].startswith(g[1])
        if not ok:
            return "cut choice %s is not a prefix: %s vs %s" % (k, json.dumps(g)[:300],
                                                                json.dumps(w)[:300])
    return None


class Traffic:
    def __init__(self, cl, templates, seed):
        self.cl, self.templates, self.seed = cl, templates, seed
        self.lock = threading.Lock()
        self.records = []  # (t0, t1, kind, cut, outcome, detail)
        self.stop = threading.Event()
        self.n_bad = 0
        self.t_start = now()

    def client(self, idx):
        rng = random.Random(self.seed * 1000 + idx)
        while not self.stop.is_set():
            t = rng.choice(self.templates)
            cut_after = rng.randint(1, 20) if rng.random() < 0.2 else None
            t0 = now()
            try:
                got, cut = run_template(self.cl, t, cut_after)
                diff = compare(t, got, cut)
                outcome, detail = ("wrong", diff) if diff else ("ok", "")
            except Failure as e:
                outcome, detail = "fail", str(e)
            except Exception as e:  # noqa: BLE001 (a client bug is a failure too)
                outcome, detail = "fail", "client: %r" % e
            rec = (t0, now(), t.kind, cut_after is not None, outcome, detail)
            with self.lock:
                self.records.append(rec)
            if outcome == "ok":
                continue
            with self.lock:
                self.n_bad += 1
                loud = self.n_bad <= 20 or outcome == "wrong"
            if loud:
                print("chaos: t=%.1f %s %s (template %d, cut %s): %s" % (
                    rec[0] - self.t_start, outcome, t.kind, t.idx, cut_after, detail[:300]),
                    flush=True)
            if outcome == "fail":
                time.sleep(0.25)  # a client backs off after an error


class Supervisor:
    """Faults on random instances; each fault runs in its own thread and
    ends with the instance healthy in the router's view."""

    def __init__(self, cl, seed, interval, max_faults, t_start):
        self.cl = cl
        self.rng = random.Random(seed * 7919 + 1)
        self.interval, self.max_faults, self.t_start = interval, max_faults, t_start
        self.lock = threading.Lock()
        self.active = set()
        self.faults = []
        self.threads = []
        self.restarted = set()
        self.stop = threading.Event()
        self.errors = []

    def healthy(self):
        st, _, data = self.cl.http("GET", "/workers", timeout=10)
        return {x["name"]: x["healthy"] for x in json.loads(data)["workers"]}

    def wait_healthy(self, name, timeout=120):
        deadline = now() + timeout
        while now() < deadline:
            try:
                if self.healthy().get(name):
                    return now()
            except (OSError, ValueError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        raise RuntimeError("%s not healthy %ss after its fault" % (name, timeout))

    def wait_unhealthy(self, name, timeout):
        deadline = now() + timeout
        while now() < deadline:
            try:
                if not self.healthy().get(name, True):
                    return True
            except (OSError, ValueError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        return False

    def restart(self, name):
        env = {"DUET_FAULTS": "decode.step_delay_ms=%d" % STEP_MS} if name in DECODES else None
        self.cl.start(name, env=env)
        self.cl.wait_worker(name, timeout=120)
        with self.lock:
            self.restarted.add(name)

    def fault(self, name, kind):
        cl, rng = self.cl, self.rng
        f = {"kind": kind, "target": name, "t": round(now() - self.t_start, 2)}
        t_fault = now()
        f["_t_fault"] = t_fault
        try:
            p = cl.procs[name].proc
            if kind == "kill":
                p.send_signal(signal.SIGKILL)
                p.wait()
                time.sleep(rng.uniform(0.5, 3))
                self.restart(name)
            elif kind == "stop":
                hold = rng.uniform(1, 8)
                f["stopped_s"] = round(hold, 2)
                p.send_signal(signal.SIGSTOP)
                time.sleep(hold)
                p.send_signal(signal.SIGCONT)
            else:
                p.send_signal(signal.SIGTERM)
                try:
                    rc = p.wait(timeout=90)
                except Exception:  # noqa: BLE001
                    p.kill()
                    rc = p.wait()
                    self.error("%s did not exit within 90 s of SIGTERM" % name)
                f["drain_s"] = round(now() - t_fault, 3)
                if rc != 0:
                    self.error("%s exited %s after SIGTERM:\n%s" % (name, rc,
                                                                  cl.procs[name].log(2000)))
                time.sleep(rng.uniform(0.2, 1))
                self.restart(name)
            t_ok = self.wait_healthy(name)
            f["recover_s"] = round(t_ok - t_fault, 3)
            f["_t_healthy"] = t_ok
        except Exception as e:  # noqa: BLE001
            self.error("fault %s on %s: %r" % (kind, name, e))
            f["_t_healthy"] = now()
            f["error"] = repr(e)
        with self.lock:
            self.faults.append(f)
            self.active.discard(name)
        print("chaos: t=%6.1f %-4s %s recovered in %s s" % (
            f["t"], kind, name, f.get("recover_s")), flush=True)

    def error(self, what):
        with self.lock:
            self.errors.append(what)
        print("chaos: supervisor:", what[:600], flush=True)

    def run(self, t_end):
        while not self.stop.is_set() and now() < t_end:
            self.stop.wait(self.rng.uniform(0.5 * self.interval, 1.5 * self.interval))
            if self.stop.is_set() or now() >= t_end:
                break
            with self.lock:
                free = [n for n in PREFILLS + DECODES if n not in self.active]
                if len(self.active) >= self.max_faults or not free:
                    continue
                name = self.rng.choice(free)
                kind = self.rng.choices(["kill", "stop", "term"], [4, 3, 3])[0]
                self.active.add(name)
            th = threading.Thread(target=self.fault, args=(name, kind), daemon=True)
            th.start()
            self.threads.append(th)

    def join(self, timeout=300):
        for th in self.threads:
            th.join(timeout)


def role_down_windows(faults):
    """[(role, start, end)]: intervals during which every instance of a role
    was under a fault (from its signal until the router saw it healthy)."""
    out = []
    for role, names in (("prefill", PREFILLS), ("decode", DECODES)):
        per = {n: [(f["_t_fault"], f["_t_healthy"]) for f in faults if f["target"] == n]
               for n in names}
        a, b = names
        for s1, e1 in per[a]:
            for s2, e2 in per[b]:
                s, e = max(s1, s2), min(e1, e2)
                if s < e:
                    out.append((role, s, e))
    return out


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def core_fds(pid):
    """Open fds less listening sockets and epoll instances: UCX opens one
    listener (and epoll) per network interface up when its worker starts,
    and other agents on this machine add interfaces (podman bridges)."""
    return sum(1 for t in fd_detail(pid)
               if not t.endswith("st0A") and t != "anon_inode:[eventpoll]")


def fd_settle(cl, baseline, timeout=20):
    """{name: (baseline, now)} of daemons whose open fds are not back at
    baseline after timeout s: a daemon never restarted must have exactly its
    baseline; a restarted one (same config, so the same fds once connected)
    at most the baseline of its name (it may not have met every peer yet),
    both counted without listeners and epolls (core_fds)."""
    deadline = now() + timeout
    while True:
        bad = {}
        for name, (pid, fds, core) in baseline.items():
            p = cl.procs[name].proc
            if p.poll() is not None:
                bad[name] = (fds, None)
                continue
            cur, cur_core = proc_stats(p.pid)[1], core_fds(p.pid)
            if cur_core > core or (p.pid == pid and cur != fds):
                bad[name] = (fds, cur)
        if not bad or now() > deadline:
            return bad
        time.sleep(0.5)


def fd_detail(pid):
    """What a process's open fds are: sockets as local->remote TCP ports
    (state), the rest as their link targets."""
    socks = {}
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, name)) as f:
                for line in f.readlines()[1:]:
                    x = line.split()
                    socks[x[9]] = "%d->%d st%s" % (int(x[1].split(":")[1], 16),
                                                  int(x[2].split(":")[1], 16), x[3])
        except OSError:
            pass
    out = []
    for fd in sorted(os.listdir("/proc/%d/fd" % pid), key=int):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith("socket:["):
            t = "tcp " + socks.get(t[8:-1], t)
        out.append(t)
    return out


def make_templates(seed):
    rng = random.Random(seed)
    out = []
    for p in PROMPTS:
        for k in KINDS:
            out.append(Template(len(out), k, p, rng.randint(48, 160), rng.randint(1, 10 ** 6)))
    return out


def build_cluster(build, router_extra):
    router = {"stall_timeout_ms": 2000, "migrate_max": 6, "migrate_on_drain": True,
              "health_interval_ms": 200, "request_timeout_ms": 90000}
    router.update(router_extra)
    inst = {"drain_timeout_ms": 20000}
    # loopback only: UCX's tcp lanes on lo alone, so that interfaces other
    # agents on this machine bring up (podman bridges, where connections
    # are refused) take no part -- with them, a transfer once stalled until
    # its deadline and restarted daemons opened one more listener
    return Cluster(build, SRC, [(n, 1, dict(inst)) for n in PREFILLS],
                   [(n, 1, dict(inst)) for n in DECODES], router=router, n_pages=512,
                   env={"UCX_NET_DEVICES": "lo"})


def summarize(a, cl, tr, sup, t_start, t_end, extra):
    faults = sorted(sup.faults, key=lambda f: f["_t_fault"])
    windows = role_down_windows(faults)
    recs = sorted(tr.records)
    failures, excused, wrong = [], [], []
    for t0, t1, kind, cut, outcome, detail in recs:
        if outcome == "wrong":
            wrong.append({"t": round(t0 - t_start, 2), "kind": kind, "cut": cut,
                          "detail": detail[:600]})
        elif outcome == "fail":
            why = [r for r, s, e in windows if t0 <= e + 1.0 and t1 >= s]
            item = {"t": round(t0 - t_start, 2), "dur_s": round(t1 - t0, 2), "kind": kind,
                    "detail": detail[:300]}
            if why:
                item["role_down"] = why[0]
                excused.append(item)
            else:
                failures.append(item)
    for f in faults:  # first request started after the fault that succeeded
        ok = [t1 for t0, t1, _, _, o, _ in recs if t0 >= f["_t_fault"] and o == "ok"]
        f["first_ok_s"] = round(min(ok) - f["_t_fault"], 3) if ok else None
    lat = [t1 - t0 for t0, t1, _, cut, o, _ in recs if o == "ok" and not cut]
    kinds = {}
    for _, _, kind, cut, outcome, _ in recs:
        k = kind + ("-cut" if cut else "")
        kinds.setdefault(k, {"ok": 0, "fail": 0, "wrong": 0})[outcome] += 1
    table = {}
    for f in faults:
        key = "%s %s" % (f["kind"], "decode" if f["target"] in DECODES else "prefill")
        row = table.setdefault(key, {"n": 0, "recover": [], "first_ok": []})
        row["n"] += 1
        if f.get("recover_s") is not None:
            row["recover"].append(f["recover_s"])
        if f.get("first_ok_s") is not None:
            row["first_ok"].append(f["first_ok_s"])
    per_kind = {k: {"faults": v["n"], "recover_s_p50": pct(v["recover"], 0.5),
                    "recover_s_max": max(v["recover"]) if v["recover"] else None,
                    "first_ok_s_p50": pct(v["first_ok"], 0.5),
                    "first_ok_s_max": max(v["first_ok"]) if v["first_ok"] else None}
                for k, v in sorted(table.items())}
    for f in faults:
        f["t_healthy"] = round(f.pop("_t_healthy") - t_start, 2)
        f.pop("_t_fault")
    return {
        "minutes": a.minutes, "seed": a.seed, "clients": a.clients, "interval_s": a.interval,
        "max_faults": a.max_faults, "traffic_s": round(t_end - t_start, 1),
        "cluster": "router + prefill p0, p1 + decode d0, d1 (TP=1, 1 thread each), CPU, "
                   "stories260K, decode.step_delay_ms=%d" % STEP_MS,
        "router": cl.router_cfg, "requests": len(recs), "by_kind": kinds,
        "latency_s": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                      "max": round(max(lat), 3) if lat else None},
        "faults": len(faults), "faults_by_kind": per_kind,
        "role_down_s": round(sum(e - s for _, s, e in windows), 2),
        "role_down_windows": [(r, round(s - t_start, 2), round(e - t_start, 2))
                              for r, s, e in windows],
        "failures_unexcused": failures, "failures_while_role_down": excused,
        "wrong": wrong, "supervisor_errors": sup.errors, "fault_log": faults, **extra}


def print_table(s):
    print("\nchaos soak: %d requests in %.0f s, %d faults, %d role-down s" % (
        s["requests"], s["traffic_s"], s["faults"], s["role_down_s"]))
    print("%-15s %6s %8s %8s %9s %9s" % ("fault", "count", "rec p50", "rec max", "1st ok p50",
                                         "1st ok max"))
    for k, v in s["faults_by_kind"].items():
        print("%-15s %6d %8s %8s %9s %9s" % (k, v["faults"], v["recover_s_p50"],
                                             v["recover_s_max"], v["first_ok_s_p50"],
                                             v["first_ok_s_max"]))
    print("%-18s %6s %6s %6s" % ("request", "ok", "fail", "wrong"))
    for k, v in sorted(s["by_kind"].items()):
        print("%-18s %6d %6d %6d" % (k, v["ok"], v["fail"], v["wrong"]))
    print("latency (completed, not cut): p50 %s s, p99 %s s, max %s s" % (
        s["latency_s"]["p50"], s["latency_s"]["p99"], s["latency_s"]["max"]))
    print("failures: %d while a role was down, %d otherwise; wrong texts: %d" % (
        len(s["failures_while_role_down"]), len(s["failures_unexcused"]), len(s["wrong"])))
    print("pages not at baseline: %s; fds not at baseline: %s; unclean exits: %s" % (
        s["pages_not_at_baseline"] or "none", s["fds_not_at_baseline"] or "none",
        s["unclean_exit"] or "none"), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--interval", type=float, default=4, help="mean seconds between faults")
    ap.add_argument("--max-faults", type=int, default=2, help="instances under a fault at once")
    ap.add_argument("--router", default="{}", help="JSON merged into the router section")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    cl = build_cluster(build, json.loads(a.router))
    print("chaos: cluster in %s" % cl.tmp, flush=True)
    ok = False
    try:
        for n in PREFILLS:
            cl.start(n)
        for n in DECODES:
            cl.start(n, env={"DUET_FAULTS": "decode.step_delay_ms=%d" % STEP_MS})
        for n in PREFILLS + DECODES:
            cl.wait_worker(n)
        cl.start_router()
        sup0 = Supervisor(cl, a.seed, a.interval, a.max_faults, now())
        for n in PREFILLS + DECODES:
            sup0.wait_healthy(n, 60)
        templates = make_templates(a.seed)
        t0 = now()
        for t in templates:  # the oracle: each template alone on a quiet cluster
            t.oracle, _ = run_template(cl, t)
        print("chaos: oracle of %d templates in %.1f s" % (len(templates), now() - t0),
              flush=True)
        time.sleep(1)
        baseline = {n: (cl.procs[n].proc.pid, proc_stats(cl.procs[n].proc.pid)[1],
                        core_fds(cl.procs[n].proc.pid))
                    for n in ["router"] + PREFILLS + DECODES}
        fds0 = {n: fd_detail(cl.procs[n].proc.pid) for n in DECODES[:1] + PREFILLS[:1]}
        tr = Traffic(cl, templates, a.seed)
        t_start = tr.t_start = now()
        t_end = t_start + 60 * a.minutes
        sup = Supervisor(cl, a.seed, a.interval, a.max_faults, t_start)
        clients = [threading.Thread(target=tr.client, args=(i,), daemon=True)
                   for i in range(a.clients)]
        for th in clients:
            th.start()
        sup.run(t_end)
        sup.join()
        for n in PREFILLS + DECODES:
            sup.wait_healthy(n, 60)
        tr.stop.set()
        for th in clients:
            th.join(180)
        hung = sum(th.is_alive() for th in clients)
        t_stop = now()
        bad_pages = cl.pages_at_baseline(timeout=30)
        bad_fds = fd_settle(cl, baseline)
        fds_end = {n: proc_stats(cl.procs[n].proc.pid)[1] for n in baseline}
        cfds_end = {n: core_fds(cl.procs[n].proc.pid) for n in baseline}
        fds_detail = {n: fd_detail(cl.procs[n].proc.pid) for n in bad_fds
                      if cl.procs[n].alive()}
        rss = {n: proc_stats(cl.procs[n].proc.pid)[0] for n in ["router"] + PREFILLS + DECODES}
        unclean = []
        try:
            cl.stop_all()
        except AssertionError as e:
            unclean.append(str(e)[:2000])
        s = summarize(a, cl, tr, sup, t_start, t_stop, {
            "pages_not_at_baseline": bad_pages, "fds_not_at_baseline": bad_fds,
            "fds_baseline": {n: v[1] for n, v in baseline.items()}, "fds_end": fds_end,
            "core_fds_baseline": {n: v[2] for n, v in baseline.items()},
            "core_fds_end": cfds_end,
            "fds_detail": fds_detail, "fds_detail_baseline": fds0,
            "restarted": sorted(sup.restarted), "rss_kib_end": rss,
            "clients_hung": hung, "unclean_exit": unclean})
        print_table(s)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "chaos_soak.json"), "w") as f:
                json.dump(s, f, indent=1)
        ok = not (s["failures_unexcused"] or s["wrong"] or bad_pages or bad_fds or unclean
                  or hung or sup.errors)
    finally:
        cl.kill_all()
    print("chaos: %s (logs in %s)" % ("PASS" if ok else "FAIL", cl.tmp), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
