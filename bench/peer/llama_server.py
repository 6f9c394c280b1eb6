"""Start and stop llama.cpp's llama-server for the peer benchmark and the
greedy check (bench/peer/check_greedy.py, bench/serve_peer.py). Standard
library only."""
import json
import os
import subprocess
import time
import urllib.error
import urllib.request


class LlamaServer:
    """One llama-server process on 127.0.0.1:port.

    threads: -t and -tb (generation and batch threads); slots: -np parallel
    slots; ctx_per_slot: llama-server splits -c evenly over the slots, so -c
    is slots * ctx_per_slot; cpus: a `taskset -c` list, or None."""

    def __init__(self, binary, gguf, port, threads=2, slots=1, ctx_per_slot=512, cpus=None,
                 log_path=None, extra=()):
        self.binary = binary
        self.gguf = gguf
        self.port = port
        self.argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
                     "-t", str(threads), "-tb", str(threads), "-np", str(slots),
                     "-c", str(slots * ctx_per_slot), "--cont-batching", "--no-webui"] + list(extra)
        if cpus:
            self.argv = ["taskset", "-c", cpus] + self.argv
        self.log_path = log_path or "/tmp/llama-server-%d.log" % port
        self.proc = None
        self._log = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self, timeout=60.0):
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("llama-server exited with %s at start-up; log: %s\n%s"
                                   % (self.proc.returncode, self.log_path, self.log_tail()))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("llama-server not healthy after %.0f s; log: %s\n%s"
                           % (timeout, self.log_path, self.log_tail()))

    def log_tail(self, n=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def post(self, path, body, timeout=60):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def version(binary):
    """`llama-server --version` as one line (e.g. 'version: 4748 (c392e509)')."""
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    return "; ".join(ln for ln in lines if ln.startswith("version") or ln.startswith("built"))
