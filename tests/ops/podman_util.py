"""podman for the container tests (tests/ops): the engine with the
configuration scripts/lib/containers.sh makes (runc, the host's ulimits),
and small helpers.  skip() prints the reason and exits 77 (ctest SKIP)."""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from ports import free_port  # noqa: E402


def skip(reason):
    print("SKIP: " + reason, flush=True)
    sys.exit(77)


class Podman:
    def __init__(self, src):
        self.src = src
        if not shutil.which("podman"):
            skip("podman is not installed (apt-get install podman runc iptables; "
                 "scripts/install-deps.sh does)")
        if os.geteuid() != 0:
            skip("the container tests run podman as root (rootful networks, bind-mounted "
                 "secrets owned by group 10001); this is uid %d" % os.geteuid())
        lib = os.path.join(src, "scripts", "lib", "containers.sh")
        out = subprocess.run(["bash", "-c", '. "$1"; duet_podman_conf; echo "${CONTAINERS_CONF:-}"',
                              "_", lib], capture_output=True, text=True, check=True).stdout.strip()
        self.env = dict(os.environ)
        if out:
            self.env["CONTAINERS_CONF"] = out

    def run(self, *args, timeout=300):
        r = subprocess.run(["podman"] + list(args), capture_output=True, text=True,
                           env=self.env, timeout=timeout)
        return r.returncode, r.stdout + (r.stderr if r.returncode else "")

    def ok(self, *args, timeout=300):
        rc, out = self.run(*args, timeout=timeout)
        if rc != 0:
            print("FAIL: podman %s: %s" % (" ".join(args), out), flush=True)
            raise AssertionError("podman %s failed" % args[0])
        return out

    def image_exists(self, image):
        return self.run("image", "exists", image)[0] == 0

    def state(self, name):
        return json.loads(self.ok("inspect", "--format", "{{json .State}}", name))

    def logs(self, name, tail=80):
        r = subprocess.run(["podman", "logs", "--tail", str(tail), name], capture_output=True,
                           text=True, env=self.env)
        return r.stdout + r.stderr

    def version(self):
        with open(os.path.join(self.src, "CMakeLists.txt")) as f:
            m = re.search(r"project\(duet VERSION ([0-9.]+)", f.read())
        return m.group(1) if m else "0.1.0"

    @staticmethod
    def free_port():
        return free_port()
