#!/usr/bin/python3
"""bench/peer/st_to_gguf.py, read back by an independent GGUF reader:

1. structure: GGUF v3 header, the llama metadata from config.json, every
   tensor with its dims (fastest first), f32 type, aligned offsets, and the
   bytes of the unpermuted tensors equal to model.safetensors;
2. RoPE: for real Q/K rows of every layer, attention scores with HF's
   rotate_half RoPE on the safetensors rows equal those with llama.cpp's
   adjacent-pair RoPE on the GGUF rows (fails without the row permutation);
3. tokenizer: llama.cpp's SentencePiece merge rule (repeatedly merge the
   adjacent pair whose joined text is a token of highest score, leftmost on
   ties; byte fallback for what is left) over the GGUF's tokens and scores
   gives the reference ids of tests/data/tokenizers/ref_stories260K.json
   (what duet's tokenizer is tested against) for every case without literal
   special-token text (fails with llama.cpp's own HF converter's flat
   scores);
4. bad input: a missing tensor, a non-F32 dtype and merges that are not the
   vocabulary's pairs are refused with a message naming the problem.

usage: test_st_to_gguf.py SRC_DIR
"""
import heapq
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                      os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SRC, "models", "stories260K")
CONVERT = os.path.join(SRC, "bench", "peer", "st_to_gguf.py")
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what)


# -- an independent GGUF reader ------------------------------------------------

class Reader:
    def __init__(self, blob):
        self.b, self.o = blob, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.b[self.o:self.o + n].decode("utf-8")
        self.o += n
        return s

    def value(self, t):
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}
        if t in scalar:
            return self.take(scalar[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError("unknown GGUF value type %d" % t)


def read_gguf(path):
    with open(path, "rb") as f:
        blob = f.read()
    r = Reader(blob)
    assert blob[:4] == b"GGUF", "bad magic"
    r.o = 4
    ver, nt, nkv = r.take("I"), r.take("Q"), r.take("Q")
    kv = {}
    for _ in range(nkv):
        k = r.string()
        kv[k] = r.value(r.take("I"))
    tensors = {}
    for _ in range(nt):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        typ, off = r.take("I"), r.take("Q")
        tensors[name] = (dims, typ, off)
    align = kv.get("general.alignment", 32)
    base = (r.o + align - 1) // align * align
    data = {}
    for name, (dims, typ, off) in tensors.items():
        n = 1
        for d in dims:
            n *= d
        data[name] = blob[base + off:base + off + 4 * n]
    return ver, kv, tensors, data, align


def read_st(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack_from("<Q", blob)[0]
    h = json.loads(blob[8:8 + n])
    return {k: (v["shape"], blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}


def floats(b):
    return list(struct.unpack("<%df" % (len(b) // 4), b))


# -- RoPE in both conventions ----------------------------------------------------

def rope_half(v, pos, theta):
    """HF rotate_half: pairs (i, i + d/2)."""
    d = len(v)
    out = list(v)
    for i in range(d // 2):
        a = pos * theta ** (-2.0 * i / d)
        c, s = math.cos(a), math.sin(a)
        x0, x1 = v[i], v[i + d // 2]
        out[i], out[i + d // 2] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


def rope_adjacent(v, pos, theta):
    """llama.cpp's normal RoPE: pairs (2i, 2i + 1)."""
    d = len(v)
    out = list(v)
    for i in range(d // 2):
        a = pos * theta ** (-2.0 * i / d)
        c, s = math.cos(a), math.sin(a)
        x0, x1 = v[2 * i], v[2 * i + 1]
        out[2 * i], out[2 * i + 1] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


def matvec(w, rows, cols, x):
    return [sum(w[r * cols + c] * x[c] for c in range(cols)) for r in range(rows)]


# -- llama.cpp's SentencePiece merge rule ------------------------------------------

def spm_tokenize(text, tokens, scores, bos):
    ids = [bos]
    if not text:
        return ids
    index = {t: i for i, t in enumerate(tokens)}
    s = ("\u2581" + text).replace(" ", "\u2581")
    sym = list(s)  # one symbol per character
    alive = [True] * len(sym)
    nxt = list(range(1, len(sym) + 1))
    prv = list(range(-1, len(sym) - 1))
    heap = []

    def bigram(i, j):
        if i < 0 or j >= len(sym):
            return
        t = index.get(sym[i] + sym[j])
        if t is not None:
            heapq.heappush(heap, (-scores[t], i, j, sym[i] + sym[j]))

    for i in range(len(sym) - 1):
        bigram(i, i + 1)
    while heap:
        _, i, j, joined = heapq.heappop(heap)
        if not (alive[i] and alive[j] and nxt[i] == j and sym[i] + sym[j] == joined):
            continue
        sym[i] = joined
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[j] < len(sym):
            prv[nxt[j]] = i
        bigram(prv[i], i)
        bigram(i, nxt[i])
    i = 0
    while i < len(sym):
        t = index.get(sym[i])
        if t is not None:
            ids.append(t)
        else:
            for byte in sym[i].encode("utf-8"):
                ids.append(index["<0x%02X>" % byte])
        i = nxt[i]
    return ids


def expect_refusal(tmp, mutate, needle):
    bad = os.path.join(tmp, "bad")
    if os.path.exists(bad):
        shutil.rmtree(bad)
    shutil.copytree(MODEL, bad)
    mutate(bad)
    r = subprocess.run([sys.executable, CONVERT, bad, os.path.join(tmp, "bad.gguf")],
                       capture_output=True, text=True)
    check(r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr,
          "refusal naming %r (rc %d, stderr %r)" % (needle, r.returncode, r.stderr[-300:]))
    check(not os.path.exists(os.path.join(tmp, "bad.gguf")), "no output left after a refusal")


def main():
    tmp = tempfile.mkdtemp(prefix="duet_peer_gguf_")
    try:
        out = os.path.join(tmp, "m.gguf")
        r = subprocess.run([sys.executable, CONVERT, MODEL, out], capture_output=True, text=True)
        check(r.returncode == 0, "conversion succeeds: %s" % r.stderr)
        cfg = json.load(open(os.path.join(MODEL, "config.json")))
        ver, kv, tensors, data, align = read_gguf(out)
        st = read_st(os.path.join(MODEL, "model.safetensors"))

        # 1. structure
        check(ver == 3, "GGUF version 3")
        want = {"general.architecture": "llama", "llama.block_count": cfg["num_hidden_layers"],
                "llama.embedding_length": cfg["hidden_size"],
                "llama.feed_forward_length": cfg["intermediate_size"],
                "llama.attention.head_count": cfg["num_attention_heads"],
                "llama.attention.head_count_kv": cfg["num_key_value_heads"],
                "llama.context_length": cfg["max_position_embeddings"],
                "llama.rope.dimension_count": cfg["head_dim"], "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.add_bos_token": True}
        for k, v in want.items():
            check(kv.get(k) == v, "metadata %s = %r (got %r)" % (k, v, kv.get(k)))
        check(abs(kv["llama.rope.freq_base"] - cfg["rope_theta"]) < 1e-3, "rope.freq_base")
        check(abs(kv["llama.attention.layer_norm_rms_epsilon"] - cfg["rms_norm_eps"]) < 1e-9,
              "rms eps")
        check(len(tensors) == len(st), "one GGUF tensor per safetensors tensor (%d, %d)"
              % (len(tensors), len(st)))
        check("output.weight" not in tensors, "tied embeddings: no output.weight")
        for name, (dims, typ, off) in tensors.items():
            check(typ == 0 and off % align == 0, "%s is f32 at an aligned offset" % name)
        check(tensors["token_embd.weight"][0] == [cfg["hidden_size"], cfg["vocab_size"]],
              "token_embd dims fastest first")
        check(tensors["blk.0.ffn_down.weight"][0] == [cfg["intermediate_size"], cfg["hidden_size"]],
              "ffn_down dims fastest first")
        check(data["token_embd.weight"] == st["model.embed_tokens.weight"][1], "embeddings bytes")
        check(data["blk.3.attn_v.weight"] == st["model.layers.3.self_attn.v_proj.weight"][1],
              "attn_v bytes")
        check(data["blk.4.ffn_gate.weight"] == st["model.layers.4.mlp.gate_proj.weight"][1],
              "ffn_gate bytes")

        # 2. RoPE: equal attention scores in both conventions
        hd, nh, nkv, e = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], \
            cfg["hidden_size"]
        rnd = random.Random(5)
        worst = 0.0
        for layer in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d.self_attn." % layer
            xq = [rnd.uniform(-1, 1) for _ in range(e)]
            xk = [rnd.uniform(-1, 1) for _ in range(e)]
            q_hf = matvec(floats(st[p + "q_proj.weight"][1]), nh * hd, e, xq)
            k_hf = matvec(floats(st[p + "k_proj.weight"][1]), nkv * hd, e, xk)
            q_gg = matvec(floats(data["blk.%d.attn_q.weight" % layer]), nh * hd, e, xq)
            k_gg = matvec(floats(data["blk.%d.attn_k.weight" % layer]), nkv * hd, e, xk)
            for h in range(nh):
                g = h // (nh // nkv)
                for pq, pk in ((7, 3), (100, 42), (511, 0)):
                    a = rope_half(q_hf[h * hd:(h + 1) * hd], pq, cfg["rope_theta"])
                    b = rope_half(k_hf[g * hd:(g + 1) * hd], pk, cfg["rope_theta"])
                    c = rope_adjacent(q_gg[h * hd:(h + 1) * hd], pq, cfg["rope_theta"])
                    d = rope_adjacent(k_gg[g * hd:(g + 1) * hd], pk, cfg["rope_theta"])
                    s1 = sum(x * y for x, y in zip(a, b))
                    s2 = sum(x * y for x, y in zip(c, d))
                    worst = max(worst, abs(s1 - s2) / (1e-6 + abs(s1)))
        check(worst < 1e-4, "RoPE scores equal across conventions (worst relative error %.2e)"
              % worst)

        # 3. tokenizer: llama.cpp's merge rule over the GGUF vocabulary
        ref = json.load(open(os.path.join(SRC, "tests", "data", "tokenizers",
                                          "ref_stories260K.json")))
        toks, scores = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.scores"]
        types = kv["tokenizer.ggml.token_type"]
        check(types[0] == 2 and types[1] == types[2] == 3 and types[3] == 6 and types[258] == 6
              and types[300] == 1, "token types: unk, control, byte, normal")
        checked, bad = 0, []
        for c in ref["cases"]:
            if any(s in c["text"] for s in ("<s>", "</s>", "<unk>")):
                continue  # llama-server splits these out as special tokens
            checked += 1
            got = spm_tokenize(c["text"], toks, scores, 1)
            if got != c["ids"]:
                bad.append(c["text"])
        check(checked > 150 and not bad, "SentencePiece merge rule gives the reference ids in "
              "%d of %d cases (first differing: %r)" % (checked - len(bad), checked, bad[:3]))

        # 4. bad input
        def drop_tensor(d):
            path = os.path.join(d, "model.safetensors")
            blob = open(path, "rb").read()
            n = struct.unpack_from("<Q", blob)[0]
            h = json.loads(blob[8:8 + n])
            del h["model.layers.2.self_attn.k_proj.weight"]
            hb = json.dumps(h).encode()
            open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + blob[8 + n:])

        def f16(d):
            path = os.path.join(d, "model.safetensors")
            blob = open(path, "rb").read()
            n = struct.unpack_from("<Q", blob)[0]
            h = json.loads(blob[8:8 + n])
            h["model.norm.weight"]["dtype"] = "F16"
            hb = json.dumps(h).encode()
            open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + blob[8 + n:])

        def drop_merge(d):
            path = os.path.join(d, "tokenizer.json")
            tj = json.load(open(path))
            tj["model"]["merges"] = tj["model"]["merges"][1:]
            json.dump(tj, open(path, "w"))

        expect_refusal(tmp, drop_tensor, "model.layers.2.self_attn.k_proj.weight is missing")
        expect_refusal(tmp, f16, "model.norm.weight is F16")
        expect_refusal(tmp, drop_merge, "merges are not exactly the adjacent vocabulary pairs")
    finally:
        shutil.rmtree(tmp)
    print("test_st_to_gguf: %s" % ("%d checks failed" % len(FAILS) if FAILS else "all checks passed"))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
