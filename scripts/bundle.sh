#!/usr/bin/env bash
# Makes a relocatable bundle of the CUDA build: bin/tessera (plus, with --with-tests,
# the CUDA op test and the kernel benchmarks) and the non-system, non-CUDA shared
# libraries they load (spdlog, fmt, OpenBLAS + gfortran, Gloo, PCRE2, prometheus,
# ...), with rpath $ORIGIN/lib, so it runs as is on a GPU node with a different
# distribution (e.g. Ubuntu 24.04 with the CUDA 13 runtime and NCCL installed).
#
#   scripts/bundle.sh                      # build/cuda (configured and built if missing) -> bundle/
#   scripts/bundle.sh --build-dir build-cuda --with-tests
#   scripts/bundle.sh --out /tmp/b
#   scripts/bundle.sh --build-dir build-cuda --tests-only   # op test + kernel benchmarks, no tessera
#   scripts/bundle.sh --build-dir build-cuda --with-tests --out /tmp/bundle --tar bundle/bundle.tar.xz
#   scripts/bundle.sh --with-net-tools     # also net/ip and net/tc (iproute2) with their libraries, for a GPU
#       # machine without iproute2 (scripts/device_netns_nodes.sh puts net/ on PATH when ip is missing)
#       # an xz archive too (~18 MB instead of ~85 MB: to copy to a GPU machine);
#       # on the GPU machine: tar -xJf bundle/bundle.tar.xz -C /tmp && BUNDLE=/tmp/bundle scripts/device_check.sh
#
# On the GPU node:  bundle/tessera --version
# The CUDA runtime, cuBLAS(Lt) and NCCL are NOT copied: they must match the node's
# driver. The rpath also looks in /usr/local/cuda/{targets/<target>/lib,lib64}, <target> being the
# toolkit's name for this machine (x86_64-linux; sbsa-linux on arm64 servers and DGX Spark);
# elsewhere set LD_LIBRARY_PATH to the toolkit's library folder.
set -euo pipefail
cd "$(dirname "$0")/.."
# The CUDA toolkit's folder name for this machine's libraries (the bundle is made where it runs:
# the same CPU architecture).
case "$(uname -m)" in
  x86_64) CUDA_TARGET=x86_64-linux ;;
  aarch64 | arm64) CUDA_TARGET=sbsa-linux ;;
  *) CUDA_TARGET="$(uname -m)-linux" ;;
esac

BUILD=build/cuda
OUT=bundle
WITH_TESTS=0
WITH_TESSERA=1
TAR=""
NET_TOOLS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --with-tests) WITH_TESTS=1; shift ;;
    --tests-only) WITH_TESTS=1; WITH_TESSERA=0; shift ;;
    --tar) TAR="$2"; shift 2 ;;
    --with-net-tools) NET_TOOLS=1; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

case "$OUT" in ""|/|.|..) echo "bundle.sh: refusing --out '$OUT'" >&2; exit 2 ;; esac
command -v patchelf >/dev/null || { echo "bundle.sh: patchelf is missing: apt-get install patchelf (scripts/setup.sh installs it)" >&2; exit 1; }

if [ "$WITH_TESSERA" = 1 ] && [ ! -x "$BUILD/bin/tessera" ]; then
  if [ "$BUILD" = build/cuda ]; then
    echo "[bundle] building the CUDA preset into build/cuda"
    cmake --preset cuda
    cmake --build --preset cuda -j "${JOBS:-2}"
  else
    echo "bundle.sh: $BUILD/bin/tessera does not exist; build it first (cmake --build $BUILD)" >&2
    exit 1
  fi
fi

BINS=()
[ "$WITH_TESSERA" = 1 ] && BINS+=("$BUILD/bin/tessera")
if [ "$WITH_TESTS" = 1 ]; then
  for b in "$BUILD/tests/backend/cuda_ops_test" "$BUILD/tests/model/model_fixture_test" "$BUILD/tests/engine/engine_test" \
           "$BUILD/tests/engine/cuda_model_check_test" "$BUILD/tests/engine/prompt_logprobs_test" \
           "$BUILD/tests/distributed/custom_all_reduce_test" "$BUILD"/bin/kernels/*_bench "$BUILD"/bin/kernels/libtessera_ktrace.so; do
    [ -x "$b" ] && BINS+=("$b")
  done
  # Weight loading (scripts/device_load_bench.sh runs them).
  for b in "$BUILD/bench/load/make_checkpoint" "$BUILD/tests/loader/staged_reader_test"; do
    [ -x "$b" ] && BINS+=("$b")
  done
  # NCCL on one and two GPUs (scripts/device_parallel_check.sh runs them).
  for b in "$BUILD/tests/distributed/nccl_test" "$BUILD/tests/distributed/nccl_two_rank_test" "$BUILD/tests/distributed/nccl_stream_test"; do
    [ -x "$b" ] && BINS+=("$b")
  done
fi

rm -rf "$OUT"
mkdir -p "$OUT/lib"

# Libraries the target system provides itself (glibc, the C++ runtime) or that must
# come from the node's driver/toolkit (CUDA, cuBLAS, NCCL, the driver).
is_skipped() {
  case "$(basename "$1")" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libutil.so*|libresolv.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas*|libnccl.so*|libnvidia-*|libcudnn*|libnvrtc*|libnvJitLink*|libcufile*) return 0 ;;
  esac
  return 1
}

# copy_with_libs BIN DIR RPATH: BIN into DIR with RPATH, and the libraries it loads that are not
# skipped into DIR/lib (each once, with rpath $ORIGIN).
copy_with_libs() {
  local bin=$1 dir=$2 rpath=$3 name arrow path rest dst
  mkdir -p "$dir/lib"
  while read -r name arrow path rest; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then echo "bundle.sh: $bin needs $name, which is not found here" >&2; exit 1; fi
    is_skipped "$name" && continue
    [ -e "$dir/lib/$name" ] && continue
    cp -L "$path" "$dir/lib/$name"
    chmod u+w "$dir/lib/$name"
    patchelf --set-rpath '$ORIGIN' "$dir/lib/$name"
  done < <(ldd "$bin")
  dst="$dir/$(basename "$bin")"
  cp -L "$bin" "$dst"
  chmod u+w "$dst"
  patchelf --set-rpath "$rpath" "$dst"
}

for bin in "${BINS[@]}"; do
  copy_with_libs "$bin" "$OUT" "\$ORIGIN/lib:/usr/local/cuda/targets/$CUDA_TARGET/lib:/usr/local/cuda/lib64"
done

# iproute2's ip and tc for the two-namespace scripts, each with the libraries it loads that the C
# library does not provide (libmnl, libbpf, libelf, libcap, ...), in net/ with rpath $ORIGIN/lib.
if [ "$NET_TOOLS" = 1 ]; then
  for tool in ip tc; do
    path=$(command -v "$tool" || true)
    [ -n "$path" ] || path=$(ls /sbin/$tool /usr/sbin/$tool 2>/dev/null | head -1)
    [ -n "$path" ] || { echo "bundle.sh: --with-net-tools: no $tool here (apt-get install iproute2)" >&2; exit 1; }
    copy_with_libs "$path" "$OUT/net" '$ORIGIN/lib'
  done
fi

git rev-parse --short HEAD > "$OUT/COMMIT" 2>/dev/null || true
echo "[bundle] $OUT: $(ls "$OUT" | grep -v '^lib$' | tr '\n' ' ')+ $(ls "$OUT/lib" | wc -l) libraries, $(du -sh "$OUT" | cut -f1)"
ls "$OUT/lib" | sed 's/^/[bundle]   lib\//'

if [ -n "$TAR" ]; then
  mkdir -p "$(dirname "$TAR")"
  tar -cJf "$TAR" -C "$(dirname "$OUT")" "$(basename "$OUT")"
  echo "[bundle] archive $TAR ($(du -h "$TAR" | cut -f1)); unpacks to ./$(basename "$OUT")"
fi
