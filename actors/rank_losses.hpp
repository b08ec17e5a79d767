// Several ranks (mpirun): the optimizer scales the gradient by the step's counted tokens and reports
// the step's loss, both over every micro-batch of every rank, summed in global micro-batch order as one
// rank sums them. This rank's compute reports only its own micro-batches; once they are all in, every
// rank's are gathered (cluster/world.hpp, the losses channel: the optimizer's thread on every rank),
// once per step: the ledger keeps them for a respawned optimizer. Each rank's record carries its status
// too (step, busiest actor, last transfer it waited for): every rank's monitor shows every rank's
// (/status "ranks"). No CAF here.
#pragma once
#include <cstdint>
#include <map>

#include "actors/context.hpp"

namespace mt::actors {

// `losses`: step `step`'s losses by global micro-batch index. Returns true once it holds every rank's
// (ctx.micro_batches()), gathering them when this rank's are complete; false while some are missing.
// Throws cluster::ClusterError when a rank does not answer within cluster.collective_timeout_s.
bool gather_rank_losses(Context& ctx, std::int64_t step, std::map<std::int64_t, MbLoss>& losses);

}  // namespace mt::actors
