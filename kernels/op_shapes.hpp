// The shapes the op seam passes (ops.hpp), in a header of their own so the CUDA kernels can use them
// without the model headers.
#pragma once
#include <cstdint>

namespace mt {

// Rotary embeddings as transformers computes its inv_freq (Llama-3 rope_scaling when factor != 0).
struct RopeParams {
  float theta = 10000.0f;
  float scaling_factor = 0.0f, low_freq_factor = 1.0f, high_freq_factor = 4.0f;
  std::int64_t original_max_position = 8192;
};

// Causal grouped-query attention over [batch, seq] tokens; strides are floats between consecutive tokens.
struct AttnShape {
  std::int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t q_stride = 0, kv_stride = 0, o_stride = 0;
};

// cos / sin [seq, head_dim / 2] for positions 0..seq-1, where the ops read them.
struct RopeTables {
  const float* cos = nullptr;
  const float* sin = nullptr;
};

}  // namespace mt
