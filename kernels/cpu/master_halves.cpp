// The split master's array forms (kernels/master_halves.hpp): loading, checkpoints and exports go through
// these; the optimizer's own pass is fused into AdamW (cpu::adamw_split_master).
#include "kernels/master_halves.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <omp.h>

namespace mt::cpu {
namespace {

// Contiguous chunks of at least 16 Ki elements per thread: these are memory-bound copies.
int threads_for(std::size_t n, int threads) {
  const std::size_t most = std::max<std::size_t>(1, n / 16384);
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(1, threads)), most));
}

}  // namespace

void split_masters(const float* p, bf16_t* high, std::uint16_t* low, float* v, std::size_t n, int threads) {
  // First the checks (nothing written when the input is refused), then the split.
  const std::int64_t count = static_cast<std::int64_t>(n);
  std::int64_t bad = count;
#pragma omp parallel for num_threads(threads_for(n, threads)) reduction(min : bad)
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint32_t vb = float_bits(v[i]);
    const bool negative = !is_nan_bits(vb) && (vb & kSignBit) != 0;
    const bool nan_needs_bit = is_nan_bits(vb) && split_master_reference(p[i]).rounded_up;
    if ((negative || nan_needs_bit) && i < bad) bad = i;
  }
  if (bad < count)
    throw std::invalid_argument("split masters: element " + std::to_string(bad) +
                                " has Adam v = " + std::to_string(v[bad]) +
                                (is_nan_bits(float_bits(v[bad])) ? " beside a finite master" : " (negative)") +
                                ", which no AdamW update produces; train.master_weights=fp32 keeps it as it is");
#pragma omp parallel for num_threads(threads_for(n, threads))
  for (std::int64_t i = 0; i < count; ++i) {
    const MasterHalves h = split_master_reference(p[i]);
    high[i] = h.high;
    low[i] = h.low;
    v[i] = v_with_tie_bit(v[i], h.rounded_up);
  }
}

void join_masters(const bf16_t* high, const std::uint16_t* low, const float* v, float* p, std::size_t n, int threads) {
  const std::int64_t count = static_cast<std::int64_t>(n);
#pragma omp parallel for num_threads(threads_for(n, threads))
  for (std::int64_t i = 0; i < count; ++i) p[i] = join_master_reference(high[i], low[i], tie_bit_of(v[i]));
}

void plain_vs(const float* v, float* out, std::size_t n, int threads) {
  const std::int64_t count = static_cast<std::int64_t>(n);
#pragma omp parallel for num_threads(threads_for(n, threads))
  for (std::int64_t i = 0; i < count; ++i) out[i] = plain_v(v[i]);
}

}  // namespace mt::cpu
