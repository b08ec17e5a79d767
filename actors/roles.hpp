// The actors' vocabulary: who does a unit of work (Role) and what it is part of (Phase). Every work
// message names (step, micro-batch, stage, phase); the supervisor, the monitor, the restart counters and
// the fault drills name actors by Role. No CAF here.
#pragma once
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

}  // namespace mt::actors
