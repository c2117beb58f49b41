#!/usr/bin/env python3
"""Writes the mtp.* tensors of one safetensors file into another, in place, byte for byte.

    python3 scripts/merge_mtp_tensors.py NEW_MTP.safetensors models/tessera-demo/model.safetensors

Every mtp.* tensor of the first file must exist in the second with the same dtype and shape; only its
bytes change (the header and every other tensor stay as they are). No torch needed.
"""
import json
import struct
import sys


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def main():
    src, dst = sys.argv[1], sys.argv[2]
    hs, base_s = header(src)
    hd, base_d = header(dst)
    names = [k for k in hs if k.startswith("mtp.")]
    if not names:
        sys.exit("merge_mtp_tensors.py: {} has no mtp.* tensors".format(src))
    with open(src, "rb") as fs, open(dst, "r+b") as fd:
        for k in names:
            a, b = hs[k], hd.get(k)
            if b is None or a["dtype"] != b["dtype"] or a["shape"] != b["shape"]:
                sys.exit("merge_mtp_tensors.py: {} is {} in {}, {} in {}".format(k, a, src, b, dst))
            s0, s1 = a["data_offsets"]
            d0, d1 = b["data_offsets"]
            fs.seek(base_s + s0)
            data = fs.read(s1 - s0)
            assert len(data) == d1 - d0
            fd.seek(base_d + d0)
            fd.write(data)
    print("merge_mtp_tensors.py: {} tensors written into {}".format(len(names), dst))


if __name__ == "__main__":
    main()
