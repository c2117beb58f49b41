#!/usr/bin/env bash
# What the ranks send per step is what `tessera plan` prices: the demo model at TP 2 and at PP 2 (two
# CPU rank processes, TESSERA_STEP_TIMING=1 so each group counts its calls,
# distributed/traffic_communicator.h) runs STEPS steps of one sequence (--ignore-eos: a prefill, then
# decodes); rank 0's counts of all-reduces, logits gathers, stage sends, token returns and plan
# broadcasts, per step, must equal the batch-1 line of `tessera plan --nodes 2 --gpus-per-node 1`
# for the same layout (plan/network_cost.h). Bytes are not compared: CPU ranks carry f32
# activations, the plan prices bf16.
#   traffic_matches_plan.sh TESSERA_BIN
set -uo pipefail
BIN=${1:?usage: traffic_matches_plan.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MODEL="$ROOT/models/tessera-demo"
[ -f "$MODEL/model.safetensors" ] || { echo "SKIP: no demo model weights"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
STEPS=24
status=0
for layout in tp pp; do
  flags=(--tensor-parallel-size 2)
  [ "$layout" = pp ] && flags=(--pipeline-parallel-size 2)
  TESSERA_STEP_TIMING=1 timeout 120 "$BIN" generate --model "$MODEL" --device cpu --prompt-ids 5,6,7,8,9,10,11,12 \
    --max-tokens $STEPS --ignore-eos "${flags[@]}" >"$TMP/$layout.jsonl" 2>"$TMP/$layout.log" ||
    { echo "FAIL: generate ${flags[*]} exited non-zero:"; tail -5 "$TMP/$layout.log"; status=1; continue; }
  "$BIN" plan "$MODEL" "${flags[@]}" --nodes 2 --gpus-per-node 1 --gpu h100 --link 10 >"$TMP/$layout.plan" 2>&1 ||
    { echo "FAIL: plan ${flags[*]} exited non-zero:"; tail -5 "$TMP/$layout.plan"; status=1; continue; }
  python3 - "$layout" "$STEPS" "$TMP/$layout.log" "$TMP/$layout.plan" <<'PY' || status=1
import re, sys
layout, steps, log, plan = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
counts = {}
for line in open(log):
    m = re.search(r"Traffic of group (\w+) \(rank 0 of \d+, \w+\): (.*?); ", line)
    if m:
        for n, op in re.findall(r"(\d+) (\w+) \(", m.group(2)):
            counts[(m.group(1).rstrip("0123456789"), op)] = int(n)
line = next((l for l in open(plan) if re.search(r"batch 1 ", l) and "one-way latencies" in l), "")
model = {k: int(n) for n, k in re.findall(r"(\d+) (all-reduces?|logits gathers?|stage sends?|plan broadcasts?)", line)}
model = {k.rstrip("s"): v for k, v in model.items()}
returns = int(re.search(r"(\d+) plan broadcasts? (?:and|or) token returns?", line).group(1)) if "token return" in line else 0
# The plan's "N plan broadcasts and token returns": one step plan broadcast (world) a step, and, with PP,
# the last stage's tokens back to rank 0 (a pp recv).
got = {
    "all-reduce": counts.get(("tp", "all_reduce"), 0) / steps,
    "logits gather": counts.get(("tp", "gather"), 0) / steps,
    "stage send": counts.get(("pp", "send"), 0) / steps,
    "returns": (counts.get(("pp", "recv"), 0) + steps) / steps,
}
want = {"all-reduce": model.get("all-reduce", 0), "logits gather": model.get("logits gather", 0),
        "stage send": model.get("stage send", 0), "returns": returns}
broadcasts = counts.get(("world", "broadcast"), 0)
ok = all(abs(got[k] - want[k]) < 1e-9 for k in want) and steps <= broadcasts <= steps + 4
print(f"{'PASS' if ok else 'FAIL'} {layout} 2 across nodes, per step: measured {got} (world broadcasts {broadcasts} "
      f"in {steps} steps), plan's batch-1 line: {line.strip()}")
if not counts:
    print("  no 'Traffic of group' lines in the log")
sys.exit(0 if ok else 1)
PY
done
exit $status
