// Stage 0: token (and, for GPT-2, learned position) embeddings, forward and backward.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/bf16.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/profile.hpp"
#include "kernels/stage_api.hpp"

namespace mt {

void embedding_forward(const ModelConfig& c, const void* params, const token_t* tokens, std::int64_t batch,
                       std::int64_t seq, float* x_out, const ComputeCtx& ctx) {
  prof::Scope prof_scope(prof::elementwise);
  validate_batch_shape(c, batch, seq);
  validate_tokens(c, tokens, static_cast<std::size_t>(batch * seq));
  const ParamLayout& l = detail::cached_embedding_layout(c);
  const std::int64_t d = c.hidden_size, N = batch * seq;
  const std::size_t wte_off = l.tensors[0].offset;
  const std::ptrdiff_t wpe_off = c.is_gpt2() ? static_cast<std::ptrdiff_t>(l.at("wpe.weight").offset) : -1;
  if (ctx.precision == Precision::bf16) {  // bf16 rows widened to fp32 (exact), the sum in fp32
    const bf16_t* wte = static_cast<const bf16_t*>(params) + wte_off;
    const bf16_t* wpe = wpe_off >= 0 ? static_cast<const bf16_t*>(params) + wpe_off : nullptr;
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (N * d > 65536)
    for (std::int64_t r = 0; r < N; ++r) {
      const bf16_t* e = wte + static_cast<std::int64_t>(tokens[r]) * d;
      float* y = x_out + r * d;
      if (wpe) {
        const bf16_t* pe = wpe + (r % seq) * d;
        for (std::int64_t j = 0; j < d; ++j) y[j] = cpu::bf16_to_float(e[j]) + cpu::bf16_to_float(pe[j]);
      } else {
        for (std::int64_t j = 0; j < d; ++j) y[j] = cpu::bf16_to_float(e[j]);
      }
    }
    return;
  }
  const float* wte = static_cast<const float*>(params) + wte_off;
  const float* wpe = wpe_off >= 0 ? static_cast<const float*>(params) + wpe_off : nullptr;
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (N * d > 65536)
  for (std::int64_t r = 0; r < N; ++r) {
    const float* e = wte + static_cast<std::int64_t>(tokens[r]) * d;
    float* y = x_out + r * d;
    if (wpe) {
      const float* pe = wpe + (r % seq) * d;
      for (std::int64_t j = 0; j < d; ++j) y[j] = e[j] + pe[j];
    } else {
      std::memcpy(y, e, static_cast<std::size_t>(d) * sizeof(float));
    }
  }
}

void embedding_backward(const ModelConfig& c, const token_t* tokens, std::int64_t batch, std::int64_t seq,
                        const float* dx, float* grads, const ComputeCtx& ctx) {
  prof::Scope prof_scope(prof::elementwise);
  validate_batch_shape(c, batch, seq);
  validate_tokens(c, tokens, static_cast<std::size_t>(batch * seq));
  const ParamLayout& l = detail::cached_embedding_layout(c);
  const std::int64_t d = c.hidden_size, N = batch * seq;
  float* dwte = grads + l.tensors[0].offset;
  float* dwpe = c.is_gpt2() ? grads + l.at("wpe.weight").offset : nullptr;
  // Columns split over threads; every column adds rows in token order, so repeated tokens sum the same
  // way whatever the thread count.
  const std::int64_t blocks = (d + 63) / 64;
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (N * d > 65536)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t j0 = blk * 64, j1 = std::min(d, j0 + 64);
    for (std::int64_t r = 0; r < N; ++r) {
      const float* g = dx + r * d;
      float* e = dwte + static_cast<std::int64_t>(tokens[r]) * d;
      for (std::int64_t j = j0; j < j1; ++j) e[j] += g[j];
      if (dwpe) {
        float* pe = dwpe + (r % seq) * d;
        for (std::int64_t j = j0; j < j1; ++j) pe[j] += g[j];
      }
    }
  }
}

}  // namespace mt
