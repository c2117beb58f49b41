#!/usr/bin/env python3
"""Adds random multi-token-prediction (MTP) weights to the hybrid test fixtures, as Qwen3-Next /
Qwen3.5 checkpoints carry them, so that speculative decoding with method mtp runs on them.

Stdlib only (struct, json, random): no numpy or torch needed.

    python3 tools/add_random_mtp.py tests/fixtures/models/qwen3_next_tiny ...   # default: every hybrid fixture

For each model directory it rewrites model.safetensors with the main tensors unchanged and these
appended (any mtp.* tensors already there are replaced, so running it twice gives the same file):
  mtp.fc.weight [H, 2H], mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight,
  mtp.norm.weight [H], and one full-attention decoder layer under mtp.layers.0.: the input and
  post-attention norms and self_attn.* shaped like the model's first full-attention layer, mlp.*
  like its layer 0 (the layer the MTP layer's feed-forward block is chosen as: MoE with shared
  expert or dense MLP). Multimodal wrappers keep the MTP tensors at the top level ("mtp."), as the
  released checkpoints do.
Values: a seeded Gaussian (seed from the directory name) with each mirrored tensor's own mean and
standard deviation, so activations stay at the scale of the main layers; fc mirrors o_proj and
the three MTP norms mirror the final norm. Dtypes follow the mirrored tensors: bf16 (bf16 = the
upper 16 bits of the float32, rounded to nearest even), and in an FP8 checkpoint the FP8
projections and experts stay FP8 (e4m3 with 128 x 128 block scales, weight_scale_inv), fc bf16
(its name is no FP8 candidate). config.json (text_config for a wrapper) gains
num_nextn_predict_layers: 1 (Qwen3-Next) or mtp_num_hidden_layers: 1 (Qwen3.5), and tensors.txt
the new lines.
"""
import bisect
import json
import math
import os
import random
import struct
import sys
import zlib

HYBRID_FIXTURES = ["qwen3_next_tiny", "qwen3_5_moe_text_tiny", "qwen3_5_dense_tiny", "qwen3_5_moe_vl_tiny",
                   "qwen3_5_moe_text_fp8", "qwen3_5_moe_text_fp8_hd64"]
SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8, "I32": 4}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        tensors[name] = (info["dtype"], info["shape"], data[b:e])
    return meta, tensors


def write_safetensors(path, meta, tensors):
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def e4m3_value(byte):
    s = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    if e == 0:
        return s * m / 8.0 * 2.0 ** -6
    return s * (1.0 + m / 8.0) * 2.0 ** (e - 7)


# Non-negative e4m3 values (bytes 0..126), ascending, for nearest-value encoding.
E4M3_POS = [e4m3_value(b) for b in range(127)]


def e4m3_encode(x):
    a = min(abs(x), 448.0)
    i = bisect.bisect_left(E4M3_POS, a)
    if i == len(E4M3_POS) or (i > 0 and a - E4M3_POS[i - 1] <= E4M3_POS[i] - a):
        i -= 1
    return i | (0x80 if x < 0 and i else 0)


def to_floats(dtype, raw):
    n = len(raw) // SIZES[dtype]
    if dtype == "BF16":
        return [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in struct.unpack("<%dH" % n, raw)]
    if dtype == "F32":
        return list(struct.unpack("<%df" % n, raw))
    if dtype == "F16":
        return list(struct.unpack("<%de" % n, raw))
    if dtype == "F8_E4M3":
        return [e4m3_value(b) for b in raw]
    raise ValueError("unexpected dtype " + dtype)


def bf16_bytes(values):
    out = []
    for x in values:
        u = struct.unpack("<I", struct.pack("<f", x))[0]
        out.append(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return struct.pack("<%dH" % len(out), *out)


def fp8_blocks(values, shape):
    """e4m3 bytes and f32 block scales (128 x 128 blocks over the last two dims) of a 2-D matrix."""
    rows, cols = shape
    rb, cb = math.ceil(rows / 128), math.ceil(cols / 128)
    scales = [1.0] * (rb * cb)
    for i in range(rb):
        for j in range(cb):
            amax = max((abs(values[r * cols + c]) for r in range(i * 128, min(rows, i * 128 + 128))
                        for c in range(j * 128, min(cols, j * 128 + 128))), default=0.0)
            scales[i * cb + j] = amax / 448.0 if amax > 0 else 1.0
    q = bytes(e4m3_encode(values[r * cols + c] / scales[(r // 128) * cb + c // 128])
              for r in range(rows) for c in range(cols))
    return q, scales


def stats(values):
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return mean, math.sqrt(var)


def add_mtp(model_dir):
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    prefix = "model.language_model." if "text_config" in cfg else "model."
    st_path = os.path.join(model_dir, "model.safetensors")
    meta, tensors = read_safetensors(st_path)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    rng = random.Random(zlib.crc32(os.path.basename(os.path.normpath(model_dir)).encode()))
    layer_types = text["layer_types"]
    full = layer_types.index("full_attention")
    H = text["hidden_size"]

    def dequant(name):
        dtype, shape, raw = tensors[name]
        vals = to_floats(dtype, raw)
        if dtype == "F8_E4M3":
            _, _, sraw = tensors[name + "_scale_inv"]
            s = to_floats("F32", sraw)
            vals = [v * sum(s) / len(s) for v in vals]  # (the statistics only)
        return vals

    new = {}

    def mirror(dst, src, shape=None):
        dtype, sshape, _ = tensors[src]
        shape = shape or sshape
        mean, std = stats(dequant(src))
        vals = [rng.gauss(mean, std) for _ in range(math.prod(shape))]
        if dtype == "F8_E4M3":
            q, scales = fp8_blocks(vals, shape)
            sdtype, sshape_s, _ = tensors[src + "_scale_inv"]
            assert len(scales) == math.prod(sshape_s), (src, sshape_s)
            new[dst] = ("F8_E4M3", shape, q)
            new[dst + "_scale_inv"] = ("F32", sshape_s, struct.pack("<%df" % len(scales), *scales))
        else:
            new[dst] = ("BF16", shape, bf16_bytes(vals))

    full_p = prefix + "layers.%d." % full
    l0_p = prefix + "layers.0."
    # fc: bf16 (no FP8 candidate by name), at the scale of the attention output projection.
    mean, std = stats(dequant(full_p + "self_attn.o_proj.weight"))
    new["mtp.fc.weight"] = ("BF16", [H, 2 * H], bf16_bytes([rng.gauss(mean, std) for _ in range(2 * H * H)]))
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mirror("mtp.%s.weight" % n, prefix + "norm.weight")
    for name in sorted(tensors):
        if name.endswith("_scale_inv"):
            continue
        if name.startswith(full_p) and not name.startswith(full_p + "mlp."):
            mirror("mtp.layers.0." + name[len(full_p):], name)
        elif name.startswith(l0_p + "mlp."):
            mirror("mtp.layers.0." + name[len(l0_p):], name)
    tensors.update(new)
    write_safetensors(st_path, meta, tensors)

    key = "num_nextn_predict_layers" if text.get("model_type") == "qwen3_next" else "mtp_num_hidden_layers"
    text[key] = 1
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    listing = os.path.join(model_dir, "tensors.txt")
    if os.path.exists(listing):
        with open(listing) as f:
            lines = [l for l in f.read().splitlines() if not l.startswith("mtp.")]
        lines += ["%s %s %s" % (n, dt, json.dumps(sh).replace(" ", "").replace(",", ", "))
                  for n, (dt, sh, _) in sorted(new.items())]
        with open(listing, "w") as f:
            f.write("\n".join(lines) + "\n")
    print("%s: %d MTP tensors (%d bytes), %s = 1" % (model_dir, len(new), sum(len(r) for _, _, r in new.values()),
                                                     key))


def main():
    dirs = sys.argv[1:] or [os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "models", d)
                            for d in HYBRID_FIXTURES]
    for d in dirs:
        add_mtp(d)


if __name__ == "__main__":
    main()
