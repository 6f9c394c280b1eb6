#!/usr/bin/python3
"""The attacks of issue 25 items 1, 2 and 6, performed against a real
cluster (router + prefill + decode on 127.0.0.1, authentication off: the
traffic between decode and prefill is readable, as the issue assumes) with
Debian's python3-grpcio and the public protos, each shown to have no effect
(docs/security.md "Grants are used once", "UCX never sees unchecked
bytes", "Request ids are per owner").  Every case fails against the
daemons before these fixes.

The cases run twice: on a cluster without authentication, and on one
whose members authenticate with the shared secret only (auth.secret_file,
no TLS: the traffic is still readable, and the attacker holds the secret,
as every process of the cluster does).

Decode reaches prefill p0 through a recording TCP proxy (p0's `address` is
the proxy, its `listen` its own port): the proxy reads the HTTP/2 frames
decode sends and keeps every gRPC message, which is how the attacker gets
a real Bootstrap descriptor and real page grants.

  garbage_address  Prefill.Bootstrap whose descriptor is well formed (magic,
                   version, layout, fingerprint, CRC32C: a decode's own,
                   captured: d1's, a decode the router does not use)
                   around 64 random bytes as the UCX worker
                   address: refused, and prefill keeps serving (it used to
                   abort inside ucp_ep_create)
  fuzz_bootstrap   ~80 whole descriptors mutated (address and rkey bytes,
                   lengths, truncations; CRC fixed up so the wire check
                   passes): every Bootstrap answered, prefill alive, real
                   requests correct afterwards
  replay_done      a completed transfer's PrefillRequest replayed with a
                   different prompt of the same length, and unchanged:
                   PERMISSION_DENIED, and later requests sharing that
                   prompt's prefix (decode's prefix cache) equal the oracle
  replay_running   each victim's PrefillRequest replayed (another prompt)
                   the moment the proxy sees it, while its transfer runs:
                   refused, and the victims' texts equal the oracle
  duplicate_id     an attacker starts Decode.Generate with the victim's
                   request_id first; the victim's Abort(id, its token)
                   still finds and cancels the victim's request, and the
                   attacker's runs on

usage: test_router_replay.py BUILD_DIR SOURCE_DIR [case ...]
"""
import os
import random
import socket
import struct
import sys
import threading
import time

import grpc

from router_cluster import Cluster, check, detok, free_port, main, oracle

STEP_DELAY_MS = 10
PAGE = 16

_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def desc_parts(blob):
    """(fixed header, rkey, address) of a transfer descriptor
    (transfer/xfer_wire.h)."""
    rkey_len, addr_len = struct.unpack_from("<II", blob, 84)
    return blob[:92], blob[92:92 + rkey_len], blob[92 + rkey_len:92 + rkey_len + addr_len]


def desc_build(fixed, rkey, addr, fix_crc=True, total=None):
    head = bytearray(fixed)
    body_len = 92 + len(rkey) + len(addr) + 4
    struct.pack_into("<I", head, 8, body_len if total is None else total)
    struct.pack_into("<II", head, 84, len(rkey), len(addr))
    b = bytes(head) + rkey + addr
    crc = crc32c(b) if fix_crc else random.getrandbits(32)
    return b + struct.pack("<I", crc)


class RecordingProxy:
    """TCP proxy that keeps the gRPC messages clients send (h2c)."""

    def __init__(self, target_port):
        self.target = target_port
        self.lst = socket.socket()
        self.lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lst.bind(("127.0.0.1", 0))
        self.lst.listen(64)
        self.port = self.lst.getsockname()[1]
        self.messages, self.lock = [], threading.Lock()
        self.on_message = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lst.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                c.close()
                continue
            threading.Thread(target=self._pipe, args=(c, s, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(s, c, False), daemon=True).start()

    def _pipe(self, a, b, record):
        buf, streams, pre = b"", {}, False
        while True:
            try:
                d = a.recv(65536)
            except OSError:
                d = b""
            if not d:
                for x in (a, b):
                    try:
                        x.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            try:
                b.sendall(d)
            except OSError:
                return
            if not record:
                continue
            buf += d
            if not pre:
                if len(buf) < 24:
                    continue
                buf, pre = buf[24:], True
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                ftype, flags = buf[3], buf[4]
                sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                payload, buf = buf[9:9 + n], buf[9 + n:]
                if ftype != 0:
                    continue
                if flags & 0x8:
                    payload = payload[1:len(payload) - payload[0]]
                s = streams.get(sid, b"") + payload
                while len(s) >= 5 and len(s) >= 5 + int.from_bytes(s[1:5], "big"):
                    m_len = int.from_bytes(s[1:5], "big")
                    msg, s = s[5:5 + m_len], s[5 + m_len:]
                    with self.lock:
                        self.messages.append(msg)
                    if self.on_message is not None:
                        self.on_message(msg)
                streams[sid] = s

    def close(self):
        self.lst.close()


def as_prefill(pb, msg):
    try:
        r = pb["prefill"].PrefillRequest.FromString(msg)
    except Exception:  # noqa: BLE001 - not this message type
        return None
    if len(r.grant) == 32 and r.transfer_id and r.prompt_ids and r.decode_id:
        return r
    return None


def as_bootstrap(pb, msg):
    try:
        r = pb["prefill"].BootstrapRequest.FromString(msg)
    except Exception:  # noqa: BLE001
        return None
    if len(r.grant_key) == 32 and r.rank_descriptors and r.rank_descriptors[0][:4] == b"DXFD":
        return r
    return None


def other_prompt(ids, rnd):
    """The same length, another prompt (the first id kept: BOS)."""
    out = list(ids)
    for i in range(1, len(out)):
        out[i] = rnd.randrange(3, 500)
    return out


class SecretCluster(Cluster):
    """Members authenticate with the shared secret (no TLS)."""

    def __init__(self, build, src, **kw):
        self.secret_path = None
        self.secret = os.urandom(32).hex()
        super().__init__(build, src, **kw)

    def write_config(self, path=None, router=None):
        import json
        path = super().write_config(path, router)
        if self.secret_path is None:
            self.secret_path = os.path.join(self.tmp, "secret")
            with open(self.secret_path, "w") as f:
                f.write(self.secret + "\n")
        with open(path) as f:
            cfg = json.load(f)
        cfg["auth"] = {"secret_file": self.secret_path}
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        return path

    def md(self):
        return [("x-duet-secret", self.secret)]

    def info(self, name, timeout=5):
        ch = self.channel(self.address(name))
        if self.role(name) == "decode":
            stub = self.pb["decode_grpc"].DecodeStub(ch)
        else:
            stub = self.pb["prefill_grpc"].PrefillStub(ch)
        return stub.Info(self.pb["common"].InfoRequest(), timeout=timeout, metadata=self.md())


def test(build, src):
    for auth in ("off", "secret"):
        print("==== authentication %s" % auth, flush=True)
        run(build, src, auth)


def run(build, src, auth):
    names = set(sys.argv[3:])
    p0_port = free_port()
    kind = SecretCluster if auth == "secret" else Cluster
    cl = kind(build, src, prefill=[("p0", 1, {"listen": "127.0.0.1:%d" % p0_port})],
              decode=[("d0", 1)], n_pages=256)
    md = cl.md() if auth == "secret" else None
    proxy = RecordingProxy(p0_port)
    for _, e in cl.instances:
        if e["name"] == "p0":
            e["address"] = "127.0.0.1:%d" % proxy.port
    cl.write_config()
    # d1: a decode the router does not know (its own config file), whose
    # descriptor the garbage and fuzz cases start from.  UCX trusts its
    # connected peers: an accepted mutated descriptor makes prefill open a
    # second set of endpoints to that decode's worker, which can kill the
    # decode (docs/security.md); the case checks what item 1 promises,
    # that the *prefill* survives and serves d0.
    d1_port = free_port()
    cl.instances.append(("decode", {"name": "d1", "address": "127.0.0.1:%d" % d1_port,
                                    "tp": 1, "threads": 1, "n_pages": 64, "max_seqs": 4,
                                    "drain_timeout_ms": 5000}))
    d1_config = os.path.join(cl.tmp, "cluster_d1.json")
    cl.write_config(d1_config)
    cl.instances.pop()
    cl.write_config()
    cl.instances.append(("decode", {"name": "d1", "address": "127.0.0.1:%d" % d1_port}))
    failed = []
    try:
        cl.start("p0")
        cl.start("d0", env={"DUET_FAULTS": "decode.step_delay_ms=%d" % STEP_DELAY_MS})
        cl.start("d1", config=d1_config)
        cl.wait_worker("p0")
        cl.wait_worker("d0")
        cl.wait_worker("d1")
        cl.start_router()
        pb, cm = cl.pb, cl.pb["common"]
        pstub = pb["prefill_grpc"].PrefillStub(cl.channel("127.0.0.1:%d" % p0_port))
        dstub = pb["decode_grpc"].DecodeStub(cl.channel(cl.address("d0")))
        model = cl.model
        # DUET_REPLAY_FUZZ_N / _SEED: longer or other fuzz runs by hand
        rnd = random.Random(int(os.environ.get("DUET_REPLAY_FUZZ_SEED", "25")))
        fuzz_n = int(os.environ.get("DUET_REPLAY_FUZZ_N", "80"))

        def completion(text, n):
            return cl.post_json("/v1/completions",
                                {"prompt": text, "max_tokens": n, "temperature": 0})

        def expect(text, n):
            return detok(model, oracle(build, model, prompt=text, max_tokens=n)[0])

        def serving(what):
            check(cl.procs["p0"].alive(), "prefill died after %s:\n%s" %
                  (what, cl.procs["p0"].log()))
            text = "The little dog"
            st, _, r = completion(text, 6)
            check(st == 200 and r["choices"][0]["text"] == expect(text, 6),
                  "after %s: %s %s" % (what, st, str(r)[:300]))

        def captured(kind):
            with proxy.lock:
                msgs = list(proxy.messages)
            return [x for x in (kind(pb, m) for m in msgs) if x is not None]

        st, _, _ = completion("Hello", 2)
        check(st == 200, "warm-up: %s" % st)
        d1_id = cl.info("d1").instance_id
        d1stub = pb["decode_grpc"].DecodeStub(cl.channel(cl.address("d1")))
        for _ in d1stub.Generate(pb["decode"].DecodeGenerateRequest(
                request=cl.gen_request("Hi", max_tokens=1),
                prefill_target=cl.address("p0")), timeout=60, metadata=md):
            pass
        boots = [b for b in captured(as_bootstrap) if b.decode_id == d1_id]
        check(boots, "the proxy saw no Bootstrap from d1")
        real = boots[0]
        fixed, rkey, addr = desc_parts(real.rank_descriptors[0])
        check(desc_build(fixed, rkey, addr) == real.rank_descriptors[0],
              "the test's descriptor encoding differs from decode's")
        print("  decode's descriptor: rkey %d bytes, worker address %d bytes" %
              (len(rkey), len(addr)), flush=True)

        def bootstrap(desc, i):
            req = pb["prefill"].BootstrapRequest(
                decode_id="evil-%d" % i, decode_name="evil-%d@nowhere" % i, tp=1,
                model_fingerprint=real.model_fingerprint, kv_heads=real.kv_heads,
                rank_descriptors=[desc], grant_key=os.urandom(32))
            try:
                pstub.Bootstrap(req, timeout=20, metadata=md)
                return grpc.StatusCode.OK, ""
            except grpc.RpcError as e:
                return e.code(), e.details() or ""

        def garbage_address():
            code, msg = bootstrap(desc_build(fixed, rkey, os.urandom(64)), 0)
            print("  64 random address bytes: %s %s" % (code, msg[:160]), flush=True)
            check(cl.procs["p0"].alive(), "prefill died of one Bootstrap:\n%s" %
                  cl.procs["p0"].log())
            check(code != grpc.StatusCode.OK, "a garbage worker address was accepted")
            serving("a garbage worker address")

        def fuzz_bootstrap():
            codes = {}
            kinds = [int(k) for k in os.environ.get("DUET_REPLAY_FUZZ_KINDS",
                                                    "0,1,2,3,4,5,6,7").split(",")]
            for i in range(fuzz_n):
                r, a = bytearray(rkey), bytearray(addr)
                kind = kinds[i % len(kinds)]
                if kind == 0:
                    a = bytearray(os.urandom(rnd.randrange(1, 200)))
                elif kind == 1:
                    for _ in range(rnd.randrange(1, 8)):
                        a[rnd.randrange(len(a))] = rnd.randrange(256)
                elif kind == 2:
                    a = a[:rnd.randrange(1, len(a))]
                elif kind == 3 and r:
                    for _ in range(rnd.randrange(1, 8)):
                        r[rnd.randrange(len(r))] = rnd.randrange(256)
                elif kind == 4:
                    r = bytearray(os.urandom(rnd.randrange(1, 64)))
                elif kind == 5:
                    a = a + bytearray(os.urandom(rnd.randrange(1, 64)))
                    a[0] = rnd.randrange(256)
                elif kind == 6:
                    a[:4] = os.urandom(4)
                else:
                    a = bytearray(b"\x00" * len(a))
                desc = desc_build(fixed, bytes(r), bytes(a), fix_crc=(i % 10 != 9))
                code, _ = bootstrap(desc, 100 + i)
                codes[code] = codes.get(code, 0) + 1
                check(cl.procs["p0"].alive(), "prefill died on fuzz input %d (kind %d):\n%s" %
                      (i, kind, cl.procs["p0"].log()))
            print("  %d mutated descriptors: %s" %
                  (fuzz_n, {str(k): v for k, v in codes.items()}), flush=True)
            serving("%d mutated descriptors" % fuzz_n)

        def replay_done():
            text, n = "Once upon a time, there was a little girl named Lily. She", 8
            st, _, r = completion(text, n)
            check(st == 200 and r["choices"][0]["text"] == expect(text, n),
                  "first: %s %s" % (st, str(r)[:200]))
            reqs = captured(as_prefill)
            check(reqs, "the proxy saw no Prefill call")
            victim = reqs[-1]
            answers = []
            for variant in ("unchanged", "other prompt"):
                evil = pb["prefill"].PrefillRequest()
                evil.CopyFrom(victim)
                if variant == "other prompt":
                    del evil.prompt_ids[:]
                    evil.prompt_ids.extend(other_prompt(victim.prompt_ids, rnd))
                try:
                    pstub.Prefill(evil, timeout=20, metadata=md)
                    answers.append((variant, grpc.StatusCode.OK, ""))
                except grpc.RpcError as e:
                    answers.append((variant, e.code(), e.details() or ""))
            print("  replays: %s" % [(v, str(c), d[:100]) for v, c, d in answers], flush=True)
            # the prefix cache must not serve poisoned pages: the same prompt
            # and longer ones sharing its pages
            for t2 in (text, text + " liked to play", text + " was very happy"):
                st, _, r = completion(t2, n)
                check(st == 200 and r["choices"][0]["text"] == expect(t2, n),
                      "after the replays, %r: %s\n got %r\nwant %r" %
                      (t2, st, r["choices"][0]["text"] if st == 200 else r, expect(t2, n)))
            for v, c, d in answers:
                check(c == grpc.StatusCode.PERMISSION_DENIED,
                      "replayed grant (%s) not refused: %s %s" % (v, c, d))

        def replay_running():
            texts = ["One day, a little bird flew over the big green tree and",
                     "Tom had a red ball. He liked to throw it high in the"]
            n = 40
            exp = {t: expect(t, n) for t in texts}
            results, replays = {}, []

            def replay(msg):
                req = as_prefill(pb, msg)
                if req is None:
                    return
                evil = pb["prefill"].PrefillRequest()
                evil.CopyFrom(req)
                del evil.prompt_ids[:]
                evil.prompt_ids.extend(other_prompt(req.prompt_ids, rnd))
                replays.append(pstub.Prefill.future(evil, timeout=20, metadata=md))
            proxy.on_message = replay
            try:
                ths = []
                for t in texts:
                    def run(t=t):
                        results[t] = completion(t, n)
                    ths.append(threading.Thread(target=run))
                    ths[-1].start()
                for th in ths:
                    th.join(120)
            finally:
                proxy.on_message = None
            codes = []
            for f in replays:
                try:
                    f.result(timeout=20)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    codes.append(e.code())
            print("  %d replays while running: %s" % (len(replays), [str(c) for c in codes]),
                  flush=True)
            check(len(replays) >= len(texts), "only %d replays sent" % len(replays))
            for t in texts:
                st, _, r = results[t]
                check(st == 200 and r["choices"][0]["text"] == exp[t],
                      "victim %r: %s\n got %r\nwant %r" %
                      (t, st, r["choices"][0]["text"] if st == 200 else r, exp[t]))
            check(all(c == grpc.StatusCode.PERMISSION_DENIED for c in codes),
                  "replays not refused: %s" % codes)

        def duplicate_id():
            text, n = "The little dog", 120
            exp = expect(text, n)
            attacker = dstub.Generate(pb["decode"].DecodeGenerateRequest(
                request=cl.gen_request(text, max_tokens=n, request_id="shared-id"),
                prefill_target=cl.address("p0"),
                abort_token="attacker-token-0123456789abcdef"), timeout=120, metadata=md)
            check(next(attacker).HasField("chunk"), "attacker's first message")
            victim = dstub.Generate(pb["decode"].DecodeGenerateRequest(
                request=cl.gen_request(text, max_tokens=n, request_id="shared-id"),
                prefill_target=cl.address("p0"),
                abort_token="victim-token-0123456789abcdef0"), timeout=120, metadata=md)
            check(next(victim).HasField("chunk"), "victim's first message")
            r = dstub.Abort(cm.AbortRequest(request_id="shared-id",
                                            abort_token="victim-token-0123456789abcdef0"),
                            timeout=5, metadata=md)
            check(r.found, "the victim's Abort did not find its request (shadowed by the "
                  "attacker's of the same id)")
            try:
                for _ in victim:
                    pass
                check(False, "the victim's aborted stream finished normally")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.CANCELLED, "victim: %s" % e.code())
            txt = ""
            for m in attacker:
                if m.HasField("chunk"):
                    txt += m.chunk.text
            check(exp.endswith(txt) and len(txt) > 0, "the attacker's request was cut: %r" % txt)
            # a wrong token still finds nothing
            r = dstub.Abort(cm.AbortRequest(request_id="shared-id",
                                            abort_token="victim-token-0123456789abcdef0"),
                            timeout=5, metadata=md)
            check(not r.found, "a finished request was found")

        for case in (garbage_address, fuzz_bootstrap, replay_done, replay_running, duplicate_id):
            if names and case.__name__ not in names:
                continue
            t0 = time.time()
            try:
                case()
                print("%-16s ok (%.1fs)" % (case.__name__, time.time() - t0), flush=True)
            except (AssertionError, grpc.RpcError, KeyError, TypeError) as e:
                print("%-16s FAIL: %s" % (case.__name__, e), flush=True)
                failed.append(case.__name__)
                if not cl.procs["p0"].alive():
                    break
        if not cl.procs["d1"].alive():
            print("  (d1, whose descriptor was mutated, died: UCX trusts connected peers)",
                  flush=True)
        check(not failed, "failed: " + ", ".join(failed))
        check(not cl.pages_at_baseline(), "decode pages not back to baseline")
        cl.stop_all()
    finally:
        cl.kill_all()
        proxy.close()


if __name__ == "__main__":
    main(test)
