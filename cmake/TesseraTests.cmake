# tessera_add_tests(LIBS lib...): one GoogleTest executable per *_test.cpp in the
# calling folder, linked with LIBS; every TEST is registered with ctest.
# Test binaries find the repo through the TESSERA_SOURCE_DIR definition.
# No precompiled header here: measured (GCC 12, -O2 -g1) a test file spends its time compiling its
# TESTs, not parsing headers, and one with gtest, gmock and nlohmann/json all visible compiles
# slower (overload sets of the printers and matchers grow): 18 test files took 152 s of CPU with
# no precompiled header, 155 s with one.
function(tessera_add_tests)
  cmake_parse_arguments(ARG "" "" "LIBS;LABELS" ${ARGN})
  file(GLOB tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cpp)
  foreach(src IN LISTS tests)
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
    target_compile_definitions(${name} PRIVATE TESSERA_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
                                               TESSERA_BINARY_DIR="${CMAKE_BINARY_DIR}")
    # The test files themselves at -O1 in the optimised builds (after the build type's -O2, so it wins):
    # their time goes into compiling TESTs, which -O2 makes ~30% slower to build and no faster to run
    # where it matters (the code under test is in the libraries, still -O2).
    target_compile_options(${name} PRIVATE $<$<CONFIG:Release,RelWithDebInfo>:-O1>)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}")
  endforeach()
endfunction()
