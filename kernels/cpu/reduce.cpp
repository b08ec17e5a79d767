// Gradient accumulation (accum += staging) and the sum of squares used for global-norm clipping.
// Both are the step math the engine shares with the reference trainer: their bits must not depend on
// the thread count. sum_squares works in fixed 4096-float blocks, each summed in double in a fixed
// lane order, and the block sums are added in block order.
#include <algorithm>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/profile.hpp"
#include "kernels/step_math.hpp"

namespace mt::cpu {

void accumulate(float* accum, const float* staging, std::size_t n, int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) accum[i] += staging[i];
  });
}

void accumulate_first(float* accum, const float* staging, std::size_t n, int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) accum[i] = 0.0f + staging[i];  // not a copy: -0 + +0 is +0
  });
}

void zero(float* x, std::size_t n, int threads) {
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) { std::fill(x + b, x + e, 0.0f); });
}

namespace {

double block_sumsq(const float* x, std::size_t n) {
  std::size_t i = 0;
  double total = 0.0;
#ifdef MT_AVX2
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double buf[4];
  _mm256_store_pd(buf, _mm256_add_pd(a0, a1));
  total = (buf[0] + buf[1]) + (buf[2] + buf[3]);
#endif
  for (; i < n; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

}  // namespace

double sum_squares(const float* x, std::size_t n, int threads) {
  prof::Scope prof_scope(prof::optimizer);
  constexpr std::size_t kBlock = 4096, kGroup = 256;  // partial sums of up to 256 blocks on the stack
  double total = 0.0;
  for (std::size_t g0 = 0; g0 < n; g0 += kBlock * kGroup) {
    const std::size_t gn = std::min(n - g0, kBlock * kGroup);
    const std::int64_t blocks = static_cast<std::int64_t>((gn + kBlock - 1) / kBlock);
    double part[kGroup];
#pragma omp parallel for num_threads(threads) schedule(static) if (blocks > 4)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::size_t s = static_cast<std::size_t>(b) * kBlock;
      part[b] = block_sumsq(x + g0 + s, std::min(kBlock, gn - s));
    }
    for (std::int64_t b = 0; b < blocks; ++b) total += part[b];
  }
  return total;
}

}  // namespace mt::cpu
