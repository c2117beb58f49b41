# Cross-compiling the CPU build for 64-bit Arm (DGX Spark's Grace, Graviton, Ampere) on a Debian
# x86-64 machine: Debian's cross compiler (g++-aarch64-linux-gnu) and the arm64 -dev packages of
# the dependencies installed side by side with the host's (dpkg --add-architecture arm64).
# scripts/arm64_check.sh sets it up, builds and runs the result under qemu-user.
#   cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DTESSERA_ARM64_EXTRA_PREFIX=build/arm64-deps/usr
# TESSERA_ARM64_EXTRA_PREFIX: a folder holding arm64 packages that cannot be installed beside the
# host's (libgloo-dev installs to /usr/lib, not a multiarch folder), unpacked with dpkg -x.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Test discovery (gtest_discover_tests) and ctest run the arm64 binaries through qemu-user.
find_program(TESSERA_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${TESSERA_QEMU_AARCH64})
# pkg-config: the arm64 .pc files only (PCRE2, ICU).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
# Never link a host (x86-64) library: search the arm64 folders and the extra prefix first, and
# only take headers (architecture-independent: nlohmann-json, CLI11, Boost) from the host.
set(TESSERA_ARM64_EXTRA_PREFIX "" CACHE PATH "unpacked arm64 packages (see above)")
if(TESSERA_ARM64_EXTRA_PREFIX)
  get_filename_component(_tessera_arm64_extra "${TESSERA_ARM64_EXTRA_PREFIX}" ABSOLUTE)
  list(PREPEND CMAKE_PREFIX_PATH "${_tessera_arm64_extra}")
  set(Gloo_DIR "${_tessera_arm64_extra}/share/cmake/Gloo" CACHE PATH "arm64 Gloo's CMake package")
endif()
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/cmake)
