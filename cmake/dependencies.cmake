# Every dependency of the design is found here, once, so a missing package fails the configure step
# with a clear message instead of a compile error deep inside a target.
find_package(Threads REQUIRED)
find_package(CapnProto REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)  # Debian nlohmann-json3-dev: the JSON codecs in messages/, JSON output
find_package(tomlplusplus REQUIRED)  # job files (the fuzz build's job_toml target too)
if(OOBLECK_FUZZ)
  return()  # the fuzz build has planning/, messages/ (without the CAF protocol) and fuzz/ only
endif()
find_package(CAF REQUIRED COMPONENTS core io)
find_package(Torch REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(CLI11 REQUIRED)         # command-line flags of the programs
find_package(OpenSSL REQUIRED)       # admission: HMAC-SHA256 of the job token
if(OOBLECK_BUILD_TESTS)
  find_package(doctest REQUIRED)
endif()

if(OOBLECK_WITH_CUDA)
  # No CUDA sources of our own: the toolkit's headers and libraries are enough for NCCL.
  find_package(CUDAToolkit REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  add_library(oobleck::nccl UNKNOWN IMPORTED)
  set_target_properties(oobleck::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
