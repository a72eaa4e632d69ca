# The fuzz targets in the test build (GCC, no libFuzzer): each harness of fuzz/ is linked with a
# replaying main (tests/support/fuzz_replay_main.cpp) and CTest runs it on the target's seed
# corpus, as `fuzz.NAME.corpus` (label fuzz). The harnesses then compile with every change, and
# every seed (findings included) keeps passing, without clang. Fuzzing is scripts/fuzz.sh
# (cmake/fuzzing.cmake, -DOOBLECK_FUZZ=ON).
#
# oobleck_fuzz_target(NAME SOURCES harness.cpp [more.cpp...] LIBS lib... [REPLAY_LIBS lib...])
# Here only the first source (the harness) is compiled: the other sources are the project's own
# files, which the fuzz build compiles into the target because it configures neither apps/ nor
# runtime/; in this build they are in the project's libraries, which REPLAY_LIBS names.
function(oobleck_fuzz_target name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;REPLAY_LIBS" ${ARGN})
  if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/fuzz/corpus/${name})
    message(FATAL_ERROR "fuzz target ${name} has no seed corpus: add fuzz/corpus/${name}/")
  endif()
  list(GET ARG_SOURCES 0 harness)
  add_executable(fuzz_replay_${name} ${harness} ${PROJECT_SOURCE_DIR}/tests/support/fuzz_replay_main.cpp)
  target_link_libraries(fuzz_replay_${name} PRIVATE ${ARG_LIBS} ${ARG_REPLAY_LIBS})
  target_include_directories(fuzz_replay_${name} PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME fuzz.${name}.corpus COMMAND fuzz_replay_${name} ${PROJECT_SOURCE_DIR}/fuzz/corpus/${name})
  set_tests_properties(fuzz.${name}.corpus PROPERTIES TIMEOUT 60 LABELS fuzz)
  set_property(GLOBAL APPEND PROPERTY OOBLECK_FUZZ_TARGETS ${name})
endfunction()
