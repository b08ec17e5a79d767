// LayerNorm with bias (GPT-2): y = (x - mean) * rsqrt(var + eps) * w + b, biased variance.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                       std::int64_t N, std::int64_t D, float eps, int threads) {
  prof::Scope prof_scope(prof::elementwise);
#pragma omp parallel for num_threads(threads) schedule(static) if (N * D > 16384)
  for (std::int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    float sum = 0.0f;
    for (std::int64_t j = 0; j < D; ++j) sum += xr[j];
    const float m = sum / static_cast<float>(D);
    float var = 0.0f;
    for (std::int64_t j = 0; j < D; ++j) var += (xr[j] - m) * (xr[j] - m);
    const float s = 1.0f / std::sqrt(var / static_cast<float>(D) + eps);
    mean[r] = m;
    rstd[r] = s;
    for (std::int64_t j = 0; j < D; ++j) yr[j] = (xr[j] - m) * s * w[j] + b[j];
  }
}

void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add,
                        int threads) {
  prof::Scope prof_scope(prof::elementwise);
#pragma omp parallel num_threads(threads) if (N * D > 16384)
  {
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < N; ++r) {
      const float* xr = x + r * D;
      const float* dyr = dy + r * D;
      float* dxr = dx + r * D;
      const float m = mean[r], s = rstd[r];
      float sum_g = 0.0f, sum_gx = 0.0f;
      for (std::int64_t j = 0; j < D; ++j) {
        const float g = dyr[j] * w[j];
        sum_g += g;
        sum_gx += g * ((xr[j] - m) * s);
      }
      const float mg = sum_g / static_cast<float>(D), mgx = sum_gx / static_cast<float>(D);
      if (add)
        for (std::int64_t j = 0; j < D; ++j) dxr[j] += s * (dyr[j] * w[j] - mg - (xr[j] - m) * s * mgx);
      else
        for (std::int64_t j = 0; j < D; ++j) dxr[j] = s * (dyr[j] * w[j] - mg - (xr[j] - m) * s * mgx);
    }
    const std::int64_t blocks = (D + 63) / 64;
#pragma omp for schedule(static)
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::int64_t j0 = blk * 64, j1 = std::min<std::int64_t>(D, j0 + 64);
      float aw[64], ab[64];
      for (std::int64_t j = j0; j < j1; ++j) aw[j - j0] = ab[j - j0] = 0.0f;
      for (std::int64_t r = 0; r < N; ++r) {
        const float m = mean[r], s = rstd[r];
        for (std::int64_t j = j0; j < j1; ++j) {
          const float g = dy[r * D + j];
          aw[j - j0] += g * ((x[r * D + j] - m) * s);
          ab[j - j0] += g;
        }
      }
      for (std::int64_t j = j0; j < j1; ++j) {
        dw_acc[j] += aw[j - j0];
        db_acc[j] += ab[j - j0];
      }
    }
  }
}

}  // namespace mt::cpu
