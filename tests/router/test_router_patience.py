#!/usr/bin/python3
"""The router refuses cleanly or waits, rather than failing a request it
accepted (docs/migration.md "Overload"; found by bench/overload.py on the
124M model):

  queue  a prefill that serves one prompt per 1.5 s (prefill.delay_ms,
         max_seqs 1), admission on (router.prefill_wait_max_ms), a request
         deadline of 8 s and 8 requests at once: each is a completion equal
         to the oracle or a 429 with Retry-After, refused once it spent half
         its deadline in the router's queue -- none waits out its deadline
         there and ends with a 504 (before: "the request timed out in the
         router's queue", or launched at the last moment and "d1: Deadline
         Exceeded").
  bootstrap  Decode.Generate naming a prefill that is down is recomputed
         on decode (transfer.on_failure recompute), not failed UNAVAILABLE
         (found by bench/chaos_soak.py).
  stall  a lone decode slower per token (decode.step_delay_ms) than
         router.stall_timeout_ms: its streams complete, equal to the
         oracle -- the stall watch moves a stream only where another decode
         is healthy (before: cut and failed, "no other prefill/decode
         worker pair to retry on").

usage: test_router_patience.py BUILD_DIR SOURCE_DIR
"""
import threading
import time

from router_cluster import Cluster, check, detok, main, oracle

PROMPT = "Once upon a time"


def queue_case(build, src):
    n_tok, n_req = 4, 8
    cl = Cluster(build, src, prefill=[("p1", 1, {"max_seqs": 1})], decode=[("d1", 1)],
                 router={"request_timeout_ms": 8000, "prefill_wait_max_ms": 500,
                         "queue_limit": 64})
    try:
        cl.start("p1", env={"DUET_FAULTS": "prefill.delay_ms=1500"})
        cl.start("d1")
        cl.wait_worker("p1")
        cl.wait_worker("d1")
        cl.start_router()
        ids, _ = oracle(build, cl.model, prompt=PROMPT, max_tokens=n_tok)
        text = detok(cl.model, ids)
        body = {"prompt": PROMPT, "max_tokens": n_tok, "temperature": 0}
        # one first, so that prefill has measured its rate (admission's input)
        st, _, r = cl.post_json("/v1/completions", body, timeout=60)
        check(st == 200 and r["choices"][0]["text"] == text, "warm-up: %d %s" % (st, r))
        time.sleep(0.5)  # an Info with the rate reaches the router
        out = [None] * n_req

        def one(k):
            t0 = time.time()
            st, h, r = cl.post_json("/v1/completions", body, timeout=60)
            out[k] = (st, h, r, time.time() - t0)
        ts = [threading.Thread(target=one, args=(k,)) for k in range(n_req)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        check(not any(t.is_alive() for t in ts), "a client hung")
        done = refused = 0
        for st, h, r, dt in out:
            if st == 200:
                check(r["choices"][0]["text"] == text, "wrong text: %s" % r)
                done += 1
            else:
                check(st == 429 and h.get("retry-after") and "overloaded" in
                      r["error"]["message"], "not a clean refusal: %d %s %s" % (st, h, r))
                check(dt < 7.0, "refused only after %.1f s (deadline 8 s)" % dt)
                refused += 1
        check(done >= 1 and refused >= 1, "completed %d, refused %d" % (done, refused))
        print("queue: %d completed equal to the oracle, %d refused with 429 (%s s)" % (
            done, refused, sorted(round(x[3], 1) for x in out)))
        cl.stop_all()
    except BaseException:
        cl.kill_all()
        raise


def stall_case(build, src):
    n_tok = 4
    cl = Cluster(build, src, prefill=[("p1", 1)], decode=[("d1", 1)],
                 router={"stall_timeout_ms": 800, "migrate_max": 3})
    try:
        cl.start("p1")
        cl.start("d1", env={"DUET_FAULTS": "decode.step_delay_ms=1300"})
        cl.wait_worker("p1")
        cl.wait_worker("d1")
        cl.start_router()
        ids, _ = oracle(build, cl.model, prompt=PROMPT, max_tokens=n_tok)
        st, events, raw = cl.sse("/v1/completions", {
            "prompt": PROMPT, "max_tokens": n_tok, "temperature": 0, "stream": True},
            timeout=60)
        check(st == 200 and events and events[-1] == "[DONE]", "stream: %d %s" % (st, raw[-400:]))
        check(not any("error" in e for e in events[:-1]), "error event: %s" % raw[-400:])
        text = "".join(c["text"] for e in events[:-1] for c in e.get("choices", []))
        check(text == detok(cl.model, ids), "text %r != %r" % (text, detok(cl.model, ids)))
        log = cl.procs["router"].log(None)
        check("no token from decode" not in log, "the stream was cut:\n%s" % log[-1500:])
        print("stall: a lone decode slower than stall_timeout_ms finished its stream")
        cl.stop_all()
    except BaseException:
        cl.kill_all()
        raise


def bootstrap_case(build, src):
    """Decode.Generate naming a prefill that is down (never started, so
    the bootstrap's connection is refused): with transfer.on_failure
    recompute (the default) decode prefills it locally and the request
    completes, equal to the oracle (before: UNAVAILABLE "bootstrap with
    prefill ...: failed to connect", which a router that had used its one
    retry before the first token passed on to the client -- the chaos soak
    met it when a prefill was SIGKILLed under a retried request)."""
    n_tok = 8
    cl = Cluster(build, src, prefill=[("p1", 1)], decode=[("d1", 1)])
    try:
        cl.start("d1")
        cl.wait_worker("d1")
        g, c, d = cl.pb["generate"], cl.pb["common"], cl.pb["decode"]
        ids, _ = oracle(build, cl.model, prompt_ids=[1, 40, 41, 42, 43], max_tokens=n_tok,
                        extra=["--ignore-eos"])
        req = d.DecodeGenerateRequest(
            request=g.GenerateRequest(token_ids=c.TokenIds(ids=[1, 40, 41, 42, 43]),
                                      max_tokens=n_tok, ignore_eos=True,
                                      sampling=c.SamplingParams(temperature=0)),
            prefill_target=cl.address("p1"))
        stub = cl.pb["decode_grpc"].DecodeStub(cl.channel(cl.address("d1")))
        got = []
        for r in stub.Generate(req, timeout=60):
            if r.HasField("chunk"):
                got += list(r.chunk.ids)
        check(got == ids, "recomputed %s != oracle %s" % (got, ids))
        check("recomputing its prompt here" in cl.procs["d1"].log(None),
              "no recompute logged:\n%s" % cl.procs["d1"].log(1500))
        print("bootstrap: a request naming a prefill that is down was recomputed on decode")
        cl.stop_all()
    except BaseException:
        cl.kill_all()
        raise


def test(build, src):
    queue_case(build, src)
    stall_case(build, src)
    bootstrap_case(build, src)


if __name__ == "__main__":
    main(test)
