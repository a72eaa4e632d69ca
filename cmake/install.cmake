# `cmake --install` puts the programs in bin/ and a CMake package in lib/cmake/oobleck, so that
# `find_package(oobleck)` gives a user what an actor of their own needs to talk to a coordinator
# (examples/event_logger): the protocol's messages and typed interfaces, the actors, and the
# planning and runtime-core code their headers use. No LibTorch: the stage library stays inside.
include(CMakePackageConfigHelpers)

set(OOBLECK_PACKAGE_TARGETS oobleck_planning oobleck_protocol oobleck_runtime_core oobleck_actors)
foreach(target IN LISTS OOBLECK_PACKAGE_TARGETS)
  string(REPLACE "oobleck_" "" exported ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${exported})  # oobleck::actors, ...
  target_compile_features(${target} PUBLIC cxx_std_20)  # the headers need it, so users get it
endforeach()

install(TARGETS ${OOBLECK_PACKAGE_TARGETS} EXPORT oobleckTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# Headers keep their folders under include/oobleck: #include "messages/protocol.hpp".
foreach(folder planning actors)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/ DESTINATION ${OOBLECK_INSTALL_INCLUDEDIR}/${folder}
    FILES_MATCHING PATTERN "*.hpp")
endforeach()
install(FILES
    messages/actor_interfaces.hpp messages/admission_messages.hpp messages/checkpoint_messages.hpp messages/control_messages.hpp
    messages/epoch_messages.hpp messages/input_error.hpp messages/protocol.hpp messages/step_messages.hpp
    messages/wire_double.hpp
  DESTINATION ${OOBLECK_INSTALL_INCLUDEDIR}/messages)
install(FILES runtime/gpt_config.hpp runtime/optimizer_options.hpp runtime/sampler.hpp runtime/data_source.hpp
  DESTINATION ${OOBLECK_INSTALL_INCLUDEDIR}/runtime)

set(OOBLECK_PROGRAMS oobleck-coordinator oobleck-worker oobleck-ctl oobleck-local oobleck-plan oobleck-profile oobleck-report
  oobleck-export oobleck-eval)
# A LibTorch outside the system's library folders (pip's) stays found from the installed programs.
set_target_properties(${OOBLECK_PROGRAMS} PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS ${OOBLECK_PROGRAMS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/oobleck)
install(EXPORT oobleckTargets NAMESPACE oobleck:: DESTINATION ${config_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/oobleckConfig.cmake.in
  ${PROJECT_BINARY_DIR}/oobleckConfig.cmake INSTALL_DESTINATION ${config_dir})
# 0.x: a minor version may change the protocol's messages.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/oobleckConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
# Debian's CAF 0.17 has no CMake package of its own: the package brings our FindCAF.cmake.
install(FILES ${PROJECT_BINARY_DIR}/oobleckConfig.cmake ${PROJECT_BINARY_DIR}/oobleckConfigVersion.cmake
    ${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake
  DESTINATION ${config_dir})
