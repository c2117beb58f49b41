# Unity builds (CMake's UNITY_BUILD) for the libraries, the CLI and the fuzz targets: a target's
# C++ files compile in batches of TESSERA_UNITY_BATCH, one translation unit a batch, so the
# templates every file instantiates (nlohmann/json, fmt, spdlog, CLI11, the standard containers)
# are compiled once a batch instead of once a file; precompiled headers (TesseraPch.cmake) only
# save the parsing. A file that must stay alone sets SKIP_UNITY_BUILD_INCLUSION.
#
# Default: TesseraPch.cmake's (included before this file): on without a compiler launcher (CI's
# fresh clone), off under ccache, where editing one file would recompile its whole batch.
#   -DTESSERA_UNITY=ON|OFF overrides; -DTESSERA_UNITY_BATCH=N sets the batch size.
option(TESSERA_UNITY "Unity builds of the libraries, the CLI and the fuzz targets (off under ccache)"
       ${_tessera_pch_default})
set(TESSERA_UNITY_BATCH 8 CACHE STRING "C++ files per unity translation unit")

# tessera_unity(TARGET...): each TARGET that exists compiles as a unity build (when TESSERA_UNITY).
function(tessera_unity)
  if(NOT TESSERA_UNITY)
    return()
  endif()
  foreach(target IN LISTS ARGN)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${TESSERA_UNITY_BATCH})
    endif()
  endforeach()
endfunction()
