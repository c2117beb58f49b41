#!/usr/bin/env bash
# Speculative decoding on one H200 (issue 22), on the demo model shipped in models/tessera-demo:
# batch-1 decode with and without MTP (k = 1, 2, 3) and with --enforce-eager, the run's
# acceptance (the SpecDecoding line `tessera generate` prints at the end), concurrency 64, and
# ngram on a workload that copies from its prompt. Needs the bundle carried:
#   scripts/bundle.sh --build-dir build/cuda --out /tmp/bundle --tar bundle/bundle.tar.xz
#   carry: ["bundle"]      command: bash scripts/device_spec_check.sh
# PARTS (default all): b1 eager c64 conc ngram (ngram: the code-copy prompt and a held-out text repeated) (c64: N_C64 requests, default 64, of TOKENS_C64 tokens) (conc: concurrency 8, 16, 32, 64 with and without MTP, and
# with disable_by_batch_size DBB, default 32).  N_B1 (default 8): batch-1 prompts; TOKENS (default 128).
# BASE: another build's tessera binary (e.g. the build before a change), run beside this one at
# batch 1 (none and MTP k = 2) in the same call.
set -u
OUT=${OUT:-/tmp/out}
L=/tmp/spec_logs
mkdir -p "$OUT" "$L"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
T=/tmp/bundle/tessera
M=${MODEL:-models/tessera-demo}  # MODEL: another copy (e.g. a fine-tuned one)
PARTS=" ${PARTS:-b1 eager c64 conc ngram} "
DBB=${DBB:-32}
part() { [[ "$PARTS" == *" $1 "* ]]; }
N_B1=${N_B1:-8}
TOKENS=${TOKENS:-128}
N_C64=${N_C64:-64}           # c64: requests, 64 at a time (more: a run long enough that graph captures do not rule it)
TOKENS_C64=${TOKENS_C64:-$TOKENS}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader

# Prompts: the first line of held-out texts (poems and quotes the model half knows).
python3 - "$L" "$N_B1" "$N_C64" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
texts = [json.loads(l)["text"] for l in open("models/tessera-demo/heldout_texts.jsonl")]
starts = [t.split("\n")[0] + "\n" for t in texts if "<|im" not in t]
with open(f"{d}/b1.jsonl", "w") as f:
    for s in starts[:n]: f.write(json.dumps({"prompt": s}) + "\n")
for c in (8, 16, 32, 64):
    with open(f"{d}/c{c}.jsonl", "w") as f:
        for s in (starts * 8)[:c]: f.write(json.dumps({"prompt": s}) + "\n")
with open(f"{d}/c64_run.jsonl", "w") as f:  # the c64 part's requests (N_C64; at 64, every one at once)
    for s in (starts * 64)[:int(sys.argv[3])]: f.write(json.dumps({"prompt": s}) + "\n")
# ngram: a source file, then its first lines again: the model copies the rest (an editing workload).
src = open("src/engine/spec/spec_config.cpp").read()
src = src[:3000]
head = "\n".join(src.split("\n")[:12]) + "\n"
with open(f"{d}/copy.jsonl", "w") as f:
    for cut in (0, 1, 2, 3):
        f.write(json.dumps({"prompt": src + "\n\n// The same file again:\n" + "\n".join(src.split("\n")[:8 + 4 * cut]) + "\n"}) + "\n")
# ngram_text: a held-out text the model's own kind (it does not copy code), then its first lines again.
long = [t for t in texts if "<|im" not in t and t.count("\n") >= 6][:4]
with open(f"{d}/copytext.jsonl", "w") as f:
    for t in long:
        t = t[:2000]
        f.write(json.dumps({"prompt": t + "\n\n" + "\n".join(t.split("\n")[:2]) + "\n"}) + "\n")
PY

# run NAME FILE extra-flags...: decode tok/s per sequence, output tok/s, acceptance.
run() {
  local name=$1 file=$2; shift 2
  timeout 300 "${TBIN:-$T}" generate --model $M --input "$file" --max-tokens "$TOKENS" --ignore-eos --output "$L/$name.out.jsonl" \
    "$@" > "$L/$name.log" 2>&1
  local rc=$?
  local dec out acc
  dec=$(grep -o 'decode [0-9.]* tok/s' "$L/$name.log" | awk '{print $2}')
  out=$(grep -o 'output [0-9.]* tok/s' "$L/$name.log" | awk '{print $2}')
  acc=$(grep -o 'Mean acceptance length: [0-9.]*.*Per-position acceptance rate: [0-9., ]*' "$L/$name.log" | tail -1 |
        sed 's/Accepted throughput.*Per-position/per-position/')
  printf '%-22s rc=%s decode/seq %8s tok/s  output %9s tok/s  %s\n' "$name" "$rc" "${dec:-?}" "${out:-?}" "$acc"
  [ $rc = 0 ] || tail -5 "$L/$name.log"
  grep -o 'costs (x a plain step, by batch) [^;]*' "$L/$name.log" | sed 's/^/    calibration: /'
}
same() {  # greedy outputs equal?
  python3 - "$L/$1.out.jsonl" "$L/$2.out.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["token_ids"] for l in open(sys.argv[1])]
b = [json.loads(l)["token_ids"] for l in open(sys.argv[2])]
print(f"  greedy tokens {sys.argv[2].split('/')[-1][:-10]} == {sys.argv[1].split('/')[-1][:-10]}: "
      f"{sum(x == y for x, y in zip(a, b))}/{len(a)} prompts identical")
PY
}
MTP() { echo "{\"method\":\"mtp\",\"num_speculative_tokens\":$1}"; }

if part b1; then
  echo "== batch 1 (--max-num-seqs 1), $N_B1 prompts x $TOKENS tokens, CUDA graphs on"
  run none "$L/b1.jsonl" --max-num-seqs 1
  for k in 1 2 3; do run mtp$k "$L/b1.jsonl" --max-num-seqs 1 --speculative-config "$(MTP $k)"; same none mtp$k; done
  if [ -n "${BASE:-}" ]; then
    TBIN=$BASE run base_none "$L/b1.jsonl" --max-num-seqs 1
    TBIN=$BASE run base_mtp2 "$L/b1.jsonl" --max-num-seqs 1 --speculative-config "$(MTP 2)"
    same base_mtp2 mtp2
  fi
fi
if part eager; then
  echo "== batch 1, --enforce-eager"
  run none_eager "$L/b1.jsonl" --max-num-seqs 1 --enforce-eager
  run mtp2_eager "$L/b1.jsonl" --max-num-seqs 1 --enforce-eager --speculative-config "$(MTP 2)"
fi
if part c64; then
  echo "== concurrency 64 ($N_C64 requests x $TOKENS_C64 tokens, 64 at a time): none, MTP k=2 (limit measured at startup),"
  echo "   MTP k=2 drafting at every batch size (disable_by_batch_size 0)"
  TOKENS=$TOKENS_C64 run c64_none "$L/c64_run.jsonl" --max-num-seqs 64
  TOKENS=$TOKENS_C64 run c64_mtp2 "$L/c64_run.jsonl" --max-num-seqs 64 --speculative-config "$(MTP 2)"
  same c64_none c64_mtp2
  TOKENS=$TOKENS_C64 run c64_mtp2_always "$L/c64_run.jsonl" --max-num-seqs 64 \
    --speculative-config '{"method":"mtp","num_speculative_tokens":2,"disable_by_batch_size":0}'
fi
if part conc; then
  echo "== concurrency 8, 16, 32, 64: none, mtp k=2, mtp k=2 with disable_by_batch_size=$DBB"
  for c in 8 16 32 64; do
    run c${c}_none "$L/c$c.jsonl" --max-num-seqs $c
    run c${c}_mtp2 "$L/c$c.jsonl" --max-num-seqs $c --speculative-config "$(MTP 2)"
    run c${c}_mtp2_dbb "$L/c$c.jsonl" --max-num-seqs $c \
      --speculative-config "{\"method\":\"mtp\",\"num_speculative_tokens\":2,\"disable_by_batch_size\":$DBB}"
    same c${c}_none c${c}_mtp2_dbb
  done
fi
if part ngram; then
  echo "== ngram on a prompt that copies a source file (batch 1)"
  run copy_none "$L/copy.jsonl" --max-num-seqs 1
  run copy_ngram3 "$L/copy.jsonl" --max-num-seqs 1 --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"prompt_lookup_max":5}'
  same copy_none copy_ngram3
  run copy_mtp2 "$L/copy.jsonl" --max-num-seqs 1 --speculative-config "$(MTP 2)"
  echo "== ngram on a held-out text followed by its first lines again (batch 1; copying text of the kind it learnt)"
  run copytext_none "$L/copytext.jsonl" --max-num-seqs 1
  run copytext_ngram3 "$L/copytext.jsonl" --max-num-seqs 1 --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"prompt_lookup_max":5}'
  same copytext_none copytext_ngram3
fi
tar -czf "$OUT/spec_logs.tar.gz" -C /tmp spec_logs 2>/dev/null
