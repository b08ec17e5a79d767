#include "actors/stage_accumulators.hpp"

#include <stdexcept>
#include <string>

namespace mt::actors {

StageAccumulators::StageAccumulators(std::size_t floats) {
  if (floats == 0) return;
  for (int k = 0; k < kCount; ++k) buffers_.push_back(make_aligned_floats(floats));
  owners_.resize(kCount);
}

int StageAccumulators::claim(std::int64_t step, std::int64_t stage) {
  std::lock_guard<std::mutex> lock(mutex_);
  int free = -1;
  for (int k = 0; k < static_cast<int>(owners_.size()); ++k) {
    const Owner& o = owners_[static_cast<std::size_t>(k)];
    if (o.step == step && o.stage == stage) return k;
    if (o.stage < 0 && free < 0) free = k;
  }
  if (free >= 0) owners_[static_cast<std::size_t>(free)] = Owner{step, stage};
  return free;
}

int StageAccumulators::held_by(std::int64_t step, std::int64_t stage) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int k = 0; k < static_cast<int>(owners_.size()); ++k)
    if (owners_[static_cast<std::size_t>(k)].step == step && owners_[static_cast<std::size_t>(k)].stage == stage)
      return k;
  return -1;
}

void StageAccumulators::release(int index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index < 0 || index >= static_cast<int>(owners_.size()))
    throw std::out_of_range("StageAccumulators: no accumulator " + std::to_string(index));
  owners_[static_cast<std::size_t>(index)] = Owner{};
}

}  // namespace mt::actors
