// Stage gradients of several micro-batches (train.gradient_buffer=stage, layer-major), or of several
// ranks (the host state sharded: a stage's owner sums every rank's rounds in rank order): a stage's
// micro-batches are summed into one of two host accumulators, exactly as the tile's accumulator
// would be (zeroed, then each micro-batch added in order), and the optimizer updates from it once the
// stage is complete. Two suffice: the stage being summed, and the one before it in the optimizer.
// The collector claims an accumulator at a stage's first micro-batch of a pass; whoever used it last
// releases it (the collector after a first pass's sum of squares, the optimizer after the update).
// Claims survive actor restarts (the supervisor hands a complete stage's accumulator to a respawned
// optimizer). No CAF here.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/tile.hpp"
#include "plan/engine_plan.hpp"

namespace mt::actors {

class StageAccumulators {
 public:
  static constexpr int kCount = plan::kStageAccumulators;
  explicit StageAccumulators(std::size_t floats = 0);
  bool enabled() const { return !buffers_.empty(); }
  // An accumulator for (step, stage): the one it holds already, else a free one claimed; -1 if none is free.
  int claim(std::int64_t step, std::int64_t stage);
  // The accumulator (step, stage) holds, or -1.
  int held_by(std::int64_t step, std::int64_t stage) const;
  void release(int index);
  float* data(int index) { return buffers_.at(static_cast<std::size_t>(index)).get(); }

 private:
  struct Owner {
    std::int64_t step = -1, stage = -1;
  };
  mutable std::mutex mutex_;  // the collector claims, the optimizer releases
  std::vector<AlignedFloats> buffers_;
  std::vector<Owner> owners_;
};

}  // namespace mt::actors
