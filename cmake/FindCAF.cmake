# Debian's libcaf-dev (CAF 0.17.x) ships headers and shared libraries but no CMake package config.
# Components: core, io, openssl. Defines CAF::<component> imported targets and CAF_FOUND.
include(FindPackageHandleStandardArgs)

if(NOT CAF_FIND_COMPONENTS)
  set(CAF_FIND_COMPONENTS core)
endif()

find_path(CAF_INCLUDE_DIR caf/actor_system.hpp)

set(_caf_required_vars CAF_INCLUDE_DIR)
foreach(_comp IN LISTS CAF_FIND_COMPONENTS)
  find_library(CAF_${_comp}_LIBRARY NAMES caf_${_comp})
  if(CAF_${_comp}_LIBRARY)
    set(CAF_${_comp}_FOUND TRUE)
  endif()
  list(APPEND _caf_required_vars CAF_${_comp}_LIBRARY)
endforeach()

if(CAF_INCLUDE_DIR AND EXISTS "${CAF_INCLUDE_DIR}/caf/config.hpp")
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _caf_version_line REGEX "#define CAF_VERSION [0-9]+")
  if(_caf_version_line MATCHES "CAF_VERSION ([0-9]+)")
    math(EXPR CAF_VERSION_MAJOR "${CMAKE_MATCH_1} / 10000")
    math(EXPR CAF_VERSION_MINOR "(${CMAKE_MATCH_1} / 100) % 100")
    math(EXPR CAF_VERSION_PATCH "${CMAKE_MATCH_1} % 100")
    set(CAF_VERSION "${CAF_VERSION_MAJOR}.${CAF_VERSION_MINOR}.${CAF_VERSION_PATCH}")
  endif()
endif()

find_package_handle_standard_args(CAF
  REQUIRED_VARS ${_caf_required_vars}
  VERSION_VAR CAF_VERSION
  HANDLE_COMPONENTS)

if(CAF_FOUND)
  foreach(_comp IN LISTS CAF_FIND_COMPONENTS)
    if(NOT TARGET CAF::${_comp})
      add_library(CAF::${_comp} SHARED IMPORTED)
      set_target_properties(CAF::${_comp} PROPERTIES
        IMPORTED_LOCATION "${CAF_${_comp}_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
    endif()
  endforeach()
  if(TARGET CAF::io AND TARGET CAF::core)
    set_property(TARGET CAF::io APPEND PROPERTY INTERFACE_LINK_LIBRARIES CAF::core)
  endif()
  if(TARGET CAF::core)
    set_property(TARGET CAF::core APPEND PROPERTY INTERFACE_LINK_LIBRARIES Threads::Threads)
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR)
