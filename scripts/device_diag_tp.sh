#!/usr/bin/env bash
# Diagnoses a TP=2 CUDA generate that does not finish: each variant gets 25 s; a hung head and
# its ranks get their stacks dumped with kill -QUIT (the device machines have no gdb).
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=/tmp/bundle
variant() {  # variant NAME FLAGS...
  local name=$1; shift
  NCCL_DEBUG=WARN "$B/tessera" generate --model tests/fixtures/models/llama_gqa2 --device cuda --json --ignore-eos \
    --max-tokens 8 --prompt-ids 39,7,201,5,88 --tensor-parallel-size 2 "$@" > "$OUT/$name.json" 2> "$OUT/$name.log" &
  local p=$!
  for i in $(seq 1 250); do kill -0 $p 2>/dev/null || break; sleep 0.1; done
  if kill -0 $p 2>/dev/null; then
    echo "$name: HUNG"
    # kill -QUIT: every thread's stack into the log (module+offset; addr2line -f -C -e tessera OFFSET
    # on the build machine with the same binary), then look at what the head and its ranks wait in.
    for q in $p $(pgrep -P $p); do kill -QUIT $q 2>/dev/null; sleep 1; done
    grep -E "^--- thread|tessera\+0x|libnccl|libcuda" "$OUT/$name.log" | head -60 > "$OUT/${name}_stacks.txt"
    echo "-- stacks: $(grep -c '^--- thread' "$OUT/$name.log") threads (in $OUT/${name}_stacks.txt)"
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
NCCL_GRAPH_REGISTER=0 variant graphs_noregister --disable-custom-all-reduce
