#!/usr/bin/env bash
# The seeds' Ray-style flow with tessera, on two "hosts" (network namespaces A and B joined by
# a veth pair named ens1, with decoys docker0/eno9 and, in A, a second fast port ens2):
#   1. `tessera node start --head` in A (seed 000's ray start flags, VLLM_HOST_IP instead of
#      --node-ip-address, NCCL_SOCKET_IFNAME=ens as a prefix list), `tessera node start
#      --address` in B (seed 003's flags, NCCL_SOCKET_IFNAME with a wrong entry): the log lines
#      for each environment variable; `tessera cluster status` lists both with GPU counts.
#   2. Seed 003's serve command (TP=2 across the two hosts, --distributed-executor-backend ray
#      and every other flag of it) on the head: /v1/models and a chat request answer; the
#      warning names the link TP crosses; --language-model-only is logged once.
#   3. The job is killed: both nodes stay joined; seed 002's serve command (TP=1 x PP=2, no
#      backend flag: the ranks do not fit the head) puts one pipeline stage on each node; seed 000's serve command (minus
#      --speculative-config: the scaled-down model has no MTP layer, and the command fails saying so) then serves
#      with an FP8 KV cache, and seed 000's benchmark_serving line runs as `tessera bench`.
#      Then a rank of that job is killed on the worker: the job ends naming it, the nodes stay.
#   4. The worker node is killed: `cluster status` names it DEAD within 10 s.
#   5. Startup errors: a *_SOCKET_IFNAME contradicting the route to the head or --nic, and
#      VLLM_HOST_IP contradicting --node-ip-address, each naming both.
#   netns_cluster_test.sh TESSERA_BIN
# Exit 77 (ctest SKIP) when not root or when namespaces cannot be created here.
set -uo pipefail
BIN=${1:?usage: netns_cluster_test.sh TESSERA_BIN}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TOK="$ROOT/.npm-pkgs/tokenizer-qwen3/package/models"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for ip netns"; exit 77; fi
command -v ip >/dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: $TOK/tokenizer.json missing (scripts/fetch_test_data.sh)"; exit 77; }

TMP=$(mktemp -d /tmp/tessera-netns-cluster.XXXXXX)
chmod 755 "$TMP"
source "$(dirname "$0")/netns_hosts.sh"
# The seeds' model directory, scaled down (netns_hosts.sh), the same path on both "hosts" as the
# seeds require. The serve commands add --load-format dummy (no weights) and
# --num-gpu-blocks-override (on CPU, --gpu-memory-utilization is a share of the host's memory,
# which other processes of a CI machine use too: a fixed KV cache keeps the test deterministic).
MODEL="$TMP/model"
tiny_chat_model "$MODEL"
CPU_FIXTURE=(--load-format dummy --num-gpu-blocks-override 256)
netns_hosts_up tsc 10.79.0
set -e
# Decoys: docker0 and eno9 on other subnets in both, and in A a second fast port ens2.
netns_hosts_decoys
ip -n "$A" link add ens2 type veth peer name ens2p
ip -n "$A" addr add 10.80.0.1/24 dev ens2
ip -n "$A" link set ens2 up
set +e

fail=0
FAIL() { echo "FAIL: $*"; fail=1; }
has() { grep -q -- "$2" "$1" || { FAIL "$1 lacks '$2'"; echo "--- $1"; tail -20 "$1"; }; }
lacks() { ! grep -q -- "$2" "$1" || FAIL "$1 has '$2'"; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
wait_for() {  # wait_for FILE TEXT SECONDS
  for _ in $(seq 1 $(($3 * 10))); do grep -q -- "$2" "$1" && return 0; sleep 0.1; done
  FAIL "$1: no '$2' within $3 s"; tail -20 "$1"; return 1
}
export TESSERA_STATE_DIR="$TMP/state" TESSERA_CLUSTER_TOKEN=netns-cluster-token
PORT=6379

# --- 1. the cluster: head in A, worker in B, each with the seeds' environment
ip netns exec "$A" env VLLM_HOST_IP=10.79.0.1 GLOO_SOCKET_IFNAME=ens1 NCCL_SOCKET_IFNAME=ens NCCL_IB_DISABLE=1 \
  "$BIN" node start --head --port=$PORT --num-gpus 1 --object-store-memory 17179869184 --disable-usage-stats \
  >"$TMP/head.log" 2>&1 &
HEAD=$!; PIDS+=($HEAD)
wait_for "$TMP/head.log" "tessera cluster head started at 10.79.0.1:$PORT" 10
ip netns exec "$B" env VLLM_HOST_IP=10.79.0.2 GLOO_SOCKET_IFNAME=ens1 NCCL_SOCKET_IFNAME=ens1,ib7 \
  "$BIN" node start --address=10.79.0.1:$PORT --node-ip-address=10.79.0.2 --num-gpus 1 --block \
  >"$TMP/worker.log" 2>&1 &
WORKER=$!; PIDS+=($WORKER)
wait_for "$TMP/worker.log" "joined the tessera cluster at 10.79.0.1:$PORT as node 1" 10
has "$TMP/head.log" "VLLM_HOST_IP=10.79.0.1 (from the environment) used as --node-ip-address"
has "$TMP/head.log" "NCCL_SOCKET_IFNAME=ens (set by the user) matches ens1, ens2; NCCL gets the whole list"
has "$TMP/head.log" "network interface ens1 (10.79.0.1): matches GLOO_SOCKET_IFNAME=ens1 (from the environment); NCCL_SOCKET_IFNAME=ens GLOO_SOCKET_IFNAME=ens1"
has "$TMP/head.log" "tessera has no object store"
has "$TMP/worker.log" "NCCL_SOCKET_IFNAME entry 'ib7' matches no interface on this node"
has "$TMP/worker.log" "GLOO_SOCKET_IFNAME=ens1 (set by the user) matches ens1"
ip netns exec "$A" "$BIN" node start --head --port 6380 --node-ip-address 10.79.0.1 >"$TMP/head2.log" 2>&1
[ $? != 0 ] || FAIL "a second head on the same machine started"
has "$TMP/head2.log" "a cluster head already runs on this machine (pid"
ip netns exec "$A" "$BIN" cluster status >"$TMP/status1.log" 2>&1 || FAIL "cluster status exited $?"
cat "$TMP/status1.log"
has "$TMP/status1.log" "2 node(s) alive of 2 joined"
grep -Eq "^0 .*10\.79\.0\.1 +ens1 +0 .* 1 .*alive +\(head\)" "$TMP/status1.log" || FAIL "status: head row"
grep -Eq "^1 .*10\.79\.0\.2 +ens1 +0 .* 1 .*alive" "$TMP/status1.log" || FAIL "status: worker row"
echo "1. node start --head / --address: both joined; environment logged"

# serve_and_wait TAG ARGS...: starts `tessera serve ARGS` in A; sets SERVE, HTTP_OK.
serve_and_wait() {
  local tag="$1"; shift
  ip netns exec "$A" "$BIN" serve "$@" >"$TMP/$tag.log" 2>&1 &
  SERVE=$!; PIDS+=($SERVE)
  HTTP_OK=0
  for _ in $(seq 1 600); do
    grep -q "Application startup complete" "$TMP/$tag.log" && { HTTP_OK=1; break; }
    kill -0 $SERVE 2>/dev/null || break
    sleep 0.1
  done
  [ $HTTP_OK = 1 ] || { FAIL "$tag: serve did not start"; tail -30 "$TMP/$tag.log"; tail -20 "$TMP/worker.log"; }
}
chat() {  # chat HOST MODEL OUT
  ip netns exec "$A" curl -sS -m 60 "http://$1:8000/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"$2\",\"messages\":[{\"role\":\"user\",\"content\":\"你好\"}],\"max_tokens\":8,\"temperature\":0}" >"$3"
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["choices"][0]["message"]; assert "content" in c, c' "$3" ||
    { FAIL "chat request failed: $(head -c 300 "$3")"; }
}

# --- 2. seed 003's serve command (vllm serve -> tessera serve, /model/qwen3.5-122 -> fixture)
T0=$(date +%s.%N)
serve_and_wait seed003 "$MODEL" \
  --tensor-parallel-size 2 \
  --distributed-executor-backend ray \
  --host 0.0.0.0 --port 8000 \
  --max-model-len 2048 \
  --gpu-memory-utilization 0.60 \
  --enforce-eager \
  --disable-custom-all-reduce \
  --trust-remote-code \
  --language-model-only \
  --reasoning-parser qwen3 \
  "${CPU_FIXTURE[@]}"
T1=$(date +%s.%N)
if [ $HTTP_OK = 1 ]; then
  ip netns exec "$A" curl -sS -m 10 http://127.0.0.1:8000/v1/models >"$TMP/models.json"
  has "$TMP/models.json" "$MODEL"
  chat 127.0.0.1 "$MODEL" "$TMP/chat1.json"
  has "$TMP/seed003.log" "2 rank(s) on 2 nodes of the cluster at 10.79.0.1:$PORT: cluster node 0 (10.79.0.1): ranks 0-0, cluster node 1 (10.79.0.2): ranks 1-1"
  has "$TMP/seed003.log" "crosses the network link 10.79.0.1 on ens1 <-> 10.79.0.2 on ens1"
  has "$TMP/seed003.log" "node 0 of 2: NIC ens1 (10.79.0.1), world ranks 0..0 of 2"
  [ "$(grep -c -- "--language-model-only: tessera loads only the language model" "$TMP/seed003.log")" = 1 ] ||
    FAIL "--language-model-only not logged exactly once"
  has "$TMP/seed003.log" '"POST /v1/chat/completions HTTP/1.1" 200'
  has "$TMP/worker.log" "job: node 1 of 2, head 10.79.0.1:"
  has "$TMP/worker.log" "node 1 of 2: NIC ens1 (10.79.0.2), world ranks 1..1 of 2"
  echo "2. seed 003 serve, TP=2 over the two nodes: chat answered ($(elapsed "$T0" "$T1") s to start)"
fi

# --- 3. kill the job: the nodes stay; a second job (seed 000's command) runs on them
kill -9 $SERVE; wait $SERVE 2>/dev/null
wait_for "$TMP/worker.log" "the job's process (node 1 of 2) ended" 15
sleep 0.5
ip netns exec "$A" "$BIN" cluster status >"$TMP/status2.log" 2>&1 || FAIL "cluster status after the job exited $?"
has "$TMP/status2.log" "2 node(s) alive of 2 joined"
kill -0 $HEAD 2>/dev/null || FAIL "the head node died with the job"
kill -0 $WORKER 2>/dev/null || FAIL "the worker node died with the job"
# Seed 002's serve (vllm serve -> tessera serve): TP = GPUs per node (1 here), PP = nodes (2), no
# backend flag: the ranks do not fit the head, so they go to the cluster; TP stays inside a node.
serve_and_wait seed002 "$MODEL" \
  --tensor-parallel-size 1 \
  --pipeline-parallel-size 2 \
  --gpu-memory-utilization 0.90 \
  --max-model-len 2048 \
  "${CPU_FIXTURE[@]}"
if [ $HTTP_OK = 1 ]; then
  chat 127.0.0.1 "$MODEL" "$TMP/chat_pp.json"
  has "$TMP/seed002.log" "2 ranks do not fit this node's 1 slot(s): placing them on the cluster"
  has "$TMP/seed002.log" "2 rank(s) on 2 nodes of the cluster"
  lacks "$TMP/seed002.log" "crosses the network link"
  kill $SERVE; wait $SERVE || FAIL "seed 002's server exited $? on SIGTERM"
  for _ in $(seq 1 150); do [ "$(grep -c "the job's process (node 1 of 2) ended" "$TMP/worker.log")" -ge 2 ] && break; sleep 0.1; done
  [ "$(grep -c "the job's process (node 1 of 2) ended" "$TMP/worker.log")" -ge 2 ] || FAIL "the worker's second job did not end"
  echo "2b. seed 002 serve (TP=1 x PP=2, no backend flag): one pipeline stage per node, chat answered"
fi
# Seed 000's --speculative-config (method mtp) runs on several ranks; this Qwen3 model has no MTP
# layer, so the command fails at load saying so (and pointing at ngram).
ip netns exec "$A" "$BIN" serve "$MODEL" --tensor-parallel-size 2 --distributed-executor-backend ray \
  --speculative-config '{"method":"mtp","num_speculative_tokens":2}' "${CPU_FIXTURE[@]}" >"$TMP/spec.log" 2>&1
[ $? != 0 ] || FAIL "--speculative-config method mtp accepted for a model without an MTP layer"
has "$TMP/spec.log" "needs a checkpoint with a multi-token-prediction layer"
lacks "$TMP/spec.log" "not built yet"
serve_and_wait seed000 \
  --model "$MODEL" \
  --served-model-name Qwen3.5-122B-A10B-FP8 \
  --tensor-parallel-size 2 \
  --host 10.79.0.1 \
  --port 8000 \
  --trust-remote-code \
  --max-model-len 2048 \
  --max-num-seqs 8 \
  --gpu-memory-utilization 0.85 \
  --kv-cache-dtype fp8 \
  --distributed-executor-backend ray \
  --enable-auto-tool-choice \
  --tool-call-parser qwen3_coder \
  --reasoning-parser qwen3 \
  --language-model-only \
  "${CPU_FIXTURE[@]}"
if [ $HTTP_OK = 1 ]; then
  chat 10.79.0.1 Qwen3.5-122B-A10B-FP8 "$TMP/chat2.json"
  has "$TMP/seed000.log" "dtype fp8_e4m3"
  # seed 000's benchmark line (python3 -m vllm.benchmarks.benchmark_serving -> tessera bench), 100 prompts -> 4
  ip netns exec "$A" "$BIN" bench \
    --backend openai-chat \
    --base-url http://10.79.0.1:8000 \
    --model Qwen3.5-122B-A10B-FP8 \
    --dataset-name random \
    --num-prompts 4 \
    --request-rate 8 \
    --random-input-len 16 --random-output-len 4 --no-progress >"$TMP/bench.log" 2>&1 ||
    { FAIL "tessera bench --backend openai-chat exited $?"; tail -20 "$TMP/bench.log"; }
  cat "$TMP/bench.log" | tail -8
  chat_lines=$(grep -c '"POST /v1/chat/completions HTTP/1.1" 200' "$TMP/seed000.log")
  [ "$chat_lines" -ge 5 ] || FAIL "bench --backend openai-chat: $chat_lines chat requests in the server log"
  ip netns exec "$A" "$BIN" bench --backend openai --base-url http://10.79.0.1:8000 --model Qwen3.5-122B-A10B-FP8 \
    --dataset-name random --num-prompts 2 --random-input-len 8 --random-output-len 2 \
    --no-progress >"$TMP/bench2.log" 2>&1 || FAIL "tessera bench --backend openai exited $?"
  has "$TMP/seed000.log" '"POST /v1/completions HTTP/1.1" 200'
  echo "3. job killed, both nodes stayed; seed 000 serve + bench (openai-chat, openai) on them"
  # A rank of the job dies on the worker: the job ends (non-zero, naming it), the nodes stay.
  JOBPROC="$(cat /proc/$WORKER/task/$WORKER/children 2>/dev/null | awk '{print $1}')"
  RANK1="$(cat /proc/$JOBPROC/task/$JOBPROC/children 2>/dev/null | awk '{print $1}')"
  if [ -z "$RANK1" ]; then FAIL "no rank process under the worker's job"; else
    kill -9 "$RANK1"
    for _ in $(seq 1 300); do kill -0 $SERVE 2>/dev/null || break; sleep 0.1; done
    wait $SERVE; SRC=$?
    [ $SRC != 0 ] || FAIL "the job's head exited 0 after rank 1 died"
    grep -q "error: .*\(rank 1\|node 1\)" "$TMP/seed000.log" || FAIL "the job's head does not name rank 1 / node 1"
    wait_for "$TMP/worker.log" "the job's process (node 1 of 2) ended with exit code 1; this node stays in the cluster" 15
    ip netns exec "$A" "$BIN" cluster status >"$TMP/status2b.log" 2>&1 || FAIL "cluster status after a dead rank exited $?"
    has "$TMP/status2b.log" "2 node(s) alive of 2 joined"
    echo "3b. a rank killed on the worker ended the job (exit $SRC); both nodes stayed joined"
  fi
fi

# --- 4. a worker node dies: named in cluster status within 10 s
kill -9 $WORKER
T0=$(date +%s.%N)
DEAD=0
for _ in $(seq 1 100); do
  ip netns exec "$A" "$BIN" cluster status >"$TMP/status3.log" 2>&1
  grep -Eq "^1 .*10\.79\.0\.2 .*DEAD" "$TMP/status3.log" && { DEAD=1; break; }
  sleep 0.1
done
T1=$(date +%s.%N)
[ $DEAD = 1 ] || { FAIL "a killed worker is not DEAD in cluster status within 10 s"; cat "$TMP/status3.log"; }
ip netns exec "$A" "$BIN" cluster status >/dev/null 2>&1
[ $? = 3 ] || FAIL "cluster status with a dead node should exit 3"
echo "4. killed worker node named DEAD in cluster status after $(elapsed "$T0" "$T1") s"

# --- 5. environment that contradicts the network: errors naming both
ip netns exec "$B" env GLOO_SOCKET_IFNAME=eno9 timeout 10 "$BIN" node start --address 10.79.0.1:$PORT >"$TMP/e1.log" 2>&1
[ $? != 0 ] || FAIL "GLOO_SOCKET_IFNAME=eno9 accepted"
has "$TMP/e1.log" "GLOO_SOCKET_IFNAME=eno9 (from the environment) contradicts the route to the head 10.79.0.1, which leaves from ens1 (10.79.0.2)"
ip netns exec "$B" env NCCL_SOCKET_IFNAME=eno9 timeout 10 "$BIN" node start --address 10.79.0.1:$PORT --nic ens1 \
  >"$TMP/e2.log" 2>&1
[ $? != 0 ] || FAIL "NCCL_SOCKET_IFNAME contradicting --nic accepted"
has "$TMP/e2.log" "NCCL_SOCKET_IFNAME=eno9 (from the environment) contradicts --nic ens1"
ip netns exec "$B" env VLLM_HOST_IP=10.79.0.9 timeout 10 "$BIN" node start --address 10.79.0.1:$PORT \
  --node-ip-address 10.79.0.2 >"$TMP/e3.log" 2>&1
[ $? != 0 ] || FAIL "VLLM_HOST_IP contradicting --node-ip-address accepted"
has "$TMP/e3.log" "--node-ip-address 10.79.0.2 contradicts VLLM_HOST_IP=10.79.0.9"
echo "5. contradicting GLOO/NCCL_SOCKET_IFNAME and VLLM_HOST_IP: errors naming both"

kill $HEAD; wait $HEAD
[ -e "$TESSERA_STATE_DIR/cluster" ] && FAIL "the head left its state file behind"

# --- 6. --disable-log-requests and --uvicorn-log-level act: no per-request line (two servers at once)
ip netns exec "$A" "$BIN" serve "$MODEL" --uvicorn-log-level loud "${CPU_FIXTURE[@]}" >"$TMP/lvl.log" 2>&1
[ $? != 0 ] || FAIL "--uvicorn-log-level loud accepted"
has "$TMP/lvl.log" "--uvicorn-log-level loud: not one of critical, error, warning, info, debug, trace"
ip netns exec "$A" "$BIN" serve "$MODEL" --port 8001 --disable-log-requests "${CPU_FIXTURE[@]}" >"$TMP/quiet1.log" 2>&1 &
Q1=$!; PIDS+=($Q1)
ip netns exec "$A" "$BIN" serve "$MODEL" --port 8002 --uvicorn-log-level warning "${CPU_FIXTURE[@]}" >"$TMP/quiet2.log" 2>&1 &
Q2=$!; PIDS+=($Q2)
wait_for "$TMP/quiet1.log" "Application startup complete" 60 && wait_for "$TMP/quiet2.log" "Application startup complete" 60
for p in 8001 8002; do ip netns exec "$A" curl -sS -m 10 "http://127.0.0.1:$p/v1/models" >/dev/null || FAIL "port $p"; done
sleep 0.2
lacks "$TMP/quiet1.log" '"GET /v1/models"'
lacks "$TMP/quiet2.log" '"GET /v1/models"'
kill $Q1 $Q2; wait $Q1 $Q2
echo "6. --disable-log-requests / --uvicorn-log-level warning: no per-request log line"
"$BIN" bench --backend tgi >"$TMP/b1.log" 2>&1
[ $? != 0 ] || FAIL "bench --backend tgi accepted"
has "$TMP/b1.log" "--backend tgi: tessera bench speaks the OpenAI API; use --backend openai-chat"
"$BIN" bench --backend openai --endpoint /v1/chat/completions >"$TMP/b2.log" 2>&1
[ $? != 0 ] || FAIL "bench --backend openai with the chat endpoint accepted"
has "$TMP/b2.log" "--backend openai means --endpoint /v1/completions, but --endpoint /v1/chat/completions was given"
echo "7. bench --backend: other backends and a contradicting --endpoint are errors naming what to do"
[ $fail = 0 ] && echo "PASS: Ray-style cluster flow across namespaces"
exit $fail
