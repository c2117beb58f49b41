#!/usr/bin/env bash
# Two "nodes" on one host with 2 GPUs (issue 9): `--nnodes 2`, one GPU and one rank per node,
# NCCL forced onto sockets over loopback (imitated Ethernet between machines). TP=2 and PP=2
# across the two nodes must give TP=1's greedy ids (fixture llama_gqa2 / qwen3_gqa4_hd32).
#   carry: ["bundle"]    command: bash scripts/device_two_nodes.sh
set -u
export NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
B=/tmp/bundle
ids() { python3 -c "import json,sys; print([json.loads(l)['token_ids'] for l in open(sys.argv[1]) if l.startswith('{')])" "$1"; }
port=29650
for c in "qwen3_gqa4_hd32 --tensor-parallel-size 2" "qwen3_gqa4_hd32 --pipeline-parallel-size 2" \
         "llama_gqa2 --pipeline-parallel-size 2"; do
  set -- $c; m=$1; shift
  GEN=(generate --model tests/fixtures/models/$m --device cuda --json --ignore-eos --max-tokens 16
       --prompt-ids 39,7,201,5,88 --prompt-ids 12,240,1,66,3,9)
  CUDA_VISIBLE_DEVICES=0 timeout 60 $B/tessera "${GEN[@]}" > "$OUT/ref_$m.jsonl" 2>/dev/null
  common=("${GEN[@]}" "$@" --nnodes 2 --master-addr 127.0.0.1 --master-port $port --cluster-token two-nodes --join-timeout 30)
  t0=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=0 timeout 90 $B/tessera "${common[@]}" --node-rank 0 > "$OUT/head.jsonl" 2> "$OUT/head_$m$1.log" &
  h=$!
  CUDA_VISIBLE_DEVICES=1 timeout 90 $B/tessera "${common[@]}" --node-rank 1 > /dev/null 2> "$OUT/node1_$m$1.log" &
  n=$!
  wait $h; hr=$?; wait $n; nr=$?
  secs=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  same=$([ "$(ids "$OUT/ref_$m.jsonl")" = "$(ids "$OUT/head.jsonl")" ] && echo "equal to TP=1" || echo "DIFFER from TP=1")
  echo "$m $* across 2 nodes: head rc=$hr node rc=$nr in ${secs}s, ids $same"
  grep -h "rank processes\|nodes joined\|NIC\|nic" "$OUT/head_$m$1.log" | head -3 | cut -c1-200
  grep -h "^error" "$OUT/head_$m$1.log" "$OUT/node1_$m$1.log" | head -2
  port=$((port + 10))
done
