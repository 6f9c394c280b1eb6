"""Network namespaces for the network-fault tests: one namespace per side
of the cluster link, a veth pair between them (the link the faults are
injected on), and an access veth from the root namespace into each, so the
test (in the root namespace) reaches the daemons without crossing the
faulty link.

  root ns                      ns <tag>p                ns <tag>d
  10.N.2.1 --access veth-- 10.N.2.2                 10.N.3.2 --access veth-- 10.N.3.1
                             10.N.1.1 ==cluster link== 10.N.1.2
                             (prefill)                 (decode)

The daemons listen on their cluster-link addresses; the root namespace
routes each of them through that side's access veth.  Names carry the
creating process id, so a later run removes what a killed run left behind
(remove_stale) and two runs never collide.  Every fault is a tc qdisc on
the cluster link's two ends (egress of each side):

  partition   pfifo limit 0: every packet dropped silently, both ways
  slow        tbf: a rate limit
  netem       delay/jitter, loss, reordering (needs the sch_netem module)

and, without sch_netem, random loss with nftables in each namespace (an
output rule on the cluster link: `numgen random mod 100 < N drop`).
"""
import os
import random
import re
import subprocess

PREFIX = "dnf"


def sh(*args, check=True):
    """Run a command; return its output.  Raises with stderr on failure."""
    r = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(args), (r.stderr or r.stdout).strip()))
    return r


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_stale():
    """Delete namespaces a dead test process left behind."""
    r = sh("ip", "netns", "list", check=False)
    for line in r.stdout.splitlines():
        m = re.match(r"(%s(\d+)x\d+[pd])\b" % PREFIX, line)
        if m and not _alive(int(m.group(2))):
            sh("ip", "netns", "del", m.group(1), check=False)


def why_unavailable():
    """None when namespaces, veths and tc work here; else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root (running as uid %d)" % os.geteuid()
    for tool in ("ip", "tc"):
        if sh("sh", "-c", "command -v " + tool, check=False).returncode != 0:
            return "'%s' is not installed (iproute2)" % tool
    name = "%s%dxprobe" % (PREFIX, os.getpid())
    r = sh("ip", "netns", "add", name, check=False)
    if r.returncode != 0:
        return "ip netns add fails: %s" % r.stderr.strip()
    try:
        r = sh("ip", "-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "b0",
               check=False)
        if r.returncode != 0:
            return "cannot create a veth pair: %s" % r.stderr.strip()
        r = sh("tc", "-n", name, "qdisc", "add", "dev", "a0", "root", "pfifo", "limit", "0",
               check=False)
        if r.returncode != 0:
            return "tc cannot add a pfifo qdisc: %s" % r.stderr.strip()
    finally:
        sh("ip", "netns", "del", name, check=False)
    return None


def why_no_netem():
    """None when tc netem works here; else tc's answer."""
    name = "%s%dxnetem" % (PREFIX, os.getpid())
    sh("ip", "netns", "add", name)
    try:
        r = sh("tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
               check=False)
        return None if r.returncode == 0 else "tc netem: %s" % r.stderr.strip()
    finally:
        sh("ip", "netns", "del", name, check=False)


NFT_TABLE = "dnfloss"


def why_no_nft():
    """None when nftables can drop packets inside a namespace here; else
    the reason."""
    if sh("sh", "-c", "command -v nft", check=False).returncode != 0:
        return "'nft' is not installed (nftables)"
    name = "%s%dxnft" % (PREFIX, os.getpid())
    sh("ip", "netns", "add", name)
    try:
        r = subprocess.run(["ip", "netns", "exec", name, "nft", "-f", "-"],
                           input=_nft_loss_rules("lo", 1), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        return None if r.returncode == 0 else "nft: %s" % r.stderr.strip()
    finally:
        sh("ip", "netns", "del", name, check=False)


def _nft_loss_rules(dev, percent):
    return ("table inet %s {\n"
            "  chain out {\n"
            "    type filter hook output priority 0; policy accept;\n"
            "    oifname \"%s\" numgen random mod 100 < %d counter drop\n"
            "  }\n"
            "}\n" % (NFT_TABLE, dev, percent))


class Pair:
    """Two namespaces joined by the cluster link.  Use as a context manager:
    everything is removed on every way out."""

    def __init__(self):
        self.tag = "%s%dx%d" % (PREFIX, os.getpid(), random.randint(0, 9999))
        self.ns = {"p": self.tag + "p", "d": self.tag + "d"}
        n = random.randint(16, 250)
        self.net = n
        self.ip = {"p": "10.%d.1.1" % n, "d": "10.%d.1.2" % n}
        # the cluster link's ends: the same name inside each namespace
        self.link = "cl0"
        self.created = []
        self.shaping = None  # the qdisc a healed partition goes back to

    def __enter__(self):
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _create(self):
        n, tag = self.net, self.tag
        for side in ("p", "d"):
            sh("ip", "netns", "add", self.ns[side])
            self.created.append(self.ns[side])
            sh("ip", "-n", self.ns[side], "link", "set", "lo", "up")
        # the cluster link
        sh("ip", "link", "add", tag + "c", "type", "veth", "peer", "name", tag + "e")
        sh("ip", "link", "set", tag + "c", "netns", self.ns["p"], "name", self.link)
        sh("ip", "link", "set", tag + "e", "netns", self.ns["d"], "name", self.link)
        for side in ("p", "d"):
            sh("ip", "-n", self.ns[side], "addr", "add", self.ip[side] + "/30", "dev", self.link)
            sh("ip", "-n", self.ns[side], "link", "set", self.link, "up")
        # access links from the root namespace
        for side, third in (("p", 2), ("d", 3)):
            root_end = tag + side + "r"
            sh("ip", "link", "add", root_end, "type", "veth", "peer", "name", tag + side + "n")
            self.created.append(root_end)
            sh("ip", "link", "set", tag + side + "n", "netns", self.ns[side], "name", "acc0")
            sh("ip", "addr", "add", "10.%d.%d.1/30" % (n, third), "dev", root_end)
            sh("ip", "link", "set", root_end, "up")
            sh("ip", "-n", self.ns[side], "addr", "add", "10.%d.%d.2/30" % (n, third), "dev",
               "acc0")
            sh("ip", "-n", self.ns[side], "link", "set", "acc0", "up")
            sh("ip", "route", "add", self.ip[side] + "/32", "via", "10.%d.%d.2" % (n, third))

    def close(self):
        for name in reversed(self.created):
            if name.endswith("r"):
                sh("ip", "link", "del", name, check=False)  # takes its route with it
            else:
                sh("ip", "netns", "del", name, check=False)
        self.created = []

    def exec_prefix(self, side):
        return ["ip", "netns", "exec", self.ns[side]]

    # ---- faults on the cluster link -----------------------------------------------

    def _qdisc(self, *spec):
        for side in ("p", "d"):
            sh("tc", "-n", self.ns[side], "qdisc", "replace", "dev", self.link, "root", *spec)

    def clear(self):
        """No fault and no shaping any more."""
        self.shaping = None
        for side in ("p", "d"):
            sh("tc", "-n", self.ns[side], "qdisc", "del", "dev", self.link, "root", check=False)
            sh(*self.exec_prefix(side), "nft", "delete", "table", "inet", NFT_TABLE,
               check=False)

    def nft_loss(self, percent):
        """Drop percent % of the packets each side sends on the link (KV
        over UCX tcp and gRPC alike), at random: nftables, no netem."""
        for side in ("p", "d"):
            r = subprocess.run(self.exec_prefix(side) + ["nft", "-f", "-"],
                               input=_nft_loss_rules(self.link, percent),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                raise RuntimeError("nft: %s" % r.stderr.strip())

    def nft_dropped(self):
        """Packets the loss rules dropped, both sides together."""
        n = 0
        for side in ("p", "d"):
            out = sh(*self.exec_prefix(side), "nft", "list", "table", "inet", NFT_TABLE,
                     check=False).stdout
            n += sum(int(x) for x in re.findall(r"counter packets (\d+)", out))
        return n

    def partition(self):
        """Drop every packet on the link, both ways, silently."""
        self._qdisc("pfifo", "limit", "0")

    def heal(self):
        """End a partition: back to the shaping before it (or none)."""
        if self.shaping is None:
            for side in ("p", "d"):
                sh("tc", "-n", self.ns[side], "qdisc", "del", "dev", self.link, "root")
        else:
            self._qdisc(*self.shaping)

    def slow(self, rate="8mbit", burst="16kb", latency="50ms"):
        """A rate limit with a short queue: the backlog waits in the
        sender's socket, as behind a slow link."""
        self.shaping = ("tbf", "rate", rate, "burst", burst, "latency", latency)
        self._qdisc(*self.shaping)

    def netem(self, *args):
        self.shaping = ("netem",) + tuple(args)
        self._qdisc(*self.shaping)

    def dropped(self):
        """Packets the link's qdiscs dropped, both ends together."""
        n = 0
        for side in ("p", "d"):
            out = sh("tc", "-s", "-n", self.ns[side], "qdisc", "show", "dev", self.link).stdout
            n += sum(int(x) for x in re.findall(r"dropped (\d+)", out))
        return n
