// The fp32 master as two 16-bit halves (train.master_weights=split): exact, in 4 bytes per parameter,
// where a bf16 run otherwise keeps 6 (an fp32 master and the bf16 compute copy).
//
//   high = RNE bf16(p)        the compute copy the device streams, the very bits cpu::bf16_round_reference gives
//   low  = bits(p) & 0xffff   the 16 bits the rounding dropped
//
// Why this is exact, and where the one missing bit lives. Write u = bits(p), h = u >> 16 (truncation).
// RNE gives high = h (low < 0x8000, or low == 0x8000 with h even) or high = h + 1 (low > 0x8000, or
// low == 0x8000 with h odd). So from (high, low): low < 0x8000 means u = high:low, low > 0x8000 means
// u = (high - 1):low, and only low == 0x8000 is ambiguous: both h = high (even, rounded down) and
// h = high - 1 (odd, rounded up) give the same even high. That case needs one bit, `rounded_up`.
// It is kept in the sign bit of the element's Adam v: an update makes v = b2 v + (1 - b2) g^2 from v >= +0,
// so v is +0 or positive (never -0) unless it is NaN, and its sign carries no information.
//   - NaN masters: RNE quiets a NaN (sets 0x0040 of the high half); every NaN an update produces is already
//     quiet, so high = h and low restores u with no extra bit. A signalling NaN can only come from outside
//     (a file); splitting it stores its quiet form, as the first update would make it.
//   - A NaN v comes only with a NaN master (the update divides by sqrt(v)), so a NaN v never has to carry
//     the bit and keeps its own sign. Infinities, -0 and subnormals are plain integer patterns: exact.
// Readers of v (checkpoints, snapshots) take plain_v(), the fp32 path's bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/precision.hpp"

namespace mt {

inline constexpr std::uint32_t kSignBit = 0x80000000u;

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline bool is_nan_bits(std::uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
inline bool is_nan_bf16(bf16_t h) { return (h & 0x7fffu) > 0x7f80u; }

// One element: the halves and the bit v must carry (true only for low == 0x8000 rounded up).
struct MasterHalves {
  bf16_t high;
  std::uint16_t low;
  bool rounded_up;
};

inline MasterHalves split_master_reference(float p) {
  std::uint32_t u = float_bits(p);
  if (is_nan_bits(u)) u |= 0x00400000u;  // quiet, as the rounding does
  const std::uint32_t h = u >> 16, low = u & 0xffffu;
  const bool up = !is_nan_bits(u) && (low > 0x8000u || (low == 0x8000u && (h & 1u)));
  return {static_cast<bf16_t>(h + (up ? 1u : 0u)), static_cast<std::uint16_t>(low), up && low == 0x8000u};
}

inline float join_master_reference(bf16_t high, std::uint16_t low, bool rounded_up) {
  const bool borrow = !is_nan_bf16(high) && (low > 0x8000u || (low == 0x8000u && rounded_up));
  return bits_float(((static_cast<std::uint32_t>(high) - (borrow ? 1u : 0u)) << 16) | low);
}

// The tie bit as v's sign (v from the tiles), and v as the fp32 path holds it.
inline bool tie_bit_of(float v_stored) {
  return (float_bits(v_stored) & kSignBit) != 0 && !is_nan_bits(float_bits(v_stored));
}
inline float plain_v(float v_stored) {
  const std::uint32_t u = float_bits(v_stored);
  return is_nan_bits(u) ? v_stored : bits_float(u & ~kSignBit);
}
inline float v_with_tie_bit(float v_plain, bool rounded_up) {
  return rounded_up ? bits_float(float_bits(v_plain) | kSignBit) : v_plain;
}

namespace cpu {

// Whole arrays (threaded over contiguous chunks; bits do not depend on `threads`).
// split_masters: p -> (high, low) and the tie bit into v's sign. v must hold the plain v (sign clear,
// or NaN); throws std::invalid_argument naming the element when v is negative or -0 (not an Adam second
// moment), or NaN where p is finite and needs the bit (no update produces either).
void split_masters(const float* p, bf16_t* high, std::uint16_t* low, float* v, std::size_t n, int threads);
// join_masters: (high, low, v's sign) -> p. v is not changed.
void join_masters(const bf16_t* high, const std::uint16_t* low, const float* v, float* p, std::size_t n, int threads);
// out[i] = plain_v(v[i]) (out may equal v: clears the tie bits in place).
void plain_vs(const float* v, float* out, std::size_t n, int threads);

}  // namespace cpu
}  // namespace mt
