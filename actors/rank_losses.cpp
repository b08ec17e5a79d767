#include "actors/rank_losses.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "actors/monitor_publish.hpp"
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

// What each rank tells the others once per step beside its losses, for every rank's /status "ranks":
// its busiest pipeline actor over the step and the last transfer it waited for before this gather.
struct RankStatus {
  std::int64_t step = 0;
  std::int32_t slowest_actor = -1;  // monitor::ActorId; -1 = none busy yet
  std::int32_t channel = -1;        // cluster::Channel of the last transfer; -1 = none yet
  std::int32_t peer = -1;
  std::int32_t sending = 0, done = 1, pad = 0;
  double slowest_busy_s = 0.0;  // that actor's busy time since the previous gather
  double transfer_s = 0.0;
  double unix_s = 0.0;  // when this rank gathered
  char what[104] = {};
};

static_assert(monitor::kActorCount <= static_cast<int>(sizeof(Context::busy_at_gather) / sizeof(double)));

RankStatus my_status(Context& ctx, std::int64_t step) {
  RankStatus st;
  st.step = step;
  st.unix_s = monitor::unix_seconds();
  const monitor::StatusBoard& board = ctx.monitor->board();
  const std::int64_t now = monitor::steady_ns();
  st.slowest_busy_s = -1.0;
  for (int a = 0; a < monitor::kActorCount; ++a) {
    if (static_cast<monitor::ActorId>(a) == monitor::ActorId::node) continue;
    const double busy = board.probe(static_cast<monitor::ActorId>(a)).view(now).busy_s;
    const double over_step = busy - ctx.busy_at_gather[a];
    ctx.busy_at_gather[a] = busy;
    if (over_step > st.slowest_busy_s) {
      st.slowest_actor = a;
      st.slowest_busy_s = over_step;
    }
  }
  if (const auto t = ctx.world->last_transfer()) {
    st.channel = static_cast<std::int32_t>(t->channel);
    st.peer = t->peer;
    st.sending = t->sending ? 1 : 0;
    st.done = t->done ? 1 : 0;
    st.transfer_s = t->seconds;
    std::strncpy(st.what, t->what.c_str(), sizeof st.what - 1);
  }
  return st;
}

nlohmann::json rank_json(int rank, const RankStatus& st) {
  nlohmann::json j{
      {"rank", rank},
      {"step", st.step},
      {"updated_unix", st.unix_s},
      {"slowest_actor", st.slowest_actor >= 0
                            ? nlohmann::json(monitor::actor_name(static_cast<monitor::ActorId>(st.slowest_actor)))
                            : nlohmann::json(nullptr)},
      {"slowest_busy_s", st.slowest_busy_s},
      {"last_collective", nullptr}};
  if (st.channel >= 0) {
    cluster::TransferView t;
    t.channel = static_cast<cluster::Channel>(st.channel);
    t.peer = st.peer;
    t.what = std::string(st.what, strnlen(st.what, sizeof st.what));
    t.sending = st.sending != 0;
    t.done = st.done != 0;
    t.seconds = st.transfer_s;
    j["last_collective"] = transfer_json(t);
  }
  return j;
}

}  // namespace

bool gather_rank_losses(Context& ctx, std::int64_t step, std::map<std::int64_t, MbLoss>& losses) {
  const auto all = static_cast<std::size_t>(ctx.micro_batches());
  if (losses.size() >= all) return true;
  auto& gathered = ctx.ledger.gathered_losses;
  if (auto it = gathered.find(step); it != gathered.end()) {  // gathered before this optimizer was respawned
    losses = it->second;
    return true;
  }
  // This rank's micro-batches of data (stage gradients with clipping replay them: one loss each).
  const auto local = static_cast<std::size_t>(ctx.data_micro_batches());
  if (ctx.ranks <= 1 || ctx.world == nullptr || losses.size() < local) return false;
  const RankStatus status = my_status(ctx, step);  // before the gather: the transfer it waited for last
  std::vector<RankLoss> mine;
  mine.reserve(losses.size());
  const std::int64_t stop = ctx.run->stop_wanted.load() ? 1 : 0;
  const std::int64_t checkpoint = ctx.run->checkpoint_wanted.exchange(false) ? 1 : 0;  // carried once
  for (const auto& kv : losses)
    mine.push_back(RankLoss{kv.first, kv.second.loss_sum, kv.second.counted, stop, checkpoint});
  // Each rank's bytes: its status, then its micro-batches' losses (every rank has as many).
  const std::size_t per_rank = sizeof(RankStatus) + mine.size() * sizeof(RankLoss);
  std::vector<unsigned char> out(per_rank), in(per_rank * static_cast<std::size_t>(ctx.ranks));
  std::memcpy(out.data(), &status, sizeof status);
  std::memcpy(out.data() + sizeof status, mine.data(), mine.size() * sizeof(RankLoss));
  ctx.world->allgather(cluster::Channel::losses, out.data(), per_rank, in.data(),
                       "the losses of step " + std::to_string(step));
  std::vector<RankLoss> every(mine.size() * static_cast<std::size_t>(ctx.ranks));
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < ctx.ranks; ++r) {
    const unsigned char* at = in.data() + per_rank * static_cast<std::size_t>(r);
    RankStatus st;
    std::memcpy(&st, at, sizeof st);
    ranks.push_back(rank_json(r, st));
    std::memcpy(every.data() + mine.size() * static_cast<std::size_t>(r), at + sizeof st,
                mine.size() * sizeof(RankLoss));
  }
  ctx.monitor->board().set_ranks(std::move(ranks));
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
