#!/usr/bin/python3
"""Soak: mixed traffic through a local cluster (router + prefill TP=2 +
decode TP=4, CPU backend, stories260K) for a while, sampling each
process's RSS, open file descriptors and threads, and the daemons' free KV
pages.  Reports the RSS slope (least squares over the samples after the
warm-up fifth, KiB per minute) and fails when a request ends in an
unexpected way, a greedy answer changes, or pages are not back at
baseline once the traffic stopped.

The traffic, over --clients threads, each request drawn at random:
  streamed completion (read to [DONE])            35%
  streamed completion cut after the first event   15%  (client cancel)
  chat completion, not streamed                   15%
  gRPC Generate through the router                10%  (half cancelled)
  bad requests, each must be a 4xx                15%  (bad JSON, unknown
                                                        model, max_tokens
                                                        over the limit, ...)
  greedy check: a fixed prompt must give the       10%
  answer it gave the first time

usage: bench/soak.py BUILD_DIR [--minutes 30] [--clients 4] [--sample 10]
                     [--out DIR] [--seed 1]
"""
import argparse
import json
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "router"))
sys.path.insert(0, os.path.join(SRC, "tests", "pylib"))

from router_cluster import Cluster  # noqa: E402

PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a boy named Tom",
           "The sun was"]


def proc_stats(pid):
    """(RSS KiB, open fds, threads) of a live process."""
    rss = threads = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir("/proc/%d/fd" % pid)), threads


def slope_per_min(points):
    """Least-squares slope of [(seconds, value)] in value per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return 60.0 * sxy / sxx if sxx > 0 else 0.0


class Traffic:
    def __init__(self, cl, seed):
        self.cl = cl
        self.rng_seed = seed
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []
        self.greedy = {}
        self.stop = threading.Event()

    def count(self, kind):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def error(self, what):
        with self.lock:
            if len(self.errors) < 50:
                self.errors.append(what)
        print("soak: unexpected:", what, flush=True)

    def stream(self, rng, cut):
        body = {"model": "stories260K", "prompt": rng.choice(PROMPTS),
                "max_tokens": rng.randint(8, 64), "temperature": rng.choice([0, 0.8]),
                "stream": True}
        if cut:
            first = threading.Event()
            # read until the first event, then drop the connection
            c = self.cl
            import http.client
            conn = http.client.HTTPConnection("127.0.0.1", c.http_port, timeout=60)
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                self.error("cut stream: status %d" % r.status)
            else:
                while not first.is_set():
                    line = r.readline()
                    if not line:
                        break
                    if line.startswith(b"data: "):
                        first.set()
            conn.close()
            return "stream_cut"
        st, events, raw = self.cl.sse("/v1/completions", body, timeout=120)
        if st != 200 or not events or events[-1] != "[DONE]":
            self.error("stream: status %d, %r" % (st, raw[-300:]))
        return "stream"

    def chat(self, rng):
        st, _, r = self.cl.post_json("/v1/chat/completions", {
            "model": "stories260K", "max_tokens": rng.randint(4, 48), "temperature": 0.7,
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}, timeout=120)
        if st != 200 or not r.get("choices"):
            self.error("chat: status %d, %s" % (st, json.dumps(r)[:300]))
        return "chat"

    def grpc(self, rng):
        stub = self.cl.router_stub()
        req = self.cl.gen_request(rng.choice(PROMPTS), max_tokens=rng.randint(8, 48))
        cancel = rng.random() < 0.5
        call = stub.Generate(req, timeout=120)
        try:
            for _ in call:
                if cancel:
                    call.cancel()
                    break
        except Exception as e:  # grpc.RpcError: CANCELLED is what we asked for
            code = getattr(e, "code", lambda: None)()
            if not (cancel and code is not None and code.name == "CANCELLED"):
                self.error("grpc: %s" % e)
        return "grpc_cancel" if cancel else "grpc"

    def bad(self, rng):
        cases = [
            (b"{not json", None),
            ({"model": "no-such-model", "prompt": "x", "max_tokens": 4}, None),
            ({"model": "stories260K", "prompt": "x", "max_tokens": 10 ** 7}, None),
            ({"model": "stories260K", "prompt": "x", "max_tokens": 4, "n": 3}, None),
            ({"model": "stories260K", "max_tokens": 4}, None),
        ]
        body, _ = rng.choice(cases)
        st, _, _ = self.cl.http("POST", "/v1/completions", body,
                                headers={"Content-Type": "application/json"}, timeout=60)
        if not 400 <= st < 500:
            self.error("bad request got %d: %r" % (st, body))
        return "bad"

    def check_greedy(self, rng):
        p = rng.choice(PROMPTS)
        st, _, r = self.cl.post_json("/v1/completions", {"model": "stories260K", "prompt": p,
                                                         "max_tokens": 24, "temperature": 0},
                                     timeout=120)
        if st != 200:
            self.error("greedy: status %d" % st)
            return "greedy"
        text = r["choices"][0]["text"]
        with self.lock:
            first = self.greedy.setdefault(p, text)
        if text != first:
            self.error("greedy answer for %r changed: %r then %r" % (p, first, text))
        return "greedy"

    def client(self, idx):
        rng = random.Random(self.rng_seed * 1000 + idx)
        while not self.stop.is_set():
            x = rng.random()
            try:
                if x < 0.35:
                    kind = self.stream(rng, False)
                elif x < 0.50:
                    kind = self.stream(rng, True)
                elif x < 0.65:
                    kind = self.chat(rng)
                elif x < 0.75:
                    kind = self.grpc(rng)
                elif x < 0.90:
                    kind = self.bad(rng)
                else:
                    kind = self.check_greedy(rng)
                self.count(kind)
            except Exception as e:
                self.error("client %d: %r" % (idx, e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--sample", type=float, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    cl = Cluster(build, SRC, [("p0", 2)], [("d0", 4)])
    # the shipped model has no chat template: the same files with one
    mdir = os.path.join(cl.tmp, "stories260K")
    os.makedirs(mdir)
    for f in os.listdir(cl.model):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(cl.model, f), os.path.join(mdir, f))
    with open(os.path.join(cl.model, "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc["chat_template"] = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: "
                           "{{ m['content'] | trim }}\n{% endfor %}"
                           "{% if add_generation_prompt %}assistant:{% endif %}")
    with open(os.path.join(mdir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    cl.model = mdir
    cl.write_config()
    samples = []
    t_traffic = None
    ok = False
    try:
        cl.start_workers()
        cl.start_router()
        tr = Traffic(cl, a.seed)
        names = ["router", "p0", "d0"]
        threads = [threading.Thread(target=tr.client, args=(i,), daemon=True)
                   for i in range(a.clients)]
        t0 = time.time()
        for t in threads:
            t.start()
        t_traffic = a.minutes * 60
        next_sample = t0
        while time.time() - t0 < t_traffic:
            now = time.time()
            if now >= next_sample:
                row = {"t": round(now - t0, 1)}
                for n in names:
                    p = cl.procs[n]
                    if not p.alive():
                        raise SystemExit("soak: %s died:\n%s" % (n, p.log()))
                    row[n + "_rss_kib"], row[n + "_fds"], row[n + "_threads"] = \
                        proc_stats(p.proc.pid)
                st, _, data = cl.http("GET", "/workers")
                for wk in json.loads(data)["workers"]:
                    row[wk["name"] + "_free_pages"] = wk["free_pages"]
                    row[wk["name"] + "_total_pages"] = wk["total_pages"]
                samples.append(row)
                with tr.lock:
                    done = sum(tr.counts.values())
                print("soak: t=%5.0fs requests=%d rss router/p0/d0 = %d/%d/%d KiB fds %d/%d/%d"
                      % (row["t"], done, row["router_rss_kib"], row["p0_rss_kib"],
                         row["d0_rss_kib"], row["router_fds"], row["p0_fds"], row["d0_fds"]),
                      flush=True)
                next_sample += a.sample
            time.sleep(0.2)
        tr.stop.set()
        for t in threads:
            t.join(180)
        bad_pages = cl.pages_at_baseline(timeout=30)
        warm = [s for s in samples if s["t"] >= 0.2 * t_traffic]
        summary = {"minutes": a.minutes, "clients": a.clients, "requests": dict(tr.counts),
                   "errors": tr.errors, "pages_not_at_baseline": bad_pages,
                   "samples": len(samples)}
        for n in names:
            summary[n + "_rss_slope_kib_per_min"] = round(
                slope_per_min([(s["t"], s[n + "_rss_kib"]) for s in warm]), 2)
            summary[n + "_fds_slope_per_min"] = round(
                slope_per_min([(s["t"], s[n + "_fds"]) for s in warm]), 3)
            summary[n + "_rss_kib_first_last"] = [warm[0][n + "_rss_kib"],
                                                  warm[-1][n + "_rss_kib"]] if warm else []
        print(json.dumps(summary, indent=1), flush=True)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "soak.json"), "w") as f:
                json.dump({"summary": summary, "samples": samples}, f, indent=1)
            keys = list(samples[0].keys()) if samples else []
            with open(os.path.join(a.out, "soak.csv"), "w") as f:
                f.write(",".join(keys) + "\n")
                for s in samples:
                    f.write(",".join(str(s.get(k, "")) for k in keys) + "\n")
        ok = not tr.errors and not bad_pages
    finally:
        cl.stop_all()
    print("soak: %s" % ("PASS" if ok else "FAIL"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
