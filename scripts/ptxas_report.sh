#!/usr/bin/env bash
# Registers, spills and shared memory of every CUDA kernel, per target architecture: compiles
# src/backend/cuda/*.cu (or the files given) with ptxas -v for sm_90a, sm_120a and sm_121a, with
# the flags of src/backend/cuda/CMakeLists.txt, and prints one line a kernel and architecture:
#   ARCH REGS STACK SPILL_ST SPILL_LD STATIC DYNAMIC TOTAL FLAGS KERNEL
# DYNAMIC is the dynamic shared memory its launcher asks for (scripts/smem_table.cpp, from the
# constants the launchers use: src/backend/cuda/kernel_smem.h; '-' where a launcher asks for
# none; for kernels whose bytes depend on the shapes, the largest). FLAGS: SPILL (spill stores or
# loads), OVER (static + dynamic above the architecture's per-block limit: 232,448 bytes on
# sm_90, 101,376 on sm_120 and sm_121), unused (the launchers take another variant of this
# kernel on this architecture), NONE (no variant of its launcher fits: see NONE FITS). Exits 1
# when a launched kernel is OVER or a launcher has no variant that fits an architecture.
#   scripts/ptxas_report.sh                   # every file, every architecture (~30 minutes on 2 cores, ~3 on 16)
#   scripts/ptxas_report.sh src/backend/cuda/moe_gemm.cu
#   ARCHS="120a" scripts/ptxas_report.sh      # some architectures only
#   JOBS=16 scripts/ptxas_report.sh           # files compiled 16 at a time (default: the core count)
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
command -v "$NVCC" >/dev/null 2>&1 || NVCC=nvcc
ARCHS=${ARCHS:-"90a 120a 121a"}
if [ $# -gt 0 ]; then files=("$@"); else files=(src/backend/cuda/*.cu); fi

limit_of() {  # bytes of shared memory a block may opt into
  case "$1" in
    90a) echo 232448 ;;
    120a | 121a) echo 101376 ;;
    *) echo "ptxas_report: no shared-memory limit known for sm_$1" >&2; exit 2 ;;
  esac
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$NVCC" -std=c++17 -I src scripts/smem_table.cpp -o "$tmp/smem_table"
gencode=()
for a in $ARCHS; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done

# ptxas's lines, file by file: "arch mangled regs stack spill_st spill_ld smem". The files
# compile JOBS at a time (default: the number of cores); their logs are read in order.
JOBS=${JOBS:-$(nproc)}
i=0
for f in "${files[@]}"; do
  i=$((i + 1))
  echo "compiling $f" >&2
  ("$NVCC" -std=c++17 --expt-relaxed-constexpr --diag-suppress=177 -I src "${gencode[@]}" -Xptxas -v \
    -c "$f" -o "$tmp/out$i.o" 2>"$tmp/log$i" || touch "$tmp/failed$i") &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
done
wait
for i in $(seq 1 "${#files[@]}"); do
  if [ -e "$tmp/failed$i" ]; then
    echo "ptxas_report: ${files[$((i - 1))]} does not compile:" >&2
    cat "$tmp/log$i" >&2
    exit 1
  fi
  awk '
    /Compiling entry function/ {
      match($0, /function .[^'"'"']*'"'"'/); fn = substr($0, RSTART + 10, RLENGTH - 11)
      match($0, /for .sm_[0-9a-z]*'"'"'/); arch = substr($0, RSTART + 8, RLENGTH - 9)
      stack = st = ld = 0; next
    }
    /bytes stack frame/ { stack = $1; st = $5; ld = $9; next }
    /Used [0-9]+ registers/ {
      if (fn == "") next
      match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
      smem = 0
      if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
      print arch, fn, regs, stack, st, ld, smem
      fn = ""
    }' "$tmp/log$i" >>"$tmp/kernels"
done

# Demangled, without "void ", namespaces and the parameter list.
cut -d' ' -f2 "$tmp/kernels" | c++filt |
  sed -e 's/^void //' -e 's/tessera::cuda:://g' -e 's/(anonymous namespace):://g' -e 's/(.*$//' >"$tmp/names"
paste -d' ' "$tmp/kernels" "$tmp/names" >"$tmp/all"

over=0
spills=0
for a in $ARCHS; do
  limit=$(limit_of "$a")
  wg=()
  [ "$a" = "90a" ] && wg=(--wgmma)
  "$tmp/smem_table" "$limit" "${wg[@]}" >"$tmp/table_$a"
  echo
  echo "== sm_$a: $limit bytes of shared memory a block =="
  printf '%-5s %4s %5s %8s %8s %7s %7s %7s %-10s %s\n' ARCH REGS STACK SPILL_ST SPILL_LD STATIC DYNAMIC TOTAL FLAGS KERNEL
  while read -r arch _ regs stack st ld smem name; do
    [ "$arch" = "$a" ] || continue
    dyn=- launched=0 unused=0 nonefit=0
    while IFS=$'\t' read -r glob bytes status _; do
      # shellcheck disable=SC2053  # the table's names are globs
      [[ "$name" == $glob ]] || continue
      if [ "$status" = launched ]; then
        launched=1
        if [ "$dyn" = - ] || [ "$bytes" -gt "$dyn" ]; then dyn=$bytes; fi
      elif [ "$status" = none ]; then
        nonefit=1
      else
        unused=1
      fi
    done <"$tmp/table_$a"
    total=$((smem + ${dyn/-/0}))
    flags=""
    if [ "$st" -gt 0 ] || [ "$ld" -gt 0 ]; then flags+="SPILL "; spills=$((spills + 1)); fi
    if [ "$launched" = 0 ] && [ "$nonefit" = 1 ]; then
      flags+="NONE "
    elif [ "$launched" = 0 ] && [ "$unused" = 1 ]; then
      flags+="unused "
    elif [ "$total" -gt "$limit" ]; then
      flags+="OVER "
      over=$((over + 1))
    fi
    printf '%-5s %4s %5s %8s %8s %7s %7s %7s %-10s %s\n' "$a" "$regs" "$stack" "$st" "$ld" "$smem" "$dyn" "$total" \
      "${flags:--}" "$name"
  done <"$tmp/all"
  # Launchers with no variant that fits this architecture.
  while IFS=$'\t' read -r glob _ status note; do
    [ "$status" = none ] || continue
    echo "NONE FITS: $glob: $note"
    over=$((over + 1))
  done <"$tmp/table_$a"
  # A table line no compiled kernel matched (a renamed kernel), on runs over every file.
  [ $# -eq 0 ] || continue
  while IFS=$'\t' read -r glob _ status _; do
    [ "$status" = none ] && continue
    found=0
    while read -r arch _ _ _ _ _ _ name; do
      # shellcheck disable=SC2053
      if [ "$arch" = "$a" ] && [[ "$name" == $glob ]]; then found=1; break; fi
    done <"$tmp/all"
    [ "$found" = 1 ] || echo "note: no compiled kernel is named $glob (smem_table.cpp)"
  done <"$tmp/table_$a"
done
echo
echo "ptxas_report: $over kernel configuration(s) over their architecture's limit or with none that fits," \
  "$spills with spills"
[ "$over" = 0 ]
