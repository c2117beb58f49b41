#!/usr/bin/env bash
# Structured output's cost on one GPU: `tessera serve` on a real-size model with dummy weights and the real
# Qwen3 vocabulary (151,936 tokens), `tessera bench` at concurrency 1 and 64, free requests against the same
# requests constrained to a nested JSON Schema (--extra-body guided_json); the mean TPOT ratio is the per-step
# overhead of the masks (computed on the engine thread, applied by Backend::apply_token_mask on the GPU).
# Also the grammar library's own benchmark (compile time, mask time per token) on this machine's CPU.
# Needs the bundle carried (scripts/bundle.sh --build-dir build/cuda --with-tests --out /tmp/bundle; then
#   tar -cf - -C /tmp bundle | xz -T2 > bundle/bundle.tar.xz), carry ["bundle"], command:
#   bash scripts/device_structured_bench.sh
# MODEL (default configs/qwen3-30b-a3b), TOKENS (default 128), N (requests per level, default 128).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
T=/tmp/bundle/tessera
M=${MODEL:-configs/qwen3-30b-a3b}
TOKENS=${TOKENS:-128}
N=${N:-128}
TOK=.npm-pkgs/tokenizer-qwen3/package/models
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
[ -f "$TOK/tokenizer.json" ] || { echo "no $TOK/tokenizer.json: run scripts/fetch_test_data.sh before bundling"; exit 1; }

"$T" serve "$M" --tokenizer "$TOK" --load-format dummy --port 8123 --max-model-len 4096 --max-num-seqs 64 \
  --served-model-name m > "$OUT/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 600); do curl -sf -o /dev/null http://127.0.0.1:8123/health && break; sleep 1; done
curl -sf -o /dev/null http://127.0.0.1:8123/health || { tail -30 "$OUT/serve.log"; kill $PID; exit 1; }

SCHEMA='{"guided_json": {"type": "object", "properties": {"order": {"type": "object", "properties": {
  "id": {"type": "string"}, "items": {"type": "array", "items": {"type": "object", "properties": {
  "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
  "required": ["sku", "qty", "price"]}}, "customer": {"type": "object", "properties": {"name": {"type": "string"},
  "email": {"type": "string", "format": "email"}}, "required": ["name"]}}, "required": ["id", "items"]}},
  "required": ["order"]}, "temperature": 1.0}'
for c in 1 64; do
  n=$([ $c = 1 ] && echo 16 || echo "$N")
  "$T" bench --base-url http://127.0.0.1:8123 --model m --concurrency $c --num-prompts "$n" --max-tokens "$TOKENS" \
    --ignore-eos --temperature 1.0 --json "$OUT/free_c$c.json" > "$OUT/free_c$c.log" 2>&1
  "$T" bench --base-url http://127.0.0.1:8123 --model m --concurrency $c --num-prompts "$n" --max-tokens "$TOKENS" \
    --ignore-eos --temperature 1.0 --extra-body "$SCHEMA" --json "$OUT/json_c$c.json" > "$OUT/json_c$c.log" 2>&1
done
kill -TERM $PID; wait $PID
python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
for c in (1, 64):
    f = json.load(open(f"{d}/free_c{c}.json"))["levels"][0]
    j = json.load(open(f"{d}/json_c{c}.json"))["levels"][0]
    a, b = f["tpot_ms"]["mean"], j["tpot_ms"]["mean"]
    print(f"concurrency {c}: TPOT free {a:.2f} ms, guided_json {b:.2f} ms, overhead {100 * (b / a - 1):+.1f}%")
PY
[ -x /tmp/bundle/grammar_bench ] && /tmp/bundle/grammar_bench --benchmark_min_time=0.2 2>&1 | tail -30
