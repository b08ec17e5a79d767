// The fault hook: makes one pipeline actor throw at a chosen point of the schedule, so the restart tests
// can crash any actor mid-step, and a monitor client allowed to (MonitorSection::allow_fault_injection,
// which only test harnesses set) can run a fault drill. Inert unless armed. No CAF here.
//
// Every actor calls fault_point(plan, role, step, micro_batch, stage, phase) at the start of each unit
// of work it is about to do (before it touches any durable state), so a planned crash always happens
// at a message boundary: the supervisor then restarts the actor and re-issues the work.
#pragma once
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "actors/roles.hpp"

namespace mt::actors {

// A planned crash. Fields at -1 match anything. Fires at most once per plan (across restarts).
struct FaultPlan {
  bool armed = false;
  Role role = Role::compute;
  std::int64_t step = -1;
  std::int64_t micro_batch = -1;
  std::int64_t stage = -1;
  int phase = -1;  // static_cast<int>(Phase), or -1
  std::atomic<int> fired{0};
  // On demand (the monitor's /control/fault): the role's next fault point throws, whatever it is.
  std::atomic<int> on_demand[kRoleCount] = {};

  FaultPlan() = default;
  FaultPlan(Role r, std::int64_t s, std::int64_t mb, std::int64_t st, int ph)
      : armed(true), role(r), step(s), micro_batch(mb), stage(st), phase(ph) {}
  std::string describe() const;
};

// The exception a planned crash throws (a std::runtime_error, as any bug in a handler would).
struct InjectedFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws InjectedFault when `plan` is armed, not yet fired and matches this point, or when a fault was
// requested on demand for `role`.
void fault_point(FaultPlan* plan, Role role, std::int64_t step, std::int64_t micro_batch, std::int64_t stage,
                 Phase phase);

}  // namespace mt::actors
