#!/usr/bin/env bash
# Self-distillation of the demo model's MTP head on one H200 (issue 22; tools/finetune_demo_mtp.py --distill):
# the demo model (tessera, CUDA) continues prompts from the training corpus greedily, the MTP head is trained on
# those continuations with the main model's argmax as targets, and its acceptance is measured on continuations
# of the held-out prompts. Needs the bundle carried (scripts/bundle.sh ... --tar bundle/bundle.tar.xz), and
# tools/demo_data/train.jsonl (made by tools/demo_data.py; carried) for the prompts.
#   carry: ["bundle", "tools/demo_data/train.jsonl"]    command: bash scripts/device_demo_distill.sh
# Writes $OUT/mtp.safetensors (the trained mtp.* tensors; scripts/merge_mtp_tensors.py puts them into
# models/tessera-demo/model.safetensors here), $OUT/eval.json and $OUT/distill_logs.tar.gz; the fine-tuned copy
# stays in /tmp/demo-mtp-distill for later calls on the same machine (MODEL=... scripts/device_spec_check.sh).
# N_PROMPTS (12000, without bundle/train_prompts.jsonl), GEN_TOKENS (160), MINUTES (3).
set -u
OUT=${OUT:-/tmp/out}
W=/tmp/distill
mkdir -p "$OUT" "$W"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
T=/tmp/bundle/tessera
M=/tmp/demo-mtp-distill
if [ -f bundle/train_prompts.jsonl ]; then
  cp bundle/train_prompts.jsonl "$W/train_prompts.jsonl"
else
  python3 tools/finetune_demo_mtp.py --write-prompts "$W/train_prompts.jsonl" --max-prompts "${N_PROMPTS:-12000}"
fi
python3 tools/finetune_demo_mtp.py --write-prompts "$W/held_prompts.jsonl" --heldout
gen() {
  local t0=$SECONDS
  timeout 300 "$T" generate --model models/tessera-demo --input "$W/$1_prompts.jsonl" --max-tokens "$2" --ignore-eos \
    --temperature 0 --max-num-seqs 256 --output "$W/$1_gen.jsonl" > "$W/gen_$1.log" 2>&1
  echo "generate $1: rc=$? $(wc -l < "$W/$1_gen.jsonl") sequences in $((SECONDS - t0)) s; $(grep -o 'output [0-9.]* tok/s' "$W/gen_$1.log")"
}
gen train "${GEN_TOKENS:-160}"
gen held 128
python3 tools/finetune_demo_mtp.py --model models/tessera-demo --out "$M" --distill "$W/train_gen.jsonl" \
  --eval-distill "$W/held_gen.jsonl" --minutes "${MINUTES:-3}" > "$W/finetune.log" 2>&1
echo "finetune: rc=$?"; grep -iE "before|after|done|error|Traceback" "$W/finetune.log" | tail -12
python3 - "$M/model.safetensors" "$OUT/mtp.safetensors" <<'PY'
import sys
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
save_file({k: v for k, v in t.items() if k.startswith("mtp.")}, sys.argv[2], metadata={"format": "pt"})
PY
cp "$M/eval.json" "$OUT/eval.json"
tar -czf "$OUT/distill_logs.tar.gz" -C "$W" gen_train.log gen_held.log finetune.log
