#include "actors/rank_losses.hpp"

#include <string>
#include <vector>

#include "cluster/world.hpp"

namespace mt::actors {
namespace {

struct RankLoss {  // one micro-batch's report, as the ranks exchange it (every rank runs the same binary)
  std::int64_t micro_batch = 0;
  double loss_sum = 0.0;
  std::int64_t counted = 0;
  std::int64_t stop_wanted = 0;        // the sending rank was asked to stop (Context::stop_wanted)
  std::int64_t checkpoint_wanted = 0;  // ... for a checkpoint (Context::checkpoint_wanted, sharded state)
};

}  // namespace

bool gather_rank_losses(Context& ctx, std::int64_t step, std::map<std::int64_t, MbLoss>& losses) {
  const auto all = static_cast<std::size_t>(ctx.micro_batches());
  if (losses.size() >= all) return true;
  auto& gathered = ctx.ledger.gathered_losses;
  if (auto it = gathered.find(step); it != gathered.end()) {  // gathered before this optimizer was respawned
    losses = it->second;
    return true;
  }
  const auto local = static_cast<std::size_t>(ctx.sched.micro_batches());
  if (ctx.ranks <= 1 || ctx.world == nullptr || losses.size() < local) return false;
  std::vector<RankLoss> mine;
  const std::int64_t stop = ctx.run->stop_wanted.load() ? 1 : 0;
  const std::int64_t checkpoint = ctx.run->checkpoint_wanted.exchange(false) ? 1 : 0;  // carried once
  for (const auto& kv : losses)
    mine.push_back(RankLoss{kv.first, kv.second.loss_sum, kv.second.counted, stop, checkpoint});
  std::vector<RankLoss> every(mine.size() * static_cast<std::size_t>(ctx.ranks));
  ctx.world->allgather(cluster::Channel::losses, mine.data(), mine.size() * sizeof(RankLoss), every.data(),
                       "the losses of step " + std::to_string(step));
  bool stop_agreed = false, checkpoint_agreed = false;
  for (const RankLoss& l : every) {
    losses[l.micro_batch] = MbLoss{l.loss_sum, l.counted};
    stop_agreed = stop_agreed || l.stop_wanted != 0;
    checkpoint_agreed = checkpoint_agreed || l.checkpoint_wanted != 0;
  }
  if (checkpoint_agreed) ctx.run->checkpoint_agreed_step.store(step);  // the optimizer's decision of this step
  // Every rank saw the same records: the same end (Context::agreed_end; written only here, on the
  // optimizer's thread).
  if (stop_agreed && step + 2 < ctx.run->agreed_end.load()) ctx.run->agreed_end.store(step + 2);
  // Steps before the previous one are done on every rank: their losses go.
  while (!gathered.empty() && gathered.begin()->first < step - 1) gathered.erase(gathered.begin());
  gathered[step] = losses;
  return losses.size() >= all;
}

}  // namespace mt::actors
