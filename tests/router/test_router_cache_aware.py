#!/usr/bin/python3
"""duet-router's cache_aware policy over two prefill and two decode
instances (real daemons, HTTP /v1/completions):

  1. sequential requests of three prompt groups (each group: one long
     shared prefix, different tails) -- every request of a group goes to the
     same prefill and the same decode, the repeats are counted as "prefix"
     routes with a matched prefix, and the router tells the decode its
     matched length (router_cached_tokens, seen in the router's debug log);
  2. with tight balance thresholds, concurrent requests of one group: the
     load imbalance overrides the prefix (both decodes serve the group, and
     "balance" routes are counted);
  3. a two-turn conversation by token ids (gRPC): turn 2 (turn 1's prompt +
     output + new tokens) goes to the decode that ran turn 1, matching its
     output's pages there, and hits them in that decode's cache;
and every output equals `duet generate --tp 1` (greedy).

usage: test_router_cache_aware.py BUILD_DIR SOURCE_DIR
"""
import re
import threading

from router_cluster import Cluster, check, detok, main, oracle, completion

PREFIXES = {
    "A": "Once upon a time, there was a little girl named Lily. She loved to play outside "
         "in the park with her big red ball and her friend Tom.",
    "B": "Tim and his mom went to the store to buy some food. They saw a big dog that "
         "was sad because it was lost and could not find its home.",
    "C": "In a small house by the sea lived an old cat. Every morning the cat sat by "
         "the window and looked at the birds flying over the water.",
}
TAILS = [" One day,", " Then she said,", " The sun was"]
N_TOKENS = 24


def served(cl, names, before):
    """The names whose requests_total grew since before (updated)."""
    out = []
    for n in names:
        t = cl.info(n).requests_total
        if t != before[n]:
            out.append(n)
            before[n] = t
    return out


def metric(m, series, **labels):
    """The sum of the series with these labels (m: cl.metrics())."""
    total = 0.0
    for k, v in m.items():
        if k.startswith(series + "{") and \
                all('%s="%s"' % (lk, lv) in k for lk, lv in labels.items()):
            total += v
    return total


def generate_ids(cl, prompt, n):
    """Greedy ids through the router's gRPC Generate."""
    out = []
    for r in cl.router_stub().Generate(cl.gen_request(prompt, max_tokens=n, ignore_eos=True),
                                       timeout=60):
        if r.HasField("chunk"):
            out += list(r.chunk.ids)
    return out


def conversation(cl, build, names):
    """Turn 1: a 20-token prompt (1 full page) and 60 output tokens; turn 2
    = turn 1's prompt + output + 5 new tokens.  The router recorded turn 1's
    output on its decode (docs/kv-aware-routing.md "Generated tokens"): 64
    of turn 2's 85 tokens match there (pages 0..3; page 4 holds the last
    output token, whose KV decode never computed), a "prefix" route, and
    decode's own cache hits those 4 pages.  Prefill never saw the output:
    its match is the 16-token first page only (under min_match_ratio)."""
    p1 = [1] + [(i * 37 + 5) % 509 + 3 for i in range(19)]
    out1 = oracle(build, cl.model, prompt_ids=p1, max_tokens=60, extra=["--ignore-eos"])[0]
    before = {n: cl.info(n).requests_total for n in names}
    check(generate_ids(cl, p1, 60) == out1, "turn 1 differs from duet generate")
    where = served(cl, names, before)
    home = [n for n in where if n.startswith("d")]
    check(len(home) == 1, "turn 1 served by %s" % where)
    home = home[0]
    m0, h0 = cl.metrics(), cl.info(home).cache_hit_pages
    check(metric(m0, "duet_router_cache_aware_output_tokens_total", role="decode", name=home)
          >= 59 and metric(m0, "duet_router_cache_aware_output_tokens_total", role="prefill")
          == 0, "the router recorded turn 1's output on %s only" % home)
    p2 = p1 + out1 + [7, 8, 9, 10, 11]
    out2 = oracle(build, cl.model, prompt_ids=p2, max_tokens=8, extra=["--ignore-eos"])[0]
    check(generate_ids(cl, p2, 8) == out2, "turn 2 differs from duet generate")
    where = served(cl, names, before)
    check(home in where, "turn 2 went to %s, turn 1 to %s" % (where, home))
    m1 = cl.metrics()
    dm = {k: metric(m1, k, role="decode", name=home) - metric(m0, k, role="decode", name=home)
          for k in ("duet_router_cache_aware_matched_tokens_total",
                    "duet_router_cache_aware_routed_total")}
    check(dm["duet_router_cache_aware_matched_tokens_total"] == 64,
          "turn 2 matched %d tokens on %s, not 64" %
          (dm["duet_router_cache_aware_matched_tokens_total"], home))
    check(metric(m1, "duet_router_cache_aware_routed_total", role="decode", name=home,
                 reason="prefix") -
          metric(m0, "duet_router_cache_aware_routed_total", role="decode", name=home,
                 reason="prefix") == 1, "turn 2 was not a prefix route")
    hits = cl.info(home).cache_hit_pages - h0
    check(hits == 4, "decode %s hit %d pages of turn 2, not 4" % (home, hits))
    print("conversation: both turns on %s, turn 2 matched 64 tokens, %d pages hit" %
          (home, hits))


def test(build, src):
    cl = Cluster(build, src, prefill=[("p0", 1), ("p1", 1)], decode=[("d0", 1), ("d1", 1)],
                 router={"policy": "cache_aware"}, env={"DUET_LOG_LEVEL": "debug"})
    try:
        exp = {}
        for g, pre in PREFIXES.items():
            for t in TAILS:
                ids, _ = oracle(build, cl.model, prompt=pre + t, max_tokens=N_TOKENS)
                exp[pre + t] = (ids, detok(cl.model, ids))
        cl.start_workers()
        names = ["p0", "p1", "d0", "d1"]

        # 1. groups stick to their instances
        cl.start_router()
        before = {n: cl.info(n).requests_total for n in names}
        homes = {}
        for rnd in range(2):
            for g, pre in PREFIXES.items():
                for t in TAILS:
                    st, r = completion(cl, pre + t, N_TOKENS)
                    check(st == 200 and r["choices"][0]["text"] == exp[pre + t][1],
                          "%s: %d %s, expected %r" % (pre + t, st, r, exp[pre + t][1]))
                    where = served(cl, names, before)
                    dec = [n for n in where if n.startswith("d")]
                    pre_ = [n for n in where if n.startswith("p")]
                    # decode's prefix cache: once it holds all but a
                    # prompt's last page (a repeated prompt, or a tail
                    # within the last page), no prefill runs
                    check(len(dec) == 1 and len(pre_) <= 1,
                          "%s (round %d) served by %s" % (pre + t, rnd, where))
                    homes.setdefault(g, (set(), set()))
                    homes[g][0].update(pre_)
                    homes[g][1].update(dec)
        print("homes (prefill, decode): %s" % homes)
        for g, (hp, hd) in homes.items():
            check(len(hp) == 1 and len(hd) == 1,
                  "group %s went to several instances: %s %s" % (g, hp, hd))
        check(len({list(hd)[0] for hp, hd in homes.values()}) == 2,
              "three groups on one decode: %s" % homes)
        m = cl.metrics()
        n_req = 2 * len(PREFIXES) * len(TAILS)
        for role in ("prefill", "decode"):
            prefix = metric(m, "duet_router_cache_aware_routed_total", role=role, reason="prefix")
            load = metric(m, "duet_router_cache_aware_routed_total", role=role, reason="load")
            check(prefix == n_req - len(PREFIXES) and load == len(PREFIXES),
                  "%s: %d prefix / %d load routes, expected %d / %d" %
                  (role, prefix, load, n_req - len(PREFIXES), len(PREFIXES)))
            matched = metric(m, "duet_router_cache_aware_matched_tokens_total", role=role)
            check(matched >= 16 * (n_req - len(PREFIXES)), "%s: matched tokens %d" %
                  (role, matched))
            check(metric(m, "duet_router_cache_aware_tree_tokens", role=role) > 0,
                  "%s: no tree tokens" % role)
        check(cl.stop("router") == 0, "router exit")
        hints = [int(x) for x in re.findall(r"router_cached_tokens (\d+)",
                                            cl.procs["router"].log(tail=None))]
        check(len(hints) == n_req and hints.count(0) == len(PREFIXES) and
              all(h >= 16 and h % 16 == 0 for h in hints if h),
              "router_cached_tokens sent: %s" % hints)

        # 2. load imbalance overrides the prefix
        cfg = cl.write_config(cl.tmp + "/balance.json", router={
            "policy": "cache_aware",
            "cache_aware": {"balance_abs_threshold": 1, "balance_rel_threshold": 1.0}})
        cl.start_router(config=cfg)
        before = {n: cl.info(n).requests_total for n in names}
        pre = PREFIXES["A"]
        errors, lock = [], threading.Lock()

        def client(k):
            for i in range(4):
                text = pre + TAILS[(k + i) % len(TAILS)]
                st, r = completion(cl, text, N_TOKENS)
                if st != 200 or r["choices"][0]["text"] != exp[text][1]:
                    with lock:
                        errors.append("%s: %d %s" % (text, st, r))
        ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        check(not any(t.is_alive() for t in ts), "a client hung")
        check(not errors, "wrong results:\n" + "\n".join(errors))
        after = {n: cl.info(n).requests_total for n in names}
        delta = {n: after[n] - before[n] for n in names}
        print("group A under load: %s" % delta)
        check(delta["d0"] + delta["d1"] == 32, "decode counts %s" % delta)
        check(delta["d0"] > 0 and delta["d1"] > 0, "one decode served everything: %s" % delta)
        m = cl.metrics()
        balance = metric(m, "duet_router_cache_aware_routed_total", role="decode",
                         reason="balance")
        check(balance > 0, "no balance routes counted")
        print("balance routes (decode): %d" % balance)
        check(cl.stop("router") == 0, "router exit")
        check(not cl.pages_at_baseline(), "decode pages not back")

        # 3. a conversation: turn 2 follows turn 1's output to its decode
        cl.start_router()
        conversation(cl, build, names)
        check(cl.stop("router") == 0, "router exit")
        check(not cl.pages_at_baseline(), "decode pages not back")
    finally:
        cl.stop_all()


if __name__ == "__main__":
    main(test)
