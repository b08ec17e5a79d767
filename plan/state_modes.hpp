// The ways a run can hold its optimizer state, side by side for `megatrain plan`: host bytes per
// parameter, whether it fits, and the predicted step of each (the exact modes: fp32 or split masters,
// gradient accumulators or stage gradients; beside them the lossy int8 moments and the NVMe tier).
// Each row is the plan of the config with that mode's keys set, through the same functions as the plan
// itself (plan_resources, predict_step). No CAF here.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.hpp"
#include "kernels/model_config.hpp"
#include "plan/resource_plan.hpp"
#include "plan/step_model.hpp"

namespace mt::plan {

struct StateMode {
  std::string name;         // "split masters, stage gradients (2 passes)"
  std::string settings;     // the keys that select it ("train.master_weights=split train.gradient_buffer=stage")
  bool exact = true;        // false: int8 moments (lossy)
  bool configured = false;  // the config's own mode
  double tile_bytes_per_param = 0.0;
  double host_bytes = 0.0;  // the plan's predicted peak resident memory
  double disk_bytes = 0.0;
  bool fits = false;
  double step_s = 0.0;  // 0: no step (the device budget does not fit)
};

// The limits are plan_resources'. ops: the op times of the config's own plan (every mode computes the
// same ops; only the host side and the passes differ).
std::vector<StateMode> state_modes(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& extras,
                                   const HardwareProfile& hw, const OpTimes& ops, double host_limit, double disk_limit,
                                   double device_limit);
// sharded_rank >= 0: the modes of that rank of a job with the host state sharded (its tiles' bytes).
std::string describe_state_modes(const std::vector<StateMode>& modes, int sharded_rank = -1);

// Whether train.gradient_buffer=auto may still drop `cfg`'s gradient accumulators (auto kept them,
// and stage gradients can run it).
bool may_drop_accumulators(const TrainConfig& cfg);
// train.gradient_buffer=auto picks the fastest mode that fits: when `cfg` (accumulators kept) does not
// fit and the same run without them does (`fits` decides), that config; else nullopt. The two give the
// same bits. `train` runs with it, and `megatrain plan` plans it.
std::optional<TrainConfig> without_accumulators_if_only_that_fits(const TrainConfig& cfg,
                                                                  const std::function<bool(const TrainConfig&)>& fits);
inline constexpr const char* kDroppedAccumulatorsNote =
    "train.gradient_buffer=auto: stage (the gradient accumulators do not fit host RAM; with clipping each step "
    "replays the head and backward once more)";

}  // namespace mt::plan
