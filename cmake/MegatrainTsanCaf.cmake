# Included through CMAKE_PROJECT_INCLUDE by the tsan-actors preset (CMakePresets.json): points CAF at the
# ThreadSanitizer build of CAF 0.17.6 that tools/build-tsan-caf caches outside the repository, so TSan sees
# the happens-before edges of CAF's mailboxes (Debian's libcaf is not instrumented). Stops the configure
# with a clear message when that build is missing. See tools/README-tsan.md.
if(DEFINED ENV{MEGATRAIN_CACHE} AND NOT "$ENV{MEGATRAIN_CACHE}" STREQUAL "")
  set(_megatrain_cache "$ENV{MEGATRAIN_CACHE}")
else()
  set(_megatrain_cache "$ENV{HOME}/.cache/megatrain")
endif()
set(MEGATRAIN_CAF_TSAN_PREFIX "${_megatrain_cache}/caf-tsan/prefix" CACHE PATH
    "Install prefix of CAF built with -fsanitize=thread by tools/build-tsan-caf")

set(_caf_tsan_stamp "${MEGATRAIN_CAF_TSAN_PREFIX}/.megatrain-caf-tsan-stamp")
if(NOT EXISTS "${_caf_tsan_stamp}" OR NOT EXISTS "${MEGATRAIN_CAF_TSAN_PREFIX}/include/caf/all.hpp"
   OR NOT EXISTS "${MEGATRAIN_CAF_TSAN_PREFIX}/lib/libcaf_core.so"
   OR NOT EXISTS "${MEGATRAIN_CAF_TSAN_PREFIX}/lib/libcaf_io.so")
  message(FATAL_ERROR
    "The tsan-actors preset needs CAF built with ThreadSanitizer, and there is none in\n"
    "  ${MEGATRAIN_CAF_TSAN_PREFIX}\n"
    "Build it once (about 5 minutes on 2 cores, cached outside the repository):\n"
    "  tools/build-tsan-caf\n"
    "then configure again. (It honours MEGATRAIN_CACHE; or pass -DMEGATRAIN_CAF_TSAN_PREFIX=<prefix>.)")
endif()

# Set before MegatrainDependencies' find_path/find_library, which then keep these values.
set(CAF_INCLUDE_DIR "${MEGATRAIN_CAF_TSAN_PREFIX}/include" CACHE PATH "CAF headers (TSan build)" FORCE)
set(CAF_CORE_LIBRARY "${MEGATRAIN_CAF_TSAN_PREFIX}/lib/libcaf_core.so" CACHE FILEPATH "libcaf_core (TSan build)" FORCE)
set(CAF_IO_LIBRARY "${MEGATRAIN_CAF_TSAN_PREFIX}/lib/libcaf_io.so" CACHE FILEPATH "libcaf_io (TSan build)" FORCE)
# Binaries find the instrumented libraries (not Debian's, which share the soname) without LD_LIBRARY_PATH.
list(APPEND CMAKE_BUILD_RPATH "${MEGATRAIN_CAF_TSAN_PREFIX}/lib")
message(STATUS "CAF: ThreadSanitizer build in ${MEGATRAIN_CAF_TSAN_PREFIX}")
