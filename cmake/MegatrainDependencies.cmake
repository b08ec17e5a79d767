# Finds every third-party dependency and wraps the ones without CMake configs in imported targets.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread REQUIRED)
add_library(megatrain::blas INTERFACE IMPORTED)
target_link_libraries(megatrain::blas INTERFACE ${BLAS_LIBRARIES})
target_include_directories(megatrain::blas SYSTEM INTERFACE ${OPENBLAS_INCLUDE_DIR})

# oneDNN picks its GEMM kernels from the CPU's features at run time (Debian's OpenBLAS 0.3.21 picks
# from a table of CPU models and falls back to SSE3 code on CPUs newer than it knows).
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(megatrain::dnnl UNKNOWN IMPORTED)
set_target_properties(megatrain::dnnl PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})

find_package(nlohmann_json 3.10 REQUIRED)
find_package(HDF5 REQUIRED COMPONENTS C)
add_library(megatrain::hdf5 INTERFACE IMPORTED)
target_link_libraries(megatrain::hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_include_directories(megatrain::hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_compile_definitions(megatrain::hdf5 INTERFACE ${HDF5_C_DEFINITIONS})
find_package(Boost 1.74 REQUIRED)
find_package(ZLIB REQUIRED)

# CAF 0.17 ships no CMake config and no pkg-config file: find it by hand.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(caf::core UNKNOWN IMPORTED)
set_target_properties(caf::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR})
target_link_libraries(caf::core INTERFACE Threads::Threads)
add_library(caf::io UNKNOWN IMPORTED)
set_target_properties(caf::io PROPERTIES IMPORTED_LOCATION ${CAF_IO_LIBRARY})
target_link_libraries(caf::io INTERFACE caf::core)

# MPI (OpenMPI from Debian, libopenmpi-dev): a job of several ranks (cluster/). Optional: without it
# the node runs alone and the multi-rank tests report skipped.
set(MEGATRAIN_MPI "AUTO" CACHE STRING "Build the multi-rank mode on MPI: AUTO (when MPI is found), ON or OFF")
set_property(CACHE MEGATRAIN_MPI PROPERTY STRINGS AUTO ON OFF)
set(MEGATRAIN_HAVE_MPI OFF)
if(NOT MEGATRAIN_MPI STREQUAL "OFF")
  if(MEGATRAIN_MPI STREQUAL "ON")
    find_package(MPI REQUIRED COMPONENTS C)
  else()
    find_package(MPI COMPONENTS C)
  endif()
  if(MPI_C_FOUND)
    set(MEGATRAIN_HAVE_MPI ON)
    find_program(MEGATRAIN_MPIEXEC NAMES mpirun mpiexec)
  endif()
endif()
message(STATUS "megatrain: multi-rank (MPI): ${MEGATRAIN_HAVE_MPI}")

if(MEGATRAIN_TESTS)
  find_package(Catch2 2 REQUIRED)
  include(Catch)
endif()

# Debian's Python with its packages (torch, numpy, h5py) is the outside oracle in tests.
set(MEGATRAIN_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with Debian's torch, numpy and h5py (tests only)")
# Test-only PyPI packages (tokenizers, safetensors, transformers) live in this venv; tools/install-deps --test makes it.
set(MEGATRAIN_VENV_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python3 CACHE FILEPATH "venv Python with test-only PyPI packages")
