#!/usr/bin/python3
"""Nothing lost when a decode dies or stalls (docs/migration.md): one
prefill, two decodes and the router on loopback.  Streaming greedy, seeded
sampling, n = 2 with logprobs (HTTP SSE) and greedy / seeded with logprobs
/ n = 2 (gRPC) run once undisturbed (the oracle, and greedy also against
`duet generate`); Decode.Generate resumed at an output index (what a
migration sends) continues an uninterrupted run exactly, a stop string
across the cut included; then every stream runs on d1 again (error: on both) while

  kill   one decode is SIGKILLed mid-stream,
  stall  one decode is SIGSTOPped for longer than router.stall_timeout_ms,
  error  one decode fails every request after its first token
         (decode.kv_copy_fail),

and every stream must end normally ([DONE] / OK, no error event) with the
oracle's ids, text and logprobs, counted in
duet_router_migrations_total{reason}; requests sent to a decode stopped
before their first token are retried once it is out of rotation.  Then

  kv     the prefill corrupts its first KV put (xfer.corrupt_put=0 with
         transfer.checksum on): decode recomputes the prompt locally
         (transfer.on_failure recompute) and the request equals the oracle.

usage: test_router_migrate.py BUILD_DIR SOURCE_DIR
"""
import json
import signal
import threading
import time

from router_cluster import Cluster, check, detok, main, oracle

STEP_MS = 20  # decode.step_delay_ms: streams long enough to be cut
N_TOK = 200
PROMPT = "Once upon a time"
DECODES = ("d1", "d2")
GAPS = {}  # the longest wait between two gRPC messages, by case (seed)


def http_cases():
    base = {"prompt": PROMPT, "max_tokens": N_TOK, "ignore_eos": True, "stream": True}
    return {
        "http-greedy": dict(base, temperature=0),
        "http-seeded": dict(base, temperature=0.9, top_p=0.95, seed=7),
        "http-n2": dict(base, temperature=0.8, seed=11, n=2, logprobs=2),
        "http-text": dict(base, prompt="The little dog", temperature=0),
    }


def run_http(cl, body, first):
    st, events, raw = cl.sse_incremental("/v1/completions", body, first_event=first, timeout=60)
    check(st == 200, "status %d: %s" % (st, raw[-300:]))
    check(events and events[-1] == "[DONE]", "stream did not end with [DONE]: %s" % raw[-400:])
    out = {}
    for ev in events[:-1]:
        check("error" not in ev, "error event: %s" % ev)
        for c in ev.get("choices", []):
            o = out.setdefault(c["index"], {"text": "", "lp": [], "finish": None})
            o["text"] += c["text"]
            if c.get("logprobs"):
                lp = c["logprobs"]
                o["lp"] += [(t, round(v, 4), sorted((k, round(x, 4)) for k, x in tops.items()),
                             off) for t, v, tops, off in zip(lp["tokens"], lp["token_logprobs"],
                                                             lp["top_logprobs"],
                                                             lp["text_offset"])]
            if c.get("finish_reason"):
                o["finish"] = c["finish_reason"]
    return out


def grpc_cases(cl):
    ids, _ = oracle(cl.build, cl.model, prompt=PROMPT, max_tokens=1)
    return {
        "grpc-greedy": cl.gen_request(PROMPT, max_tokens=N_TOK, ignore_eos=True),
        "grpc-seeded": cl.gen_request(PROMPT, max_tokens=N_TOK, ignore_eos=True,
                                      temperature=0.9, logprobs=True, top_logprobs=2,
                                      sampling=cl.pb["common"].SamplingParams(
                                          temperature=0.9, seed=5, has_seed=True)),
        "grpc-n2": cl.gen_request("Lily and Tom", max_tokens=N_TOK, ignore_eos=True, n=2,
                                  sampling=cl.pb["common"].SamplingParams(
                                      temperature=0.8, seed=9, has_seed=True)),
    }


def run_grpc(cl, req, first):
    """{choice index: ids, text, logprobs, finish}."""
    out = {}
    last, gaps = None, []
    for r in cl.router_stub().Generate(req, timeout=60):
        now = time.time()
        if last is not None:
            gaps.append(now - last)
        last = now
        if r.HasField("chunk"):
            o = out.setdefault(r.chunk.index, {"ids": [], "text": "", "lp": [], "fin": None})
            o["ids"] += list(r.chunk.ids)
            o["text"] += r.chunk.text
            o["lp"] += [(x.id, round(x.logprob, 4), sorted((t.id, round(t.logprob, 4))
                                                           for t in x.top))
                        for x in r.chunk.logprobs]
            first.set()
        else:
            o = out.setdefault(r.finished.index, {"ids": [], "text": "", "lp": [], "fin": None})
            o["fin"] = (r.finished.reason, r.finished.completion_tokens,
                        r.finished.prompt_tokens)
    first.set()
    GAPS[req.sampling.seed] = max(gaps) if gaps else 0
    return out


def run_all(cl, fault=None):
    """Every case at once; fault(cl) runs once each stream has its first
    token.  Returns {case: result}."""
    cases = [(k, "http", v) for k, v in http_cases().items()] + \
            [(k, "grpc", v) for k, v in grpc_cases(cl).items()]
    results, errors = {}, []
    firsts = [threading.Event() for _ in cases]

    def one(i):
        name, kind, body = cases[i]
        try:
            results[name] = (run_http if kind == "http" else run_grpc)(cl, body, firsts[i])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append("%s: %s" % (name, e))
            firsts[i].set()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
    for t in ts:
        t.start()
    for e in firsts:
        check(e.wait(30), "a stream got no first token")
    if fault is not None:
        fault(cl)
    for t in ts:
        t.join(60)
    check(not any(t.is_alive() for t in ts), "a client hung")
    check(not errors, "streams failed:\n" + "\n".join(errors))
    return results


def wait_healthy(cl, names, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, _, data = cl.http("GET", "/workers")
        w = {x["name"]: x["healthy"] for x in json.loads(data)["workers"]}
        if all(w.get(n) for n in names):
            return
        time.sleep(0.1)
    check(False, "workers not healthy: %s" % data)


def wait_unhealthy(cl, name, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, _, data = cl.http("GET", "/workers")
        if not {x["name"]: x["healthy"] for x in json.loads(data)["workers"]}[name]:
            return
        time.sleep(0.1)
    check(False, "%s still healthy" % name)


def all_on_d1(cl, n, timeout=5):
    """n streams run on d1 (an n > 1 request's choice 1 starts after choice
    0's first token)."""
    deadline = time.time() + timeout
    while cl.info("d1").running < n and time.time() < deadline:
        time.sleep(0.02)
    check(cl.info("d1").running == n, "not every stream on d1: %s" % cl.info("d1"))


def moved_after(cl):
    """Tokens streamed before each migration, from the router's log lines."""
    out = []
    for line in cl.procs["router"].log(None).splitlines():
        if "migrated from decode" in line:
            out.append(int(line.split(" after ")[1].split(" ")[0]))
    return out


def migrations(cl):
    m = cl.metrics()
    return {r: m.get('duet_router_migrations_total{reason="%s"}' % r, 0)
            for r in ("unavailable", "stall", "error")}


def start_decode(cl, name):
    cl.start(name, env={"DUET_FAULTS": "decode.step_delay_ms=%d" % STEP_MS})
    cl.wait_worker(name)


def compare(solo, got, what):
    for k in solo:
        check(got[k] == solo[k], "%s: %s differs from the undisturbed run:\n%s\n!=\n%s" %
              (what, k, json.dumps(got[k])[:600], json.dumps(solo[k])[:600]))


def decode_stream(cl, decode, req):
    """Decode.Generate directly: (ids, cumulative text after each chunk,
    finished)."""
    stub = cl.pb["decode_grpc"].DecodeStub(cl.channel(cl.address(decode)))
    ids, texts, fin = [], [""], None
    for r in stub.Generate(req, timeout=60):
        if r.HasField("chunk"):
            ids += list(r.chunk.ids)
            texts.append(texts[-1] + r.chunk.text)
        else:
            fin = r.finished
    return ids, texts, fin


def resume(cl):
    """Decode.Generate with first_output_index / resumed_text_bytes (what
    the router sends a migrated stream) continues an uninterrupted run
    exactly: ids, text (a stop string spanning the cut included), finish
    and counts; greedy and seeded."""
    g, c, d = cl.pb["generate"], cl.pb["common"], cl.pb["decode"]
    prompt = [1, 40, 41, 42, 43, 44, 45]
    N = 40

    def req(ids, max_tokens, sampling, stop=(), first=0, text_bytes=0):
        return d.DecodeGenerateRequest(
            request=g.GenerateRequest(token_ids=c.TokenIds(ids=ids), max_tokens=max_tokens,
                                      ignore_eos=True, sampling=sampling, stop=list(stop)),
            prefill_target=cl.address("p1"), first_output_index=first,
            resumed_text_bytes=text_bytes)

    greedy = c.SamplingParams(temperature=0)
    seeded = c.SamplingParams(temperature=0.9, seed=3, has_seed=True)
    ids, texts, _ = decode_stream(cl, "d2", req(prompt, N, greedy))
    k = 10
    cut = len(texts[k])
    text = texts[-1]
    check(len(ids) == N and 2 <= cut and cut + 3 <= len(text), "uninterrupted: %r" % text)
    stop = text[cut - 2:cut + 3]  # spans the cut: its start is held back at token k
    cases = [("greedy", greedy, ()), ("seeded", seeded, ()), ("stop", greedy, (stop,))]
    for name, sp, stops in cases:
        ids, texts, fin = decode_stream(cl, "d2", req(prompt, N, sp, stops))
        k = min(10, len(ids) - 1)
        rids, rtexts, rfin = decode_stream(cl, "d1", req(
            prompt + ids[:k], N - k, sp, stops, first=k, text_bytes=len(texts[k].encode())))
        got = (ids[:k] + rids, texts[k] + rtexts[-1], rfin.reason, rfin.completion_tokens,
               rfin.prompt_tokens, rfin.stop_matched)
        want = (ids, texts[-1], fin.reason, fin.completion_tokens, fin.prompt_tokens,
                fin.stop_matched)
        check(got == want, "resume %s at %d:\n%s\n!=\n%s" % (name, k, got, want))
        if stops:
            check(fin.stop_matched == stop and len(texts[k]) < cut,
                  "the stop case did not hold text back at the cut: %r %r" %
                  (texts[k], fin.stop_matched))
    print("resume: greedy, seeded and a stop string across the cut continue exactly")


def test(build, src):
    cl = Cluster(build, src, prefill=[("p1", 1)], decode=[("d1", 1), ("d2", 1)],
                 router={"stall_timeout_ms": 1200, "health_interval_ms": 200,
                         "policy": "round_robin", "migrate_max": 3,
                         # resumed output counts against the context, not this
                         "max_prompt_tokens": 8})
    with open(cl.config) as f:
        cfg = json.load(f)
    cfg["transfer"]["checksum"] = True  # the kv case's corrupt put must be seen
    with open(cl.config, "w") as f:
        json.dump(cfg, f)
    try:
        g_ids, _ = oracle(build, cl.model, prompt=PROMPT, max_tokens=N_TOK,
                               extra=["--ignore-eos"])
        cl.start("p1")
        cl.wait_worker("p1")
        for d in DECODES:
            start_decode(cl, d)
        cl.start_router()
        wait_healthy(cl, ["p1"] + list(DECODES))

        t0 = time.time()
        solo = run_all(cl)
        print("solo run: %.1f s" % (time.time() - t0))
        check(solo["grpc-greedy"][0]["ids"] == g_ids,
              "greedy gRPC != duet generate: %s != %s" % (solo["grpc-greedy"][0]["ids"], g_ids))
        check(solo["http-greedy"][0]["text"] == detok(cl.model, g_ids),
              "greedy SSE != duet generate: %r" % solo["http-greedy"][0]["text"])
        check(len(solo["http-n2"]) == 2 and solo["http-n2"][0]["lp"] and
              solo["http-n2"][0]["text"] != solo["http-n2"][1]["text"],
              "n=2 choices: %s" % json.dumps(solo["http-n2"])[:300])
        check(solo["grpc-seeded"][0]["fin"][1] == N_TOK, "completion tokens %s" %
              (solo["grpc-seeded"][0]["fin"],))
        check(len(solo["grpc-n2"]) == 2 and solo["grpc-n2"][0]["ids"] != solo["grpc-n2"][1]["ids"]
              and all(c["fin"][1] == N_TOK for c in solo["grpc-n2"].values()),
              "gRPC n=2: %s" % json.dumps(solo["grpc-n2"])[:300])
        check(migrations(cl) == {"unavailable": 0, "stall": 0, "error": 0},
              "migrations without a fault: %s" % migrations(cl))
        resume(cl)

        # kill: every stream on d1 (d2 down), then d2 up and d1 SIGKILLed
        # mid-stream
        n_jobs = 9  # 4 HTTP requests and 3 gRPC calls, one of each n = 2
        cl.stop("d2")
        wait_unhealthy(cl, "d2")

        def kill(cl):
            all_on_d1(cl, n_jobs)
            start_decode(cl, "d2")
            wait_healthy(cl, ["d2"])
            cl.procs["d1"].proc.send_signal(signal.SIGKILL)
            cl.procs["d1"].proc.wait()
        t0 = time.time()
        got = run_all(cl, kill)
        compare(solo, got, "kill")
        m = migrations(cl)
        check(m["unavailable"] + m["error"] == n_jobs, "migrations counted: %s" % m)
        moved = moved_after(cl)
        check(len(moved) == n_jobs and min(moved) > 0,
              "migration log lines (tokens before the move): %s" % moved)
        print("kill d1: every stream equal to the solo run in %.1f s; migrations %s after %s "
              "tokens; longest gRPC gap %.0f ms (a step is %d ms)" %
              (time.time() - t0, m, moved, 1000 * max(GAPS.values()), STEP_MS))
        start_decode(cl, "d1")
        wait_healthy(cl, DECODES)

        # stall: every stream on d1 again, then d2 up and d1 SIGSTOPped for
        # longer than stall_timeout_ms (until the streams are done)
        cl.stop("d2")
        wait_unhealthy(cl, "d2")
        stopped = []

        def stop(cl):
            all_on_d1(cl, n_jobs)
            start_decode(cl, "d2")
            wait_healthy(cl, ["d2"])
            cl.procs["d1"].proc.send_signal(signal.SIGSTOP)
            stopped.append("d1")
        before = migrations(cl)
        t0 = time.time()
        try:
            got = run_all(cl, stop)
        finally:
            for name in stopped:
                cl.procs[name].proc.send_signal(signal.SIGCONT)
        compare(solo, got, "stall")
        m = migrations(cl)
        check(m["stall"] - before["stall"] == n_jobs, "stall migrations counted: %s" % m)
        print("stall d1: every stream equal to the solo run in %.1f s; migrations %s; longest "
              "gRPC gap %.0f ms (stall_timeout_ms 1200)" % (time.time() - t0, m,
                                                           1000 * max(GAPS.values())))
        wait_healthy(cl, DECODES)

        # stalled before the first token: d1 SIGSTOPped with both decodes in
        # rotation; requests the router sends it before its health check
        # fails wait for no first token: once d1 is out of rotation and
        # stall_timeout_ms passed they take their retry on d2
        before = cl.metrics()["duet_router_retries_total"]
        ids8, _ = oracle(build, cl.model, prompt=PROMPT, max_tokens=8)
        outs = []
        cl.procs["d1"].proc.send_signal(signal.SIGSTOP)
        t0 = time.time()
        try:
            ts = [threading.Thread(target=lambda: outs.append(cl.post_json(
                "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})))
                for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(30)
        finally:
            cl.procs["d1"].proc.send_signal(signal.SIGCONT)
        took = time.time() - t0
        check(len(outs) == 4 and all(st == 200 and r["choices"][0]["text"] ==
                                     detok(cl.model, ids8) for st, _, r in outs),
              "requests sent to a stopped decode: %s" % [json.dumps(r)[:200] for _, _, r in outs])
        retried = cl.metrics()["duet_router_retries_total"] - before
        check(retried > 0 and "no first token from decode d1" in cl.procs["router"].log(None),
              "no request met the stopped decode (retries +%d)" % retried)
        check(took < 10, "took %.1f s" % took)
        print("stall before the first token: %d requests retried off the stopped decode, all "
              "done in %.1f s" % (retried, took))
        wait_healthy(cl, DECODES)

        # error: d1's KV copy fails after each request's first token
        # (decode.kv_copy_fail: INTERNAL); its streams continue on d2
        cl.stop("d1")
        cl.start("d1", env={"DUET_FAULTS": "decode.step_delay_ms=%d,decode.kv_copy_fail=1" %
                            STEP_MS})
        cl.wait_worker("d1")
        wait_healthy(cl, DECODES)
        before = migrations(cl)
        got = run_all(cl)
        compare(solo, got, "error")
        m = migrations(cl)
        check(m["error"] > before["error"], "no error migration counted: %s" % m)
        print("error on d1 after the first token: every stream equal to the solo run; "
              "migrations %s" % m)
        cl.stop("d1")
        start_decode(cl, "d1")
        wait_healthy(cl, DECODES)

        # kv: the prefill's first put is corrupted; decode recomputes
        cl.stop("p1")
        cl.start("p1", env={"DUET_FAULTS": "xfer.corrupt_put=0"})
        cl.wait_worker("p1")
        wait_healthy(cl, ["p1"])
        local0 = sum(cl.info(d).prefills_local for d in DECODES)
        st, _, r = cl.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": 24,
                                                    "temperature": 0})
        ids24, _ = oracle(build, cl.model, prompt=PROMPT, max_tokens=24)
        check(st == 200 and r["choices"][0]["text"] == detok(cl.model, ids24),
              "kv failure: %d %s" % (st, json.dumps(r)[:300]))
        local = sum(cl.info(d).prefills_local for d in DECODES) - local0
        logs = "".join(cl.procs[d].log(None) for d in DECODES)
        check(local == 1 and "recomputing its prompt here" in logs,
              "no local recompute after the corrupt put (prefills_local +%d)" % local)
        print("kv: checksum mismatch recomputed on the decode, text equals the oracle")

        bad = cl.pages_at_baseline()
        check(not bad, "pages not back: %s" % bad)
        cl.stop_all()
    finally:
        cl.kill_all()


if __name__ == "__main__":
    main(test)
