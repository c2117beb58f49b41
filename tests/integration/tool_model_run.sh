#!/usr/bin/env bash
# Runs a command against `tessera serve` on the hand-set tool-calling model of
# tests/node/make_tool_model.mjs (it calls get_weather, then answers "Warm" once it sees the tool
# result), with the qwen3 reasoning parser and hermes tool calls. TESSERA_TEST_MAX_MODEL_LEN sets the
# model's positions and the server's context (the coding agents' prompts need about 10k tokens);
# other TESSERA_TEST_* variables pass through to server_run.sh.
#   tool_model_run.sh TESSERA_BIN NODE command...
set -uo pipefail
BIN="$1"; NODE="$2"; shift 2
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
MODEL="$(mktemp -d /tmp/tessera-tool-model.XXXXXX)"
trap 'rm -rf "$MODEL"' EXIT
"$NODE" "$ROOT/tests/node/make_tool_model.mjs" "$MODEL" "${TESSERA_TEST_MAX_MODEL_LEN:-4096}" || exit 1
TESSERA_TEST_MODEL="$MODEL" TESSERA_TEST_LOAD_FORMAT=safetensors \
  "$ROOT/tests/integration/server_run.sh" "$BIN" -- --seed 0 --reasoning-parser qwen3 --enable-auto-tool-choice \
  --tool-call-parser hermes -- "$@"
