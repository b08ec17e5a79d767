// The sizes and parameters every backend plans with.
#include "kernels/ops.hpp"

#include <cmath>

#include "kernels/layer_impl.hpp"  // elem_offset
#include "kernels/workspace.hpp"

namespace mt {

RopeParams rope_params_of(const ModelConfig& c) {
  RopeParams p;
  p.theta = c.rope_theta;
  const RopeScaling& rs = c.rope_scaling;
  switch (rs.type) {
    case RopeType::none:
      break;
    case RopeType::llama3:
      p.kind = RopeKind::llama3;
      p.factor = rs.factor;
      p.low_freq_factor = rs.low_freq_factor;
      p.high_freq_factor = rs.high_freq_factor;
      p.original_max_position = rs.original_max_position_embeddings;
      break;
    case RopeType::linear:
      p.kind = RopeKind::linear;
      p.factor = rs.factor;
      break;
    case RopeType::dynamic:
      // transformers grows the base past config.max_position_embeddings (validate() refuses a different
      // rope_scaling.original_max_position_embeddings).
      p.kind = RopeKind::dynamic;
      p.factor = rs.factor;
      p.original_max_position = c.max_position_embeddings;
      break;
    case RopeType::yarn: {
      p.kind = RopeKind::yarn;
      p.factor = rs.factor;
      p.original_max_position =
          rs.original_max_position_embeddings > 0 ? rs.original_max_position_embeddings : c.max_position_embeddings;
      p.beta_fast = rs.beta_fast;
      p.beta_slow = rs.beta_slow;
      p.truncate = rs.truncate;
      // transformers' attention factor, in double as Python computes it: the given one, else
      // get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are given (newer
      // transformers; 4.46 has neither key), else 0.1 ln(factor) + 1 (1 at factor 1 in both versions).
      auto get_mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      if (rs.attention_factor > 0.0)
        p.attention_scaling = rs.attention_factor;
      else if (rs.mscale > 0.0 && rs.mscale_all_dim > 0.0)
        p.attention_scaling = get_mscale(rs.factor, rs.mscale) / get_mscale(rs.factor, rs.mscale_all_dim);
      else
        p.attention_scaling = 0.1 * std::log(rs.factor) + 1.0;
      break;
    }
  }
  return p;
}

std::size_t operand_room_floats(Precision p, const OperandRoom& room) {
  if (p != Precision::bf16) return 0;
  detail::Carver cv(nullptr);
  cv.take((room.activation + 1) / 2);  // two bf16 per float of the workspace
  cv.take((room.gradient + 1) / 2);
  cv.take(room.vector * OperandRoom::kVectorSlots);
  return cv.used();
}

// One product per expert with rows: the shapes come from the host offsets, so every backend can run it
// over its own linear products; a backend with a grouped kernel of its own overrides these.
void Ops::grouped_linear_forward(const float* x, const void* W, std::int64_t w_stride, const void* b,
                                 std::int64_t b_stride, float* y, const std::int64_t* offsets, std::int64_t experts,
                                 std::int64_t in, std::int64_t out) {
  const Precision p = precision();
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    linear_forward(x + r0 * in, detail::elem_offset(W, static_cast<std::size_t>(e * w_stride), p),
                   b ? detail::elem_offset(b, static_cast<std::size_t>(e * b_stride), p) : nullptr, y + r0 * out, rows,
                   in, out);
  }
}

void Ops::grouped_linear_backward(const float* dy, const float* x, const void* W, std::int64_t w_stride, float* dx,
                                  bool add, float* dW_acc, float* db_acc, std::int64_t b_stride,
                                  const std::int64_t* offsets, std::int64_t experts, std::int64_t in,
                                  std::int64_t out) {
  const Precision p = precision();
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    linear_backward(dy + r0 * out, x + r0 * in, detail::elem_offset(W, static_cast<std::size_t>(e * w_stride), p),
                    dx ? dx + r0 * in : nullptr, add, dW_acc + e * w_stride, db_acc ? db_acc + e * b_stride : nullptr,
                    rows, in, out);
  }
}

}  // namespace mt
