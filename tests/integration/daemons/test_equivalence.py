#!/usr/bin/python3
"""The core test (DESIGN §10): duet-prefill (TP=P) + duet-decode (TP=D),
real processes on 127.0.0.1 moving KV over UCX, give the greedy tokens of
`duet generate --tp 1`, for (P, D) in {(1,1), (1,2), (2,1), (2,4), (4,2),
(1,4), (4,1)}, on stories260K (4 KV heads) and synthetic models with 1, 2
and 8 KV heads, for a prompt shorter than a page, one of exactly a page
and one spanning many pages; a llama3-scaled Llama and a yarn-scaled Qwen3
(q/k norms, attention factor) whose original context (32 positions) the
long prompt runs past, on fewer pairs.  Then 32 concurrent requests of
mixed lengths through one pair, every one correct, pages back at baseline.

usage: test_equivalence.py BUILD_DIR SOURCE_DIR [--quick]
"""
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from duet_cluster import Cluster, mkmodel, reference_ids  # noqa: E402

BUILD, SRC = sys.argv[1], sys.argv[2]
PAIRS = [(1, 1), (1, 2), (2, 1), (2, 4), (4, 2), (1, 4), (4, 1)]
PAGE = 16
GEN = 12


def prompts(vocab):
    def ids(n, salt):
        return [1] + [(i * 37 + salt * 11 + 3) % (vocab - 3) + 3 for i in range(n - 1)]
    return {"short": ids(5, 1), "one-page": ids(PAGE, 2), "many-pages": ids(7 * PAGE + 3, 3)}


def check_model(name, model, vocab, failures, pairs=PAIRS):
    ps = prompts(vocab)
    refs = {k: reference_ids(BUILD, model, p, GEN, ignore_eos=True) for k, p in ps.items()}
    early = 0  # packed, P != D: layers decode unpacked before their transfer ended
    for P, D in pairs:
        c = Cluster(BUILD, SRC, model, prefill=[("p0", P)], decode=[("d0", D)], page_size=PAGE,
                    n_pages=128)
        try:
            c.start_all()
            want_packed = os.environ.get("DUET_KV_TRANSFER_PACK") == "on"
            if c.info("d0").transfer_packed != want_packed:
                failures.append((name, P, D, "decode Info.transfer_packed is not %s" % want_packed))
            for k, p in ps.items():
                ids, _, fin = c.generate("d0", p, max_tokens=GEN, ignore_eos=True)
                ok = ids == refs[k] and fin.completion_tokens == GEN
                print("%-12s P=%d D=%d %-10s %s" % (name, P, D, k, "ok" if ok else
                                                     "FAIL got %s want %s" % (ids, refs[k])))
                if not ok:
                    failures.append((name, P, D, k))
            bad = c.pages_at_baseline()
            if bad:
                failures.append((name, P, D, "pages: " + "; ".join(bad)))
                print("  pages not back:", bad)
            if want_packed and P != D and \
                    os.environ.get("DUET_KV_TRANSFER_PROGRESS", "auto") != "off":
                info = c.info("d0")
                if info.transfer_progress_layers < 1:
                    failures.append((name, P, D, "decode asks for no progress messages"))
                early += info.kv_unpacked_early_layers
        finally:
            c.close()
    if os.environ.get("DUET_KV_TRANSFER_PACK") == "on" and \
            os.environ.get("DUET_KV_TRANSFER_PROGRESS", "auto") != "off":
        # prefill computes layer by layer and announces every
        # transfer_progress_layers of them (auto on the cpu backend, no GPU
        # shared: every request too): over all these requests, some layers
        # must have been unpacked while the rest was in flight
        print("%-12s layers unpacked early: %d" % (name, early))
        if early == 0:
            failures.append((name, "packed", "no layer was unpacked before its transfer ended"))


def concurrent(model, vocab, failures):
    """32 requests of mixed lengths at once through one P=2 x D=4 pair."""
    reqs = []
    for i in range(32):
        n = [1, 3, 15, 16, 17, 40, 90][i % 7] + i % 5
        reqs.append([1] + [(j * 13 + i * 7 + 5) % (vocab - 3) + 3 for j in range(n - 1)])
    refs = [reference_ids(BUILD, model, p, 10, ignore_eos=True) for p in reqs]
    c = Cluster(BUILD, SRC, model, prefill=[("p0", 2)], decode=[("d0", 4)], page_size=PAGE,
                n_pages=256)
    results = [None] * len(reqs)
    try:
        c.start_all()

        def run(i):
            try:
                results[i] = c.generate("d0", reqs[i], max_tokens=10, ignore_eos=True)[0]
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = e
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        wrong = [i for i in range(len(reqs)) if results[i] != refs[i]]
        print("concurrent: %d/%d correct" % (len(reqs) - len(wrong), len(reqs)))
        for i in wrong:
            print("  request %d (%d tokens): got %s want %s" % (i, len(reqs[i]), results[i],
                                                              refs[i]))
            failures.append(("concurrent", i))
        bad = c.pages_at_baseline()
        if bad:
            failures.append(("concurrent pages", bad))
            print("  pages not back:", bad)
    finally:
        c.close()


def main():
    failures = []
    tmp = tempfile.mkdtemp(prefix="duet_equiv_")
    models = [("stories260K", os.path.join(SRC, "models", "stories260K"), 512)]
    for kv in (1, 2, 8):
        path = mkmodel(BUILD, os.path.join(tmp, "kv%d" % kv), layers=2, hidden=64, heads=8,
                       kv_heads=kv, head_dim=8, intermediate=96, vocab=300, max_pos=512,
                       seed=40 + kv)
        models.append(("synthetic-kv%d" % kv, path, 300))
    if "--quick" in sys.argv:
        models = models[:1]
    for name, path, vocab in models:
        check_model(name, path, vocab, failures)
    if "--quick" not in sys.argv:
        scaled = [
            ("llama3-rope", mkmodel(BUILD, os.path.join(tmp, "llama3"), layers=2, hidden=64,
                                    heads=4, kv_heads=2, intermediate=96, vocab=300,
                                    max_pos=512, seed=50, rope_scaling=(
                                        '{"rope_type": "llama3", "factor": 8.0, '
                                        '"low_freq_factor": 1.0, "high_freq_factor": 4.0, '
                                        '"original_max_position_embeddings": 32}'))),
            ("qwen3-yarn", mkmodel(BUILD, os.path.join(tmp, "qwen3"), arch="qwen3", layers=2,
                                   hidden=64, heads=4, kv_heads=2, head_dim=32,
                                   intermediate=96, vocab=300, max_pos=512, tied=True, seed=51,
                                   rope_scaling=('{"rope_type": "yarn", "factor": 4.0, '
                                                 '"original_max_position_embeddings": 32}'))),
        ]
        for name, path in scaled:
            check_model(name, path, 300, failures, pairs=[(1, 1), (2, 4), (4, 1)])
    concurrent(models[0][1], models[0][2], failures)
    if failures:
        sys.exit("FAIL: %d mismatches: %s" % (len(failures), failures))
    print("all disaggregated runs equal duet generate --tp 1")


if __name__ == "__main__":
    main()
