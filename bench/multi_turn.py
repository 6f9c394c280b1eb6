"""Multi-turn conversations against a router (bench/prefix_serve.py's
`multiturn` workload; docs/prefix-cache.md "Generated pages").

Each session starts with a unique first prompt and runs its turns one after
another: turn k+1's prompt is turn k's prompt + turn k's output ids + new
user tokens (as a chat client resends the conversation), sent by token ids
through the router's gRPC Generate.  Sessions arrive as a Poisson process
at the given rate; turn 1 of a session is a cold prompt, later turns carry
the previous answer, whose KV decode keeps when the prefix cache is on.

Returns one "run" shaped like bench-serve's (request_rate,
request_throughput, request_goodput, median/p99 TTFT and median TPOT, in
ms), over every request, plus the same for the later turns alone
(later_turns_*).
"""
import random
import threading
import time


def _pct(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def _ids(rng, n, vocab):
    return [rng.randrange(3, vocab) for _ in range(n)]


def run(cl, rate, n_sessions, turns=5, first_len=64, new_len=16, out_len=32, vocab=512,
        slo_ttft_ms=100, slo_tpot_ms=5, seed=1):
    """n_sessions conversations of `turns` turns at `rate` sessions/s
    against cl's router (router_cluster.Cluster)."""
    rng = random.Random(seed)
    sessions = [([1] + _ids(rng, first_len - 1, vocab),
                 [_ids(rng, new_len, vocab) for _ in range(turns - 1)])
                for _ in range(n_sessions)]
    gaps = [rng.expovariate(float(rate)) for _ in range(n_sessions)]
    results, lock, errors = [], threading.Lock(), []

    def session(first, news):
        stub = cl.router_stub()
        prompt = list(first)
        for t in range(turns):
            t0 = time.monotonic()
            t_first, out = None, []
            try:
                for r in stub.Generate(cl.gen_request(prompt, max_tokens=out_len,
                                                      ignore_eos=True), timeout=120):
                    if r.HasField("chunk"):
                        if t_first is None:
                            t_first = time.monotonic()
                        out += list(r.chunk.ids)
            except Exception as e:  # noqa: BLE001 - counted, the session stops
                with lock:
                    errors.append(str(e))
                return
            t_end = time.monotonic()
            with lock:
                results.append((t, (t_first - t0) * 1e3,
                                (t_end - t_first) * 1e3 / max(1, len(out) - 1)))
            if t + 1 < turns:
                prompt = prompt + out + news[t]

    threads = []
    start = time.monotonic()
    for (first, news), gap in zip(sessions, gaps):
        time.sleep(gap)
        th = threading.Thread(target=session, args=(first, news))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    wall = time.monotonic() - start
    if errors:
        raise SystemExit("multiturn: %d requests failed, e.g. %s" % (len(errors), errors[0]))

    def stats(rows, prefix=""):
        ttft = [r[1] for r in rows]
        tpot = [r[2] for r in rows]
        good = sum(1 for r in rows if r[1] <= slo_ttft_ms and r[2] <= slo_tpot_ms)
        return {prefix + "requests": len(rows),
                prefix + "median_ttft_ms": _pct(ttft, 0.5),
                prefix + "p99_ttft_ms": _pct(ttft, 0.99),
                prefix + "median_tpot_ms": _pct(tpot, 0.5),
                prefix + "goodput_share": good / max(1, len(rows))}

    allr = stats(results)
    r = {"request_rate": rate, "sessions": n_sessions, "turns": turns,
         "request_throughput": len(results) / wall,
         "request_goodput": allr["goodput_share"] * len(results) / wall, **allr,
         **stats([x for x in results if x[0] > 0], "later_turns_")}
    return [r]
