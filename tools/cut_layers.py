#!/usr/bin/env python3
"""A model folder cut to its first N layers, for a GPU where the whole model does not fit:
   python3 tools/cut_layers.py SRC_DIR DST_DIR N
copies SRC_DIR's files but config.json, and writes config.json with num_hidden_layers N (and
layer_types cut alike; a multimodal config's text_config is the one cut). For --load-format dummy:
no weights are copied or needed."""
import json
import os
import shutil
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "config.json" and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    with open(os.path.join(src, "config.json")) as f:
        c = json.load(f)
    t = c.get("text_config", c)
    if n < 1 or n > t["num_hidden_layers"]:
        sys.exit(f"cut_layers.py: {n} layers: the model has {t['num_hidden_layers']}")
    t["num_hidden_layers"] = n
    if "layer_types" in t:
        t["layer_types"] = t["layer_types"][:n]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(c, f, indent=1)


if __name__ == "__main__":
    main()
