"""A duet cluster whose prefill and decode run in separate network
namespaces (netns.Pair), KV over UCX tcp on the cluster link.

Prefill p0 runs in the prefill namespace; the decode d0 and, when asked, a
second prefill p1 run in the decode namespace, so p1 stays reachable from
d0 when the cluster link is cut.  The test talks to every daemon from the
root namespace over the access links (tests/integration/daemons
duet_cluster.Cluster does the rest: config, gRPC stubs, page counts)."""
import json
import os
import socket
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ports import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration", "daemons"))
from duet_cluster import Cluster  # noqa: E402

# The UCX environment of every daemon: KV over tcp on the cluster link only.
UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "cl0"}


class NsCluster(Cluster):
    def __init__(self, pair, build, src, model, second_prefill=False, control_delay=None, **kw):
        prefill = [("p0", 1)] + ([("p1", 1)] if second_prefill else [])
        env = dict(UCX_ENV)
        env.update(kw.pop("env", {}) or {})
        super().__init__(build, src, model, prefill=prefill, decode=[("d0", 1)], env=env, **kw)
        self.pair = pair
        self.side = {"p0": "p", "p1": "d", "d0": "d"}
        for name, d in self.daemons.items():
            d.host = pair.ip[self.side[name]]
            d.address = "%s:%d" % (d.host, d.port)
        # control_delay=(ms, jitter ms): p0's gRPC through delay_proxy.py in
        # decode's namespace (its address in the config is the proxy's; it
        # listens on its own); KV still goes straight over the link
        self.proxy, self.proxy_spec = None, None
        if control_delay is not None:
            d = self.daemons["p0"]
            d.extra["listen"] = d.address
            d.address = "%s:%d" % (pair.ip["d"], free_port())
            self.proxy_spec = (d.address, d.extra["listen"]) + tuple(str(x) for x in control_delay)
        self.write_config()

    def write_config(self):
        # the daemons listen on the namespaces' 10.N addresses without TLS:
        # allowed only with auth.insecure (docs/security.md)
        super().write_config()
        with open(self.config) as f:
            cfg = json.load(f)
        cfg["auth"] = {"insecure": True}
        with open(self.config, "w") as f:
            json.dump(cfg, f, indent=1)

    def start(self, name, env=None, wait=True, args=()):
        d = self.daemons[name]
        if name == "p0" and self.proxy_spec is not None and self.proxy is None:
            self.proxy = subprocess.Popen(self.pair.exec_prefix("d") +
                                          ["/usr/bin/python3", os.path.join(HERE, "delay_proxy.py")] +
                                          list(self.proxy_spec), stdout=subprocess.PIPE, text=True)
            if self.proxy.stdout.readline().strip() != "ready":
                raise RuntimeError("delay_proxy.py did not start")
        exe = os.path.join(self.build, d.role, "duet-" + d.role)
        e = dict(self.env)
        if env:
            e.update(env)
        with open(d.log_path, "ab") as log:
            d.proc = subprocess.Popen(self.pair.exec_prefix(self.side[name]) +
                                      [exe, "--config", self.config, "--name", name] + list(args),
                                      stdout=log, stderr=subprocess.STDOUT, env=e)
        if wait:
            self.wait_ready(name)
        return d

    def wait_ready(self, name, timeout=60):
        d = self.daemons[name]
        deadline = time.time() + timeout
        while time.time() < deadline:
            if d.proc.poll() is not None:
                raise RuntimeError("%s exited with %s:\n%s" % (name, d.proc.returncode,
                                                               self.log(name)))
            try:
                socket.create_connection((d.host, d.port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
                continue
            try:
                self.info(name, timeout=1)
                return
            except grpc.RpcError:
                time.sleep(0.05)
        raise RuntimeError("%s not ready after %ss:\n%s" % (name, timeout, self.log(name)))

    def close(self):
        try:
            super().close()
        finally:
            if self.proxy is not None:
                self.proxy.kill()
                self.proxy.wait()
                self.proxy = None

    def alive(self, name):
        d = self.daemons[name]
        return d.proc is not None and d.proc.poll() is None
