# Fails unless each program allocates through tcmalloc (CMakeLists.txt, OOBLECK_ALLOCATOR): tcmalloc
# prints its statistics on stderr at exit when MALLOCSTATS is set ("MALLOC: ... Bytes in use by
# application"); glibc's malloc ignores the variable. Each program runs its --help only.
#
# usage: cmake "-DPROGRAMS=<path>;<path>..." -P check_allocator.cmake
if(NOT PROGRAMS)
  message(FATAL_ERROR "no programs given")
endif()
set(failed "")
foreach(program IN LISTS PROGRAMS)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env MALLOCSTATS=1 ${program} --help
                  OUTPUT_QUIET ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 30)
  if(NOT rc EQUAL 0)
    list(APPEND failed "${program}: --help exited with ${rc}")
  elseif(NOT err MATCHES "MALLOC: +[0-9]+ .* Bytes in use by application")
    list(APPEND failed "${program}: no tcmalloc statistics on stderr with MALLOCSTATS=1 (glibc's malloc?)")
  endif()
endforeach()
if(failed)
  list(JOIN failed "\n  " text)
  message(FATAL_ERROR "programs not allocating through tcmalloc:\n  ${text}")
endif()
list(LENGTH PROGRAMS n)
message(STATUS "${n} programs allocate through tcmalloc")
