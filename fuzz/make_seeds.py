#!/usr/bin/env python3
"""Write the seed corpora fuzz/corpus/<harness>/seed-* (deterministic; the
output is committed).  Regression inputs (regress-*) are added by hand when
a finding is fixed and are never rewritten here.

    fuzz/make_seeds.py            (from anywhere; needs protoc for the gRPC seeds)

Each harness's input layout is described at the top of fuzz/fuzz_<name>.c."""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def put(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def pb(message, text, proto):
    return subprocess.run(["protoc", "--encode=" + message, "-I", os.path.join(ROOT, "proto"),
                           proto], input=text.encode(), capture_output=True, check=True).stdout


def desc(role=1, rank=0, tp=1, kv_heads=4, layers=5, pages=64, page_size=16, head_dim=8,
         dtype=0, elem=4, rkey=b"rkey-bytes", addr=b"worker-address"):
    local = kv_heads // tp if kv_heads >= tp else 1
    pool = page_size * head_dim * elem * local * pages * layers * 2
    total = 92 + len(rkey) + len(addr) + 4
    b = struct.pack("<IHHIBBHHHIIIIIIQQQQQII", 0x44465844, 1, 0, total, role, dtype, rank, tp,
                    kv_heads, layers, pages, page_size, local, head_dim, elem, 0x1234, 0x5678,
                    0x9abc, 0x100000, pool, len(rkey), len(addr)) + rkey + addr
    return b + struct.pack("<I", crc32c(b))


def msg(kind=1, flags=1, status=0):
    return struct.pack("<IHHQQQHHiIIQq", 0x4d4e5844, 1, kind, 42, 7, 9, 0, 1, status, flags,
                       0xdeadbeef, 4096, 17)


def seeds_xfer_wire():
    put("xfer_wire", "desc-prefill", b"\x00" + desc())
    put("xfer_wire", "desc-decode-tp4", b"\x00" + desc(role=2, rank=3, tp=4, kv_heads=2, dtype=2,
                                                       elem=2))
    put("xfer_wire", "desc-fixcrc", b"\x02" + desc(tp=2, rank=1, kv_heads=8))
    put("xfer_wire", "notify", b"\x01" + msg())
    put("xfer_wire", "ack-error", b"\x01" + msg(kind=2, flags=2, status=-5))


def st_file(tensors, meta=True):
    header, data, off = {}, b"", 0
    if meta:
        header["__metadata__"] = {"format": "pt"}
    for name, dtype, shape, size in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        data += bytes(range(size % 256)) * (size // 256) + bytes(size % 256)
        off += size
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors():
    one = st_file([("w", "F32", [2, 3], 24), ("b", "BF16", [3], 6), ("e", "F16", [0], 0)])
    put("safetensors", "single", b"\x00" + one)
    put("safetensors", "i8", b"\x00" + st_file([("q", "I8", [4], 4)], meta=False))
    shard = st_file([("a.weight", "F32", [1, 2], 8), ("b.weight", "F16", [2], 4)])
    index = json.dumps({"metadata": {"total_size": 12},
                        "weight_map": {"a.weight": "s.safetensors",
                                       "b.weight": "s.safetensors"}}).encode()
    put("safetensors", "sharded", b"\x01" + struct.pack("<H", len(index)) + index + shard)
    # the FP8 loader: a 1-layer llama, hidden 8, 2 heads of 4, tied, its
    # linear weights F8_E4M3 with per-channel (compressed-tensors) or
    # per-tensor (fp8) F32 scales
    for name, qc, per_channel in (
            ("fp8-channel", {"quant_method": "compressed-tensors", "format": "float-quantized",
                             "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                 "num_bits": 8, "type": "float", "strategy": "channel",
                                 "symmetric": True, "dynamic": False}}},
                             "ignore": ["lm_head"]}, True),
            ("fp8-tensor", {"quant_method": "fp8", "activation_scheme": "dynamic"}, False)):
        cfg = json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8,
                          "num_hidden_layers": 1, "num_attention_heads": 2,
                          "intermediate_size": 8, "vocab_size": 4, "tie_word_embeddings": True,
                          "quantization_config": qc}).encode()
        ts = [("model.embed_tokens.weight", "BF16", [4, 8], 64),
              ("model.norm.weight", "BF16", [8], 16),
              ("model.layers.0.input_layernorm.weight", "BF16", [8], 16),
              ("model.layers.0.post_attention_layernorm.weight", "BF16", [8], 16)]
        for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            ts.append(("model.layers.0.%s.weight" % proj, "F8_E4M3", [8, 8], 64))
            ts.append(("model.layers.0.%s.weight_scale" % proj, "F32",
                       [8, 1] if per_channel else [], 32 if per_channel else 4))
        put("safetensors", name, b"\x02" + struct.pack("<H", len(cfg)) + cfg + st_file(ts))


def seeds_model_config():
    with open(os.path.join(ROOT, "models/stories260K/config.json"), "rb") as f:
        put("model_config", "stories260K", f.read())
    put("model_config", "qwen2", json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 600, "max_position_embeddings": 256, "eos_token_id": [1, 2],
        "rope_scaling": None, "sliding_window": 4096, "use_sliding_window": False,
        "torch_dtype": "bfloat16"}).encode())
    put("model_config", "fp8-compressed-tensors", json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 600,
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                            "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                      "symmetric": True, "dynamic": True}}},
            "ignore": ["lm_head"], "kv_cache_scheme": None}}).encode())
    put("model_config", "fp8-fbgemm", json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 600,
        "quantization_config": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                "modules_to_not_convert": ["lm_head"]}}).encode())


def small_tokenizer(byte_level):
    if byte_level:
        vocab = {chr(0x100 + i) if i < 33 or i > 126 else chr(i): i for i in range(256)}
        vocab.update({"ab": 256, "abc": 257})
        return {"version": "1.0", "added_tokens": [
            {"id": 258, "content": "<|eos|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": dict(vocab, **{"<|eos|>": 258}),
                      "merges": ["a b", "ab c"]}}
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({"<0x%02X>" % i: 3 + i for i in range(256)})
    vocab.update({"\u2581": 259, "a": 260, "b": 261, "\u2581a": 262, "ab": 263})
    return {"version": "1.0", "added_tokens": [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {
                               "<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "byte_fallback": True,
                  "fuse_unk": True, "vocab": vocab, "merges": ["\u2581 a", "a b"]}}


def seeds_tokenizer_load():
    cfg = json.dumps({"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>",
                      "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    put("tokenizer_load", "sp", json.dumps(small_tokenizer(False)).encode())
    put("tokenizer_load", "sp-config",
        json.dumps(small_tokenizer(False)).encode() + b"\x00" + cfg.encode())
    put("tokenizer_load", "bytelevel", json.dumps(small_tokenizer(True)).encode())


def seeds_tokenizer():
    texts = [b"Once upon a time, there was a little girl.",
             "h\u00e9llo w\u00f6rld \u4f60\u597d \U0001f600".encode(),
             b"<s>x</s> <|endoftext|><|im_start|>\n\t  ", b"\xff\xfe\x80abc\xc3"]
    for t in range(5):
        for i, text in enumerate(texts):
            put("tokenizer", "t%d-%d" % (t, i), bytes([t | (8 if i % 2 else 0) |
                                                      (16 if i == 2 else 0)]) + text)


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}"
          "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
          "{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/"
          "assistant/...') }}{% endif %}"
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
          "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
          "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + "
          "' ' + eos_token }}{% endif %}{% endfor %}")
MISC = ("{%- set ns = namespace(n=0) -%}{# c #}{% for m in messages if m.role != 'x' %}"
        "{% set ns.n = ns.n + 1 %}{{ loop.index }}/{{ loop.length }} {{ m.content | trim | "
        "upper | replace('A', 'b') }}{{ m | tojson }}{{ m.content[1:3] ~ (3 // 2) ~ (7 % 3) }}"
        "{% if m.content is string and m.role in ['user', 'system'] %}!{% elif not loop.last "
        "%}?{% else %}.{% endif %}{% endfor %}{{ ns.n }}{{ messages | length }}"
        "{{ 'a,b'.split(',') | join('-') }}{{ {'k': 1}.get('k', 2) }}"
        "{{ none is none }}{{ 'x' if true else 'y' }}")


def seeds_chat_template():
    conv = ["system", "Be brief.", "user", "Hi", "assistant", "Hello!", "user", "A story"]
    for name, tmpl in (("chatml", CHATML), ("llama2", LLAMA2), ("misc", MISC)):
        put("chat_template", name, b"\x01" + "\x1e".join([tmpl] + conv).encode())


def seeds_openai():
    bodies = [
        (0, {"model": "qwen2-fixture", "prompt": "Once upon a time", "max_tokens": 8,
             "temperature": 0.5, "top_p": 0.9, "stop": ["\n", "end"], "seed": 3}),
        (0, {"prompt": [1, 2, 3], "stream": True, "stream_options": {"include_usage": True},
             "stop_token_ids": [5], "ignore_eos": True, "top_k": 4}),
        (0, {"prompt": ["one"], "logprobs": None, "n": 1, "echo": False, "user": "u"}),
        (1, {"model": "qwen2-fixture", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": None}], "max_completion_tokens": 16}),
        (1, {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False,
             "stream": True}),
    ]
    for i, (chat, body) in enumerate(bodies):
        put("openai", "%s-%d" % ("chat" if chat else "cmpl", i),
            bytes([chat]) + json.dumps(body).encode())
    put("openai", "bad-trailing", b"\x00" + b'{"prompt": "x"} xyz')


def seeds_rpc():
    gen = "duet/v1/generate.proto"
    put("rpc_router", "text", b"\x00" + pb("duet.v1.GenerateRequest",
        'request_id: "r1" text: "Once upon a time" max_tokens: 8 stop: "x" '
        'sampling { temperature: 0.7 top_p: 0.9 top_k: 5 seed: 3 has_seed: true }', gen))
    put("rpc_router", "ids", b"\x00" + pb("duet.v1.GenerateRequest",
        'token_ids { ids: [1, 2, 3] } stop_token_ids: [2] ignore_eos: true '
        'model: "qwen2-fixture"', gen))
    put("rpc_router", "health", b"\x01" + pb("grpc.health.v1.HealthCheckRequest",
                                             'service: "duet.v1.Generate"',
                                             "grpc/health/v1/health.proto"))
    pf = "duet/v1/prefill.proto"
    put("rpc_prefill", "prefill", b"\x00" + pb("duet.v1.PrefillRequest",
        'request_id: "r1" decode_id: "decode-fuzz" prompt_ids: [1, 403, 407] dst_pages: [5] '
        'transfer_id: 77 sampling { temperature: 0 }', pf))
    put("rpc_prefill", "prefill-packed", b"\x00" + pb("duet.v1.PrefillRequest",
        'request_id: "r2" decode_id: "decode-fuzz" prompt_ids: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, '
        '11, 12, 13, 14, 15, 16, 17] dst_pages: [1, 2] transfer_id: 78 packed: true '
        'dst_stage_page: 10', pf))
    boot = pb("duet.v1.BootstrapRequest",
              'decode_id: "decode-x" decode_name: "d@h" tp: 1 model_fingerprint: 5 kv_heads: 4 '
              'rank_descriptors: "%s"' % "".join("\\x%02x" % c for c in desc(role=2)), pf)
    put("rpc_prefill", "bootstrap", b"\x01" + boot)
    put("rpc_prefill", "abort", b"\x02" + pb("duet.v1.AbortRequest",
        'request_id: "r1" caller_id: "decode-fuzz" transfer_id: 77', "duet/v1/common.proto"))
    dec = "duet/v1/decode.proto"
    put("rpc_decode", "text", b"\x00" + pb("duet.v1.DecodeGenerateRequest",
        'request { request_id: "r1" text: "Once upon a time" max_tokens: 20 stop: "." '
        'stop_token_ids: [2] sampling { temperature: 0.8 top_p: 0.9 seed: 7 } } '
        'prefill_target: "127.0.0.1:9100"', dec))
    put("rpc_decode", "ids", b"\x00" + pb("duet.v1.DecodeGenerateRequest",
        'request { token_ids { ids: [1, 403, 407] } ignore_eos: true }', dec))
    put("rpc_decode", "abort", b"\x01" + pb("duet.v1.AbortRequest", 'request_id: "r1"',
                                            "duet/v1/common.proto"))


def main():
    seeds_xfer_wire()
    seeds_safetensors()
    seeds_model_config()
    seeds_tokenizer_load()
    seeds_tokenizer()
    seeds_chat_template()
    seeds_openai()
    seeds_rpc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
