#!/usr/bin/python3
"""Broken checkpoints (issue 13, docs/security.md "Input limits"):

- a checkpoint with NaN weights: the request fails with an error naming
  "non-finite logits" (HTTP 500 JSON, gRPC INTERNAL), in prefill (the first
  token) and in decode (a later token), greedy and sampled; the daemons keep
  serving and exit 0.  Made from `duet mkmodel` with the embedding row of one
  token set to NaN: a prompt holding that token breaks prefill; a prompt whose
  first generated token is that token breaks decode one step later.
- `duet generate` on it exits 1 with the same words;
- model.safetensors as a FIFO: the daemon exits at start-up naming the file
  (it used to block forever in open()).

usage: test_router_badmodel.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import struct
import subprocess
import tempfile
import time

import grpc

from router_cluster import Cluster, check, main, oracle

PROMPT = [1, 300, 301, 302]


def nan_row(path, tensor, row):
    """Overwrite one row of an F32 2-D tensor of a safetensors file with NaN."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        t = hdr[tensor]
        check(t["dtype"] == "F32", "%s: %s" % (tensor, t["dtype"]))
        width = t["shape"][1] * 4
        f.seek(8 + n + t["data_offsets"][0] + row * width)
        f.write(b"\xff" * width)


def test(build, src):
    tmp = tempfile.mkdtemp(prefix="duet_badmodel_")
    model = os.path.join(tmp, "nan")
    subprocess.check_call([os.path.join(build, "tools", "duet"), "mkmodel", "--out", model],
                          stdout=subprocess.DEVNULL)
    ids, _ = oracle(build, model, prompt_ids=PROMPT, max_tokens=2)
    bad = ids[0]
    check(bad not in PROMPT, "first token %d is in the prompt" % bad)
    nan_row(os.path.join(model, "model.safetensors"), "model.embed_tokens.weight", bad)

    r = subprocess.run([os.path.join(build, "tools", "duet"), "generate", "--model", model,
                        "--prompt-ids", "1 %d 300" % bad, "--max-tokens", "4", "--temperature",
                        "0", "--output", "ids"], capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "non-finite logits" in r.stderr,
          "duet generate on NaN weights: rc %d out %r err %r" % (r.returncode, r.stdout,
                                                                  r.stderr[-300:]))
    print("ok duet generate: exit %d" % r.returncode)

    cl = Cluster(build, src, prefill=[("prefill-0", 1)], decode=[("decode-0", 1)], model=model)
    try:
        cl.start_workers()
        cl.start_router()
        cases = [("decode (output 1), greedy", PROMPT, 0.0),
                 ("prefill (output 0), greedy", [1, bad, 300], 0.0),
                 ("prefill (output 0), sampled", [1, bad, 300], 0.8)]
        for what, prompt, temp in cases:
            st, _, body = cl.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 4,
                                                           "temperature": temp})
            check(st == 500 and "non-finite logits" in body["error"]["message"],
                  "%s: %d %s" % (what, st, body))
            print("ok HTTP %s: 500 %s" % (what, body["error"]["message"]))
        pb, c = cl.pb, cl.pb["common"]
        stub = pb["decode_grpc"].DecodeStub(cl.channel(cl.address("decode-0")))
        req = pb["decode"].DecodeGenerateRequest(request=pb["generate"].GenerateRequest(
            request_id="nan-1", token_ids=c.TokenIds(ids=PROMPT), max_tokens=4,
            sampling=c.SamplingParams(temperature=0)))
        try:
            list(stub.Generate(req, timeout=30))
            check(False, "direct Decode.Generate on NaN weights succeeded")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INTERNAL and "non-finite logits" in e.details(),
                  "direct Decode.Generate: %s %s" % (e.code(), e.details()))
            print("ok gRPC direct: INTERNAL %s" % e.details())
        # still serving: one token comes from prefill's finite logits
        st, _, body = cl.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 1,
                                                       "temperature": 0})
        check(st == 200 and body["usage"]["completion_tokens"] == 1, "after: %d %s" % (st, body))
        left = cl.pages_at_baseline()
        check(not left, "pages not back: %s" % left)
        cl.stop_all()
    except BaseException:
        for name, p in cl.procs.items():
            print("---- %s log ----\n%s" % (name, p.log()))
        cl.kill_all()
        raise

    # a FIFO in place of model.safetensors: a clear start-up error
    fdir = os.path.join(tmp, "fifo")
    os.makedirs(fdir)
    for f in ("config.json", "tokenizer.json"):
        os.symlink(os.path.join(model, f), os.path.join(fdir, f))
    os.mkfifo(os.path.join(fdir, "model.safetensors"))
    cf = Cluster(build, src, prefill=[], decode=[("decode-f", 1)], model=fdir)
    p = cf.start("decode-f")
    try:
        rc = p.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.proc.kill()
        p.proc.wait()
        check(False, "decode with a FIFO model.safetensors did not exit:\n%s" % p.log())
    log = p.log()
    check(rc != 0 and "model.safetensors" in log and "FIFO" in log,
          "FIFO model.safetensors: rc %s, log:\n%s" % (rc, log))
    print("ok FIFO model.safetensors: exit %d: %s" % (
        rc, [l for l in log.splitlines() if "FIFO" in l][0]))


if __name__ == "__main__":
    main(test)
