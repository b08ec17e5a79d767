#include "actors/tier_failure.hpp"

#include <string>

namespace mt::actors {

void explain_tier_failure(EngineResult& result, const HostModel& host, std::int64_t first_step) {
  if (result.error.empty()) return;
  const std::string tier = host.moments().failure();
  if (tier.empty()) return;
  const CheckpointEvent* newest = nullptr;
  for (const auto& c : result.checkpoints)
    if (c.ok && (newest == nullptr || c.step > newest->step)) newest = &c;
  std::string e = "the NVMe tier failed: " + tier + ". The run stopped after " + std::to_string(result.steps_done) +
                  " steps, mid-step (the tier holds the only copy of part of that step's state): ";
  if (newest != nullptr)
    e += "the newest checkpoint, step " + std::to_string(newest->step) + " at " + newest->path +
         ", holds the last consistent state and is intact; resume from it (train.resume_from_checkpoint)";
  else if (first_step > 0)
    e += "this run wrote no checkpoint; the one it resumed from (step " + std::to_string(first_step) +
         ") holds the last consistent state and is intact";
  else
    e += "this run wrote no checkpoint before the failure, so there is no consistent state to resume from";
  e += " [run error: " + result.error + "]";
  result.error = e;
}

}  // namespace mt::actors
