// The schedule the actors walk is the plan's (plan/schedule.hpp: the ops of a step, in order, and the
// loads each needs); these are its names in the actors, and the phase each op is part of. No CAF here.
#pragma once
#include "actors/roles.hpp"
#include "plan/schedule.hpp"

namespace mt::actors {

using plan::activation_sets;
using plan::forward_only_ops;
using plan::LoadKind;
using plan::micro_batch_ops;
using plan::Op;
using plan::OpKind;
using plan::Pos;
using plan::Schedule;

// What op is part of, as the actors' messages and the monitor name it.
inline Phase phase_of(const Op& op) {
  switch (op.kind) {
    case OpKind::embed_forward:
    case OpKind::layer_forward:
      return Phase::forward;
    case OpKind::head:
    case OpKind::head_loss:
      return Phase::head;
    case OpKind::layer_backward:
    case OpKind::embed_backward:
      return Phase::backward;
  }
  return Phase::forward;
}

}  // namespace mt::actors
