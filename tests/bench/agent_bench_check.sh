#!/usr/bin/env bash
# Run by tests/integration/server_run.sh (the real `tessera serve`, the tiny dummy Qwen3 with the real Qwen3
# tokenizer): `tessera bench --dataset-name agent`, 2 conversations x 3 turns, and its --json report. With the
# server's prefix caching on (the default), every turn from the second on reports cached prompt tokens (the shared
# system prompt at least); with --no-enable-prefix-caching none does.
#   agent_bench_check.sh TESSERA_BIN on|off
set -uo pipefail
BIN=${1:?usage: agent_bench_check.sh TESSERA_BIN on|off}
MODE=${2:?usage: agent_bench_check.sh TESSERA_BIN on|off}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOK="${TESSERA_TEST_TOKENIZER:-$ROOT/.npm-pkgs/tokenizer-qwen3/package/models}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENAI_API_KEY="$TESSERA_API_KEY"
"$BIN" bench --base-url "$TESSERA_URL" --model qwen3-tiny --dataset-name agent --agent-conversations 2 \
  --agent-turns 3 --agent-system-prompt-len 256 --agent-turn-input-len 32 --agent-turn-output-len 16 \
  --agent-reference-len 64 --agent-reference-runs 2 --tokenizer "$TOK" --seed 3 --no-progress \
  --json "$TMP/agent.json" >"$TMP/out.txt" 2>"$TMP/err.txt" ||
  { echo "FAIL: tessera bench exited $?"; cat "$TMP/out.txt" "$TMP/err.txt"; exit 1; }
grep -q "^turns 2-3: prefix-cache hit rate" "$TMP/out.txt" || { echo "FAIL: no summary line"; cat "$TMP/out.txt"; exit 1; }
python3 - "$TMP/agent.json" "$MODE" <<'PY' || { cat "$TMP/out.txt"; exit 1; }
import json, sys
report, mode = json.load(open(sys.argv[1])), sys.argv[2]
a = report["agent"]
assert a["conversations"] == 2 and a["turns"] == 3, a
assert a["reference"]["completed"] == 2 and a["reference"]["ttft_ms"]["median"] > 0, a["reference"]
assert a["turns_not_sent"] == 0, a
turns = a["per_turn"]
assert [t["turn"] for t in turns] == [1, 2, 3], turns
for t in turns:
    assert t["requests"] == 2 and t["completed"] == 2 and t["failed"] == 0, t
    assert t["ttft_ms"]["mean"] > 0, t
    assert t["mean_cached_tokens"] is not None, t
# Each turn's prompt holds the previous one: system prompt (256) + 32 a turn + 16 an answer, and the template.
assert 256 + 32 < turns[0]["mean_prompt_tokens"] < turns[1]["mean_prompt_tokens"] < turns[2]["mean_prompt_tokens"], turns
later = a["later_turns"]
assert later["requests_without_cached_tokens"] == 0, later
if mode == "on":
    for t in turns[1:]:
        assert t["mean_cached_tokens"] >= 256, ("the shared system prompt was not cached", t)
    assert 0 < later["prefix_cache_hit_rate"] <= 1, later
else:
    for t in turns:
        assert t["mean_cached_tokens"] == 0, ("prefix caching is off", t)
    assert later["prefix_cache_hit_rate"] == 0, later
assert later["ttft_ratio_to_reference"] > 0, later
level = report["levels"][0]
assert level["completed"] == 6 and level["max_concurrency"] == 2, level
print(f"PASS ({mode}): turn 2-3 hit rate {later['prefix_cache_hit_rate']:.3f}, "
      f"TTFT ratio {later['ttft_ratio_to_reference']:.2f}")
PY
