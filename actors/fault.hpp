// The test-only fault hook: makes one pipeline actor throw at a chosen point of the schedule, so the
// restart tests can crash any actor mid-step. Compiled in always, inert unless armed. No CAF here.
//
// Every actor calls fault_point(plan, role, step, micro_batch, stage, phase) at the start of each unit
// of work it is about to do (before it touches any durable state), so a planned crash always happens
// at a message boundary: the supervisor then restarts the actor and re-issues the work.
#pragma once
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace mt::actors {

// The pipeline actors (the node supervises them; it is not itself a fault target).
enum class Role : int { loader = 0, prefetcher = 1, compute = 2, collector = 3, optimizer = 4 };
inline constexpr int kRoleCount = 5;
const char* role_name(Role r);
Role parse_role(const std::string& name);  // throws std::invalid_argument listing the names

// What a unit of work is part of. Every work message names (step, micro-batch, stage, phase).
enum class Phase : int {
  data = 0,               // the loader reading a micro-batch
  prefetch = 1,           // the prefetcher streaming a stage into a slot
  forward = 2,            // compute: a stage's forward (the head's fused forward+backward is `head`)
  head = 3,               // compute: the head (final norm, LM head, loss, its backward)
  backward = 4,           // compute: a stage's recompute + backward
  collect = 5,            // collector: device-to-host copy and fp32 accumulation
  optimize = 6,           // optimizer: AdamW over one stage
  prefetch_boundary = 7,  // the prefetcher streaming a layer's input boundary back from the host
};
const char* phase_name(Phase p);

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
