#!/usr/bin/env bash
# Diagnoses a TP=2 CUDA generate that does not finish: each variant gets 25 s; a hung head and
# its rank get their stacks dumped (gdb, when the machine has it).
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=/tmp/bundle
command -v gdb >/dev/null && echo "gdb: yes" || echo "gdb: no"
variant() {  # variant NAME FLAGS...
  local name=$1; shift
  NCCL_DEBUG=WARN "$B/tessera" generate --model tests/fixtures/models/llama_gqa2 --device cuda --json --ignore-eos \
    --max-tokens 8 --prompt-ids 39,7,201,5,88 --tensor-parallel-size 2 "$@" > "$OUT/$name.json" 2> "$OUT/$name.log" &
  local p=$!
  for i in $(seq 1 250); do kill -0 $p 2>/dev/null || break; sleep 0.1; done
  if kill -0 $p 2>/dev/null; then
    echo "$name: HUNG"
    if command -v gdb >/dev/null; then
      for q in $p $(pgrep -P $p); do
        timeout 20 gdb -p $q -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E "^#|^Thread" | grep -vE "libc.so|pthread|clone|start_thread" | head -40 > "$OUT/${name}_bt_$q.txt"
        echo "-- pid $q"; grep -E "tessera::" "$OUT/${name}_bt_$q.txt" | sed 's/(.*//' | head -12
      done
    fi
    kill -9 $p $(pgrep -P $p) 2>/dev/null
  else
    wait $p; echo "$name: rc=$? $(head -c 150 "$OUT/$name.json")"
  fi
  grep -E "WARN|error|Error" "$OUT/$name.log" | head -3
}
variant eager_nccl --enforce-eager --disable-custom-all-reduce
variant eager_car --enforce-eager
variant graph_nccl --disable-custom-all-reduce
variant default
