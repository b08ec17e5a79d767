// Internal: the two layer kinds behind layer_forward/layer_backward (stage_api.hpp). "saved" holds the
// forward's intermediates (the caller's keep buffer, or the front of the workspace when recomputing);
// "scratch" is the rest of the workspace.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/model_config.hpp"

namespace mt::detail {

std::size_t llama_saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
std::size_t llama_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
void llama_forward(const ModelConfig& c, const float* params, const float* x_in, float* x_out, std::int64_t B,
                   std::int64_t T, float* saved, float* scratch, int threads);
void llama_backward(const ModelConfig& c, const float* params, const float* x_in, float* saved, bool recompute,
                    const float* dy, float* dx, float* grads, std::int64_t B, std::int64_t T, float* scratch,
                    int threads);

std::size_t gpt2_saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
std::size_t gpt2_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
void gpt2_forward(const ModelConfig& c, const float* params, const float* x_in, float* x_out, std::int64_t B,
                  std::int64_t T, float* saved, float* scratch, int threads);
void gpt2_backward(const ModelConfig& c, const float* params, const float* x_in, float* saved, bool recompute,
                   const float* dy, float* dx, float* grads, std::int64_t B, std::int64_t T, float* scratch,
                   int threads);

}  // namespace mt::detail
