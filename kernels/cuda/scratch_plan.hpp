// The CUDA ops' own device scratch (CudaOps: bf16 operand copies, column-sum partials, attention row
// dots, the expert dispatch's counts, the load-balancing partials): what each op takes, and the run's
// whole need from its shapes, so the backend allocates it once at start (never inside a step) and the
// planner counts it. Plain C++ (no CUDA headers): tests/kernels/cuda/test_scratch_plan.cpp runs every
// stage of several model families over recording ops and checks the plan covers each op's take.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/moe_plan.hpp"
#include "kernels/cuda/plan.hpp"
#include "kernels/model_config.hpp"
#include "kernels/op_shapes.hpp"
#include "kernels/precision.hpp"

namespace mt::cuda {

enum ScratchSlot { bf16_operand, bf16_gradient, colsum_partial, attention_rowdot, moe_offsets, moe_balance, kSlots };
const char* scratch_slot_name(int slot);

struct ScratchPlan {
  std::size_t bytes[kSlots] = {};
  void cover(int slot, std::size_t b) { bytes[slot] = std::max(bytes[slot], b); }
  std::size_t total() const {
    std::size_t t = 0;
    for (std::size_t b : bytes) t += b;
    return t;
  }
  bool empty() const { return total() == 0; }
};

// What each op takes (CudaOps asks its slots for exactly these).
inline std::size_t bf16_operand_bytes(std::int64_t elements) { return static_cast<std::size_t>(elements) * 2; }
inline std::size_t colsum_bytes(std::int64_t rows, std::int64_t cols) {
  return colsum_scratch_floats(rows, cols) * sizeof(float);
}
inline std::size_t rowdot_bytes(const AttnShape& a) {
  return static_cast<std::size_t>(a.batch * a.q_heads * a.q_rows()) * sizeof(float);
}
inline constexpr std::int64_t kBalanceChunk = 256;  // tokens a thread of moe_balance_stats sums
inline std::size_t balance_bytes(const RouteShape& s) {
  const std::int64_t chunks = (s.tokens + kBalanceChunk - 1) / kBalanceChunk;
  return static_cast<std::size_t>((chunks + 1) * s.experts) * sizeof(float);
}

// The run's scratch: at least what any op of any stage takes for micro-batches of batch x seq (in
// sequence tiles of seq_tile, 0: whole), LM-head chunks of head_chunk tokens (0: head_chunk_tokens()),
// at precision p. Upper bounds where the stages' exact takes would need their internals (column sums:
// the most splits of any row count up to the largest, times the widest column count).
ScratchPlan cuda_scratch_plan(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t seq_tile,
                              std::int64_t head_chunk, Precision p);

}  // namespace mt::cuda
