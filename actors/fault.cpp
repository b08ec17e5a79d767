#include "actors/fault.hpp"

#include <sstream>
#include <stdexcept>

namespace mt::actors {

std::string FaultPlan::describe() const {
  std::ostringstream o;
  o << role_name(role) << " at step " << step << " micro-batch " << micro_batch << " stage " << stage << " phase "
    << (phase < 0 ? "any" : phase_name(static_cast<Phase>(phase)));
  return o.str();
}

void fault_point(FaultPlan* plan, Role role, std::int64_t step, std::int64_t micro_batch, std::int64_t stage,
                 Phase phase) {
  if (plan == nullptr) return;
  std::atomic<int>& asked = plan->on_demand[static_cast<int>(role)];
  if (asked.load(std::memory_order_relaxed) != 0 && asked.exchange(0) != 0)
    throw InjectedFault(std::string("injected fault (on demand): ") + role_name(role) + " at step " +
                        std::to_string(step) + " micro-batch " + std::to_string(micro_batch) + " stage " +
                        std::to_string(stage) + " phase " + phase_name(phase));
  if (!plan->armed || plan->role != role) return;
  if (plan->step >= 0 && plan->step != step) return;
  if (plan->micro_batch >= 0 && plan->micro_batch != micro_batch) return;
  if (plan->stage >= 0 && plan->stage != stage) return;
  if (plan->phase >= 0 && plan->phase != static_cast<int>(phase)) return;
  if (plan->fired.exchange(1) != 0) return;
  throw InjectedFault("injected fault: " + plan->describe());
}

}  // namespace mt::actors
