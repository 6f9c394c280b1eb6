"""Test harness: real duet-prefill / duet-decode processes on 127.0.0.1.

Writes a cluster config with free ports, starts daemons, talks to them
with Debian's python3-grpcio through stubs generated at test time by
protoc + grpc_python_plugin, and checks that every process exits cleanly.
Used by the tests in this directory; run them with /usr/bin/python3.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc

_STUBS = None


def run_cases(cases, names, what):
    """Run each case (all, or those named in names), report each as ok or
    FAIL with its time, and exit non-zero when any failed."""
    wanted, failed = set(names), []
    width = max(len(c.__name__) for c in cases) + 2
    for case in cases:
        if wanted and case.__name__ not in wanted:
            continue
        t0 = time.time()
        try:
            case()
            print("%-*s ok (%.1fs)" % (width, case.__name__, time.time() - t0))
        except Exception as e:  # noqa: BLE001 - every case reports
            print("%-*s FAIL: %s" % (width, case.__name__, e))
            failed.append(case.__name__)
    if failed:
        sys.exit("FAIL: " + ", ".join(failed))
    print("all %s cases behave" % what)


def stubs(src):
    """Generate the Python stubs once per process and import them."""
    global _STUBS
    if _STUBS is None:
        out = tempfile.mkdtemp(prefix="duet_stubs_")
        protos = [os.path.join(src, "proto", "duet", "v1", f)
                  for f in ("common.proto", "generate.proto", "prefill.proto", "decode.proto")]
        subprocess.check_call(["protoc", "--proto_path=" + os.path.join(src, "proto"),
                               "--python_out=" + out, "--grpc_python_out=" + out,
                               "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin"]
                              + protos)
        sys.path.insert(0, out)
        from duet.v1 import common_pb2, decode_pb2, decode_pb2_grpc, generate_pb2
        from duet.v1 import prefill_pb2, prefill_pb2_grpc
        _STUBS = dict(common=common_pb2, decode=decode_pb2, decode_grpc=decode_pb2_grpc,
                      generate=generate_pb2, prefill=prefill_pb2, prefill_grpc=prefill_pb2_grpc)
    return _STUBS


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pylib"))
from ports import free_port  # noqa: E402

class Daemon:
    def __init__(self, cluster, role, name, tp, extra):
        self.cluster, self.role, self.name, self.tp = cluster, role, name, tp
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.extra = extra
        self.proc = None
        self.log_path = os.path.join(cluster.tmp, "%s.log" % name)

    def entry(self):
        e = {"name": self.name, "address": self.address, "tp": self.tp, "threads": 1,
             "n_pages": self.cluster.n_pages, "max_seqs": 64, "max_batch_tokens": 1024,
             "drain_timeout_ms": 5000}
        e.update(self.extra)
        return e


class Cluster:
    def __init__(self, build, src, model, prefill, decode, page_size=16, n_pages=512,
                 transfer_timeout_ms=5000, env=None, checksum=False, on_failure=None,
                 transfer=None):
        self.build, self.src, self.model = build, src, os.path.abspath(model)
        self.tmp = tempfile.mkdtemp(prefix="duet_cluster_")
        self.n_pages = n_pages
        self.page_size = page_size
        self.transfer_timeout_ms = transfer_timeout_ms
        self.checksum = checksum
        self.on_failure = on_failure  # transfer.on_failure (None: the default, recompute)
        self.transfer = dict(transfer or {})  # more transfer keys
        self.env = dict(os.environ)
        self.env.setdefault("DUET_LOG_LEVEL", "info")
        if env:
            self.env.update(env)
        self.daemons = {}
        for name, tp, *extra in prefill:
            self.daemons[name] = Daemon(self, "prefill", name, tp, extra[0] if extra else {})
        for name, tp, *extra in decode:
            self.daemons[name] = Daemon(self, "decode", name, tp, extra[0] if extra else {})
        self.config = os.path.join(self.tmp, "cluster.json")
        self.write_config()
        self.pb = stubs(src)
        self.channels = {}

    def write_config(self):
        cfg = {"model": self.model, "kv": {"page_size": self.page_size},
               "transfer": {"timeout_ms": self.transfer_timeout_ms, "checksum": self.checksum,
                            "rpc_timeout_ms": 10000},
               "prefill": [d.entry() for d in self.daemons.values() if d.role == "prefill"],
               "decode": [d.entry() for d in self.daemons.values() if d.role == "decode"]}
        if self.on_failure is not None:
            cfg["transfer"]["on_failure"] = self.on_failure
        cfg["transfer"].update(self.transfer)
        with open(self.config, "w") as f:
            json.dump(cfg, f, indent=1)

    def start(self, name, env=None, wait=True, args=()):
        d = self.daemons[name]
        exe = os.path.join(self.build, d.role, "duet-" + d.role)
        e = dict(self.env)
        if env:
            e.update(env)
        log = open(d.log_path, "ab")
        d.proc = subprocess.Popen([exe, "--config", self.config, "--name", name] + list(args),
                                  stdout=log, stderr=subprocess.STDOUT, env=e)
        log.close()
        if wait:
            self.wait_ready(name)
        return d

    def start_all(self):
        for name in self.daemons:
            self.start(name, wait=False)
        for name in self.daemons:
            self.wait_ready(name)

    def channel(self, name):
        d = self.daemons[name]
        key = (name, d.port)
        if key not in self.channels:
            self.channels[key] = grpc.insecure_channel(d.address)
        return self.channels[key]

    def info(self, name, timeout=5):
        d = self.daemons[name]
        if d.role == "decode":
            stub = self.pb["decode_grpc"].DecodeStub(self.channel(name))
        else:
            stub = self.pb["prefill_grpc"].PrefillStub(self.channel(name))
        return stub.Info(self.pb["common"].InfoRequest(), timeout=timeout)

    def wait_ready(self, name, timeout=60):
        d = self.daemons[name]
        deadline = time.time() + timeout
        while time.time() < deadline:
            if d.proc.poll() is not None:
                raise RuntimeError("%s exited with %s:\n%s" % (name, d.proc.returncode,
                                                               self.log(name)))
            # connect by hand first: a gRPC channel that failed to connect
            # backs off for seconds
            try:
                socket.create_connection(("127.0.0.1", d.port), timeout=1).close()
            except OSError:
                time.sleep(0.02)
                continue
            try:
                self.info(name, timeout=1)
                return
            except grpc.RpcError:
                time.sleep(0.02)
        raise RuntimeError("%s not ready after %ss:\n%s" % (name, timeout, self.log(name)))

    def log(self, name):
        try:
            with open(self.daemons[name].log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def request(self, prompt, max_tokens=16, prefill=None, temperature=0.0, seed=None,
                stop=None, ignore_eos=False, request_id="", stop_token_ids=None, abort_token=""):
        g = self.pb["generate"]
        sp = self.pb["common"].SamplingParams(temperature=temperature)
        if seed is not None:
            sp.seed = seed
            sp.has_seed = True
        kw = dict(max_tokens=max_tokens, sampling=sp, ignore_eos=ignore_eos,
                  request_id=request_id)
        if isinstance(prompt, str):
            kw["text"] = prompt
        else:
            kw["token_ids"] = self.pb["common"].TokenIds(ids=list(prompt))
        if stop:
            kw["stop"] = list(stop)
        if stop_token_ids:
            kw["stop_token_ids"] = list(stop_token_ids)
        target = self.daemons[prefill].address if prefill else ""
        return self.pb["decode"].DecodeGenerateRequest(request=g.GenerateRequest(**kw),
                                                       prefill_target=target,
                                                       abort_token=abort_token)

    def generate(self, decode, prompt, timeout=60, **kw):
        """Run one request to the end: (ids, text, finished)."""
        stub = self.pb["decode_grpc"].DecodeStub(self.channel(decode))
        ids, text, fin = [], "", None
        for r in stub.Generate(self.request(prompt, **kw), timeout=timeout):
            if r.HasField("chunk"):
                ids += list(r.chunk.ids)
                text += r.chunk.text
            else:
                fin = r.finished
        return ids, text, fin

    def stream(self, decode, prompt, timeout=60, **kw):
        stub = self.pb["decode_grpc"].DecodeStub(self.channel(decode))
        return stub.Generate(self.request(prompt, **kw), timeout=timeout)

    def pages_at_baseline(self, names=None, timeout=10):
        """Every daemon's free pages back to its total (waits a little for
        releases in flight).  Returns the offenders."""
        names = names or [n for n, d in self.daemons.items() if d.proc and d.proc.poll() is None]
        deadline = time.time() + timeout
        while True:
            bad = []
            for n in names:
                i = self.info(n)
                if i.free_pages != i.total_pages or i.running or i.queue_depth:
                    bad.append("%s: %d/%d pages free, %d running, %d queued" %
                               (n, i.free_pages, i.total_pages, i.running, i.queue_depth))
                # the prefix cache's accounting (docs/prefix-cache.md),
                # counted independently of free_pages
                elif (i.pool_free_pages + i.cached_idle_pages + i.in_use_pages != i.total_pages
                      or i.in_use_pages or i.cached_pages != i.cached_idle_pages
                      or (not i.prefix_cache and i.cached_pages)):
                    bad.append("%s: accounting: %d free + %d cached + %d in use != %d total "
                               "(or pages in use at rest; %d cached)" %
                               (n, i.pool_free_pages, i.cached_idle_pages, i.in_use_pages,
                                i.total_pages, i.cached_pages))
            if not bad or time.time() > deadline:
                return bad
            time.sleep(0.05)

    def kill(self, name, sig=signal.SIGKILL):
        d = self.daemons[name]
        if d.proc and d.proc.poll() is None:
            d.proc.send_signal(sig)
            d.proc.wait(timeout=30)
        self.channels.pop((name, d.port), None)

    def stop(self, name, timeout=30):
        """SIGTERM and expect exit status 0."""
        d = self.daemons[name]
        if d.proc is None or d.proc.poll() is not None:
            return d.proc.returncode if d.proc else 0
        d.proc.send_signal(signal.SIGTERM)
        try:
            rc = d.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
            raise RuntimeError("%s did not exit within %ss of SIGTERM:\n%s" %
                               (name, timeout, self.log(name)))
        self.channels.pop((name, d.port), None)
        if rc != 0:
            raise RuntimeError("%s exited %d after SIGTERM:\n%s" % (name, rc, self.log(name)))
        return rc

    def close(self):
        """Stop everything still running; decode first."""
        errors = []
        for role in ("decode", "prefill"):
            for name, d in self.daemons.items():
                if d.role == role:
                    try:
                        self.stop(name)
                    except RuntimeError as e:
                        errors.append(str(e))
        for ch in self.channels.values():
            ch.close()
        if errors:
            raise RuntimeError("\n".join(errors))


def reference_ids(build, model, prompt_ids, max_tokens, ignore_eos=False):
    """duet generate --tp 1: the single-process oracle (DESIGN §10)."""
    cmd = [os.path.join(build, "tools", "duet"), "generate", "--model", model,
           "--prompt-ids", " ".join(map(str, prompt_ids)), "--max-tokens", str(max_tokens),
           "--temperature", "0", "--output", "ids", "--threads", "1"]
    if ignore_eos:
        cmd.append("--ignore-eos")
    out = subprocess.check_output(cmd, stderr=subprocess.DEVNULL, text=True)
    return [int(x) for x in out.split()]


def mkmodel(build, out, **kw):
    args = [os.path.join(build, "tools", "duet"), "mkmodel", "--out", out]
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            args.append(flag)
        else:
            args += [flag, str(v)]
    subprocess.check_call(args, stdout=subprocess.DEVNULL)
    return out
