#!/usr/bin/python3
"""Write a GGUF v3 file (llama architecture, all tensors f32) from a Hugging
Face Llama checkpoint directory: config.json + model.safetensors (F32) +
tokenizer.json (a SentencePiece-style BPE with byte fallback, as
stories260K's). Python standard library only.

  bench/peer/st_to_gguf.py MODEL_DIR OUT.gguf [--name NAME]

What it writes (the facts llama.cpp's `llama` architecture reads):

* metadata: general.architecture "llama", llama.context_length,
  embedding_length, block_count, feed_forward_length, attention.head_count,
  attention.head_count_kv, attention.layer_norm_rms_epsilon, rope.freq_base,
  rope.dimension_count, vocab_size; general.file_type 0 (all f32).
* tensors: token_embd, output_norm, output (omitted when the embeddings are
  tied: llama.cpp then reuses token_embd), and per layer blk.N.attn_norm,
  attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down.
  GGUF lists dimensions fastest first, so a [rows, cols] safetensors matrix
  is written with dims (cols, rows) and the same bytes.
* RoPE: Hugging Face Llama checkpoints rotate dimension i of a head with
  dimension i + head_dim/2 ("rotate_half"); llama.cpp's llama architecture
  rotates adjacent pairs (2i, 2i+1). The Q and K projection rows of each head
  are therefore reordered: HF row (half*head_dim/2 + i) becomes GGUF row
  (2*i + half). The attention scores are unchanged because Q and K get the
  same reordering.
* tokenizer: tokenizer.ggml.model "llama" (llama.cpp's SentencePiece
  tokenizer): tokens, scores, token types, bos/eos/unk ids, add_bos true,
  add_eos false, add_space_prefix true (tokenizer.json's normalizer
  prepends "\u2581"). llama.cpp merges the adjacent pair whose joined text
  is a token with the highest score; the HF BPE merges the pair of lowest
  merge rank. Each token made by a merge gets score -(rank of the first
  merge producing it), so the two agree; the converter refuses a
  tokenizer.json whose merges are not exactly the adjacent vocabulary pairs
  (then no score order could reproduce it).
"""
import argparse
import json
import os
import struct
import sys

ALIGN = 32

# GGUF metadata value types
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
# llama.cpp token types
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_BYTE = 1, 2, 3, 6
GGML_TYPE_F32 = 0


class ConvertError(Exception):
    pass


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ConvertError("cannot read %s: %s" % (path, e.strerror))
    except ValueError as e:
        raise ConvertError("%s: not valid JSON: %s" % (path, e))


def read_safetensors(path):
    """Returns {name: (shape, bytes)} for an all-F32 safetensors file."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise ConvertError("cannot read %s: %s" % (path, e.strerror))
    if len(blob) < 8:
        raise ConvertError("%s: shorter than its 8-byte header length" % path)
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    if 8 + hlen > len(blob):
        raise ConvertError("%s: header length %d runs past the file" % (path, hlen))
    try:
        header = json.loads(blob[8:8 + hlen])
    except ValueError as e:
        raise ConvertError("%s: header is not JSON: %s" % (path, e))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info.get("dtype") != "F32":
            raise ConvertError("%s: tensor %s is %s; only F32 is converted"
                               % (path, name, info.get("dtype")))
        shape = list(info["shape"])
        begin, end = info["data_offsets"]
        n = 1
        for d in shape:
            n *= d
        if end - begin != 4 * n or base + end > len(blob):
            raise ConvertError("%s: tensor %s has %d bytes for shape %s"
                               % (path, name, end - begin, shape))
        out[name] = (shape, blob[base + begin:base + end])
    return out


def rope_rows_to_adjacent(data, n_heads, head_dim, row_bytes):
    """Reorder the rows of a Q or K projection from HF rotate_half pairing
    to llama.cpp's adjacent pairing (see the module doc)."""
    half = head_dim // 2
    rows = [data[r * row_bytes:(r + 1) * row_bytes] for r in range(n_heads * head_dim)]
    out = []
    for h in range(n_heads):
        for i in range(half):
            for part in range(2):
                out.append(rows[h * head_dim + part * half + i])
    return b"".join(out)


def tokenizer_meta(tok_path, vocab_size):
    tj = load_json(tok_path)
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError("%s: model.type is %r; only BPE is converted" % (tok_path, model.get("type")))
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or len(vocab) != vocab_size:
        raise ConvertError("%s: model.vocab has %s entries, config.json vocab_size is %d"
                           % (tok_path, len(vocab) if isinstance(vocab, dict) else "no", vocab_size))
    tokens = [None] * vocab_size
    for text, i in vocab.items():
        if not (0 <= i < vocab_size) or tokens[i] is not None:
            raise ConvertError("%s: model.vocab id %r of %r is out of range or repeated"
                               % (tok_path, i, text))
        tokens[i] = text
    merges = []
    for m in model.get("merges") or []:
        pair = m.split(" ") if isinstance(m, str) else m
        if len(pair) != 2:
            raise ConvertError("%s: merge %r is not a pair" % (tok_path, m))
        merges.append((pair[0], pair[1]))
    # Every merge must join two tokens into a token, and every adjacent
    # vocabulary pair that joins into a token must be a merge.
    special = {a["content"] for a in tj.get("added_tokens") or [] if a.get("special")}
    plain = [t for t in tokens if t not in special and not is_byte_token(t)]
    plain_set = set(plain)
    pairs = {(a, b) for a in plain for b in plain if a + b in plain_set}
    if set(merges) != pairs:
        raise ConvertError("%s: the merges are not exactly the adjacent vocabulary pairs "
                           "(%d merges, %d pairs): llama.cpp's score-ordered merging "
                           "would tokenize differently" % (tok_path, len(merges), len(pairs)))
    scores = [0.0] * vocab_size
    scored = set()
    for rank, (a, b) in enumerate(merges):
        i = vocab[a + b]
        if i not in scored:
            scores[i] = -float(rank)
            scored.add(i)
    types = []
    for i, t in enumerate(tokens):
        if t in special:
            types.append(TOK_UNKNOWN if t == model.get("unk_token") else TOK_CONTROL)
        elif is_byte_token(t):
            types.append(TOK_BYTE)
        else:
            types.append(TOK_NORMAL)
        if i not in scored and types[-1] == TOK_NORMAL:
            # single characters: never produced by a merge, below every merge
            scores[i] = -float(len(merges) + i)
    return tokens, scores, types, tj


def is_byte_token(t):
    return len(t) == 6 and t.startswith("<0x") and t.endswith(">")


class Writer:
    def __init__(self):
        self.kv = []
        self.tensors = []

    def add(self, key, vtype, value):
        self.kv.append((key, vtype, value))

    def tensor(self, name, shape, data):
        self.tensors.append((name, shape, data))

    @staticmethod
    def _str(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _value(self, vtype, v):
        if vtype == T_UINT32:
            return struct.pack("<I", v)
        if vtype == T_INT32:
            return struct.pack("<i", v)
        if vtype == T_FLOAT32:
            return struct.pack("<f", v)
        if vtype == T_BOOL:
            return struct.pack("<B", 1 if v else 0)
        if vtype == T_STRING:
            return self._str(v)
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(self._value(etype, x) for x in items)

    def write(self, path):
        head = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        for key, vtype, v in self.kv:
            head.append(self._str(key) + struct.pack("<I", vtype) + self._value(vtype, v))
        offset = 0
        placed = []
        for name, shape, data in self.tensors:
            dims = list(reversed(shape))  # GGUF: fastest dimension first
            head.append(self._str(name) + struct.pack("<I", len(dims)) +
                        b"".join(struct.pack("<Q", d) for d in dims) +
                        struct.pack("<IQ", GGML_TYPE_F32, offset))
            placed.append((offset, data))
            offset += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        hdr = b"".join(head)
        hdr += b"\0" * ((-len(hdr)) % ALIGN)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(hdr)
            for off, data in placed:
                f.write(data)
                f.write(b"\0" * ((-len(data)) % ALIGN))
        os.replace(tmp, path)


def need(cfg, key, path):
    if key not in cfg:
        raise ConvertError("%s: missing %r" % (path, key))
    return cfg[key]


def convert(model_dir, out, name):
    cfg_path = os.path.join(model_dir, "config.json")
    cfg = load_json(cfg_path)
    if cfg.get("model_type") != "llama":
        raise ConvertError("%s: model_type is %r; only llama is converted"
                           % (cfg_path, cfg.get("model_type")))
    n_embd = need(cfg, "hidden_size", cfg_path)
    n_layer = need(cfg, "num_hidden_layers", cfg_path)
    n_head = need(cfg, "num_attention_heads", cfg_path)
    n_head_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or n_embd // n_head
    n_vocab = need(cfg, "vocab_size", cfg_path)
    if head_dim * n_head != n_embd or head_dim % 2:
        raise ConvertError("%s: head_dim %d x %d heads != hidden_size %d (or odd head_dim)"
                           % (cfg_path, head_dim, n_head, n_embd))
    if cfg.get("rope_scaling"):
        raise ConvertError("%s: rope_scaling is set; not converted" % cfg_path)

    st = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    tokens, scores, types, tj = tokenizer_meta(os.path.join(model_dir, "tokenizer.json"), n_vocab)

    w = Writer()
    w.add("general.architecture", T_STRING, "llama")
    w.add("general.name", T_STRING, name)
    w.add("general.file_type", T_UINT32, 0)
    w.add("general.alignment", T_UINT32, ALIGN)
    w.add("llama.vocab_size", T_UINT32, n_vocab)
    w.add("llama.context_length", T_UINT32, need(cfg, "max_position_embeddings", cfg_path))
    w.add("llama.embedding_length", T_UINT32, n_embd)
    w.add("llama.block_count", T_UINT32, n_layer)
    w.add("llama.feed_forward_length", T_UINT32, need(cfg, "intermediate_size", cfg_path))
    w.add("llama.attention.head_count", T_UINT32, n_head)
    w.add("llama.attention.head_count_kv", T_UINT32, n_head_kv)
    w.add("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg.get("rms_norm_eps", 1e-5)))
    w.add("llama.rope.freq_base", T_FLOAT32, float(cfg.get("rope_theta", 10000.0)))
    w.add("llama.rope.dimension_count", T_UINT32, head_dim)

    added = {a["content"]: a["id"] for a in tj.get("added_tokens") or []}
    unk = tj["model"].get("unk_token")
    w.add("tokenizer.ggml.model", T_STRING, "llama")
    w.add("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens))
    w.add("tokenizer.ggml.scores", T_ARRAY, (T_FLOAT32, scores))
    w.add("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types))
    w.add("tokenizer.ggml.bos_token_id", T_UINT32, cfg.get("bos_token_id", added.get("<s>", 1)))
    w.add("tokenizer.ggml.eos_token_id", T_UINT32, cfg.get("eos_token_id", added.get("</s>", 2)))
    if unk in added:
        w.add("tokenizer.ggml.unknown_token_id", T_UINT32, added[unk])
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, True)
    w.add("tokenizer.ggml.add_eos_token", T_BOOL, False)
    w.add("tokenizer.ggml.add_space_prefix", T_BOOL, True)

    def take(hf, shape=None):
        if hf not in st:
            raise ConvertError("model.safetensors: tensor %s is missing" % hf)
        s, data = st.pop(hf)
        if shape is not None and s != shape:
            raise ConvertError("model.safetensors: %s has shape %s, expected %s" % (hf, s, shape))
        return s, data

    w.tensor("token_embd.weight", *take("model.embed_tokens.weight", [n_vocab, n_embd]))
    w.tensor("output_norm.weight", *take("model.norm.weight", [n_embd]))
    if "lm_head.weight" in st:
        w.tensor("output.weight", *take("lm_head.weight", [n_vocab, n_embd]))
    elif not cfg.get("tie_word_embeddings", False):
        raise ConvertError("model.safetensors: no lm_head.weight and tie_word_embeddings is false")
    kv_dim = n_head_kv * head_dim
    for i in range(n_layer):
        p = "model.layers.%d." % i
        b = "blk.%d." % i
        w.tensor(b + "attn_norm.weight", *take(p + "input_layernorm.weight", [n_embd]))
        s, q = take(p + "self_attn.q_proj.weight", [n_embd, n_embd])
        w.tensor(b + "attn_q.weight", s, rope_rows_to_adjacent(q, n_head, head_dim, 4 * n_embd))
        s, k = take(p + "self_attn.k_proj.weight", [kv_dim, n_embd])
        w.tensor(b + "attn_k.weight", s, rope_rows_to_adjacent(k, n_head_kv, head_dim, 4 * n_embd))
        w.tensor(b + "attn_v.weight", *take(p + "self_attn.v_proj.weight", [kv_dim, n_embd]))
        w.tensor(b + "attn_output.weight", *take(p + "self_attn.o_proj.weight", [n_embd, n_embd]))
        w.tensor(b + "ffn_norm.weight", *take(p + "post_attention_layernorm.weight", [n_embd]))
        w.tensor(b + "ffn_gate.weight", *take(p + "mlp.gate_proj.weight"))
        w.tensor(b + "ffn_up.weight", *take(p + "mlp.up_proj.weight"))
        w.tensor(b + "ffn_down.weight", *take(p + "mlp.down_proj.weight"))
    if st:
        raise ConvertError("model.safetensors: tensors not converted: %s" % ", ".join(sorted(st)))
    w.write(out)
    return len(w.tensors), len(w.kv)


def main():
    ap = argparse.ArgumentParser(description="safetensors Llama checkpoint -> GGUF v3 (f32)")
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--name", default=None, help="general.name (default: the directory name)")
    a = ap.parse_args()
    name = a.name or os.path.basename(os.path.normpath(a.model_dir))
    try:
        nt, nkv = convert(a.model_dir, a.out, name)
    except ConvertError as e:
        print("st_to_gguf: %s" % e, file=sys.stderr)
        return 1
    print("wrote %s: %d tensors, %d metadata keys" % (a.out, nt, nkv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
