#!/usr/bin/env bash
# Runs a command against `tessera serve` set up as the coding agents use it: the tiny dummy Qwen3 with a
# long context (the agents' system prompts and tool lists are 10-20k tokens), the qwen3 reasoning parser
# and hermes tool calls, the access log on (tests read each request's status from it), and a
# generation_config.json that makes every odd token id an end-of-sequence token, so the random model
# stops by itself after a few tokens (finish "stop", as a real model's answer ends) instead of running
# into max_tokens, which both agents treat as an unfinished answer.
#   agents_run.sh TESSERA_BIN command...
set -uo pipefail
BIN="$1"; shift
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MODEL="$(mktemp -d /tmp/tessera-agents-model.XXXXXX)"
trap 'rm -rf "$MODEL"' EXIT
sed 's/"max_position_embeddings": *[0-9]*/"max_position_embeddings": 40960/' "$ROOT/configs/qwen3-tiny/config.json" \
  >"$MODEL/config.json"
{
  printf '{"max_new_tokens": 24, "eos_token_id": [151645'
  for ((i = 1; i < 151643; i += 2)); do printf ',%d' "$i"; done
  printf ']}\n'
} >"$MODEL/generation_config.json"
TESSERA_TEST_MODEL="$MODEL" TESSERA_TEST_MAX_MODEL_LEN=40960 TESSERA_TEST_ACCESS_LOG=1 \
  "$ROOT/tests/integration/server_run.sh" "$BIN" -- --seed 0 --reasoning-parser qwen3 --enable-auto-tool-choice \
  --tool-call-parser hermes -- "$@"
