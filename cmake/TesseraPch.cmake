# Precompiled headers for the libraries and the CLI. On GCC 12 in C++20 mode the third-party
# headers that nearly every file includes cost seconds per file before a line of our code is
# compiled (nlohmann/json ~3 s of CPU, CLI11 ~9.5 s, the C++ library's containers, <filesystem>,
# <random>... ~3 s); a precompiled header parses them once per target instead. (The tests have
# none: cmake/TesseraTests.cmake says why.)
#
# Default: on, except when a compiler launcher (ccache) is set: ccache does not cache a file
# compiled with a precompiled header unless its sloppiness settings allow it, so developer
# builds through ccache stay as they were. CI (a fresh clone, no ccache) gets them.
#   -DTESSERA_PCH=ON|OFF overrides.
set(_tessera_pch_default ON)
if(CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache")
  set(_tessera_pch_default OFF)
endif()
option(TESSERA_PCH "Precompiled headers for the libraries and the CLI (off under ccache)"
       ${_tessera_pch_default})

# The headers of every precompiled header: what most files of every layer include directly or
# through src/core (logging.h brings spdlog and fmt). A header listed here is visible to every
# file of the target even when the file does not include it: builds without PCH (ccache,
# -DTESSERA_PCH=OFF) catch a missing include.
set(TESSERA_PCH_HEADERS
    <algorithm> <array> <atomic> <chrono> <cmath> <condition_variable> <cstdint> <cstdio> <cstdlib> <cstring>
    <deque> <filesystem> <fstream> <functional> <limits> <map> <memory> <mutex> <numeric> <optional> <random>
    <set> <sstream> <span> <string> <string_view> <thread> <unordered_map> <utility> <vector>
    <nlohmann/json.hpp> <fmt/format.h> <spdlog/spdlog.h>)

# tessera_pch(TARGET [REUSE_FROM OTHER] [HEADERS <h>...]): TARGET's C++ files include the
# precompiled TESSERA_PCH_HEADERS (plus HEADERS). REUSE_FROM OTHER uses OTHER's precompiled
# header instead of building one (only where both compile with the same flags: definitions
# the headers never test may differ). The fuzz build (clang, sanitizer flags on some targets
# only) gives every target its own, since clang refuses a header built with other flags.
function(tessera_pch target)
  cmake_parse_arguments(ARG "" "REUSE_FROM" "HEADERS" ${ARGN})
  if(NOT TESSERA_PCH OR NOT TARGET ${target})
    return()
  endif()
  if(ARG_REUSE_FROM AND NOT TESSERA_FUZZ)
    target_precompile_headers(${target} REUSE_FROM ${ARG_REUSE_FROM})
  else()
    target_precompile_headers(${target} PRIVATE ${TESSERA_PCH_HEADERS} ${ARG_HEADERS})
  endif()
endfunction()
