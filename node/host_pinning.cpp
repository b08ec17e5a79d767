#include "node/host_pinning.hpp"

namespace mt::node {

using namespace mt::actors;  // the engine this folder runs
using namespace mt::plan;

std::unique_ptr<BackendPinning> host_pinning_for(const TrainConfig& cfg, const EnginePlan& plan) {
  if (cfg.device.backend == "cpu") return nullptr;
  BackendOptions o = backend_options(cfg, plan);
  o.device_index = 0;
  return std::make_unique<BackendPinning>(make_backend(o));
}

}  // namespace mt::node
