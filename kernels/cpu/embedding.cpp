// Embedding rows: the gather of the forward (fp32, or bf16 rows widened exactly) and the deterministic
// scatter-add of the backward.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

namespace {

inline float widen(float v) { return v; }
inline float widen(bf16_t v) { return bf16_to_float(v); }

template <class W>
void gather(const W* wte, const W* wpe, const std::int32_t* tokens, std::int64_t N, std::int64_t seq, std::int64_t d,
            float* y, int threads, const std::int32_t* positions) {
  prof::Scope prof_scope(prof::elementwise);
#pragma omp parallel for num_threads(threads) schedule(static) if (N * d > 65536)
  for (std::int64_t r = 0; r < N; ++r) {
    const W* e = wte + static_cast<std::int64_t>(tokens[r]) * d;
    float* out = y + r * d;
    if (wpe) {
      const W* pe = wpe + (positions ? positions[r] : r % seq) * d;
      for (std::int64_t j = 0; j < d; ++j) out[j] = widen(e[j]) + widen(pe[j]);
    } else if constexpr (sizeof(W) == sizeof(float)) {
      std::memcpy(out, e, static_cast<std::size_t>(d) * sizeof(float));
    } else {
      for (std::int64_t j = 0; j < d; ++j) out[j] = widen(e[j]);
    }
  }
}

}  // namespace

void embedding_gather(const float* wte, const float* wpe, const std::int32_t* tokens, std::int64_t N, std::int64_t seq,
                      std::int64_t d, float* y, int threads, const std::int32_t* positions) {
  gather(wte, wpe, tokens, N, seq, d, y, threads, positions);
}

void embedding_gather(const bf16_t* wte, const bf16_t* wpe, const std::int32_t* tokens, std::int64_t N,
                      std::int64_t seq, std::int64_t d, float* y, int threads, const std::int32_t* positions) {
  gather(wte, wpe, tokens, N, seq, d, y, threads, positions);
}

void embedding_scatter(const std::int32_t* tokens, const float* dx, std::int64_t N, std::int64_t seq, std::int64_t d,
                       float* dwte_acc, float* dwpe_acc, int threads, const std::int32_t* positions) {
  prof::Scope prof_scope(prof::elementwise);
  // Columns split over threads; every column adds rows in token order, so repeated tokens sum the same
  // way whatever the thread count.
  const std::int64_t blocks = (d + 63) / 64;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * d > 65536)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t j0 = blk * 64, j1 = std::min(d, j0 + 64);
    for (std::int64_t r = 0; r < N; ++r) {
      const float* g = dx + r * d;
      float* e = dwte_acc + static_cast<std::int64_t>(tokens[r]) * d;
      for (std::int64_t j = j0; j < j1; ++j) e[j] += g[j];
      if (dwpe_acc) {
        float* pe = dwpe_acc + (positions ? positions[r] : r % seq) * d;
        for (std::int64_t j = j0; j < j1; ++j) pe[j] += g[j];
      }
    }
  }
}

}  // namespace mt::cpu
