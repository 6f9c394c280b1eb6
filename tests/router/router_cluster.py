"""Test harness for duet-router: real duet-prefill / duet-decode / duet-router
processes on 127.0.0.1 with free ports, a cluster config with a router
section, Python gRPC stubs generated at test time (protoc +
grpc_python_plugin) for Debian's python3-grpcio, and raw HTTP helpers.

Run the tests with /usr/bin/python3: BUILD_DIR SOURCE_DIR as arguments.
Exit 77 (ctest SKIP) when grpcio or a binary is missing.
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio is not installed for", sys.executable)
    sys.exit(77)

_STUBS = None


def fail(msg):
    print("FAIL:", msg, flush=True)
    raise AssertionError(msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def stubs(src):
    """duet.v1 and grpc.health.v1 Python stubs, generated once per process."""
    global _STUBS
    if _STUBS is None:
        out = tempfile.mkdtemp(prefix="duet_router_stubs_")
        protos = [os.path.join(src, "proto", "duet", "v1", f)
                  for f in ("common.proto", "generate.proto", "decode.proto", "prefill.proto")]
        subprocess.check_call(["protoc", "--proto_path=" + os.path.join(src, "proto"),
                               "--python_out=" + out, "--grpc_python_out=" + out,
                               "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin"]
                              + protos)
        # health.proto under a plain name: a top-level "grpc" package would
        # shadow grpcio itself
        hdir = os.path.join(out, "hsrc")
        os.makedirs(hdir)
        with open(os.path.join(src, "proto", "grpc", "health", "v1", "health.proto")) as f:
            text = f.read()
        with open(os.path.join(hdir, "health.proto"), "w") as f:
            f.write(text)
        subprocess.check_call(["protoc", "--proto_path=" + hdir, "--python_out=" + out,
                               "--grpc_python_out=" + out,
                               "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                               os.path.join(hdir, "health.proto")])
        sys.path.insert(0, out)
        from duet.v1 import common_pb2, decode_pb2, decode_pb2_grpc, generate_pb2
        from duet.v1 import generate_pb2_grpc, prefill_pb2, prefill_pb2_grpc
        import health_pb2
        import health_pb2_grpc
        _STUBS = dict(common=common_pb2, decode=decode_pb2, decode_grpc=decode_pb2_grpc,
                      generate=generate_pb2, generate_grpc=generate_pb2_grpc,
                      prefill=prefill_pb2, prefill_grpc=prefill_pb2_grpc, health=health_pb2,
                      health_grpc=health_pb2_grpc)
    return _STUBS


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ports import free_port  # noqa: E402

class Proc:
    def __init__(self, name, role, exe, log_path):
        self.name, self.role, self.exe, self.log_path = name, role, exe, log_path
        self.proc = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self, tail=4000):
        """The last tail characters of the log (None: all of it)."""
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
                return text if tail is None else text[-tail:]
        except OSError:
            return ""


class Cluster:
    """prefill/decode: lists of (name, tp[, extra instance keys])."""

    def __init__(self, build, src, prefill, decode, model=None, router=None, n_pages=512,
                 env=None, transfer=None):
        self.build, self.src = build, src
        self.model = os.path.abspath(model or os.path.join(src, "models", "stories260K"))
        self.tmp = tempfile.mkdtemp(prefix="duet_router_test_")
        self.env = dict(os.environ)
        self.env.setdefault("DUET_LOG_LEVEL", "info")
        if env:
            self.env.update(env)
        self.instances = []
        for role, lst in (("prefill", prefill), ("decode", decode)):
            for name, tp, *extra in lst:
                port = free_port()
                e = {"name": name, "address": "127.0.0.1:%d" % port, "tp": tp, "threads": 1,
                     "n_pages": n_pages, "max_seqs": 32, "drain_timeout_ms": 5000}
                e.update(extra[0] if extra else {})
                self.instances.append((role, e))
        self.http_port, self.grpc_port = free_port(), free_port()
        self.router_cfg = {"http": "127.0.0.1:%d" % self.http_port,
                           "grpc": "127.0.0.1:%d" % self.grpc_port,
                           "health_interval_ms": 200, "request_timeout_ms": 60000,
                           "max_tokens_limit": 2048}
        self.router_cfg.update(router or {})
        self.transfer = {"timeout_ms": 10000, "rpc_timeout_ms": 10000}
        self.transfer.update(transfer or {})
        self.config = os.path.join(self.tmp, "cluster.json")
        self.write_config()
        self.procs = {}
        self.pb = stubs(src)
        self.channels = {}

    def write_config(self, path=None, router=None):
        r = dict(self.router_cfg)
        r.update(router or {})
        cfg = {"model": self.model, "kv": {"page_size": 16},
               "transfer": self.transfer,
               "router": r,
               "prefill": [e for role, e in self.instances if role == "prefill"],
               "decode": [e for role, e in self.instances if role == "decode"]}
        with open(path or self.config, "w") as f:
            json.dump(cfg, f, indent=1)
        return path or self.config

    def address(self, name):
        for _, e in self.instances:
            if e["name"] == name:
                return e["address"]
        raise KeyError(name)

    def role(self, name):
        for role, e in self.instances:
            if e["name"] == name:
                return role
        return "router"

    def start(self, name, args=(), config=None, env=None):
        role = self.role(name)
        exe = os.path.join(self.build, role, "duet-" + role)
        p = Proc(name, role, exe, os.path.join(self.tmp, name + ".log"))
        e = dict(self.env)
        e.update(env or {})
        cmd = [exe, "--config", config or self.config]
        if role != "router":
            cmd += ["--name", name]
        log = open(p.log_path, "ab")
        p.proc = subprocess.Popen(cmd + list(args), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=e)
        log.close()
        self.procs[name] = p
        return p

    def start_workers(self):
        for _, e in self.instances:
            self.start(e["name"])
        for _, e in self.instances:
            self.wait_worker(e["name"])

    def wait_worker(self, name, timeout=90):
        deadline = time.time() + timeout
        port = int(self.address(name).rsplit(":", 1)[1])
        while time.time() < deadline:
            p = self.procs[name]
            if not p.alive():
                fail("%s exited with %s:\n%s" % (name, p.proc.returncode, p.log()))
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                self.info(name, timeout=1)
                return
            except (OSError, grpc.RpcError):
                time.sleep(0.05)
        fail("%s not ready after %ss:\n%s" % (name, timeout, self.procs[name].log()))

    def start_router(self, name="router", args=(), config=None, env=None, port=None,
                     wait=True):
        p = self.start(name, args, config, env)
        if wait:
            self.wait_router(name, port or self.http_port)
        return p

    def wait_router(self, name="router", port=None, timeout=60):
        deadline = time.time() + timeout
        port = port or self.http_port
        while time.time() < deadline:
            p = self.procs[name]
            if not p.alive():
                fail("%s exited with %s:\n%s" % (name, p.proc.returncode, p.log()))
            try:
                st, _, _ = self.http("GET", "/health", port=port, timeout=2)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        fail("router not ready after %ss:\n%s" % (timeout, self.procs[name].log()))

    # ---- HTTP ----
    def http(self, method, path, body=None, headers=None, port=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", port or self.http_port, timeout=timeout)
        h = dict(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hdrs, data

    def post_json(self, path, body, **kw):
        st, h, data = self.http("POST", path, body, **kw)
        try:
            return st, h, json.loads(data)
        except ValueError:
            fail("%s: not JSON (status %d): %r" % (path, st, data[:300]))

    def sse(self, path, body, port=None, timeout=60, headers=None):
        """POST and read an SSE stream: (status, events as parsed JSON or
        '[DONE]', raw text)."""
        c = http.client.HTTPConnection("127.0.0.1", port or self.http_port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", path, body=json.dumps(body), headers=h)
        r = c.getresponse()
        raw = r.read().decode()
        c.close()
        events = []
        for block in raw.split("\n\n"):
            lines = [l[6:] for l in block.split("\n") if l.startswith("data: ")]
            if lines:
                d = "\n".join(lines)
                events.append(d if d == "[DONE]" else json.loads(d))
        return r.status, events, raw

    def sse_incremental(self, path, body, first_event=None, port=None, timeout=60):
        """Like sse() but reads line by line and sets first_event (a
        threading.Event) when the first data event arrives."""
        c = http.client.HTTPConnection("127.0.0.1", port or self.http_port, timeout=timeout)
        c.request("POST", path, body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events, raw = [], ""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode()
            raw += line
            if line.startswith("data: "):
                d = line[6:].rstrip("\n")
                events.append(d if d == "[DONE]" else json.loads(d))
                if first_event is not None:
                    first_event.set()
        c.close()
        if first_event is not None:
            first_event.set()
        return r.status, events, raw

    def metrics(self, port=None):
        st, _, data = self.http("GET", "/metrics", port=port)
        check(st == 200, "/metrics status %d" % st)
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    # ---- gRPC ----
    def channel(self, address):
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return self.channels[address]

    def info(self, name, timeout=5):
        ch = self.channel(self.address(name))
        if self.role(name) == "decode":
            stub = self.pb["decode_grpc"].DecodeStub(ch)
        else:
            stub = self.pb["prefill_grpc"].PrefillStub(ch)
        return stub.Info(self.pb["common"].InfoRequest(), timeout=timeout)

    def router_stub(self, port=None):
        return self.pb["generate_grpc"].GenerateStub(
            self.channel("127.0.0.1:%d" % (port or self.grpc_port)))

    def gen_request(self, prompt, max_tokens=16, temperature=0.0, **kw):
        g, c = self.pb["generate"], self.pb["common"]
        args = dict(max_tokens=max_tokens, sampling=c.SamplingParams(temperature=temperature))
        if isinstance(prompt, str):
            args["text"] = prompt
        else:
            args["token_ids"] = c.TokenIds(ids=list(prompt))
        args.update(kw)
        return g.GenerateRequest(**args)

    def pages_at_baseline(self, timeout=10):
        """Decode daemons whose free pages are not back to total."""
        deadline = time.time() + timeout
        while True:
            bad = []
            for role, e in self.instances:
                if role != "decode" or e["name"] not in self.procs or \
                        not self.procs[e["name"]].alive():
                    continue
                i = self.info(e["name"])
                if i.free_pages != i.total_pages or i.running or i.queue_depth:
                    bad.append("%s free %d/%d running %d queued %d" % (
                        e["name"], i.free_pages, i.total_pages, i.running, i.queue_depth))
                # the prefix cache's accounting (docs/prefix-cache.md)
                elif (i.pool_free_pages + i.cached_idle_pages + i.in_use_pages != i.total_pages
                      or i.in_use_pages):
                    bad.append("%s accounting: %d free + %d cached + %d in use of %d" % (
                        e["name"], i.pool_free_pages, i.cached_idle_pages, i.in_use_pages,
                        i.total_pages))
            if not bad or time.time() > deadline:
                return bad
            time.sleep(0.1)

    # ---- shutdown ----
    def stop(self, name, sig=signal.SIGTERM, timeout=30):
        p = self.procs[name]
        if not p.alive():
            return p.proc.returncode
        p.proc.send_signal(sig)
        try:
            return p.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
            fail("%s did not exit within %ss after %s:\n%s" % (name, timeout, sig, p.log()))

    def stop_all(self):
        """SIGTERM routers first, then workers; every one must exit 0."""
        bad = []
        order = [n for n in self.procs if self.role(n) == "router"] + \
                [n for n in self.procs if self.role(n) != "router"]
        for name in order:
            p = self.procs[name]
            if p.proc.returncode is not None and p.proc.returncode < 0:
                continue  # killed on purpose by the test
            rc = self.stop(name)
            if rc != 0 and rc != -signal.SIGKILL:
                bad.append("%s exited %s:\n%s" % (name, rc, p.log()))
        for ch in self.channels.values():
            ch.close()
        check(not bad, "unclean exits: " + "\n".join(bad))

    def kill_all(self):
        for p in self.procs.values():
            if p.alive():
                p.proc.kill()
                p.proc.wait()


def oracle(build, model, prompt_ids=None, prompt=None, max_tokens=16, extra=()):
    """`duet generate --tp 1` greedy: (ids, text)."""
    exe = os.path.join(build, "tools", "duet")
    base = [exe, "generate", "--model", model, "--max-tokens", str(max_tokens),
            "--temperature", "0", "--tp", "1"] + list(extra)
    base += ["--prompt-ids", " ".join(map(str, prompt_ids))] if prompt_ids is not None \
        else ["--prompt", prompt]
    ids = subprocess.run(base + ["--output", "ids"], check=True, capture_output=True,
                         text=True).stdout.split()
    text = subprocess.run(base + ["--output", "text"], check=True, capture_output=True,
                          text=True).stdout
    if text.endswith("\n"):
        text = text[:-1]
    return [int(x) for x in ids], text


_VOCAB = {}


def detok(model, ids):
    """Independent text of generated ids for a SentencePiece-BPE tokenizer
    (stories260K): pieces with U+2581 as a space, <0xNN> byte tokens,
    special tokens skipped, no leading-space strip (the text continues the
    prompt, as decode streams it)."""
    if model not in _VOCAB:
        with open(os.path.join(model, "tokenizer.json")) as f:
            tj = json.load(f)
        inv = {v: k for k, v in tj["model"]["vocab"].items()}
        special = {t["id"] for t in tj.get("added_tokens", []) if t.get("special")}
        _VOCAB[model] = (inv, special)
    inv, special = _VOCAB[model]
    out = b""
    for i in ids:
        if i in special:
            continue
        p = inv[i]
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            out += bytes([int(p[3:5], 16)])
        else:
            out += p.replace("\u2581", " ").encode()
    return out.decode("utf-8", errors="replace")


def completion(cl, text, n):
    """Greedy /v1/completions of n tokens after text: (HTTP status, body)."""
    st, _, r = cl.post_json("/v1/completions", {"prompt": text, "max_tokens": n,
                                                "temperature": 0})
    return st, r


def run_batch(cl, prompts, exp, rounds, threads=2):
    """rounds x prompts ([(text, max_tokens)]) requests over `threads` client
    threads; all must be 200 and equal the oracle exp[text] = (ids, text)."""
    errors, lock = [], threading.Lock()
    work = [p for _ in range(rounds) for p in prompts]

    def worker():
        while True:
            with lock:
                if not work:
                    return
                text, n = work.pop()
            st, r = completion(cl, text, n)
            if st != 200 or r["choices"][0]["text"] != exp[text][1] or \
                    r["usage"]["completion_tokens"] != len(exp[text][0]):
                errors.append("%s: %d %s" % (text, st, json.dumps(r)[:300]))
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    check(not any(t.is_alive() for t in ts), "a client hung")
    check(not errors, "wrong results:\n" + "\n".join(errors))


def main(test):
    """Run test(build, src) with the standard arguments; exit 0/1/77."""
    if len(sys.argv) < 3:
        print("usage: %s BUILD_DIR SOURCE_DIR" % sys.argv[0])
        sys.exit(2)
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    for exe in ("router/duet-router", "prefill/duet-prefill", "decode/duet-decode",
                "tools/duet"):
        if not os.access(os.path.join(build, exe), os.X_OK):
            print("SKIP: %s is not built" % exe)
            sys.exit(77)
    t0 = time.time()
    try:
        test(build, src)
    except AssertionError as e:
        print("FAILED after %.1f s: %s" % (time.time() - t0, e), flush=True)
        sys.exit(1)
    print("PASS (%.1f s)" % (time.time() - t0), flush=True)
