#!/usr/bin/python3
"""The CPU image (scripts/images.sh) run as users run it: duet-router,
duet-prefill (TP=2) and duet-decode (TP=4) containers on a podman network,
with the commands, environment and security settings of the Kubernetes
manifests (deploy/k8s/base, overlays/cpu):

* the overlay's own cluster.json, unchanged: the daemons are found through
  DNS (`discover` names = podman network aliases, as headless Services);
* the authentication material as read-only bind mounts (ca.crt, tls.crt,
  tls.key, secret; 0440, group 10001 as fsGroup makes it);
* the image's non-root user (10001), a read-only root file system, a
  tmpfs /tmp, every capability dropped, no-new-privileges;
* the kubelet's exec probe (`duet-client --health`) goes healthy;
* curl (plain and streamed) and the npm openai client (tests/clients)
  through the router's HTTPS port give the `duet generate --tp 1` oracle's
  text;
* SIGTERM of each container (decode, prefill, router) with a stream in
  flight: the stream finishes with the oracle's text and the container
  exits 0; the daemons are restarted and serve again.

usage: test_image_run.py BUILD_DIR SOURCE_DIR
env:   DUET_IMAGE (default duet-cpu:<project version>)
exit 77 (SKIP, with the reason) when podman or the image is missing.
"""
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "router"))
sys.path.insert(0, HERE)

from router_cluster import check, detok, fail, main, oracle  # noqa: E402
from podman_util import Podman, skip  # noqa: E402

PROMPTS = [("Once upon a time", 24), ("The cat", 40)]
DAEMON_ENV = ["DUET_LOG_LEVEL=info", "UCX_TLS=tcp", "UCX_TCP_PORT_RANGE=20000-20999",
              "UCX_WARN_UNUSED_ENV_VARS=n"]


class Fleet:
    def __init__(self, pm, src, tmp, image):
        self.pm, self.src, self.tmp, self.image = pm, src, tmp, image
        self.prefix = "duet-it%d" % os.getpid()
        self.net = self.prefix + "-net"
        self.names = {}
        self.port = None

    def auth(self):
        a = os.path.join(self.tmp, "auth")
        # one certificate per workload, naming its identity (docs/security.md
        # "Identities and roles"), as cert-manager issues them in deploy/k8s
        roles = ("router", "prefill", "decode")
        subprocess.run([os.path.join(self.src, "scripts", "gen-auth.sh"), a, "duet.duet.svc"] +
                       ["%s/%s" % (r, r) for r in roles], check=True, capture_output=True)
        sec, cfg = os.path.join(self.tmp, "secret"), os.path.join(self.tmp, "config")
        self.tls = {r: os.path.join(self.tmp, "tls-" + r) for r in roles}
        for d in list(self.tls.values()) + [sec, cfg]:
            os.makedirs(d)
        shutil.copy(os.path.join(a, "secret"), os.path.join(sec, "secret"))
        for r, d in self.tls.items():
            for s, f in (("ca.pem", "ca.crt"), ("%s-%s.pem" % (r, r), "tls.crt"),
                         ("%s-%s.key" % (r, r), "tls.key")):
                shutil.copy(os.path.join(a, s), os.path.join(d, f))
        tls = self.tls["router"]
        # as a Secret volume with defaultMode 0440 and fsGroup 10001
        for d in list(self.tls.values()) + [sec]:
            os.chown(d, 0, 10001)
            os.chmod(d, 0o750)
            for f in os.listdir(d):
                os.chown(os.path.join(d, f), 0, 10001)
                os.chmod(os.path.join(d, f), 0o440)
        shutil.copy(os.path.join(self.src, "deploy", "k8s", "overlays", "cpu", "cluster.json"),
                    os.path.join(cfg, "cluster.json"))
        os.chmod(cfg, 0o755)
        os.chmod(os.path.join(cfg, "cluster.json"), 0o644)
        self.ca = os.path.join(tls, "ca.crt")
        self.mounts = ["-v", cfg + ":/etc/duet:ro", "-v", sec + ":/etc/duet-secret:ro"]

    def run(self, role, alias, args, publish=()):
        name = "%s-%s" % (self.prefix, role)
        cmd = ["run", "-d", "--name", name, "--hostname", name, "--network", self.net,
               "--network-alias", alias, "--read-only", "--read-only-tmpfs=false",
               "--tmpfs", "/tmp:rw,size=256m", "--shm-size", "256m",
               "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
               "--stop-timeout", "45"] + self.mounts + \
            ["-v", self.tls[role] + ":/etc/duet-tls:ro"]
        for e in DAEMON_ENV if role != "router" else DAEMON_ENV[:1]:
            cmd += ["-e", e]
        for p in publish:
            cmd += ["-p", p]
        self.pm.ok(*(cmd + [self.image] + args))
        self.names[role] = name
        return name

    def start(self):
        self.pm.ok("network", "create", self.net)
        cfgp = ["--config", "/etc/duet/cluster.json"]
        self.run("prefill", "duet-prefill.duet.svc.cluster.local",
                 ["duet-prefill"] + cfgp + ["--name", "prefill", "--listen", "0.0.0.0:9100"])
        self.run("decode", "duet-decode.duet.svc.cluster.local",
                 ["duet-decode"] + cfgp + ["--name", "decode", "--listen", "0.0.0.0:9200"])
        self.port = self.pm.free_port()
        self.run("router", "duet-router.duet.svc.cluster.local",
                 ["duet-router"] + cfgp + ["--http", "0.0.0.0:8000", "--grpc", "0.0.0.0:8001",
                                           "--grace-ms", "30000"],
                 publish=["127.0.0.1:%d:8000" % self.port])

    def probe(self, role, timeout=180):
        """The manifests' exec probe, as the kubelet runs it."""
        port = {"prefill": 9100, "decode": 9200, "router": 8001}[role]
        deadline = time.time() + timeout
        out = ""
        while time.time() < deadline:
            st = self.pm.state(self.names[role])
            if st["Status"] == "exited":
                fail("%s exited %s:\n%s" % (role, st["ExitCode"], self.pm.logs(self.names[role])))
            rc, out = self.pm.run("exec", self.names[role], "duet-client", "--config",
                                  "/etc/duet/cluster.json", "--health", "--target",
                                  "127.0.0.1:%d" % port, "--timeout-ms", "2500")
            if rc == 0:
                return time.time()
            time.sleep(1)
        fail("%s not healthy after %d s (%s):\n%s" % (role, timeout, out,
                                                       self.pm.logs(self.names[role])))

    def ctx(self):
        return ssl.create_default_context(cafile=self.ca)

    def https(self, method, path, body=None, timeout=120):
        c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx(),
                                        timeout=timeout)
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def ip(self, role):
        out = self.pm.ok("inspect", "--format",
                         "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                         self.names[role])
        return out.strip()

    def workers_healthy(self):
        """Every running daemon container is a healthy worker at its
        current address (a restarted container may have a new one)."""
        try:
            st, data = self.https("GET", "/workers", timeout=5)
        except OSError:
            return False
        if st != 200:
            return False
        ws = json.loads(data).get("workers", [])
        have = {(w.get("role"), (w.get("address") or "").rsplit(":", 1)[0])
                for w in ws if w.get("healthy")}
        return all((role, self.ip(role)) in have for role in ("prefill", "decode"))

    def wait_serving(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.workers_healthy():
                try:
                    st, _ = self.https("POST", "/v1/completions",
                                       {"prompt": "Hello", "max_tokens": 2}, timeout=30)
                    if st == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.5)
        fail("router not serving after %d s:\n%s" % (timeout, self.pm.logs(self.names["router"])))


def curl_checks(fl, model, build):
    for prompt, n in PROMPTS:
        ids, _ = oracle(build, model, prompt=prompt, max_tokens=n)
        want = detok(model, ids)
        body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0})
        url = "https://127.0.0.1:%d/v1/completions" % fl.port
        r = subprocess.run(["curl", "-sS", "--fail-with-body", "--cacert", fl.ca, url,
                            "-H", "Content-Type: application/json", "-d", body],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, "curl: %s %s" % (r.stdout, r.stderr))
        got = json.loads(r.stdout)["choices"][0]["text"]
        check(got == want, "curl text %r != oracle %r" % (got, want))
        body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True})
        r = subprocess.run(["curl", "-sS", "-N", "--fail-with-body", "--cacert", fl.ca, url,
                            "-H", "Content-Type: application/json", "-d", body],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, "curl stream: %s %s" % (r.stdout, r.stderr))
        text = ""
        for line in r.stdout.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                if ev.get("choices"):
                    text += ev["choices"][0].get("text", "")
        check(text == want, "curl stream text %r != oracle %r" % (text, want))
        check(r.stdout.rstrip().endswith("data: [DONE]"), "stream without [DONE]")
    print("curl: plain and streamed completions equal the oracle")


def openai_checks(fl, model, build, src):
    node = shutil.which("node")
    mods = os.path.join(src, "tests", "clients", "node_modules", "openai")
    if not node or not os.path.isdir(mods):
        fail("node or tests/clients/node_modules/openai missing (scripts/install-deps.sh)")
    cases = []
    for prompt, n in PROMPTS:
        ids, _ = oracle(build, model, prompt=prompt, max_tokens=n)
        cases.append({"prompt": prompt, "max_tokens": n, "expect_text": detok(model, ids),
                      "expect_tokens": len(ids)})
    spec = {"base_url": "https://127.0.0.1:%d/v1" % fl.port, "model": "stories260K",
            "cases": cases, "expect_chat_400": True}
    path = os.path.join(fl.tmp, "openai.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, NODE_EXTRA_CA_CERTS=fl.ca)
    r = subprocess.run([node, os.path.join(src, "tests", "clients", "router_openai.mjs"), path],
                       capture_output=True, text=True, timeout=300, env=env)
    print(r.stdout.strip())
    check(r.returncode == 0, "openai client through the container router failed:\n%s\n%s"
          % (r.stdout, r.stderr[-2000:]))
    print("openai client: equal to the oracle over HTTPS")


def stream_in_flight(fl, prompt, n, first, out):
    """POST a streamed completion; set `first` at the first event, store
    (status, text, events, events after the signal) in out."""
    try:
        c = http.client.HTTPSConnection("127.0.0.1", fl.port, context=fl.ctx(), timeout=300)
        c.request("POST", "/v1/completions",
                  body=json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0,
                                   "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text, events, done, after = "", 0, False, 0
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode()
            if line.startswith("data: "):
                d = line[6:].strip()
                if d == "[DONE]":
                    done = True
                    continue
                ev = json.loads(d)
                events += 1
                if out.get("signalled"):
                    after += 1
                if ev.get("choices"):
                    text += ev["choices"][0].get("text", "")
                first.set()
        out.update(status=r.status, text=text, events=events, done=done, after=after)
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        out.update(error=repr(e))
    finally:
        first.set()


def drain(fl, role, model, build, restart):
    """SIGTERM `role` with a stream in flight: the stream completes with the
    oracle's text, the container exits 0 within the grace period."""
    n = 400
    prompt = "Once upon a time, in a %s far away" % role
    ids, _ = oracle(build, model, prompt=prompt, max_tokens=n)
    want = detok(model, ids)
    first, out = threading.Event(), {}
    t = threading.Thread(target=stream_in_flight, args=(fl, prompt, n, first, out))
    t.start()
    check(first.wait(120), "%s drain: no first event" % role)
    check("status" not in out, "%s drain: the stream ended before the signal: %s" % (role, out))
    out["signalled"] = True
    t0 = time.time()
    fl.pm.ok("kill", "--signal", "TERM", fl.names[role])
    rc, code = fl.pm.run("wait", fl.names[role])
    took = time.time() - t0
    t.join(300)
    check(not t.is_alive(), "%s drain: the stream hung" % role)
    check("error" not in out, "%s drain: stream error %s" % (role, out.get("error")))
    check(out["status"] == 200 and out["done"], "%s drain: stream %s" % (role, out))
    check(out["text"] == want, "%s drain: text %r != oracle %r" % (role, out["text"], want))
    check(rc == 0 and code.strip() == "0",
          "%s exited %s after SIGTERM:\n%s" % (role, code, fl.pm.logs(fl.names[role])))
    check(took < 45, "%s took %.1f s to drain (grace period 45 s)" % (role, took))
    print("%s: SIGTERM with a stream in flight (%d of %d events after the signal): "
          "stream complete and equal to the oracle, exit 0 in %.1f s"
          % (role, out["after"], out["events"], took))
    if restart:
        fl.pm.ok("start", fl.names[role])
        fl.probe(role)
        fl.wait_serving()


def test(build, src):
    pm = Podman(src)
    image = os.environ.get("DUET_IMAGE") or "duet-cpu:" + pm.version()
    if not pm.image_exists(image):
        skip("image %s is not built (scripts/images.sh --cpu; ctest -R ops.image.build)" % image)
    model = os.path.join(src, "models", "stories260K")
    tmp = tempfile.mkdtemp(prefix="duet_image_run_")
    fl = Fleet(pm, src, tmp, image)
    try:
        fl.auth()
        fl.start()
        # non-root, read-only root, read-only secrets
        for role, name in fl.names.items():
            rc, uid = pm.run("exec", name, "id", "-u")
            check(rc == 0 and uid.strip() == "10001", "%s runs as uid %r" % (role, uid))
            rc, _ = pm.run("exec", name, "sh", "-c", "echo x > /usr/local/bin/x")
            check(rc != 0, "%s: root file system is writable" % role)
            rc, _ = pm.run("exec", name, "sh", "-c", "echo x > /etc/duet-tls/x")
            check(rc != 0, "%s: authentication mount is writable" % role)
            rc, _ = pm.run("exec", name, "cat", "/etc/duet-tls/tls.key")
            check(rc == 0, "%s: the key is not readable by the non-root user" % role)
        print("all containers: uid 10001, read-only root and secrets")
        t0 = time.time()
        for role in ("prefill", "decode", "router"):
            fl.probe(role)
        fl.wait_serving()
        print("probes healthy, router serving after %.1f s" % (time.time() - t0))
        st, data = fl.https("GET", "/workers")
        print("workers:", [(w["role"], w["name"], w.get("address"), w["healthy"])
                           for w in json.loads(data)["workers"]])
        logs = pm.logs(fl.names["prefill"]) + pm.logs(fl.names["decode"])
        check("auth" in logs.lower() or "tls" in logs.lower(), "no auth line in the daemon logs")
        curl_checks(fl, model, build)
        openai_checks(fl, model, build, src)
        drain(fl, "decode", model, build, restart=True)
        drain(fl, "prefill", model, build, restart=True)
        drain(fl, "router", model, build, restart=False)
        for role in ("decode", "prefill"):
            t0 = time.time()
            pm.ok("kill", "--signal", "TERM", fl.names[role])
            rc, code = pm.run("wait", fl.names[role])
            check(code.strip() == "0", "%s idle SIGTERM: exit %s\n%s" %
                  (role, code, pm.logs(fl.names[role])))
            print("%s: idle SIGTERM, exit 0 in %.1f s" % (role, time.time() - t0))
    finally:
        for name in fl.names.values():
            pm.run("rm", "-f", "-t", "0", name)
        pm.run("network", "rm", "-f", fl.net)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(test)
