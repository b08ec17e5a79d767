// Softmax cross-entropy over a chunk of logit rows, turning the logits into their gradient in place
// (softmax - onehot), so the LM head never holds more than one chunk of logits.
#include <cmath>
#include <limits>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

namespace {

float row_max(const float* x, std::int64_t n) {
  std::int64_t j = 0;
  float m = -std::numeric_limits<float>::infinity();
#ifdef MT_AVX2
  __m256 vm = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + j));
  m = simd::hmax(vm);
#endif
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// sum_j exp(x[j] - m); with `store` the exponentials replace x.
double exp_sum(float* x, std::int64_t n, float m, bool store) {
  std::int64_t j = 0;
  double total = 0.0;
#ifdef MT_AVX2
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = simd::exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm));
    if (store) _mm256_storeu_ps(x + j, e);
    acc = _mm256_add_ps(acc, e);
    if ((j & 1023) == 1016) {  // fold into double every 1024 columns to bound fp32 error on big vocabs
      total += simd::hsum(acc);
      acc = _mm256_setzero_ps();
    }
  }
  total += simd::hsum(acc);
#endif
  for (; j < n; ++j) {
    const float e = simd::exp1(x[j] - m);
    if (store) x[j] = e;
    total += e;
  }
  return total;
}

}  // namespace

void cross_entropy_rows(float* logits, const std::int32_t* targets, float* row_loss, std::int64_t rows, std::int64_t V,
                        bool want_grad, int threads) {
  prof::Scope prof_scope(prof::loss);
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * V > 65536)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * V;
    const std::int32_t tgt = targets[r];
    if (tgt < 0) {  // ignored (-100): no loss, no gradient
      row_loss[r] = 0.0f;
      if (want_grad)
        for (std::int64_t j = 0; j < V; ++j) x[j] = 0.0f;
      continue;
    }
    const float m = row_max(x, V);
    const float target_logit = x[tgt];
    const double sum = exp_sum(x, V, m, want_grad);
    const float lse = m + static_cast<float>(std::log(sum));
    row_loss[r] = lse - target_logit;
    if (want_grad) {
      const float inv = static_cast<float>(1.0 / sum);
      for (std::int64_t j = 0; j < V; ++j) x[j] *= inv;
      x[tgt] -= 1.0f;
    }
  }
}

}  // namespace mt::cpu
