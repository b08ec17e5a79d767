// Small AVX2/FMA helpers shared by the CPU kernels (internal header). Every helper has a portable
// fallback so the project still builds for plain x86-64; vector and tail elements go through the same
// polynomial (tails are padded into a vector), so an element's bits do not depend on where it falls.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MT_AVX2 1
#endif

namespace mt::cpu::simd {

#ifdef MT_AVX2
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

inline float hmax(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_max_ps(lo, hi);
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// exp(x) for 8 lanes: range reduction by ln 2 and a degree-6 polynomial (about 1-2 ulp); inputs are
// clamped to [-87.3, 88.3] so the result is finite and >= ~1e-38.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Loads/stores of a tail of m < 8 floats, masked: lanes from m on are neither read (they load as 0) nor
// written. (Through a buffer, element by element, every short row paid a store-forwarding stall.)
inline __m256i tail_mask(std::size_t m) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(m)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m256 load_tail(const float* p, std::size_t m) { return _mm256_maskload_ps(p, tail_mask(m)); }
inline void store_tail(float* p, __m256 v, std::size_t m) { _mm256_maskstore_ps(p, tail_mask(m), v); }
#endif

// Scalar exp for code paths that are not vectorised (and builds without AVX2).
inline float exp1(float x) {
#ifdef MT_AVX2
  return _mm256_cvtss_f32(exp8(_mm256_set1_ps(x)));
#else
  return std::exp(x);
#endif
}

// Dot product of two float vectors (8 lanes, then a fixed horizontal order).
inline float dot(const float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
#ifdef MT_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
#else
  float s = 0.0f;
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy(float a, const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#ifdef MT_AVX2
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

// y[i] = a * x[i] for i < n, into an output the caller does not read again (the next op does). Where y
// holds whole aligned cache lines they are stored past the caches: no read for ownership first, and no
// line of the rows being worked on evicted for them. a = 1 copies x bit for bit (all but a signalling NaN,
// which no arithmetic makes). fence_streams() before another thread may read y.
inline void scale_past_caches(const float* x, float a, float* y, std::int64_t n) {
  std::int64_t i = 0;
#ifdef MT_AVX2
  if (n % 16 == 0 && reinterpret_cast<std::uintptr_t>(y) % 64 == 0) {
    const __m256 va = _mm256_set1_ps(a);
    for (; i < n; i += 8) _mm256_stream_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), va));
  }
#endif
  for (; i < n; ++i) y[i] = x[i] * a;
}
inline void fence_streams() {
#ifdef MT_AVX2
  _mm_sfence();
#endif
}

// y *= a
inline void scale(float a, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace mt::cpu::simd
