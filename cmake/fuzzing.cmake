# The fuzz build (-DOOBLECK_FUZZ=ON, see scripts/fuzz.sh): libFuzzer targets for every decoder of
# outside bytes, built with clang's coverage instrumentation, AddressSanitizer and UBSan. Only
# planning/, messages/ (without the CAF protocol library) and fuzz/ are configured: no LibTorch,
# CAF or Boost is needed; toml++ (header-only) is, for job_toml.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "OOBLECK_FUZZ needs clang (libFuzzer): run scripts/fuzz.sh, or configure with "
                      "-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14")
endif()

# Every library of the fuzz build is instrumented, so a bug in planning/ or messages/ stops the run
# where it happens; UBSan findings abort instead of printing and going on.
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_link_options(-fsanitize=address,undefined)

# oobleck_fuzz_target(NAME SOURCES file.cpp... [LIBS lib...])
# A libFuzzer executable fuzz/NAME; its seed corpus is fuzz/corpus/NAME/ (required) and, when it
# exists, fuzz/NAME.dict is its dictionary. scripts/fuzz.sh runs every target registered here.
function(oobleck_fuzz_target name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/fuzz/corpus/${name})
    message(FATAL_ERROR "fuzz target ${name} has no seed corpus: add fuzz/corpus/${name}/")
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  set_property(GLOBAL APPEND PROPERTY OOBLECK_FUZZ_TARGETS ${name})
endfunction()
