#!/usr/bin/python3
"""The attacks of issue 13 that page grants, abort ownership, random ids,
the careful bootstrap and the prefill allow-list close, each performed
with nothing but the public protos (Debian's python3-grpcio) against a
real cluster (router + prefill + decode on 127.0.0.1), and each shown to
have no effect (docs/security.md "Page grants and ownership").  Every case
failed against the daemons before these fixes.

  kv_corruption   Prefill.Prefill with decode's public instance id, any
                  transfer id and dst_pages covering decode's whole pool,
                  repeatedly while a victim request decodes: refused
                  (PERMISSION_DENIED, no grant / a forged one) and the
                  victim's text equals the TP=1 oracle
  abort_anyone    the next router id predicted from one a client got (the
                  old counter scheme), and the victim's real id leaked:
                  Decode.Abort without the victim's abort token does
                  nothing (PERMISSION_DENIED without a token, found=false
                  with a wrong one); direct-call ids are 128 random bits;
                  the owner's token still aborts
  break_link      Prefill.Bootstrap with decode's instance id, name and
                  fingerprint and a garbage descriptor, ~40 a second for
                  5 s while real requests run: every real request is 200
                  with the oracle's text, and neither daemon's open file
                  descriptors pile up
  dial_anywhere   Decode.Generate with a prefill_target that is no prefill
                  of the cluster: INVALID_ARGUMENT with the same message
                  whether the port is open or closed, and a listener there
                  sees no connection

usage: test_router_grants.py BUILD_DIR SOURCE_DIR [case ...]
"""
import os
import random
import re
import socket
import sys
import threading
import time

import grpc

from router_cluster import Cluster, check, detok, main, oracle

STEP_DELAY_MS = 10  # decode steps take at least this long: victims stay in flight
N_PAGES = 64
PAGE = 16


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def completion(cl, text, n, **kw):
    body = {"prompt": text, "max_tokens": n, "temperature": 0}
    body.update(kw)
    return cl.post_json("/v1/completions", body)


def predict_next_old_id(rid):
    """The old router ids were cmpl-<8 hex counter n><16 hex mix(salt ^ n*K)>
    with a splitmix64 mix: invert it to recover the salt and compute the
    id of request n + 1."""
    m = re.fullmatch(r"(\w+)-([0-9a-f]{8})([0-9a-f]{16})", rid)
    if m is None:
        return None
    M, K = (1 << 64) - 1, 0x9E3779B97F4A7C15
    n, a = int(m.group(2), 16), int(m.group(3), 16)

    def unshift(x, s):
        r = x
        for _ in range(64 // s + 1):
            r = x ^ (r >> s)
        return r & M
    z = unshift(a, 31)
    z = (z * pow(0x94D049BB133111EB, -1, 1 << 64)) & M
    z = unshift(z, 27)
    z = (z * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & M
    z = unshift(z, 30)
    salt = ((z - K) & M) ^ ((n * K) & M)

    def mix(v):
        z = (v + K) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)
    n1 = n + 1
    return "%s-%08x%016x" % (m.group(1), n1 & 0xFFFFFFFF, mix(salt ^ ((n1 * K) & M)))


def test(build, src):
    names = set(sys.argv[3:])
    cl = Cluster(build, src, prefill=[("p0", 1)], decode=[("d0", 1)], n_pages=N_PAGES)
    failed = []
    try:
        cl.start("p0")
        cl.start("d0", env={"DUET_FAULTS": "decode.step_delay_ms=%d" % STEP_DELAY_MS})
        cl.wait_worker("p0")
        cl.wait_worker("d0")
        cl.start_router()
        pb, cm = cl.pb, cl.pb["common"]
        pstub = pb["prefill_grpc"].PrefillStub(cl.channel(cl.address("p0")))
        dstub = pb["decode_grpc"].DecodeStub(cl.channel(cl.address("d0")))
        d_info = cl.info("d0")
        model = cl.model

        def victim(text, n, out):
            try:
                out["status"], _, out["body"] = completion(cl, text, n)
            except Exception as e:  # noqa: BLE001 - reported by the case
                out["status"], out["body"] = None, repr(e)

        def kv_corruption():
            text, n = "Once upon a time, there was a little girl", 120
            exp = detok(model, oracle(build, model, prompt=text, max_tokens=n)[0])
            out, answers, stop = {}, [], threading.Event()
            rnd = random.Random(13)

            def attack():
                grant_variants = [{}, {"grant": os.urandom(32),
                                       "grant_expiry_ms": int(time.time() * 1000) + 60000}]
                i = 0
                while not stop.is_set():
                    # the whole pool, in runs of 32 pages (512 tokens, the context)
                    for first in range(0, N_PAGES, 32):
                        req = pb["prefill"].PrefillRequest(
                            request_id="evil-%d" % i, decode_id=d_info.instance_id,
                            prompt_ids=[rnd.randrange(3, 500) for _ in range(32 * PAGE)],
                            dst_pages=list(range(first, first + 32)),
                            transfer_id=rnd.getrandbits(63) + 1,
                            **grant_variants[i % 2])
                        # (a deadline past the decode's transfer timeout: prefill
                        # runs only calls that leave it time to send)
                        answers.append(pstub.Prefill.future(req, timeout=30))
                        i += 1
                    time.sleep(0.05)
            t = threading.Thread(target=victim, args=(text, n, out))
            a = threading.Thread(target=attack)
            t.start()
            time.sleep(0.1)
            a.start()
            t.join(120)
            stop.set()
            a.join(30)
            # a refusal comes at once; give slow (loaded) machines 20 s, then
            # stop the calls that are still running (those were not refused)
            t_wait = time.time() + 20
            for f in answers:
                try:
                    f.exception(timeout=max(0.0, t_wait - time.time()))
                except (grpc.FutureTimeoutError, grpc.FutureCancelledError):
                    pass
                f.cancel()
            refused = 0
            for f in answers:
                try:
                    f.result()
                except grpc.FutureCancelledError:
                    pass
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.PERMISSION_DENIED and "grant" in e.details():
                        refused += 1
            got = out.get("body")
            check(out.get("status") == 200,
                  "victim: status %s %s" % (out.get("status"), str(got)[:300]))
            check(got["choices"][0]["text"] == exp,
                  "victim's text corrupted by %d forged Prefill calls:\n got %r\nwant %r" %
                  (len(answers), got["choices"][0]["text"], exp))
            check(answers and refused == len(answers),
                  "%d of %d forged Prefill calls were not refused with PERMISSION_DENIED "
                  "naming the grant" % (len(answers) - refused, len(answers)))
            check(not cl.pages_at_baseline(), "decode pages not back to baseline")

        def abort_anyone():
            text, n = "The little dog", 100
            exp = detok(model, oracle(build, model, prompt=text, max_tokens=n)[0])
            st, _, mine = completion(cl, "Hello", 2)
            check(st == 200, "first request: %d" % st)
            guess = predict_next_old_id(mine["id"])
            out = {}
            t = threading.Thread(target=victim, args=(text, n, out))
            t.start()
            time.sleep(0.3)  # in flight (decode steps are slowed)
            leaked = None
            if guess is not None:
                # the old scheme: the predicted id is the victim's
                r = dstub.Abort(cm.AbortRequest(request_id=guess), timeout=5)
                leaked = guess if r.found else None
            t.join(120)
            check(leaked is None, "predicted the victim's id %s from %s and aborted it" %
                  (guess, mine["id"]))
            check(out.get("status") == 200 and out["body"]["choices"][0]["text"] == exp,
                  "victim: %s %s" % (out.get("status"), str(out.get("body"))[:300]))
            vid = out["body"]["id"]
            check(vid != guess, "the victim's id %s was predicted" % vid)
            for rid in (mine["id"], vid):
                check(re.fullmatch(r"cmpl-[0-9a-f]{32}", rid) is not None,
                      "router id %r is not 128 random bits" % rid)
            # the victim's id leaked anyway: no token, a wrong token
            it = dstub.Generate(pb["decode"].DecodeGenerateRequest(
                request=cl.gen_request(text, max_tokens=n, request_id="victim-direct"),
                prefill_target=cl.address("p0"), abort_token="owner-token-0123456789abcdef"),
                timeout=60)
            first = next(it)
            check(first.HasField("chunk"), "first message %s" % first)
            try:
                r = dstub.Abort(cm.AbortRequest(request_id="victim-direct"), timeout=5)
                check(False, "Abort without a token was accepted (found=%s)" % r.found)
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.PERMISSION_DENIED and
                      "abort_token" in e.details(), "no token: %s %s" % (e.code(), e.details()))
            r = dstub.Abort(cm.AbortRequest(request_id="victim-direct",
                                            abort_token="guessed-token-0123456789"), timeout=5)
            check(not r.found, "Abort with a wrong token found the request")
            # a NUL inside the id must not cut it short to another request's
            try:
                r = dstub.Abort(cm.AbortRequest(request_id="victim-direct\x00tail",
                                                abort_token="owner-token-0123456789abcdef"),
                                timeout=5)
                check(False, "Abort with a NUL in request_id was accepted (found=%s)" % r.found)
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "NUL" in e.details(),
                      "NUL in request_id: %s %s" % (e.code(), e.details()))
            ids, txt = list(first.chunk.ids), first.chunk.text
            for m in it:
                if m.HasField("chunk"):
                    ids += list(m.chunk.ids)
                    txt += m.chunk.text
            check(txt == exp, "direct victim: %r != %r" % (txt, exp))
            # direct-call ids: 128 random bits, not <instance>-<counter>
            got = []
            for _ in range(2):
                for m in dstub.Generate(pb["decode"].DecodeGenerateRequest(
                        request=cl.gen_request("Hi", max_tokens=1)), timeout=30):
                    if m.HasField("finished"):
                        got.append(m.finished.request_id)
            check(all(re.fullmatch(r"[0-9a-f]{32}", g) for g in got) and got[0] != got[1],
                  "direct-call ids %s are not 128 random bits" % got)
            # the owner's token still aborts
            it = dstub.Generate(pb["decode"].DecodeGenerateRequest(
                request=cl.gen_request(text, max_tokens=n, request_id="owned"),
                abort_token="owner-token-0123456789abcdef"), timeout=60)
            next(it)
            r = dstub.Abort(cm.AbortRequest(request_id="owned",
                                            abort_token="owner-token-0123456789abcdef"),
                            timeout=5)
            check(r.found, "the owner's Abort did not find its request")
            try:
                for _ in it:
                    pass
                check(False, "the aborted stream finished normally")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.CANCELLED, "aborted: %s" % e.code())
            check(not cl.pages_at_baseline(), "decode pages not back to baseline")

        def break_link():
            text, n = "A cat sat", 4
            exp = detok(model, oracle(build, model, prompt=text, max_tokens=n)[0])
            check(completion(cl, text, n)[0] == 200, "warm-up request failed")
            pids = {x: cl.procs[x].proc.pid for x in ("p0", "d0")}
            before = {x: fds(p) for x, p in pids.items()}
            stop, bad, count = threading.Event(), [], [0]

            def real():
                while not stop.is_set():
                    st, _, r = completion(cl, text, n)
                    count[0] += 1
                    if st != 200 or r["choices"][0]["text"] != exp:
                        bad.append("%s %s" % (st, str(r)[:200]))
            t = threading.Thread(target=real)
            t.start()
            t_end, sent = time.time() + 5, 0
            while time.time() < t_end:
                req = pb["prefill"].BootstrapRequest(
                    decode_id=d_info.instance_id, decode_name="d0@" + socket.gethostname(),
                    tp=1, model_fingerprint=d_info.model_fingerprint, kv_heads=4,
                    rank_descriptors=[os.urandom(200)], grant_key=os.urandom(32))
                try:
                    pstub.Bootstrap(req, timeout=5)
                except grpc.RpcError:
                    pass
                sent += 1
                time.sleep(0.025)
            stop.set()
            t.join(60)
            time.sleep(0.5)
            after = {x: fds(p) for x, p in pids.items()}
            print("  %d bad bootstraps, %d real requests (%d failed), open fds %s -> %s" %
                  (sent, count[0], len(bad), before, after))
            check(not bad, "%d of %d real requests failed during %d bad bootstraps: %s" %
                  (len(bad), count[0], sent, bad[:3]))
            check(count[0] > 0, "no real request ran")
            for x in pids:
                check(after[x] <= before[x] + 8, "%s: open fds %d -> %d after %d bad "
                      "bootstraps" % (x, before[x], after[x], sent))

        def dial_anywhere():
            lst = socket.socket()
            lst.bind(("127.0.0.1", 0))
            lst.listen(8)
            lst.settimeout(1.5)
            closed = socket.socket()
            closed.bind(("127.0.0.1", 0))
            closed_port = closed.getsockname()[1]
            closed.close()
            answers = []
            for port in (lst.getsockname()[1], closed_port):
                try:
                    for _ in dstub.Generate(pb["decode"].DecodeGenerateRequest(
                            request=cl.gen_request("Hi", max_tokens=2),
                            prefill_target="127.0.0.1:%d" % port), timeout=15):
                        pass
                    answers.append(("OK", ""))
                except grpc.RpcError as e:
                    answers.append((e.code(), e.details().replace(str(port), "PORT")))
            try:
                conn, _ = lst.accept()
                conn.close()
                dialed = True
            except socket.timeout:
                dialed = False
            lst.close()
            check(not dialed, "decode connected to an arbitrary prefill_target "
                  "(answers: %s)" % answers)
            check(answers[0][0] == grpc.StatusCode.INVALID_ARGUMENT, "open port: %s" %
                  (answers[0],))
            check(answers[0] == answers[1], "open and closed ports answer differently: %s" %
                  answers)
            check("prefill_target" in answers[0][1], "message %r" % answers[0][1])

        for case in (kv_corruption, abort_anyone, break_link, dial_anywhere):
            if names and case.__name__ not in names:
                continue
            t0 = time.time()
            try:
                case()
                print("%-14s ok (%.1fs)" % (case.__name__, time.time() - t0), flush=True)
            except (AssertionError, grpc.RpcError, KeyError, TypeError) as e:
                print("%-14s FAIL: %s" % (case.__name__, e), flush=True)
                failed.append(case.__name__)
        check(not failed, "failed: " + ", ".join(failed))
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
