// RMSNorm (Llama family): y = w * (x * rsqrt(mean(x^2) + eps)), the order transformers uses.
// Rows run in parallel; the weight gradient splits over column blocks and sums rows in order.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::int64_t N, std::int64_t D, float eps,
                     int threads) {
  prof::Scope prof_scope(prof::elementwise);
#pragma omp parallel for num_threads(threads) schedule(static) if (N * D > 16384)
  for (std::int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    const float s = 1.0f / std::sqrt(simd::dot(xr, xr, D) / static_cast<float>(D) + eps);
    rstd[r] = s;
    for (std::int64_t j = 0; j < D; ++j) yr[j] = w[j] * (xr[j] * s);
  }
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw_acc,
                      std::int64_t N, std::int64_t D, bool add, int threads) {
  prof::Scope prof_scope(prof::elementwise);
#pragma omp parallel num_threads(threads) if (N * D > 16384)
  {
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < N; ++r) {
      const float* xr = x + r * D;
      const float* dyr = dy + r * D;
      float* dxr = dx + r * D;
      const float s = rstd[r];
      // mean(g * xhat) with g = dy * w, xhat = x * s
      float acc = 0.0f;
      for (std::int64_t j = 0; j < D; ++j) acc += dyr[j] * w[j] * xr[j];
      const float c = acc * s * s / static_cast<float>(D);
      if (add)
        for (std::int64_t j = 0; j < D; ++j) dxr[j] += s * (dyr[j] * w[j] - xr[j] * c);
      else
        for (std::int64_t j = 0; j < D; ++j) dxr[j] = s * (dyr[j] * w[j] - xr[j] * c);
    }
    if (dw_acc) {
      const std::int64_t blocks = (D + 63) / 64;
#pragma omp for schedule(static)
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t j0 = blk * 64, j1 = std::min<std::int64_t>(D, j0 + 64);
        float acc[64];
        for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] = 0.0f;
        for (std::int64_t r = 0; r < N; ++r) {
          const float s = rstd[r];
          for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] += dy[r * D + j] * (x[r * D + j] * s);
        }
        for (std::int64_t j = j0; j < j1; ++j) dw_acc[j] += acc[j - j0];
      }
    }
  }
}

}  // namespace mt::cpu
