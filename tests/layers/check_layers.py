#!/usr/bin/env python3
"""The layer rule (docs/architecture.md): every directory may include and link
only the directories on floors below it (and itself).  Fails, naming the file
and the line, on an #include "dir/..." or a target_link_libraries entry that
points sideways or up, and on a UCX header included anywhere but the
transport's implementation (transfer/transport_ucx.c).

Inside a directory the same rule holds between its rooms (ROOMS: router/'s
sub-directories, router/README.md "Rooms"): a room includes only the rooms
listed below it, and the rooms' #include edges form no circle.  In the
directories of FILE_CYCLE_DIRS the files' own headers form no circle either
(foo.c, foo.h and foo_internal.h are one node).

    check_layers.py SOURCE_DIR          check the tree
    check_layers.py --self-test         show that a wrong include is caught
    check_layers.py --fixtures DIR      run the checker on DIR's fixture trees
                                        and compare with each one's expect.txt
"""
import os
import re
import sys
import tempfile

# directory -> the directories it may use.  Floors, bottom up:
#   common | kv | model tokenizer | engine transfer | node | synth testkit |
#   prefill decode router tools | bench tests fuzz
# proto/ is generated code ("duet/v1/...", "grpc/health/v1/...") that the
# gRPC glue and everything above it may use.
PROTO = {"duet", "grpc"}
ALLOWED = {
    "common": {"common"} | PROTO,
    "kv": {"kv", "common"},
    "model": {"model", "kv", "common"},
    "tokenizer": {"tokenizer", "common"},
    "engine": {"engine", "model", "kv", "common"},
    "transfer": {"transfer", "kv", "common"},
    "node": {"node", "engine", "transfer", "model", "kv", "common"} | PROTO,
    "synth": {"synth", "model", "tokenizer", "kv", "common"},
    "prefill": {"prefill", "node", "engine", "transfer", "model", "kv", "common"} | PROTO,
    "decode": {"decode", "node", "engine", "transfer", "tokenizer", "model", "kv",
               "common"} | PROTO,
    "router": {"router", "tokenizer", "model", "kv", "common"} | PROTO,
    "tools": {"tools", "synth", "engine", "tokenizer", "model", "kv", "common"} | PROTO,
}
# bench/ may use every library but nothing of tests/ (shared code lives in a
# library both link); tests/ may use everything.
LIBRARY_DIRS = set(ALLOWED) - {"prefill", "decode", "router", "tools"}
ALLOWED["bench"] = {"bench", "router"} | LIBRARY_DIRS | PROTO | {"testkit"}
ALLOWED["testkit"] = {"testkit", "transfer", "kv", "common"}
# fuzz/ (libFuzzer harnesses) sits above the daemons: it drives their request
# validation, so it may use every library and daemon directory (not tests/,
# testkit/ or bench/); nothing may use fuzz/.
ALLOWED["fuzz"] = {"fuzz", "prefill", "decode", "router"} | LIBRARY_DIRS | PROTO

# CMake library targets -> the directory that defines them
TARGET_DIR = {
    "duet_common": "common", "duet_rpc": "common", "duet_proto": "proto",
    "duet_kv": "kv", "duet_model": "model", "duet_tokenizer": "tokenizer",
    "duet_engine": "engine", "duet_engine_cuda": "engine", "duet_transfer": "transfer",
    "duet_node": "node", "duet_synth": "synth", "duet_router_core": "router",
    "duet_router": "router", "duet_testkit": "testkit", "duet_fuzz_util": "fuzz",
}

# Rooms: top directory -> {room (sub-directory) -> the rooms it may include}.
# Files directly in the top directory (router/main.c, router/router.c: the
# daemon that assembles the rooms) may include every room; no room may
# include them.  A sub-directory missing here is an error, so a new room
# gets its place in the order when it is made.
ROOMS = {
    "router": {
        # front ends -> job (the seam) -> openai, chat, fleet -> base
        "http": {"job", "openai", "chat", "fleet", "base"},
        "grpc": {"job", "openai", "chat", "fleet", "base"},
        "job": {"openai", "chat", "fleet", "base"},
        "openai": {"chat", "base"},
        "chat": {"base"},
        "fleet": {"base"},
        "base": set(),
    },
}

# Directories (relative to the tree, "dir/*" = each sub-directory) whose
# files' headers must not include each other in a circle (decode/: one
# home for a request, issue 23).
FILE_CYCLE_DIRS = [
    "router",
    "router/*",
    "decode",
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"')
INCLUDE_PATH = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".inc")


def top_dir(root, path):
    rel = os.path.relpath(path, root)
    return rel.split(os.sep)[0]


def check_includes(root, errors):
    for d in sorted(ALLOWED):
        base = os.path.join(root, d)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for no, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) not in ALLOWED[d]:
                            errors.append("%s:%d: %s/ may not include %s/ (%s)" % (
                                os.path.relpath(path, root), no, d, m.group(1), line.strip()))


def check_links(root, errors):
    link = re.compile(r"target_link_libraries\(\s*(\S+)\s+(?:PUBLIC|PRIVATE|INTERFACE)?([^)]*)\)",
                      re.S)
    for d in sorted(ALLOWED):
        path = os.path.join(root, d, "CMakeLists.txt")
        if not os.path.exists(path):
            continue
        text = open(path, encoding="utf-8").read()
        for m in link.finditer(text):
            for lib in re.split(r"\s+", m.group(2).strip()):
                owner = TARGET_DIR.get(lib)
                if owner and owner not in ALLOWED[d] and owner != "proto":
                    errors.append("%s/CMakeLists.txt: %s links %s (%s/), not below %s/" % (
                        d, m.group(1), lib, owner, d))


# The transport boundary (transfer/transport.h): UCX's headers are included
# by its implementation alone.
UCX_INCLUDE = re.compile(r'^\s*#\s*include\s+<(ucp|uct|ucs|ucm)/')
UCX_ALLOWED = {os.path.join("transfer", "transport_ucx.c")}


def check_transport(root, errors):
    for top in sorted(ALLOWED):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if rel in UCX_ALLOWED:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for no, line in enumerate(f, 1):
                        if UCX_INCLUDE.match(line):
                            errors.append("%s:%d: only transfer/transport_ucx.c speaks UCX (%s)" %
                                          (rel, no, line.strip()))


def include_lines(path):
    """(line number, included path, line) of each #include "..." of path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for no, line in enumerate(f, 1):
            m = INCLUDE_PATH.match(line)
            if m:
                yield no, m.group(1), line.strip()


def sources(base, recursive):
    if not os.path.isdir(base):
        return
    for dirpath, dirs, files in os.walk(base):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SOURCE_EXT):
                yield os.path.join(dirpath, name)
        if not recursive:
            return


def find_circles(edges):
    """The strongly connected components of more than one node of the graph
    {node: {node: witness}}, each as one circle [n0, n1, ..., n0]."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    circles = []
    for comp in comps:
        # a shortest way back to the smallest node, inside the component
        start = min(comp)
        prev, todo, seen = {}, [start], {start}
        back = None
        while todo and back is None:
            nxt = []
            for v in todo:
                for w in sorted(edges.get(v, {})):
                    if w == start and back is None:
                        back = v
                    if w in comp and w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
            todo = nxt
        path = [back]
        while path[-1] != start:
            path.append(prev[path[-1]])
        path.reverse()
        circles.append(path + [start])
    return sorted(circles)


def describe(circle, edges):
    return "; ".join(edges[a][b] for a, b in zip(circle, circle[1:]))


def check_rooms(root, errors):
    for top in sorted(ROOMS):
        rooms = ROOMS[top]
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for d in sorted(os.listdir(base)):
            if os.path.isdir(os.path.join(base, d)) and d not in rooms:
                errors.append("%s/%s/: not a room of %s/ (list it in ROOMS, "
                              "tests/layers/check_layers.py)" % (top, d, top))
        edges = {}
        for path in sources(base, True):
            rel = os.path.relpath(path, root)
            parts = rel.split(os.sep)
            room = parts[1] if len(parts) > 2 else "."  # "." = the top files
            for no, inc, line in include_lines(path):
                ip = inc.split("/")
                if ip[0] != top or len(ip) < 2:
                    continue
                to = ip[1] if len(ip) > 2 else "."
                if to == room:
                    continue
                edges.setdefault(room, {}).setdefault(to, "%s:%d includes %s" % (rel, no, inc))
                if room == "." or room not in rooms:  # not a room: said once above
                    continue
                if to == "." or to not in rooms.get(room, set()):
                    errors.append("%s:%d: %s/%s/ may not include %s/%s (%s)" % (
                        rel, no, top, room, top, "" if to == "." else to + "/", line))
        for circle in find_circles(edges):
            errors.append("%s/: rooms in a circle: %s (%s)" % (
                top, " -> ".join(circle), describe(circle, edges)))


def file_cycle_dirs(root, dirs):
    for d in dirs:
        if d.endswith("/*"):
            base = os.path.join(root, d[:-2])
            if os.path.isdir(base):
                for sub in sorted(os.listdir(base)):
                    if os.path.isdir(os.path.join(base, sub)):
                        yield d[:-2] + "/" + sub
        elif os.path.isdir(os.path.join(root, d)):
            yield d


def file_node(name):
    stem = os.path.splitext(name)[0]
    return stem[:-len("_internal")] if stem.endswith("_internal") else stem


def check_file_cycles(root, errors, dirs):
    for d in file_cycle_dirs(root, dirs):
        edges = {}
        for path in sources(os.path.join(root, d), False):
            rel = os.path.relpath(path, root)
            me = file_node(os.path.basename(path))
            for no, inc, line in include_lines(path):
                if os.path.dirname(inc) != d:
                    continue
                to = file_node(os.path.basename(inc))
                if to != me:
                    edges.setdefault(me, {}).setdefault(to, "%s:%d includes %s" % (rel, no, inc))
        for circle in find_circles(edges):
            errors.append("%s/: files in a circle: %s (%s)" % (
                d, " -> ".join(circle), describe(circle, edges)))


def check(root, cycle_dirs=None):
    errors = []
    check_includes(root, errors)
    check_links(root, errors)
    check_transport(root, errors)
    check_rooms(root, errors)
    check_file_cycles(root, errors, FILE_CYCLE_DIRS if cycle_dirs is None else cycle_dirs)
    return errors


def run_fixtures(fixtures):
    """Each sub-directory of fixtures is a tree; its expect.txt lists the
    findings the checker must report, one prefix a line ("dirs: a b" adds
    directories to FILE_CYCLE_DIRS).  Every one must be found and nothing
    else: a fixture without findings must pass, one with them must fail."""
    bad = 0
    names = sorted(n for n in os.listdir(fixtures)
                   if os.path.isdir(os.path.join(fixtures, n)))
    for name in names:
        tree = os.path.join(fixtures, name)
        want, extra = [], []
        with open(os.path.join(tree, "expect.txt"), encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if line.startswith("dirs:"):
                    extra += line[5:].split()
                elif line.strip() and not line.startswith("#"):
                    want.append(line)
        errors = check(tree, FILE_CYCLE_DIRS + extra)
        missing = [w for w in want if not any(e.startswith(w) for e in errors)]
        unexpected = [e for e in errors if not any(e.startswith(w) for w in want)]
        for w in missing:
            print("fixture %s: not caught: %s" % (name, w))
        for e in unexpected:
            print("fixture %s: unexpected: %s" % (name, e))
        if missing or unexpected:
            bad += 1
        else:
            print("fixture %s: %s" % (name, "%d finding(s) as expected" % len(errors)
                                      if errors else "clean, as expected"))
    if not names:
        print("fixtures: none in %s" % fixtures)
        return 1
    return 1 if bad else 0


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "transfer"))
        os.makedirs(os.path.join(root, "kv"))
        with open(os.path.join(root, "kv", "ok.h"), "w") as f:
            f.write('#include "common/status.h"\n')
        with open(os.path.join(root, "transfer", "bad.c"), "w") as f:
            f.write('#include "kv/ok.h"\n#include "engine/engine.h"\n')
        with open(os.path.join(root, "transfer", "core.c"), "w") as f:
            f.write('#include <ucp/api/ucp.h>\n')
        with open(os.path.join(root, "transfer", "transport_ucx.c"), "w") as f:
            f.write('#include <ucp/api/ucp.h>\n')
        with open(os.path.join(root, "kv", "CMakeLists.txt"), "w") as f:
            f.write("target_link_libraries(duet_kv PUBLIC duet_engine duet_common)\n")
        os.makedirs(os.path.join(root, "bench"))
        with open(os.path.join(root, "bench", "b.c"), "w") as f:
            f.write('#include "testkit/testkit.h"\n#include "tests/x/h.h"\n')
        os.makedirs(os.path.join(root, "router"))
        with open(os.path.join(root, "router", "uses_fuzz.c"), "w") as f:
            f.write('#include "fuzz/fuzz.h"\n')
        os.makedirs(os.path.join(root, "router", "job"))
        os.makedirs(os.path.join(root, "router", "http"))
        with open(os.path.join(root, "router", "http", "h.c"), "w") as f:
            f.write('#include "router/job/j.h"\n')
        with open(os.path.join(root, "router", "job", "j.c"), "w") as f:
            f.write('#include "router/http/h.h"\n')
        os.makedirs(os.path.join(root, "fuzz"))
        with open(os.path.join(root, "fuzz", "ok.c"), "w") as f:
            f.write('#include "decode/decode.h"\n#include "router/router.h"\n')
        errors = check(root)
        want = ["router/uses_fuzz.c:1: router/ may not include fuzz/","transfer/bad.c:2: transfer/ may not include engine/",
                "kv/CMakeLists.txt: duet_kv links duet_engine",
                "bench/b.c:2: bench/ may not include tests/",
                "transfer/core.c:1: only transfer/transport_ucx.c speaks UCX",
                "router/job/j.c:1: router/job/ may not include router/http/",
                "router/: rooms in a circle: http -> job -> http"]
        for w in want:
            if not any(e.startswith(w) for e in errors):
                print("self-test: not caught: %s (got %r)" % (w, errors))
                return 1
        if len(errors) != len(want):
            print("self-test: unexpected findings %r" % errors)
            return 1
    print("self-test: wrong includes (bench -> tests too, router -> fuzz), a wrong link, UCX "
          "outside its transport, a room including upward and a circle of rooms are caught")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) == 3 and argv[1] == "--fixtures":
        return run_fixtures(argv[2])
    if len(argv) != 2:
        print(__doc__)
        return 2
    errors = check(argv[1])
    for e in errors:
        print(e)
    if errors:
        print("layers: %d violation(s) of the layer rule (docs/architecture.md)" % len(errors))
        return 1
    print("layers: every include and link points down; rooms and files in no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
