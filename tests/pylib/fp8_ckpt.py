"""FP8 (e4m3) checkpoints in numpy, independently of duet: read a
safetensors file, and write the F32 checkpoint holding an FP8 checkpoint's
dequantization (float32(e4m3) * float32(scale), rounded once: what duet's
CPU backend computes at load).  Used by tests/integration/daemons/test_fp8.py
and tests/gpu/hf_fp8.py."""
import json
import os
import shutil
import struct

import numpy as np


def e4m3_table():
    """float32 value of every e4m3 byte (OCP e4m3fn), independently of duet."""
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = float("nan")
        elif e == 0:
            v = m / 8.0 * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3 = e4m3_table()
NP = {"F32": np.float32, "F16": np.float16, "F8_E4M3": np.uint8}


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            u = np.frombuffer(data[b:end], dtype=np.uint16).astype(np.uint32) << 16
            a = u.view(np.float32)
        else:
            a = np.frombuffer(data[b:end], dtype=NP[e["dtype"]])
        out[name] = (e["dtype"], e["shape"], a.reshape(e["shape"]))
    return out


def write_st_f32(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def dequantize(src, dst):
    """The F32 checkpoint holding e4m3 * scale (float32) of src's FP8 weights."""
    os.makedirs(dst, exist_ok=True)
    ts = read_st(os.path.join(src, "model.safetensors"))
    out = {}
    for name, (dtype, shape, a) in ts.items():
        if name.endswith(".weight_scale") or name.endswith(".input_scale"):
            continue
        if dtype == "F8_E4M3":
            scale = ts[name + "_scale"][2].astype(np.float32).reshape(-1, 1)
            out[name] = E4M3[a] * scale  # float32 * float32, rounded once
            assert out[name].dtype == np.float32
        else:
            out[name] = a.astype(np.float32)  # bf16 / f16 -> f32 is exact
    write_st_f32(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    del cfg["quantization_config"]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    shutil.copy(os.path.join(src, "tokenizer.json"), dst)


