#!/usr/bin/env bash
# Two tessera nodes that share ONE GPU: two network namespaces joined by a veth pair named ens1 in
# each (10.77.0.1 / 10.77.0.2, tests/integration/netns_hosts.sh), each running one node of a
# `--nnodes 2` job whose one rank uses GPU 0 (docs/distributed.md, "Nodes that share a GPU"). NCCL
# runs over sockets on the veth: each node's ranks set NCCL_HOSTID of their own, so NCCL sees two
# hosts and not a duplicate GPU; the custom all-reduce stays off (its ranks span nodes); each node
# sizes its cache with --kv-cache-memory-bytes so that both fit.
#
#  1. Cases: fixtures (dense TP 2 and PP 2, MoE TP 2 with --enable-expert-parallel = EP 2, hybrid
#     Gated DeltaNet TP 2 and PP 2, its FP8 twin PP 2) and the demo model with MTP k=2 (TP 2, PP 2).
#     Each case's greedy token ids must equal a one-rank run's with the same flags, exactly (both
#     lists printed when they differ). One summary line per case.
#  2. LINK: the veth shaped with `tc qdisc add dev ens1 root netem delay 50us rate NNgbit` on both
#     ends, one run per value (0 = unshaped): the demo model's TP 2 decode tok/s for 64 tokens.
#  3. The flagship (dummy FP8, cut to FLAG_LAYERS=24 layers on a GPU under 240 GB) served at TP 2 and
#     PP 2 across the nodes with MTP k=2: the seed-003 protocol, then node 1's rank killed mid-run
#     (a named error and /health 503 within 30 s).
#
# Needs root, ip, tc, one GPU and the bundle (scripts/bundle.sh; bundle/bundle.tar.xz is unpacked
# to /tmp/bundle as scripts/device_two_nodes.sh does; `--with-net-tools` adds ip and tc for a
# machine without iproute2):
#   carry: ["bundle"]    command: bash scripts/device_netns_nodes.sh
# Settings (environment): DEADLINE=540 (seconds since the start; a case that would start later is
# skipped), LINK="0 50 10" (Gbit/s per link run), KV=512M (each node's --kv-cache-memory-bytes).
# DEVICE=cpu TESSERA_BIN=build/cpu/bin/tessera FLAG_MODEL=models/tessera-demo: a dry run of the script's own logic on a machine without a GPU (CPU ranks over Gloo; the
# flagship's section serves FLAG_MODEL, e.g. the demo model, since the flagship is too large for it).
# $OUT gets summary.txt and netns_nodes_logs.tar.gz (every log).
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
DEADLINE=${DEADLINE:-540}
LINK=${LINK:-"0 50 10"}
KV=${KV:-512M}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOGS="$OUT/netns_nodes_logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

if [ "$(id -u)" -ne 0 ]; then say "SKIP: needs root for ip netns"; exit 77; fi
# TESSERA_BIN: a tessera binary to run instead of the bundle's (the CPU dry run: build/cpu/bin/tessera).
if [ -z "${TESSERA_BIN:-}" ] && [ ! -d /tmp/bundle ]; then
  tar -xJf bundle/bundle.tar.xz -C /tmp || { say "FAIL setup: cannot unpack bundle/bundle.tar.xz"; exit 1; }
fi
# A GPU machine without iproute2: the bundle's own ip and tc (scripts/bundle.sh --with-net-tools).
command -v ip >/dev/null || [ ! -x /tmp/bundle/net/ip ] || export PATH="/tmp/bundle/net:$PATH"
DEVICE=${DEVICE:-cuda}
TOOLS="ip tc python3"
[ "$DEVICE" = cuda ] && TOOLS="$TOOLS nvidia-smi"
for tool in $TOOLS; do
  command -v "$tool" >/dev/null || { say "SKIP: no $tool"; exit 77; }
done
BIN=$(readlink -f "${TESSERA_BIN:-/tmp/bundle/tessera}")
[ -x "$BIN" ] || { say "FAIL setup: no $BIN"; exit 1; }

# The namespaces (A = node 0, the head; B = node 1); the helper's exit trap deletes them and kills
# what runs in them; ours first packs the logs.
TMP=$(mktemp -d /tmp/tessera-netns-nodes.XXXXXX)
# shellcheck source=tests/integration/netns_hosts.sh
source "$ROOT/tests/integration/netns_hosts.sh"
netns_hosts_up tsg 10.77.0
finish() {
  tar -czf "$OUT/netns_nodes_logs.tar.gz" -C "$OUT" netns_nodes_logs 2>/dev/null && rm -rf "$LOGS"
}
trap 'finish; netns_hosts_cleanup' EXIT

# NCCL over sockets on the veth: no peer-to-peer, shared memory, NVLink multicast or InfiniBand
# between the two nodes, as between two machines. NCCL's own log goes to files (stdout is --json's).
# shellcheck disable=SC2054  # the commas are inside values (NCCL_DEBUG_SUBSYS=INIT,NET)
NCCL_ENV=(NCCL_SOCKET_IFNAME=ens1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_IB_DISABLE=1
          NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
FIX=tests/fixtures/models
DEMO=models/tessera-demo
MTP='{"method":"mtp","num_speculative_tokens":2}'
# shellcheck disable=SC2054  # --prompt-ids takes comma-separated ids
PROMPTS=(--prompt-ids 39,7,201,5,88 --prompt-ids 12,240,1,66,3,9)
TOKEN=netns-nodes-token
PORT=29710

gpu_mib() { [ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 || echo 0; }
say "GPU: $([ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | head -1 || echo "none, DEVICE=$DEVICE"); bundle commit $(cat /tmp/bundle/COMMIT 2>/dev/null)"
say "namespaces $A (10.77.0.1, node 0) and $B (10.77.0.2, node 1), both on GPU 0; each node --kv-cache-memory-bytes $KV"

# The seconds a command may still run: at most $1, and not far past the deadline.
limit() {
  local left=$((DEADLINE + 50 - SECONDS))
  [ "$left" -lt 20 ] && left=20
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
ids() {
  python3 -c 'import json, sys
print([json.loads(l)["token_ids"] for l in open(sys.argv[1]) if l.startswith("{")])' "$1" 2>/dev/null
}
decode_rate() { grep -ho "decode [0-9.]* tok/s per sequence" "$1" | tail -1 | awk '{print $2}'; }

# reference NAME ARGS...: one rank on GPU 0, outside the namespaces.
reference() {
  local name=$1; shift
  env CUDA_VISIBLE_DEVICES=0 "${NCCL_ENV[@]}" NCCL_DEBUG_FILE="$LOGS/nccl.$name.ref.%p.log" \
    timeout "$(limit 120)" "$BIN" generate "$@" >"$LOGS/$name.ref.jsonl" 2>"$LOGS/$name.ref.log"
}
# on_node NS NAME N CMD...: CMD in namespace NS on GPU 0 with the NCCL settings, NCCL's log to node N's file of NAME.
on_node() {
  local ns=$1 name=$2 node=$3; shift 3
  ip netns exec "$ns" env CUDA_VISIBLE_DEVICES=0 "${NCCL_ENV[@]}" NCCL_DEBUG_FILE="$LOGS/nccl.$name.node$node.%p.log" "$@"
}
# pair NAME ARGS...: node 0 in A, node 1 in B, one rank each on GPU 0; sets HEAD_RC and NODE_RC.
pair() {
  local name=$1; shift
  PORT=$((PORT + 10))
  local common=(generate "$@" --nnodes 2 --master-addr 10.77.0.1 --master-port "$PORT" --cluster-token "$TOKEN"
                --join-timeout 60 --kv-cache-memory-bytes "$KV")
  local t
  t=$(limit 180)
  on_node "$A" "$name" 0 timeout "$t" "$BIN" "${common[@]}" --node-rank 0 >"$LOGS/$name.head.jsonl" \
    2>"$LOGS/$name.head.log" &
  local h=$!
  on_node "$B" "$name" 1 timeout "$t" "$BIN" "${common[@]}" --node-rank 1 >"$LOGS/$name.node1.out" \
    2>"$LOGS/$name.node1.log" &
  local n=$!
  wait "$h"; HEAD_RC=$?
  wait "$n"; NODE_RC=$?
}
# What the logs say about the path the ranks took (NCCL transport, custom all-reduce, NCCL_HOSTID).
path_notes() {
  local name=$1 notes=()
  if grep -qh "via NET/Socket" "$LOGS"/nccl."$name".node*.log 2>/dev/null; then notes+=("NCCL NET/Socket"); fi
  if grep -qhE "via (P2P|SHM)" "$LOGS"/nccl."$name".node*.log 2>/dev/null; then notes+=("NCCL P2P/SHM seen!"); fi
  if grep -qh "custom all-reduce off on group tp0: its ranks span nodes" "$LOGS/$name.head.log"; then
    notes+=("custom all-reduce off (spans nodes)")
  fi
  if grep -qh "Duplicate GPU" "$LOGS"/nccl."$name".node*.log "$LOGS/$name".*.log 2>/dev/null; then
    notes+=("NCCL: Duplicate GPU detected")
  fi
  local IFS=,
  echo "${notes[*]}"
}

pass=0; fail=0; skipped=0
# run_case NAME ARGS...: the one-rank reference (ARGS without the parallel flags that follow
# `--`), then the two nodes; one summary line.
run_case() {
  local name=$1; shift
  local base=() par=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do base+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  par=("$@")
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    say "SKIP $name: the deadline (DEADLINE=$DEADLINE s) has passed"
    skipped=$((skipped + 1))
    return
  fi
  local t0=$SECONDS
  reference "$name" "${base[@]}"
  local ref_rc=$?
  pair "$name" "${base[@]}" "${par[@]}"
  local want got
  want=$(ids "$LOGS/$name.ref.jsonl")
  got=$(ids "$LOGS/$name.head.jsonl")
  local notes
  notes=$(path_notes "$name")
  if [ $ref_rc != 0 ] || [ -z "$want" ] || [ "$want" = "[]" ]; then
    say "FAIL $name: the one-rank reference exited $ref_rc: $(grep -h '^error' "$LOGS/$name.ref.log" | tail -1)"
    fail=$((fail + 1))
  elif [ "$HEAD_RC" != 0 ] || [ "$NODE_RC" != 0 ]; then
    say "FAIL $name: head rc=$HEAD_RC node rc=$NODE_RC in $((SECONDS - t0)) s [$notes]: $(grep -h '^error' \
      "$LOGS/$name.head.log" "$LOGS/$name.node1.log" | head -2 | cut -c1-300 | tr '\n' ' ')"
    fail=$((fail + 1))
  elif [ "$want" != "$got" ]; then
    say "FAIL $name: token ids differ from one rank's [$notes]"
    say "  one rank:  $want"
    say "  two nodes: $got"
    fail=$((fail + 1))
  else
    say "PASS $name: ids equal to one rank's, $((SECONDS - t0)) s [$notes]"
    pass=$((pass + 1))
  fi
}

say "== 1. greedy ids on two nodes sharing GPU 0 vs one rank"
G=(--device "$DEVICE" --json --ignore-eos --max-num-seqs 8 "${PROMPTS[@]}")
run_case dense_tp2 --model "$FIX/qwen3_gqa4_hd32" "${G[@]}" --max-tokens 16 -- --tensor-parallel-size 2
run_case dense_pp2 --model "$FIX/qwen3_gqa4_hd32" "${G[@]}" --max-tokens 16 -- --pipeline-parallel-size 2
run_case moe_tp2_ep2 --model "$FIX/qwen3_moe_e8_k2_norm" "${G[@]}" --max-tokens 16 -- --tensor-parallel-size 2 \
  --enable-expert-parallel
run_case hybrid_tp2 --model "$FIX/qwen3_5_moe_text_tiny" "${G[@]}" --max-tokens 16 -- --tensor-parallel-size 2
run_case hybrid_pp2 --model "$FIX/qwen3_5_moe_text_tiny" "${G[@]}" --max-tokens 16 -- --pipeline-parallel-size 2
# The FP8 twin by layers only: its one Gated DeltaNet key head cannot be split over two TP ranks.
run_case fp8_hybrid_pp2 --model "$FIX/qwen3_5_moe_text_fp8" "${G[@]}" --max-tokens 16 -- --pipeline-parallel-size 2
run_case demo_mtp_tp2 --model "$DEMO" "${G[@]}" --max-tokens 24 --speculative-config "$MTP" -- \
  --tensor-parallel-size 2
run_case demo_mtp_pp2 --model "$DEMO" "${G[@]}" --max-tokens 24 --speculative-config "$MTP" -- \
  --pipeline-parallel-size 2

say "== 2. the demo model's TP 2 decode (64 tokens, one prompt) per link: LINK=\"$LINK\" Gbit/s (0 = unshaped)"
shape() {  # shape GBIT: both ends of the veth; 0 removes the shaping
  local ns
  [ "$1" = 0 ] || modprobe sch_netem 2>/dev/null
  for ns in "$A" "$B"; do
    ip netns exec "$ns" tc qdisc del dev ens1 root 2>/dev/null
    if [ "$1" != 0 ]; then
      ip netns exec "$ns" tc qdisc add dev ens1 root netem delay 50us rate "${1}gbit" || return 1
    fi
  done
}
# shellcheck disable=SC2054  # --prompt-ids takes comma-separated ids
L=(--model "$DEMO" --device "$DEVICE" --json --ignore-eos --max-num-seqs 8 --max-tokens 64 --prompt-ids 39,7,201,5,88)
first_ids=""
for gbit in $LINK; do
  name="link_${gbit}gbit"
  what=$([ "$gbit" = 0 ] && echo "unshaped" || echo "$gbit Gbit/s + 50 us each way")
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    say "SKIP $name ($what): the deadline (DEADLINE=$DEADLINE s) has passed"
    skipped=$((skipped + 1))
    continue
  fi
  if ! shape "$gbit"; then
    say "FAIL $name: tc netem on ens1 failed (sch_netem module?)"
    fail=$((fail + 1))
    continue
  fi
  t0=$SECONDS
  pair "$name" "${L[@]}" --tensor-parallel-size 2
  rate=$(decode_rate "$LOGS/$name.head.log")
  got=$(ids "$LOGS/$name.head.jsonl")
  [ -z "$first_ids" ] && first_ids=$got
  if [ "$HEAD_RC" = 0 ] && [ "$NODE_RC" = 0 ] && [ -n "$rate" ]; then
    same=$([ "$got" = "$first_ids" ] && echo "ids as on the first link" || echo "ids DIFFER from the first link")
    say "PASS $name ($what): TP 2 decode ${rate} tok/s, $((SECONDS - t0)) s, $same [$(path_notes "$name")]"
    pass=$((pass + 1))
  else
    say "FAIL $name ($what): head rc=$HEAD_RC node rc=$NODE_RC, decode rate '${rate}': $(grep -h '^error' \
      "$LOGS/$name.head.log" "$LOGS/$name.node1.log" | head -2 | cut -c1-300 | tr '\n' ' ')"
    fail=$((fail + 1))
  fi
done
shape 0

# 3. The seeds' flagship (dummy FP8 weights; cut to FLAG_LAYERS layers on a GPU under 120 GB, where two
# ranks of the whole model do not fit) served across the two nodes with MTP k=2: the seed-003 protocol
# from node 0's namespace, then node 1's rank process killed mid-run: the head must name it and answer
# /health 503 within 30 s. FLAGSHIP="tp2 pp2" (the layouts; empty skips), FLAG_KV (each node's cache).
FLAG=${FLAG_MODEL:-configs/qwen3.5-122b-a10b-fp8}
total_mib=$(gpu_mib)
if [ -z "${FLAG_MODEL:-}" ] && [ "${total_mib:-0}" -lt 240000 ]; then
  FLAG=$TMP/flagship_cut
  mkdir -p "$FLAG"
  python3 tools/cut_layers.py configs/qwen3.5-122b-a10b-fp8 "$FLAG" "${FLAG_LAYERS:-24}"
fi
TOK=$ROOT/.npm-pkgs/tokenizer-qwen3/package/models  # the flagship's (Qwen3's vocabulary); FLAG_MODEL's own if it has one
[ -n "${FLAG_MODEL:-}" ] && [ -f "$FLAG/tokenizer.json" ] && TOK=$FLAG
health_a() { ip netns exec "$A" curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/health"; }
# The rank process a node's tessera started (its child running `--worker-*`), by /proc.
rank_child() {
  python3 - "$1" <<'PY'
import os, sys
kids = {}
for p in os.listdir("/proc"):
    if p.isdigit():
        try: kids.setdefault(int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
        except OSError: pass
todo, seen = [int(sys.argv[1])], []
while todo:
    q = todo.pop(); seen.append(q); todo += kids.get(q, [])
for q in seen[1:]:
    try:
        if b"--worker" in open(f"/proc/{q}/cmdline", "rb").read(): print(q); break
    except OSError: pass
PY
}
for layout in ${FLAGSHIP-tp2 pp2}; do
  name="flagship_$layout"
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    say "SKIP $name: the deadline (DEADLINE=$DEADLINE s) has passed"; skipped=$((skipped + 1)); continue
  fi
  par=(--tensor-parallel-size 2); [ "$layout" = pp2 ] && par=(--pipeline-parallel-size 2)
  PORT=$((PORT + 10)); http=$((8100 + PORT % 100))
  common=(serve "$FLAG" --load-format dummy --device "$DEVICE" --tokenizer "$TOK" --max-model-len 4096 --max-num-seqs 64
          --speculative-config "$MTP" "${par[@]}" --nnodes 2 --master-addr 10.77.0.1 --master-port "$PORT"
          --cluster-token "$TOKEN" --join-timeout 120 --kv-cache-memory-bytes "${FLAG_KV:-2G}" --host 127.0.0.1
          --port "$http")
  t0=$SECONDS
  on_node "$A" "$name" 0 "$BIN" "${common[@]}" --node-rank 0 >"$LOGS/$name.head.log" 2>&1 &
  h=$!
  on_node "$B" "$name" 1 "$BIN" "${common[@]}" --node-rank 1 >"$LOGS/$name.node1.log" 2>&1 &
  n=$!
  up=0
  for _ in $(seq 1 "$(limit 240)"); do
    [ "$(health_a $http)" = 200 ] && { up=1; break; }
    kill -0 $h 2>/dev/null || break
    sleep 1
  done
  if [ $up != 1 ]; then
    say "FAIL $name: the head did not serve within $((SECONDS - t0)) s: $(grep -h '^error' "$LOGS/$name.head.log" \
      "$LOGS/$name.node1.log" | head -2 | cut -c1-300 | tr '\n' ' ')"
    fail=$((fail + 1)); kill -9 $h $n 2>/dev/null; wait $h $n 2>/dev/null; continue
  fi
  started=$((SECONDS - t0))
  ip netns exec "$A" timeout "$(limit 200)" "$BIN" bench --base-url "http://127.0.0.1:$http" --concurrency 1,5,10,20 \
    --requests-per-level 40 --max-tokens 64 --prompt "Explain parallel computing in one sentence." \
    --json "$LOGS/$name.bench.json" >"$LOGS/$name.bench.txt" 2>&1
  rates=$(python3 - "$LOGS/$name.bench.json" 2>/dev/null <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(", ".join("c%d %.1f%s" % (l["max_concurrency"], l["completion_token_throughput"],
                                " FAILED %d" % l["failed"] if l["failed"] else "") for l in d["levels"]))
PY
)
  # Node 1's rank killed while requests run.
  ip netns exec "$A" timeout 60 "$BIN" bench --base-url "http://127.0.0.1:$http" --concurrency 4 \
    --requests-per-level 40 --max-tokens 256 --prompt "Explain parallel computing in one sentence." \
    >"$LOGS/$name.killbench.txt" 2>&1 &
  kb=$!
  sleep 3
  victim=$(rank_child $n)
  k0=$SECONDS; saw503=""; head_rc=""
  if [ -n "$victim" ]; then
    kill -9 "$victim"
    for _ in $(seq 1 400); do  # 40 s
      [ -z "$saw503" ] && [ "$(health_a $http)" = 503 ] && saw503=$((SECONDS - k0))
      if ! kill -0 $h 2>/dev/null; then wait $h; head_rc=$?; break; fi
      sleep 0.1
    done
  fi
  kill $kb 2>/dev/null; wait $kb 2>/dev/null
  kill -9 $h $n 2>/dev/null; wait $h $n 2>/dev/null
  named=$(grep -h "^error" "$LOGS/$name.head.log" | head -1 | cut -c1-240)
  if [ -n "$rates" ] && [ -n "$victim" ] && [ -n "$saw503" ] && [ "$saw503" -le 30 ] && [ -n "$named" ]; then
    say "PASS $name: served after ${started} s; seed-003 protocol, MTP k=2, completion tok/s $rates" \
      "[$(path_notes "$name")]; node 1's rank (pid $victim) killed: /health 503 after ${saw503} s, head exit" \
      "${head_rc:-still running}: $named"
    pass=$((pass + 1))
  else
    say "FAIL $name: served after ${started} s, rates '${rates}', victim '${victim}', 503 after '${saw503}' s," \
      "head exit '${head_rc}', error '${named}'"
    fail=$((fail + 1))
  fi
done

say "== $pass passed, $fail failed, $skipped skipped in $SECONDS s; logs: $OUT/netns_nodes_logs.tar.gz"
[ "$fail" = 0 ]
