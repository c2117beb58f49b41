#!/usr/bin/env bash
# `vllm serve` command lines work unchanged: human-readable sizes (32k = 32000, 32K = 32768),
# underscore spellings, -tp/-pp, a repeated flag's last value, vLLM's harmless flags; every flag
# mistake is one "error: ..." line with exit code 2 (a misspelt flag names the closest one); and
# every flag docs/server.md lists is one `tessera serve --help` shows. Loads no model.
#   serve_vllm_flags.sh TESSERA_BIN
set -uo pipefail
BIN=${1:?usage: serve_vllm_flags.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# Flags that parse, as `tessera plan --json` reads them (the same engine flags as serve).
# (configs/qwen3.5-35b-a3b: max_position_embeddings 262144.)
plan_field() {  # plan_field FIELD FLAGS...
  local field=$1; shift
  "$BIN" plan "$ROOT/configs/qwen3.5-35b-a3b" --gpu h200 --json "$@" 2>"$TMP/err" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['$field'])" 2>/dev/null
}
expect_plan() {  # expect_plan FIELD WANT FLAGS...
  local field=$1 want=$2; shift 2
  local got; got=$(plan_field "$field" "$@")
  [ "$got" = "$want" ] || bad "$* -> $field $got, want $want ($(cat "$TMP/err"))"
}
expect_plan max_model_len 32000 --max-model-len 32k
expect_plan max_model_len 32768 --max-model-len 32K
expect_plan max_model_len 25600 --max-model-len 25.6k
# Past the model's context: the error quotes the value read.
for size in 1M=1048576 1m=1000000; do
  "$BIN" plan "$ROOT/configs/qwen3.5-35b-a3b" --gpu h200 --max-model-len "${size%=*}" >"$TMP/out" 2>&1
  grep -q -- "--max-model-len ${size#*=} is larger than the model's max_position_embeddings" "$TMP/out" ||
    bad "--max-model-len ${size%=*} is not ${size#*=}: $(cat "$TMP/out")"
done
expect_plan max_model_len 2048 --max_model_len 2048
expect_plan max_model_len 3000 --max_model_len=3k
expect_plan max_model_len 2000 --max-model-len 1k --max-model-len 2k
expect_plan max_num_seqs 8 --max-num-seqs 4 --max_num_seqs 8
expect_plan tensor_parallel_size 2 -tp 2
expect_plan pipeline_parallel_size 2 -pp=2
expect_plan tensor_parallel_size 1 --dtype bfloat16 -dp 1
# --disable-sliding-window caps max_model_len at the window, as vLLM does (a Mistral-7B-shaped config,
# sliding_window 4096); a larger --max-model-len is refused naming the window.
mkdir -p "$TMP/swa"
cat >"$TMP/swa/config.json" <<'JSON'
{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
 "head_dim": 128, "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
 "rope_theta": 10000.0, "hidden_act": "silu", "sliding_window": 4096, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16"}
JSON
swa_plan() { "$BIN" plan "$TMP/swa" --gpu h200 --json "$@" 2>"$TMP/err"; }
got=$(swa_plan | python3 -c "import json,sys; print(json.load(sys.stdin)['max_model_len'])" 2>/dev/null)
[ "$got" = 32768 ] || bad "sliding-window plan: max_model_len $got, want 32768 ($(cat "$TMP/err"))"
got=$(swa_plan --disable-sliding-window | python3 -c "import json,sys; print(json.load(sys.stdin)['max_model_len'])" 2>/dev/null)
[ "$got" = 4096 ] || bad "--disable-sliding-window: max_model_len $got, want 4096 ($(cat "$TMP/err"))"
swa_plan --disable-sliding-window --max-model-len 8192 >/dev/null
grep -q -- "--max-model-len 8192 is larger than the model's sliding window (4096 tokens" "$TMP/err" ||
  bad "--disable-sliding-window --max-model-len 8192: $(cat "$TMP/err")"

# Mistakes: exit 2, one "error:" line, no CLI11 wording.
expect_error() {  # expect_error TEXT ARGS...
  local text=$1; shift
  "$BIN" serve "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ $rc = 2 ] || bad "serve $* exited $rc, want 2: $(cat "$TMP/err")"
  grep -qF -- "$text" "$TMP/err" || bad "serve $*: no '$text' in: $(cat "$TMP/err")"
  head -1 "$TMP/err" | grep -q '^error: ' || bad "serve $*: first line is not 'error: ...': $(cat "$TMP/err")"
  ! grep -qE "Run with --help|Could not convert|required INT missing|The following argument" "$TMP/err" ||
    bad "serve $*: CLI11's own words: $(cat "$TMP/err")"
}
expect_error "argument --max-model-len: must be a positive number of tokens" --max-model-len 0
expect_error "argument --max-model-len: invalid value '-5'" --max-model-len -5
expect_error "decimals are not allowed with binary suffixes like K; did you mean 1.5k?" --max-model-len 1.5K
expect_error "argument --max-model-len: invalid value 'lots'" --max-model-len lots
expect_error "did you mean --max-model-len?" --max-modle-len 100
expect_error "did you mean --tensor-parallel-size?" --tensor-paralel-size 2
expect_error "argument --port: invalid value: 'abc'" --port abc
expect_error "argument --port: expected one argument" --port
expect_error "--dtype float32: tessera computes in bfloat16" --dtype float32
expect_error "--data-parallel-size 2: tessera runs one engine per server" -dp 2
expect_error "--enable-lora is a vLLM flag tessera does not support: tessera serves one model without adapters" --enable-lora
expect_error "--ssl-certfile $TMP/none.pem: cannot read the file" --ssl-certfile "$TMP/none.pem"
expect_error "--ssl-keyfile needs --ssl-certfile" --ssl-keyfile k.pem
expect_error "--enable-ssl-refresh is a vLLM flag tessera does not support: the --ssl-certfile" --enable-ssl-refresh
expect_error "--allowed-origins [1]: give a JSON list of strings" --allowed-origins '[1]'
expect_error "--max-logprobs must be -1 (the vocabulary) or a count >= 0, got -2" --max-logprobs -2
expect_error "--scheduling-policy priority: requests are scheduled first come, first served" --scheduling-policy priority
expect_error "--tokenizer-mode mistral: tessera reads the checkpoint's Hugging Face tokenizer.json" --tokenizer-mode mistral
expect_error "--limit-mm-per-prompt: image 2: tessera serves text only" --limit-mm-per-prompt '{"image": 2}'
expect_error "--override-generation-config: 'seed': not a generation setting" --override-generation-config '{"seed": 1}'
expect_error "--default-chat-template-kwargs must be a JSON object" --default-chat-template-kwargs '[1]'
expect_error "--enable-reasoning needs --reasoning-parser" --enable-reasoning
expect_error "argument --optimization-level" -O7
expect_error "argument --config: cannot read" --config /no/such.yaml
printf 'max-model-len: 8k\n  nested: 1\n' >"$TMP/bad.yaml"
expect_error "line 2: expected a list item" --config "$TMP/bad.yaml"
expect_error "--enable-auto-tool-choice requires --tool-call-parser" --enable-auto-tool-choice
expect_error "--quantization awq: tessera reads bf16 checkpoints and FP8 ones" --quantization awq
expect_error "--gpu-memory-utilization must be in (0, 1]" --gpu-memory-utilization 2
expect_error "--swap-space must be >= 0, got -1" --swap-space -1
expect_error "--log-stats-interval must be above 0 seconds" --log-stats-interval 0

# vLLM's harmless flags get past the flag checks (the missing model directory is what stops them).
"$BIN" serve "$TMP/no-such-model" --dtype auto --swap-space 4 --disable-fastapi-docs --max-seq-len-to-capture 8192 \
  --enable-prompt-tokens-details --async-scheduling --enable-log-requests --max-log-len 100 --disable-log-requests \
  --disable-log-stats --max_num_batched_tokens 8k --dtype half -O3 --cuda-graph-sizes 1 2 4 --root-path /v \
  --guided-decoding-backend xgrammar --tokenizer-mode auto --scheduling-policy fcfs --model-impl auto \
  --limit-mm-per-prompt '{"image": 0}' --long-prefill-token-threshold 512 >"$TMP/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "not a model directory" "$TMP/out" || bad "harmless vLLM flags: exit $rc: $(cat "$TMP/out")"
grep -q -- "--swap-space is accepted for vLLM compatibility and has no effect" "$TMP/out" || bad "no-op flags not logged"
grep -q -- "--optimization-level is accepted for vLLM compatibility and has no effect" "$TMP/out" || bad "-O3 not logged"
grep -q -- "--dtype half: tessera computes in bfloat16" "$TMP/out" || bad "--dtype half not logged"

# --config: a YAML file's flags, the command line's own winning (plan reads the same engine flags).
printf '# vLLM --config\nmax-model-len: 16k\nmax_num_seqs: 12\ntensor-parallel-size: 2\nenable-prefix-caching: false\n' >"$TMP/c.yaml"
got=$("$BIN" serve --config "$TMP/c.yaml" --max-model-len 4k "$TMP/no-such-model" 2>&1)
echo "$got" | grep -q "not a model directory" || bad "--config: $got"
# The same file through serve's parser, shown by the startup line of a model that does not exist: 4000 wins.
cp -r "$ROOT/configs/qwen3-tiny" "$TMP/tiny"
got=$("$BIN" serve "$TMP/tiny" --config "$TMP/c.yaml" --max-model-len 4k --load-format dummy --device cpu \
  --tokenizer "$TMP/no-tokenizer" --port 0 2>&1)
echo "$got" | grep -q "max-model-len=4000 max-num-seqs=12" || bad "--config values not used: $got"
echo "$got" | grep -q "prefix-caching=false" || bad "--config's false not applied: $got"

# Every flag docs/server.md's flag table names is a flag of tessera serve.
"$BIN" serve --help >"$TMP/help" 2>&1 || bad "serve --help exited non-zero"
documented=$(python3 - "$ROOT/docs/server.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text[text.index("## Flags"):]
section = section[:section.index("\n## ", 5)]
names = set()
for row in section.splitlines():
    if row.startswith("|"):
        names.update(re.findall(r"`(--[a-z0-9-]+)", row.split("|")[1]))
print("\n".join(sorted(names)))
PY
)
[ -n "$documented" ] || bad "no flags found in docs/server.md's flag table"
for flag in $documented; do
  grep -qE -- "(^|[ ,])$flag([ ,={]|$)" "$TMP/help" || bad "docs/server.md lists $flag, which tessera serve --help does not show"
done
# And the reverse: every flag --help shows (at the start of its line) is in the table.
shown=$(grep -oE '^ +(-[a-z], ?)?--[a-z0-9-]+(\{false\})?(,--[a-z0-9-]+)?' "$TMP/help" | grep -oE -- '--[a-z0-9-]+' | sort -u)
for flag in $shown; do
  [ "$flag" = --help ] && continue
  echo "$documented" | grep -qx -- "$flag" || bad "tessera serve --help shows $flag, which docs/server.md's flag table does not list"
done
echo "$(echo "$documented" | wc -l) documented flags checked against --help"
[ $fail = 0 ] && echo "PASS: vLLM flags"
exit $fail
