# Compile options for project code only: third-party headers come in as SYSTEM includes and are exempt.
add_library(megatrain_options INTERFACE)
target_compile_options(megatrain_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wno-psabi>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${MEGATRAIN_WERROR}>>:-Werror>
  $<$<COMPILE_LANGUAGE:CXX>:-march=${MEGATRAIN_ARCH}>)
target_compile_definitions(megatrain_options INTERFACE MEGATRAIN_ARCH_NAME="${MEGATRAIN_ARCH}")
target_include_directories(megatrain_options INTERFACE ${PROJECT_SOURCE_DIR})

# Hot loops: sqrt must not set errno, or it blocks vectorisation. Applied per source file.
set(MEGATRAIN_HOT_LOOP_FLAGS -O3 -fno-math-errno -fno-trapping-math)
