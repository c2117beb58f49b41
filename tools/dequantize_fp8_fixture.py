#!/usr/bin/env python3
"""A bf16 copy of an FP8 block-scaled fixture: every e4m3 tensor times its `<name>_scale_inv`
(one f32 scale per 128 x 128 block, the block grid from the weight's shape: ceil(R/128) x
ceil(C/128) per matrix, also where the checkpoint stored the scales squeezed to 1-D), rounded to
bf16 (round to nearest even); other tensors copied as they are; config.json without its
quantization_config; reference.json and generation_config.json copied.

Why: to tell an FP8 kernel's fault from a model's own sensitivity to rounding. On 2026-12-02
(`915c5fc`, one H200) the CUDA engine tests ran on `qwen3_5_moe_text_fp8` and on this copy of it:
both parted in the same tests, so the parting was the fixture, not the FP8 path (docs/cuda.md,
"The fixture rule on CUDA").

Plain Python (no numpy; a 7 MB fixture takes about 6 s here):

    python3 tools/dequantize_fp8_fixture.py tests/fixtures/models/qwen3_5_moe_text_fp8 /tmp/fx/qwen3_5_moe_text_fp8deq
    TESSERA_TEST_FIXTURES=/tmp/fx TESSERA_TEST_DEVICE=cuda engine_test --gtest_filter='*fp8deq*'

(the copy's model_fixture_test fails by design: its weights are rounded to bf16, the reference is
the fp32 forward on the FP8 ones.)
"""
import json
import os
import shutil
import struct
import sys


def e4m3(b):
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 0:
        return sign * m / 8.0 * 2.0 ** -6
    if e == 15 and m == 7:
        return float("nan")
    return sign * (1 + m / 8.0) * 2.0 ** (e - 7)


def to_bf16(values):
    out = bytearray()
    for v in values:
        u = struct.unpack("<I", struct.pack("<f", v))[0]
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u & 0xFFFF)
    return bytes(out)


def main(src, dst):
    os.makedirs(dst, exist_ok=True)
    raw = open(os.path.join(src, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", None)
    lut = [e4m3(b) for b in range(256)]

    def data(name):
        a, b = header[name]["data_offsets"]
        return raw[base + a:base + b]

    def f32(name):
        t, d = header[name], data(name)
        if t["dtype"] == "F32":
            return list(struct.unpack("<%df" % (len(d) // 4), d))
        if t["dtype"] == "BF16":
            return [struct.unpack("<f", b"\0\0" + d[i:i + 2])[0] for i in range(0, len(d), 2)]
        raise SystemExit(f"{name}: scale dtype {t['dtype']}")

    tensors = {}
    for name, t in header.items():
        if name.endswith("_scale_inv"):
            continue
        d = data(name)
        if t["dtype"] != "F8_E4M3":
            tensors[name] = (t["dtype"], t["shape"], d)
            continue
        scale = f32(name + "_scale_inv")
        rows, cols = t["shape"][-2], t["shape"][-1]
        mats = len(d) // (rows * cols)
        rb, cb = (rows + 127) // 128, (cols + 127) // 128
        if len(scale) != mats * rb * cb:
            raise SystemExit(f"{name}: {len(scale)} scales for {mats} x {rb} x {cb} blocks")
        values = [0.0] * len(d)
        for m in range(mats):
            for r in range(rows):
                srow, o = (m * rb + r // 128) * cb, (m * rows + r) * cols
                for c in range(cols):
                    values[o + c] = lut[d[o + c]] * scale[srow + c // 128]
        tensors[name] = ("BF16", t["shape"], to_bf16(values))

    out_header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, d = tensors[name]
        out_header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(d)]}
        off += len(d)
        blobs.append(d)
    if meta:
        out_header["__metadata__"] = meta
    hb = json.dumps(out_header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)
    config = json.load(open(os.path.join(src, "config.json")))
    config.pop("quantization_config", None)
    json.dump(config, open(os.path.join(dst, "config.json"), "w"), indent=1)
    for f in ("generation_config.json", "reference.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    print(f"wrote {dst}: {len(tensors)} tensors")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: dequantize_fp8_fixture.py FP8_FIXTURE_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])
