// MEGATRAIN_MAX_CPU_ISA holds our own kernels to the paths an AVX2-only CPU takes (the isa_avx2 label
// relies on it). The variable is read once per process, so the held and refused cases are hidden and
// run by their own ctest entries with the variable set (tests/kernels/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <stdexcept>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/cpu_info.hpp"

using namespace mt::cpu;

TEST_CASE("our kernels take the CPU's own paths when MEGATRAIN_MAX_CPU_ISA is unset", "[isa]") {
  if (std::getenv("MEGATRAIN_MAX_CPU_ISA") != nullptr) return;  // run by the entries below instead
  CHECK(avx512_allowed());
  const bool bf16_cpu =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  CHECK(cpu_has_avx512_bf16() == bf16_cpu);
  CHECK(bf16_pairs_available() == bf16_cpu);
  CHECK_THAT(cpu_isa_flags(), !Catch::Contains("held"));
}

TEST_CASE("MEGATRAIN_MAX_CPU_ISA=avx2 holds every AVX-512 path of ours", "[.held]") {
  CHECK_FALSE(avx512_allowed());
  CHECK_FALSE(cpu_has_avx512_bf16());
  CHECK_FALSE(bf16_pairs_available());
  CHECK_THAT(cpu_isa_flags(), Catch::EndsWith(" held:avx2"));  // a cache key of its own
}

TEST_CASE("another MEGATRAIN_MAX_CPU_ISA value is refused, naming it", "[.invalid]") {
  CHECK_THROWS_AS(avx512_allowed(), std::invalid_argument);
  CHECK_THROWS_WITH(avx512_allowed(), Catch::Contains("MEGATRAIN_MAX_CPU_ISA=sse9"));
}
