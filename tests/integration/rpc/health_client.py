#!/usr/bin/python3
"""Interop test: Debian's python3-grpcio, a client nobody in this project
wrote, talks to duet's gRPC layer (tests/integration/rpc/health_server.c).

Python stubs for grpc.health.v1 are generated at test time with protoc and
grpc_python_plugin.  Exit 77 (ctest SKIP) when grpcio is not importable.
Run with /usr/bin/python3 (the system one that has grpcio).
"""
import argparse
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio is not installed for", sys.executable)
    sys.exit(77)


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def generate_stubs(args):
    """Compile health.proto into args.out.  The proto is copied under a plain
    file name so the generated modules (health_pb2, health_pb2_grpc) do not
    collide with the installed `grpc` package; the service keeps its full
    name grpc.health.v1.Health, which is what goes on the wire."""
    src = os.path.join(args.out, "src")
    os.makedirs(src, exist_ok=True)
    shutil.copyfile(args.proto, os.path.join(src, "health.proto"))
    subprocess.run([args.protoc, "-I", src, "--python_out=" + args.out,
                    "--grpc_python_out=" + args.out,
                    "--plugin=protoc-gen-grpc_python=" + args.plugin,
                    os.path.join(src, "health.proto")], check=True)
    sys.path.insert(0, args.out)
    import health_pb2
    import health_pb2_grpc
    return health_pb2, health_pb2_grpc


class Server:
    def __init__(self, path):
        self.proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()
        first = self.read(10)
        check(first.startswith("port "), "server said %r" % first)
        self.port = int(first.split()[1])

    def _reader(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def read(self, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            fail("server silent for %s s" % timeout)
        check(line is not None, "server exited early")
        return line

    def cmd(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.read(10)


class Watch:
    """A Watch stream read by a thread, so every read has a timeout."""

    def __init__(self, stub, pb2, service):
        self.call = stub.Watch(pb2.HealthCheckRequest(service=service), timeout=60)
        self.items = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        try:
            for resp in self.call:
                self.items.put(("msg", resp.status))
            self.items.put(("end", grpc.StatusCode.OK))
        except grpc.RpcError as e:
            self.items.put(("end", e.code()))

    def next(self, timeout=10):
        try:
            return self.items.get(timeout=timeout)
        except queue.Empty:
            fail("watch: nothing for %s s" % timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--protoc", default="protoc")
    ap.add_argument("--plugin", default="/usr/bin/grpc_python_plugin")
    ap.add_argument("--proto", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    signal.alarm(100)  # a hang is a failure, not a stuck CI job

    pb2, pb2_grpc = generate_stubs(args)
    R = pb2.HealthCheckResponse
    srv = Server(args.server)
    channel = grpc.insecure_channel("127.0.0.1:%d" % srv.port)
    stub = pb2_grpc.HealthStub(channel)

    # Check: overall, unknown, then known.
    check(stub.Check(pb2.HealthCheckRequest(service=""), timeout=10).status == R.SERVING,
          "overall status not SERVING")
    try:
        stub.Check(pb2.HealthCheckRequest(service="duet.v1.Decode"), timeout=10)
        fail("unknown service did not fail")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.NOT_FOUND, "unknown service: %s" % e.code())
    check(srv.cmd("set duet.v1.Decode SERVING") == "ok", "set failed")
    check(stub.Check(pb2.HealthCheckRequest(service="duet.v1.Decode"),
                     timeout=10).status == R.SERVING, "Decode not SERVING")

    # Watch: the current status at once, then each change.
    wd = Watch(stub, pb2, "duet.v1.Decode")
    check(wd.next() == ("msg", R.SERVING), "watch Decode: first not SERVING")
    check(srv.cmd("set duet.v1.Decode NOT_SERVING") == "ok", "set failed")
    check(wd.next() == ("msg", R.NOT_SERVING), "watch Decode: change not seen")
    wp = Watch(stub, pb2, "duet.v1.Prefill")
    check(wp.next() == ("msg", R.SERVICE_UNKNOWN), "watch Prefill: not SERVICE_UNKNOWN")
    check(srv.cmd("set duet.v1.Prefill SERVING") == "ok", "set failed")
    check(wp.next() == ("msg", R.SERVING), "watch Prefill: change not seen")

    # A watcher the client cancels is dropped by the server.
    wx = Watch(stub, pb2, "")
    check(wx.next() == ("msg", R.SERVING), "watch overall: not SERVING")
    check(srv.cmd("watchers") == "watchers 3", "expected 3 watchers")
    wx.call.cancel()
    check(wx.next() == ("end", grpc.StatusCode.CANCELLED), "cancelled watch did not end")
    deadline = time.time() + 10
    while srv.cmd("watchers") != "watchers 2":
        check(time.time() < deadline, "server kept the cancelled watcher")
        time.sleep(0.02)

    # Raw-bytes methods through the generic API.
    echo = channel.unary_unary("/duet.test.Echo/Unary")
    check(echo(b"\x00\x01hello\xff", timeout=10) == b"\x00\x01hello\xff", "echo mismatch")
    count = channel.unary_stream("/duet.test.Echo/Count")
    got = [m.decode() for m in count(b"2000", timeout=30)]
    check(got == [str(i) for i in range(2000)], "stream out of order or short")
    try:
        channel.unary_unary("/duet.test.Echo/Nope")(b"x", timeout=20)
        fail("unknown method did not fail")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNIMPLEMENTED, "unknown method: %s" % e.code())

    # Shutdown drains: open watches see NOT_SERVING, then the stream ends.
    srv.proc.stdin.write("quit\n")
    srv.proc.stdin.flush()
    check(wp.next() == ("msg", R.NOT_SERVING), "watch Prefill: drain not seen")
    check(wp.next() == ("end", grpc.StatusCode.UNAVAILABLE), "watch Prefill: bad end")
    check(wd.next() == ("end", grpc.StatusCode.UNAVAILABLE), "watch Decode: bad end")
    check(srv.read(15) == "bye", "server did not say bye")
    check(srv.proc.wait(timeout=15) == 0, "server exit code")
    try:
        stub.Check(pb2.HealthCheckRequest(service=""), timeout=5)
        fail("Check after shutdown succeeded")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE, "after shutdown: %s" % e.code())
    channel.close()
    print("PASS: python grpcio %s interop with duet_rpc" % grpc.__version__)


if __name__ == "__main__":
    main()
