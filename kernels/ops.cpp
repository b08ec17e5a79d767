// The sizes and parameters every backend plans with.
#include "kernels/ops.hpp"

#include "kernels/workspace.hpp"

namespace mt {

RopeParams rope_params_of(const ModelConfig& c) {
  RopeParams p;
  p.theta = c.rope_theta;
  p.scaling_factor = c.rope_scaling.factor;
  p.low_freq_factor = c.rope_scaling.low_freq_factor;
  p.high_freq_factor = c.rope_scaling.high_freq_factor;
  p.original_max_position = c.rope_scaling.original_max_position_embeddings;
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

}  // namespace mt
