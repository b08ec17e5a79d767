// fp32 <-> bf16 arrays (see bf16.hpp for the rounding contract).
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/cpu_info.hpp"

#include <algorithm>

#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define MT_BF16_X86 1
#endif

namespace mt::cpu {

namespace {

// The reference rounding as a loop the compiler vectorises for the build's baseline (AVX2 on x86-64-v3).
void narrow_portable(const float* x, bf16_t* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = bf16_round_reference(x[i]);
}

#ifdef MT_BF16_X86
// 32 floats per vcvtne2ps2bf16. The instruction flushes denormal inputs to (signed) zero, which the
// contract does not: a block with a denormal is redone by the portable loop (rare in practice).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void narrow_avx512bf16(const float* x, bf16_t* y,
                                                                                       std::size_t n) {
  std::size_t i = 0;
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000), man_mask = _mm512_set1_epi32(0x007fffff);
  const __m512i zero = _mm512_setzero_si512();
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
    const __m512i lo_i = _mm512_castps_si512(lo), hi_i = _mm512_castps_si512(hi);
    // denormal: exponent bits 0 and mantissa non-zero
    const __mmask16 d_lo = _mm512_mask_cmpneq_epi32_mask(
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(lo_i, exp_mask), zero), _mm512_and_si512(lo_i, man_mask), zero);
    const __mmask16 d_hi = _mm512_mask_cmpneq_epi32_mask(
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(hi_i, exp_mask), zero), _mm512_and_si512(hi_i, man_mask), zero);
    if (d_lo | d_hi) {
      narrow_portable(x + i, y + i, 32);
      continue;
    }
    const __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);  // second operand fills the low half
    _mm512_storeu_si512(reinterpret_cast<void*>(y + i), reinterpret_cast<__m512i>(r));
  }
  narrow_portable(x + i, y + i, n - i);
}
#endif

template <class F>
void split(std::size_t n, int threads, F&& f) {
  // Chunks in multiples of 64 elements so thread edges never split a vector; elementwise either way.
  constexpr std::size_t kGrain = 64;
  const std::size_t blocks = (n + kGrain - 1) / kGrain;
  const int t = std::max(1, std::min<int>(threads, static_cast<int>(std::max<std::size_t>(blocks, 1))));
  if (t == 1 || n < 16384) {
    f(std::size_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(t)
  {
    const std::size_t id = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t per = (blocks + static_cast<std::size_t>(t) - 1) / static_cast<std::size_t>(t);
    const std::size_t b = std::min(n, id * per * kGrain), e = std::min(n, (id + 1) * per * kGrain);
    if (b < e) f(b, e);
  }
}

}  // namespace

bool cpu_has_avx512_bf16() {
#ifdef MT_BF16_X86
  static const bool has = avx512_allowed() && __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

void to_bf16(const float* x, bf16_t* y, std::size_t n, int threads, Bf16Path path) {
  bool fast = false;
#ifdef MT_BF16_X86
  fast = path != Bf16Path::portable && cpu_has_avx512_bf16();
#endif
  if (path == Bf16Path::avx512bf16 && !fast) path = Bf16Path::portable;  // not available: the same results
  split(n, threads, [&](std::size_t b, std::size_t e) {
#ifdef MT_BF16_X86
    if (fast) {
      narrow_avx512bf16(x + b, y + b, e - b);
      return;
    }
#endif
    narrow_portable(x + b, y + b, e - b);
  });
}

void from_bf16(const bf16_t* x, float* y, std::size_t n, int threads) {
  split(n, threads, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) y[i] = bf16_to_float(x[i]);
  });
}

}  // namespace mt::cpu
