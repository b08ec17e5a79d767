// CPU AdamW: a reference loop and the fast kernel. The fast kernel is memory-bound (28 bytes per
// parameter), so the aim is to keep both cores streaming: 8 lanes per instruction, no errno checks on
// sqrt, and one contiguous chunk per thread.
#include "kernels/adamw.hpp"

#include <algorithm>
#include <cmath>

#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MT_ADAMW_AVX2 1
#endif

namespace mt::cpu {

void adamw_reference(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s) {
  for (std::size_t i = 0; i < n; ++i) {
    const float grad = g[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + s.one_minus_beta1 * grad;
    v[i] = s.beta2 * v[i] + s.one_minus_beta2 * grad * grad;
    const float denom = std::sqrt(v[i]) * s.inv_sqrt_bias2 + s.eps;
    p[i] = p[i] * s.decay_factor - s.step_size * (m[i] / denom);
  }
}

namespace {

// One element with the same fused operations as one lane of the vector loop, so an element gives the
// same bits whether it lands in a vector body or a scalar tail.
inline void adamw_one(float& p, float g, float& m, float& v, const AdamWStep& s) {
  const float grad = g * s.grad_scale;
  m = std::fma(s.one_minus_beta1, grad, s.beta1 * m);
  v = std::fma(s.one_minus_beta2 * grad, grad, s.beta2 * v);
  const float denom = std::fma(std::sqrt(v), s.inv_sqrt_bias2, s.eps);
  p = std::fma(-s.step_size, m / denom, p * s.decay_factor);
}

void adamw_range(float* p, const float* g, float* m, float* v, std::size_t begin, std::size_t end, const AdamWStep& s) {
  std::size_t i = begin;
#ifdef MT_ADAMW_AVX2
  const __m256 b1 = _mm256_set1_ps(s.beta1), b2 = _mm256_set1_ps(s.beta2);
  const __m256 c1 = _mm256_set1_ps(s.one_minus_beta1), c2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(s.eps), decay = _mm256_set1_ps(s.decay_factor);
  const __m256 neg_step = _mm256_set1_ps(-s.step_size), isb2 = _mm256_set1_ps(s.inv_sqrt_bias2);
  const __m256 scale = _mm256_set1_ps(s.grad_scale);
  for (; i + 8 <= end; i += 8) {
    const __m256 grad = _mm256_mul_ps(_mm256_loadu_ps(g + i), scale);
    const __m256 mi = _mm256_fmadd_ps(c1, grad, _mm256_mul_ps(b1, _mm256_loadu_ps(m + i)));
    const __m256 vi = _mm256_fmadd_ps(_mm256_mul_ps(c2, grad), grad, _mm256_mul_ps(b2, _mm256_loadu_ps(v + i)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), isb2, eps);
    const __m256 pi = _mm256_fmadd_ps(neg_step, _mm256_div_ps(mi, denom), _mm256_mul_ps(_mm256_loadu_ps(p + i), decay));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
  }
#endif
  for (; i < end; ++i) adamw_one(p[i], g[i], m[i], v[i], s);
}

}  // namespace

void adamw(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s, int threads) {
  // Chunks are whole multiples of 64 floats (a cache line of each of the four arrays per 16 floats),
  // so only the global tail runs scalar and thread boundaries never split a vector.
  constexpr std::size_t kGrain = 64;
  const std::size_t blocks = (n + kGrain - 1) / kGrain;
  const int t = std::max(1, std::min<int>(threads, static_cast<int>(std::max<std::size_t>(blocks, 1))));
  if (t == 1 || n < 4096) {
    adamw_range(p, g, m, v, 0, n, s);
    return;
  }
#pragma omp parallel num_threads(t)
  {
    // Static contiguous split computed by hand (not omp for) to keep chunk edges on the grain.
    const std::size_t id = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t per = (blocks + t - 1) / t;
    const std::size_t begin = std::min(n, id * per * kGrain);
    const std::size_t end = std::min(n, (id + 1) * per * kGrain);
    if (begin < end) adamw_range(p, g, m, v, begin, end, s);
  }
}

}  // namespace mt::cpu
