#!/usr/bin/env bash
# docs/seeds.md's plans are what the binary prints: every ``` block of the page that starts with
# `$ tessera plan ...` (lines ending in `\` continue the command) is run with TESSERA_BIN from the
# repository root, and its stdout and "(exit status N)" must equal the block's other lines.
#   plan_seeds_doc.sh TESSERA_BIN
set -uo pipefail
BIN=${1:?usage: plan_seeds_doc.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT" || exit 1
python3 - "$BIN" "$ROOT/docs/seeds.md" <<'PY'
import difflib, shlex, subprocess, sys

binary, doc = sys.argv[1], sys.argv[2]
lines = open(doc, encoding="utf-8").read().split("\n")
blocks, block = [], None
for line in lines:
    if line.startswith("```"):
        if block is None:
            block = []
        else:
            blocks.append(block)
            block = None
    elif block is not None:
        block.append(line)
blocks = [b for b in blocks if b and b[0].startswith("$ tessera plan ")]
if len(blocks) < 10:
    sys.exit(f"FAIL: {len(blocks)} `tessera plan` blocks in {doc}, expected at least 10")
failed = 0
for b in blocks:
    i, cmd = 0, ""
    while True:
        text = b[i][2:] if i == 0 else b[i].strip()
        cont = text.endswith("\\")
        cmd += " " + (text[:-1].strip() if cont else text.strip())
        i += 1
        if not cont:
            break
    argv = shlex.split(cmd)
    argv[0] = binary
    run = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120)
    got = run.stdout.rstrip("\n").split("\n") + [f"(exit status {run.returncode})"]
    want = b[i:]
    if got != want:
        failed += 1
        print(f"FAIL: {cmd.strip()}")
        sys.stdout.writelines(l + "\n" for l in difflib.unified_diff(want, got, "docs/seeds.md", "tessera", lineterm=""))
    else:
        print(f"ok: {cmd.strip()}")
if failed:
    sys.exit(1)
print(f"PASS: {len(blocks)} plans in docs/seeds.md match the binary")
PY
