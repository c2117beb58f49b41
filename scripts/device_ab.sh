#!/usr/bin/env bash
# Two builds side by side in one GPU call (issue 15's "no behaviour change" figures): the
# previous build's tessera (PREV, a binary from an earlier bundle) and this one ($B/tessera),
# alternating A B (ROUNDS times, default 1) so clock and thermal drift fall on both. Per build:
# decode at batch 1 (Qwen3-8B shape, and with HYBRID=1 the Qwen3.5-35B-A3B shape; dummy weights,
# 512-token prompt, 256 new tokens),
# one 4,096-token prefill (Qwen3-8B), and serving with the seeds' protocol (tessera bench,
# concurrency 1,5,10,20, 40 requests a level, max_tokens 64, "Explain parallel computing in one
# sentence."). Generated ids of each decode are compared between the builds.
#   carry: ["bundle", ".npm-pkgs/tokenizer-qwen3/package/models"]
#   bash scripts/device_ab.sh     (bundle/bundle.tar.xz holds both: the previous binary as prev/tessera)
#   SERVE=0: decode and prefill only.
#   MODELS="configs/qwen3-30b-a3b configs/qwen3-8b": the decode models (default Qwen3-8B; HYBRID=1 adds
#   Qwen3.5-35B-A3B); SERVE_MODEL: the served one (default configs/qwen3-8b); EXTRA: flags for both builds.
set -u
. "$(dirname "$0")/device_prompts.sh"
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=${BUNDLE:-/tmp/bundle}
PREV=${PREV:-$B/prev/tessera}
TOK=${TOK:-.npm-pkgs/tokenizer-qwen3/package/models}
ROUNDS=${ROUNDS:-1}
MODELS=${MODELS:-configs/qwen3-8b$([ "${HYBRID:-0}" = 1 ] && echo " configs/qwen3.5-35b-a3b")}
[ -x "$PREV" ] || { echo "device_ab: PREV=$PREV is not an executable tessera" >&2; exit 2; }
echo "A (previous): $PREV ($("$PREV" --version 2>/dev/null | head -1)); B (this): $B/tessera ($("$B/tessera" --version | head -1))"

decode() {  # build-label binary model name
  local tag=$1 bin=$2 model=$3 name=$4
  timeout 240 "$bin" generate --model "$model" --load-format dummy --device cuda --prompt-ids "$P512" ${EXTRA:-} \
    --max-tokens 256 --ignore-eos --max-model-len 8192 --json > "$OUT/${name}_$tag.json" 2> "$OUT/${name}_$tag.log"
  echo "$name $tag: $(grep -o 'decode [0-9.]* tok/s' "$OUT/${name}_$tag.log" | tail -1)"
}
prefill() {
  local tag=$1 bin=$2
  timeout 240 "$bin" generate --model configs/qwen3-8b --load-format dummy --device cuda --prompt-ids "$P4K" \
    --prompt-ids "$P4K2" --max-tokens 1 --max-num-seqs 1 --max-num-batched-tokens 4096 --max-model-len 8192 \
    --no-enable-prefix-caching --json > "$OUT/prefill_$tag.json" 2> "$OUT/prefill_$tag.log"
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print('prefill_4096 $tag: %.4f s' % (r[1]['first_token_at_s'] - r[0]['first_token_at_s']))" "$OUT/prefill_$tag.json"
}
serve() {
  local tag=$1 bin=$2
  "$bin" serve ${SERVE_MODEL:-configs/qwen3-8b} --load-format dummy ${EXTRA:-} --device cuda --tokenizer $TOK --port 8012 \
    --max-model-len 4096 --max-num-seqs 256 > "$OUT/serve_$tag.log" 2>&1 &
  local sp=$!
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:8012/health >/dev/null && break; sleep 1; done
  timeout 200 "$B/tessera" bench --base-url http://127.0.0.1:8012 --concurrency 1,5,10,20 --requests-per-level 40 \
    --max-tokens 64 --temperature 0 --prompt "Explain parallel computing in one sentence." \
    --json "$OUT/bench_$tag.json" > "$OUT/bench_$tag.txt" 2>/dev/null
  kill $sp; wait $sp 2>/dev/null
  python3 - "$OUT/bench_$tag.json" "$tag" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
out = []
for l in d["levels"]:
    p95 = l["e2el_ms"].get("p95")
    out.append(f"c{l['max_concurrency']} {l['completion_token_throughput']:.1f}" + (f" (p95 {p95 / 1000:.3f} s)" if p95 else "")
               + (f" FAILED {l['failed']}" if l["failed"] else ""))
print(f"serve seed protocol {sys.argv[2]}: completion tok/s " + ", ".join(out))
PY
}

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  for tag in A B; do
    bin=$([ $tag = A ] && echo "$PREV" || echo "$B/tessera")
    for m in $MODELS; do decode $tag "$bin" "$m" "$(basename "$m")"; done
    prefill $tag "$bin"
    [ "${SERVE:-1}" = 1 ] && serve $tag "$bin"
  done
  for m in $MODELS; do
    m=$(basename "$m")
    [ "$(first_ids "$OUT/${m}_A.json")" = "$(first_ids "$OUT/${m}_B.json")" ] \
      && echo "$m: A and B generate identical tokens" || echo "$m: A and B tokens DIFFER"
  done
done
