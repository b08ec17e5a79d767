#include "tools/bench/isa_peak.hpp"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mt::bench {

#if defined(__x86_64__)
namespace {

constexpr int kAcc = 12;  // independent chains: enough to cover the instructions' latency
constexpr long kIters = 4'000'000;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Stores the accumulators where the compiler must assume they are read.
__attribute__((target("avx512f"))) void consume(const __m512* acc) {
  alignas(64) float out[16];
  for (int i = 0; i < kAcc; ++i) {
    _mm512_store_ps(out, acc[i]);
    __asm__ volatile("" : : "r"(out) : "memory");
  }
}

__attribute__((target("avx512f"))) double fma_rate() {
  __m512 acc[kAcc];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-8f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm512_fmadd_ps(x, y, a);
    __asm__ volatile("" : "+v"(x), "+v"(y));  // keeps the loop from being folded
  }
  const double s = seconds_since(t0);
  consume(acc);
  return 2.0 * 16 * kAcc * static_cast<double>(kIters) / s;
}

__attribute__((target("avx2,fma"))) void consume(const __m256* acc) {
  alignas(32) float out[8];
  for (int i = 0; i < kAcc; ++i) {
    _mm256_store_ps(out, acc[i]);
    __asm__ volatile("" : : "r"(out) : "memory");
  }
}

__attribute__((target("avx2,fma"))) double fma_ymm_rate() {
  __m256 acc[kAcc];
  for (auto& a : acc) a = _mm256_setzero_ps();
  __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-8f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm256_fmadd_ps(x, y, a);
    __asm__ volatile("" : "+x"(x), "+x"(y));
  }
  const double s = seconds_since(t0);
  consume(acc);
  return 2.0 * 8 * kAcc * static_cast<double>(kIters) / s;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_rate() {
  __m512 acc[kAcc];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3280);  // 1.0, ~1.5e-8
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, y);
    __asm__ volatile("" : "+v"(x), "+v"(y));
  }
  const double s = seconds_since(t0);
  consume(acc);
  return 2.0 * 32 * kAcc * static_cast<double>(kIters) / s;
}

}  // namespace

IsaPeaks isa_peaks(int reps) {
  IsaPeaks p;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  for (int r = 0; r < reps; ++r) {  // interleaved, so a noisy moment hits all
    if (avx512) p.fma_avx512 = std::max(p.fma_avx512, fma_rate());
    if (avx2) p.fma_avx2 = std::max(p.fma_avx2, fma_ymm_rate());
    if (bf16) p.dpbf16 = std::max(p.dpbf16, dpbf16_rate());
  }
  p.fma_fp32 = std::max(p.fma_avx512, p.fma_avx2);
  if (p.fma_fp32 > 0) p.fma_isa = p.fma_avx512 >= p.fma_avx2 ? "avx512f" : "avx2";
  return p;
}
#else
IsaPeaks isa_peaks(int) { return {}; }
#endif

}  // namespace mt::bench
