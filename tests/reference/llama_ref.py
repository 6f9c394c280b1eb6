#!/usr/bin/python3
"""Independent numpy reference of a Hugging Face Llama-family forward pass.

Reads config.json and model.safetensors (or a sharded index) directly and
computes the logits of every position of a prompt in float64, following the
transformers implementation (RMSNorm, rotate-half RoPE, GQA attention,
SwiGLU MLP, q/k/v bias for Qwen2, q/k/v and o_proj bias for a Llama with
attention_bias, Qwen3's per-head q_norm / k_norm before RoPE, tied
embeddings) and RoPE scaling as transformers' modeling_rope_utils defines
it (linear, llama3, yarn with its attention factor on cos and sin, dynamic
NTK over the prompt's length).  It shares no code with duet: it is the
oracle for tests/integration/test_forward_reference.py.

usage: llama_ref.py MODEL_DIR "1 2 3" OUT.f32 [LAST]   (writes [n][vocab] float32)

The ids may be given as @FILE (a long prompt outgrows the command line).
LAST: only the logits of the last LAST positions ([LAST][vocab]); the last
layer then computes its queries for those rows alone, so a one-layer model
is checked at 32K positions in seconds.
"""
import json
import os
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b:base + e]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError("unsupported dtype %s" % dt)
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    return out


def load_model(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    idx = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
        for f in files:
            tensors.update(load_safetensors(os.path.join(d, f)))
    else:
        tensors = load_safetensors(os.path.join(d, "model.safetensors"))
    return cfg, tensors


def rms_norm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * w


def rope_params(cfg, hd, seq_len):
    """(inv_freq [hd/2], attention factor) of config.json for a forward
    pass over seq_len positions, float64."""
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    factor = rs.get("factor")
    if kind == "dynamic":  # NTK: theta grows once the pass is past max_position_embeddings
        mp = cfg.get("max_position_embeddings", 2048)
        seq_len = max(seq_len, mp)
        base = theta * ((factor * seq_len / mp) - (factor - 1)) ** (hd / (hd - 2))
        return 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)), 1.0
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        orig = rs["original_max_position_embeddings"]
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        wave = 2 * np.pi / inv
        smooth = (orig / wave - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        return np.where(wave < orig / hi, inv,
                        np.where(wave > orig / lo, inv / factor, mid)), 1.0
    if kind == "yarn":
        orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        if factor is None:
            factor = cfg["max_position_embeddings"] / orig

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * np.log(scale) + 1.0
        attn = rs.get("attention_factor")
        if not attn:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                attn = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
            else:
                attn = mscale(factor)

        def corr_dim(rot):
            return hd * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(theta))
        lo, hi = corr_dim(rs.get("beta_fast") or 32), corr_dim(rs.get("beta_slow") or 1)
        if rs.get("truncate", True):
            lo, hi = np.floor(lo), np.ceil(hi)
        lo, hi = max(lo, 0), min(hi, hd - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(hd // 2) - lo) / (hi - lo), 0, 1)
        keep = 1 - ramp  # the share of the unscaled (extrapolated) frequency
        return inv / factor * (1 - keep) + inv * keep, float(attn)
    raise ValueError("rope_scaling type %s" % kind)


def rope(x, pos, inv, attn):
    # x: [n, heads, hd]; HF rotate_half convention, cos and sin times attn
    hd = x.shape[-1]
    ang = pos[:, None] * inv[None, :]                     # [n, hd/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :] * attn
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :] * attn
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    rot = np.concatenate([-x2, x1], -1)
    return x * cos + rot * sin


def forward(cfg, t, ids, last=None):
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    arch = cfg.get("architectures", [""])[0]
    qwen3 = arch == "Qwen3ForCausalLM" or cfg.get("model_type") == "qwen3"
    hd = cfg.get("head_dim") or (128 if qwen3 else H // nh)
    eps = cfg.get("rms_norm_eps", 1e-6)
    L = cfg["num_hidden_layers"]
    # LlamaAttention: every projection, o_proj included, has a bias when
    # attention_bias is set; Qwen2Attention: q/k/v only, always
    qwen2 = cfg.get("architectures", [""])[0] == "Qwen2ForCausalLM" or \
        cfg.get("model_type") == "qwen2"
    o_bias = cfg.get("attention_bias", False) and not qwen2
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    inv, attn = rope_params(cfg, hd, n)
    x = t["model.embed_tokens.weight"][ids]
    B = 512  # query rows per block: a long prompt's scores stay small
    for l in range(L):
        p = "model.layers.%d." % l
        h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        # the rows whose outputs are needed: all, but at the last layer
        # only the last `last` ones (their keys and values are all rows')
        a = n - last if last and l == L - 1 else 0
        m = n - a
        q = h[a:] @ t[p + "self_attn.q_proj.weight"].T
        k = h @ t[p + "self_attn.k_proj.weight"].T
        v = h @ t[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in t:
            q = q + t[p + "self_attn.q_proj.bias"]
            k = k + t[p + "self_attn.k_proj.bias"]
            v = v + t[p + "self_attn.v_proj.bias"]
        q = q.reshape(m, nh, hd)
        k = k.reshape(n, nkv, hd)
        if qwen3:  # Qwen3Attention: RMSNorm of each head, before RoPE
            q = rms_norm(q, t[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, t[p + "self_attn.k_norm.weight"], eps)
        q = rope(q, pos[a:], inv, attn)
        k = rope(k, pos, inv, attn)
        v = v.reshape(n, nkv, hd)
        g = nh // nkv
        out = np.zeros((m, nh, hd))
        for hh in range(nh):
            kh = k[:, hh // g, :]
            vh = v[:, hh // g, :]
            for b0 in range(0, m, B):
                b1 = min(m, b0 + B)
                # query rows a+b0 .. a+b1-1 see keys 0 .. their own position
                mask = np.triu(np.full((b1 - b0, a + b1), -np.inf), a + b0 + 1)
                s = q[b0:b1, hh, :] @ kh[:a + b1].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                s = s / s.sum(-1, keepdims=True)
                out[b0:b1, hh, :] = s @ vh[:a + b1]
        o = out.reshape(m, nh * hd) @ t[p + "self_attn.o_proj.weight"].T
        if o_bias:
            o = o + t[p + "self_attn.o_proj.bias"]
        x = x[a:] + o
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
        gate = h @ t[p + "mlp.gate_proj.weight"].T
        up = h @ t[p + "mlp.up_proj.weight"].T
        act = gate / (1.0 + np.exp(-gate)) * up
        x = x + act @ t[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, t["model.norm.weight"], eps)
    lm = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return x @ lm.T


def main():
    d, ids, out = sys.argv[1], sys.argv[2], sys.argv[3]
    last = int(sys.argv[4]) if len(sys.argv) > 4 else None
    cfg, t = load_model(d)
    if ids.startswith("@"):
        with open(ids[1:]) as f:
            ids = f.read()
    ids = [int(s) for s in ids.split()]
    logits = forward(cfg, t, ids, last)
    logits.astype(np.float32).tofile(out)


if __name__ == "__main__":
    main()
