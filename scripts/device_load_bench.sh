#!/usr/bin/env bash
# Weight loading on the GPU machine, through the staged loader (src/loader/staged_reader.h): a
# real-layout FP8 checkpoint (configs/qwen3.5-122b-a10b-fp8 cut to LAYERS layers, about 2.5 GiB a
# layer plus 3.3 GiB of embeddings and head; default 8: about 23 GiB) made on the device with
# make_checkpoint, then loaded by `tessera generate` with its pages evicted first. Prints per run the
# load time, the loader's GB/s (over the load and inside the reads), the disk's own direct-read
# GB/s (dd iflag=direct over one shard), the page cache's peak growth during the load and how much
# of the checkpoint stays resident afterwards (the staged loader: none). With OLD=/path/to/tessera
# (a build before the staged loader, e.g. main's bundle) the same runs are made with it.
# Needs the bundle carried (scripts/bundle.sh --build-dir build/cuda --with-tests --out /tmp/bundle
#   --tar bundle/bundle.tar.xz), carry ["bundle"], command: bash scripts/device_load_bench.sh
# LAYERS (default 8), RUNS (default 2), CKPT (default /tmp/ckpt_fp8; reused when present), OLD.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/bundle ] || tar -xJf bundle/bundle.tar.xz -C /tmp
T=/tmp/bundle/tessera
MK=/tmp/bundle/make_checkpoint
LAYERS=${LAYERS:-8}
RUNS=${RUNS:-2}
CKPT=${CKPT:-/tmp/ckpt_fp8}
OLD=${OLD:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -x "$MK" ] || { echo "no $MK: bundle with --with-tests (scripts/bundle.sh)"; exit 1; }
if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
  start=$(date +%s)
  "$MK" configs/qwen3.5-122b-a10b-fp8 "$CKPT" --layers "$LAYERS" | tail -1
  echo "written in $(($(date +%s) - start)) s"
fi
evict() { for f in "$CKPT"/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done; }
cached_kib() { awk '/^Cached:/ {print $2}' /proc/meminfo; }
resident_mib() {  # of the checkpoint, by mincore (fincore from util-linux)
  if command -v fincore >/dev/null; then
    fincore -b -n -o RES "$CKPT"/*.safetensors | awk '{s += $1} END {printf "%.0f", s / 1048576}'
  else echo "?"; fi
}
first=$(ls "$CKPT"/*.safetensors | head -1)
evict
disk=$(dd if="$first" of=/dev/null bs=64M iflag=direct 2>&1 | tail -1)
echo "disk, direct read of one shard: $disk"

run() {  # label binary
  local label=$1 bin=$2
  for r in $(seq 1 "$RUNS"); do
    evict
    local before peak=0 now
    before=$(cached_kib)
    "$bin" generate --model "$CKPT" --prompt-ids 1,2,3 --max-tokens 4 --max-model-len 512 --max-num-seqs 4 \
      --enforce-eager > "$OUT/load_${label}_$r.log" 2>&1 &
    local pid=$!
    while kill -0 $pid 2>/dev/null; do
      now=$(cached_kib); [ $((now - before)) -gt $peak ] && peak=$((now - before)); sleep 0.5
    done
    wait $pid || { echo "$label run $r failed:"; tail -5 "$OUT/load_${label}_$r.log"; continue; }
    echo "$label run $r: $(grep -o 'Loading weights took [0-9.]* seconds' "$OUT/load_${label}_$r.log")," \
         "page cache peak growth $((peak / 1024)) MiB, checkpoint resident after $(resident_mib) MiB"
    grep -o 'Read [0-9.]* GiB of safetensors.*' "$OUT/load_${label}_$r.log" | head -1
  done
}
run staged "$T"
[ -n "$OLD" ] && run old "$OLD"
du -sh "$CKPT"
