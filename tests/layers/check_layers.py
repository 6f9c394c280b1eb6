#!/usr/bin/env python3
"""The layer rule (docs/architecture.md): every directory may include and link
only the directories on floors below it (and itself).  Fails, naming the file
and the line, on an #include "dir/..." or a target_link_libraries entry that
points sideways or up, and on a UCX header included anywhere but the
transport's implementation (transfer/transport_ucx.c).

    check_layers.py SOURCE_DIR          check the tree
    check_layers.py --self-test         show that a wrong include is caught
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

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"')
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


def check(root):
    errors = []
    check_includes(root, errors)
    check_links(root, errors)
    check_transport(root, errors)
    return errors


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
        os.makedirs(os.path.join(root, "fuzz"))
        with open(os.path.join(root, "fuzz", "ok.c"), "w") as f:
            f.write('#include "decode/decode.h"\n#include "router/router.h"\n')
        errors = check(root)
        want = ["router/uses_fuzz.c:1: router/ may not include fuzz/","transfer/bad.c:2: transfer/ may not include engine/",
                "kv/CMakeLists.txt: duet_kv links duet_engine",
                "bench/b.c:2: bench/ may not include tests/",
                "transfer/core.c:1: only transfer/transport_ucx.c speaks UCX"]
        for w in want:
            if not any(e.startswith(w) for e in errors):
                print("self-test: not caught: %s (got %r)" % (w, errors))
                return 1
        if len(errors) != len(want):
            print("self-test: unexpected findings %r" % errors)
            return 1
    print("self-test: wrong includes (bench -> tests too, router -> fuzz), a wrong link and UCX outside its transport are caught")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2:
        print(__doc__)
        return 2
    errors = check(argv[1])
    for e in errors:
        print(e)
    if errors:
        print("layers: %d violation(s) of the layer rule (docs/architecture.md)" % len(errors))
        return 1
    print("layers: every include and link points down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
