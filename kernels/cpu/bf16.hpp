// fp32 <-> bf16 conversion. bf16 is the upper half of an IEEE fp32, so widening is exact (a shift) and
// narrowing rounds to nearest, ties to even, on the dropped 16 bits. Semantics, identical on every path:
//   finite values (denormals included, no flush to zero) and +-inf: RNE; a value that rounds past the
//   largest finite bf16 becomes +-inf; NaN stays NaN: the upper 16 bits with the quiet bit (0x0040) set,
//   sign and upper payload kept (what AVX512-BF16's vcvtne2ps2bf16 does).
// The fast path uses vcvtne2ps2bf16 when the CPU has AVX512-BF16 (chosen at run time); that instruction
// flushes denormal inputs to zero, so blocks holding a denormal are redone with the integer rounding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/precision.hpp"

namespace mt::cpu {

// The plain scalar reference every path is tested against.
inline bf16_t bf16_round_reference(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((u >> 16) | 0x0040u);  // NaN: quiet it
  const std::uint32_t lsb = (u >> 16) & 1u;  // ties go to the even neighbour
  return static_cast<bf16_t>((u + 0x7fffu + lsb) >> 16);
}

inline float bf16_to_float(bf16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Which narrowing path to_bf16 takes (tests force each one; `automatic` picks the fastest available).
enum class Bf16Path { automatic, portable, avx512bf16 };
bool cpu_has_avx512_bf16();

// y[i] = RNE(x[i]) / x[i] widened, split over `threads` OpenMP threads in contiguous chunks. Results do
// not depend on the thread count or the path (elementwise, one rounding each).
void to_bf16(const float* x, bf16_t* y, std::size_t n, int threads, Bf16Path path = Bf16Path::automatic);
void from_bf16(const bf16_t* x, float* y, std::size_t n, int threads);

}  // namespace mt::cpu
