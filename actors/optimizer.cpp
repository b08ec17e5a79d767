// The optimizer: AdamW over the host tiles (adamw_stage, threaded), one stage at a time, each update
// publishing the tile's next version so the prefetcher can stream it for the next step.
//   - with global-norm clipping: waits for every stage's sum of squares, combines them in stage order
//     (compute_step_scale, as the reference trainer), then updates stages 0..L+1 in forward order, so
//     the next step's forward of layer i overlaps the updates of the layers after it;
//   - without clipping: updates each stage as soon as its gradients are complete (during backward).
//   - with stage gradients (train.gradient_buffer=stage): each stage's gradient arrives in its staging
//     slot, or with several micro-batches (or ranks) in a stage accumulator (after the second pass's
//     backward of it, with clipping: the first pass brought only the sums of squares) and is used and
//     freed at once, in backward order; with the host state sharded a stage another rank owns arrives
//     as complete there, and its new weights are received in the same turn.
// Either way it needs the step's counted tokens (from the loss reports) to normalise the gradient.
// A stage whose tile version already says "updated" is skipped, so re-issued work is harmless.
#include <cstring>
#include <set>

#include "actors/actors.hpp"
#include "actors/rank_losses.hpp"
#include "cluster/grad_reduce.hpp"
#include "kernels/step_math.hpp"

namespace mt::actors {
namespace {

struct optimizer_state {
  Context* ctx = nullptr;
  std::uint64_t epoch = 0;
  bool running = false;
  PeerHandles peers;
  std::int64_t step = 0;  // the step being optimised
  std::int64_t end_step = 0;
  std::map<std::int64_t, std::map<std::int64_t, MbLoss>> losses;  // step -> micro-batch -> loss
  std::map<std::int64_t, std::map<std::int64_t, double>> sumsq;   // step -> stage -> sum of squares
  struct Waiting {
    int slot = -1, accumulator = -1;  // where the gradient waits (LayerGradsComplete)
  };
  std::map<std::int64_t, std::map<std::int64_t, Waiting>> in_slot;  // stage gradients: step -> stage -> where
  double busy_s = 0.0;
  double gate_wait_s = 0.0;   // this step's wait for the checkpointer
  std::int64_t decided = -1;  // the step whose checkpoint decision is made
  // The node's CheckpointRequest, until a decision takes it. Kept across a reset (the supervisor sends
  // it again to a respawned optimizer until CheckpointTaken reaches it).
  bool checkpoint_requested = false;
  static constexpr const char* name = "optimizer";
};

using self_ptr = optimizer_actor::stateful_pointer<optimizer_state>;

// Before the first update of step s: is a checkpoint of version s + 1 due? (every save_steps, the
// planned last step, or a request: SIGUSR1 / the timer). If so, register it in the gate and tell the
// checkpointer, before any stage moves to s + 1. A checkpoint registered before a restart stays.
void decide_checkpoint(self_ptr self, std::int64_t s) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  if (st.decided == s) return;
  st.decided = s;
  if (!ctx->checkpointing) return;
  const std::int64_t v = s + 1;
  const CheckpointJob& cj = ctx->job->checkpoint;
  if (v == cj.deferred_step) return;  // the evaluation pass after this step writes it (a request waits)
  bool due = (cj.save_steps > 0 && v % cj.save_steps == 0) || (cj.at_end && v == ctx->cfg_end_step);
  // With the host state sharded a request is taken at the step every rank agreed on (rank_losses.hpp).
  const bool take_request =
      ctx->shard_world != nullptr ? ctx->run->checkpoint_agreed_step.load() == s : st.checkpoint_requested;
  if (ctx->shard_world != nullptr && take_request) due = true;
  if (take_request && st.checkpoint_requested) {
    st.checkpoint_requested = false;
    due = true;
    // The controller reports the request took effect at step v; the supervisor stops asking again.
    self->send(st.peers.node, CheckpointTaken{v});
    self->send(st.peers.supervisor, CheckpointTaken{v});
  }
  if (due && ctx->gate.open(v, ctx->stages())) {
    // The data position now, while the loader still keeps it (checkpoint_gate.hpp); a failure here
    // leaves it to the checkpointer, which then names it.
    if (ctx->run_data) {
      try {
        ctx->gate.set_data_cursor(v, ctx->run_data->cursor_before(static_cast<std::uint64_t>(v) *
                                                                  static_cast<std::uint64_t>(ctx->micro_batches())));
      } catch (const std::exception&) {
      }
    }
    self->send(st.peers.checkpointer, CheckpointNow{v});
  }
}

// The host state sharded (cluster.shard_state): the owner of a stage, after updating it, sends what
// compute streams, its new fp32 masters or with bf16 its new bf16 copy (the fused update's, so the same
// bits), to every other rank (cluster::share_from_owner, the weights channel); a rank that holds the
// stage as a replica receives it into its tile in place of an update. Every rank makes these transfers
// in the same order: clipping updates in stage order, no clipping in backward order.
std::string weights_what(std::int64_t s, std::int64_t stage) {
  return "the new weights of stage " + std::to_string(stage) + " after step " + std::to_string(s);
}

// What compute streams, on the owner and on every replica alike: the bf16 copy, else the fp32 masters.
void share_stream_copy(Context* ctx, std::int64_t s, std::int64_t stage, HostTile& tile) {
  void* data = tile.has_compute_copy() ? tile.compute_copy() : tile.params();
  const std::size_t bytes = tile.has_compute_copy() ? tile.compute_copy_bytes() : tile.region_bytes();
  cluster::share_from_owner(*ctx->world, cluster::Channel::weights, cluster::stage_owner(stage, ctx->ranks), data,
                            bytes, weights_what(s, stage));
}

// grad: the stage's gradient (the tile's accumulator, or its staging slot with stage gradients).
void update_stage(self_ptr self, std::int64_t s, std::int64_t stage, const AdamWHyper& hyper, float grad_scale,
                  const float* grad) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  decide_checkpoint(self, s);  // before any update of step s, as late as possible (requests)
  HostTile& tile = ctx->host->tile(stage);
  if (tile.version() != static_cast<std::uint64_t>(s)) return;  // done before a restart
  fault_point(ctx->fault, Role::optimizer, s, -1, stage, Phase::optimize);
  // Version gate: a checkpoint of version s may not have written this tile yet; then its state is
  // copied aside for it (within the budget) or the update waits (checkpoint_gate.hpp).
  const std::size_t floats = ctx->layouts[static_cast<std::size_t>(stage)].total_floats;
  // A stage another rank owns (cluster.shard_state): an fp32 replica's masters are written from here
  // (copied aside: the owner's checkpointer sends the moments); a bf16 replica holds nothing a
  // checkpoint writes (the owner sends masters and moments): no gate.
  const bool own = ctx->host->owns(stage);
  if (own || ctx->host->holds_masters(stage))
    st.gate_wait_s += ctx->gate.before_update(s, stage, floats, own ? 3 : 1, [&](StageSnapshot& snap) {
      if (!own) {
        std::memcpy(snap.master.get(), tile.params(), tile.region_bytes());
        return;
      }
      const StateLease state(*ctx->host, stage);
      copy_stage_state(state, snap);
    });
  const auto t0 = Clock::now();
  if (!ctx->host->owns(stage)) {
    share_stream_copy(ctx, s, stage, tile);  // the owner's new weights
  } else if (tile.has_split_master()) {
    // The masters as halves, in place: the copy the prefetcher streams is their high half.
    adamw_stage_split_master(ctx->layouts[static_cast<std::size_t>(stage)], tile.master_high(), tile.master_low(), grad,
                             tile.adam_m(), tile.adam_v(), hyper, s + 1, grad_scale,
                             ctx->granted(ctx->optimizer_threads));
  } else {
    // The moments (and with train.offload_params the masters): the tile's own regions, or a staged
    // copy from the moment store (read ahead while the previous stage was updated; written back behind
    // the next one).
    StateLease state(*ctx->host, stage);
    adamw_stage(ctx->layouts[static_cast<std::size_t>(stage)], state.master(), grad, state.m(), state.v(), hyper, s + 1,
                grad_scale, ctx->granted(ctx->optimizer_threads),
                static_cast<bf16_t*>(tile.compute_copy()));  // bf16 runs: the copy the prefetcher streams
    state.mark_modified();
  }
  tile.publish_version(static_cast<std::uint64_t>(s + 1));
  const auto t1 = Clock::now();
  st.busy_s += seconds_between(t0, t1);
  ctx->intervals.add(Role::optimizer, s, t0, t1);
  ctx->monitor->board().probe(monitor::ActorId::optimizer).unit(s, -1, stage, "optimize");
  for (const auto& p : st.peers.prefetchers)  // every device's (device.gpus)
    self->send(p, LayerUpdated{st.epoch, s, stage, static_cast<std::uint64_t>(s + 1)});
  if (ctx->checkpointing)
    self->send(st.peers.checkpointer, LayerUpdated{st.epoch, s, stage, static_cast<std::uint64_t>(s + 1)});
  if (ctx->host->sharded() && ctx->host->owns(stage)) share_stream_copy(ctx, s, stage, tile);  // after: compute goes on
}

// Sends the step's report and moves to the next step.
void finish_step(self_ptr self, std::int64_t s, const StepScale& scale, const AdamWHyper& hyper, std::int64_t counted) {
  auto& st = self->state;
  self->send(st.peers.node, OptimizerStepDone{s, scale.loss, scale.grad_norm, scale.clip, hyper.lr, counted, st.busy_s,
                                              st.gate_wait_s});
  st.busy_s = 0.0;
  st.gate_wait_s = 0.0;
  st.losses.erase(s);
  st.sumsq.erase(s);
  st.in_slot.erase(s);
  ++st.step;
}

// Stage gradients: frees where a stage's gradient waited, once used (or updated before a restart).
void give_back(self_ptr self, std::int64_t s, std::int64_t stage, int slot, int accumulator) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  if (accumulator >= 0) {
    ctx->stage_accums->release(accumulator);
    self->send(st.peers.collector, AccumulatorFree{st.epoch});
  }
  if (slot >= 0) {
    const WorkId work{s, ctx->passes - 1, stage, static_cast<std::int32_t>(Phase::optimize)};
    self->send(st.peers.computes.at(0), GradSlotFree{st.epoch, work, slot, 0});
  }
}

// Stage gradients: where stage's gradient waits for its update (null: another rank owns the stage and
// sends its new weights).
const float* waiting_gradient(const Context& ctx, const optimizer_state::Waiting& w) {
  if (w.accumulator >= 0) return ctx.stage_accums->data(w.accumulator);
  if (w.slot < 0) return nullptr;
  return ctx.backend->shares_host_memory() ? ctx.arena->grad_slot(w.slot)
                                           : ctx.grad_landing.at(static_cast<std::size_t>(w.slot)).get();
}

// Stage gradients: updates the stages of step s whose gradient waits (in a slot, an accumulator, or
// with the host state sharded at its owner), once the scale is known (with clipping: every stage's
// sum of squares from the first pass), and frees where it waited. In backward order, each stage once
// every stage after it is done: the order the collector completes them in, and with several ranks the
// order of the new weights' transfers, the same on every rank also after a restart (whatever order the
// supervisor hands complete stages over in). True when every stage of step s is updated.
bool update_from_slots(self_ptr self, std::int64_t s, const AdamWHyper& hyper, std::int64_t counted, double loss_sum) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const std::int64_t S = ctx->stages();
  auto& sq = st.sumsq[s];
  const bool clipping = ctx->max_grad_norm > 0.0f;
  if (clipping && static_cast<std::int64_t>(sq.size()) < S) return false;
  std::vector<double> sums;
  for (const auto& kv : sq) sums.push_back(kv.second);
  const float grad_scale =
      clipping ? compute_step_scale(sums, counted, ctx->max_grad_norm, loss_sum).grad_scale
               : compute_step_scale(std::vector<double>(static_cast<std::size_t>(S), 0.0), counted, 0.0f, loss_sum)
                     .grad_scale;
  auto& waiting = st.in_slot[s];
  for (std::int64_t stage = S - 1; stage >= 0; --stage) {
    const auto it = waiting.find(stage);
    if (it == waiting.end()) {
      if (ctx->host->tile(stage).version() > static_cast<std::uint64_t>(s)) continue;  // updated before a restart
      return false;
    }
    const optimizer_state::Waiting w = it->second;
    update_stage(self, s, stage, hyper, grad_scale, waiting_gradient(*ctx, w));  // skips one updated before
    give_back(self, s, stage, w.slot, w.accumulator);
    waiting.erase(it);
  }
  return static_cast<std::int64_t>(sq.size()) == S;  // the norm the step reports
}

// The tile's gradient accumulator; null for a stage another rank owns (it sends the weights instead).
const float* gradient_of(Context& ctx, std::int64_t stage) {
  return ctx.host->owns(stage) ? ctx.host->tile(stage).grad() : nullptr;
}

void try_update(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const std::int64_t S = ctx->stages(), M = ctx->micro_batches();
  while (st.running && st.step < st.end_step) {
    const std::int64_t s = st.step;
    auto& losses = st.losses[s];
    if (ctx->ranks > 1 && !gather_rank_losses(*ctx, s, losses)) return;  // every rank's (rank_losses.hpp)
    if (static_cast<std::int64_t>(losses.size()) < M) return;
    double loss_sum = 0.0;
    std::int64_t counted = 0;
    for (const auto& kv : losses) {
      loss_sum += kv.second.loss_sum;
      counted += kv.second.counted;
    }
    const AdamWHyper hyper = ctx->cfg->adamw_at(s);
    auto& sq = st.sumsq[s];
    if (ctx->stage_gradients) {
      if (!update_from_slots(self, s, hyper, counted, loss_sum)) return;
    } else if (ctx->max_grad_norm <= 0.0f) {
      const float grad_scale =
          compute_step_scale(std::vector<double>(static_cast<std::size_t>(S), 0.0), counted, 0.0f, loss_sum).grad_scale;
      // In backward order, each stage once every stage after it is done: the order the collector
      // completes them in, and with the host state sharded the order of the weights' transfers, the same
      // on every rank also after a restart (the supervisor hands complete stages over in stage order).
      for (std::int64_t stage = S - 1; stage >= 0 && sq.count(stage); --stage)
        update_stage(self, s, stage, hyper, grad_scale, gradient_of(*ctx, stage));
    }
    if (static_cast<std::int64_t>(sq.size()) < S) return;
    std::vector<double> sumsq;
    for (const auto& kv : sq) sumsq.push_back(kv.second);
    const StepScale scale = compute_step_scale(sumsq, counted, ctx->max_grad_norm, loss_sum);
    if (ctx->max_grad_norm > 0.0f && !ctx->stage_gradients)
      for (std::int64_t stage = 0; stage < S; ++stage)
        update_stage(self, s, stage, hyper, scale.grad_scale, gradient_of(*ctx, stage));
    finish_step(self, s, scale, hyper, counted);
  }
}

optimizer_actor::behavior_type optimizer_fn(self_ptr self, Context* ctx, std::uint64_t epoch) {
  self->state.ctx = ctx;
  self->state.epoch = epoch;
  self->set_exception_handler(exception_to_error);
  return {
      [=](const LossReport& m) {
        const auto probe = probe_handler(self, monitor::ActorId::optimizer, "LossReport");
        auto& st = self->state;
        if (m.epoch != st.epoch || m.step < st.step) return;
        st.losses[m.step][m.micro_batch] = MbLoss{m.loss_sum, m.counted};
        try_update(self);
      },
      [=](const LayerGradsComplete& m) {
        const auto probe = probe_handler(self, monitor::ActorId::optimizer, "LayerGradsComplete");
        auto& st = self->state;
        if (m.epoch != st.epoch) return;
        if (m.step < st.step) {  // a stage updated before a restart, its slot handed over again
          give_back(self, m.step, m.stage, m.grad_slot, m.accumulator);
          return;
        }
        st.sumsq[m.step][m.stage] = m.sumsq;
        if (m.grad_slot >= 0 || m.accumulator >= 0 || m.owned_elsewhere)
          st.in_slot[m.step][m.stage] = optimizer_state::Waiting{m.grad_slot, m.accumulator};
        try_update(self);
      },
      [=](const Peers& p) {
        const auto probe = probe_handler(self, monitor::ActorId::optimizer, "Peers");
        self->state.peers.set(p);
      },
      [=](const Resume& r) {
        const auto probe = probe_handler(self, monitor::ActorId::optimizer, "Resume");
        auto& st = self->state;
        st.epoch = r.epoch;
        st.step = r.opt_step;
        st.end_step = r.end_step;
        st.losses.clear();
        st.sumsq.clear();
        st.in_slot.clear();
        st.running = true;
        st.decided = -1;
      },
      [=](const CheckpointRequest&) {
        const auto probe = probe_handler(self, monitor::ActorId::optimizer, "CheckpointRequest");
        self->state.checkpoint_requested = true;
        if (ctx->shard_world != nullptr) ctx->run->checkpoint_wanted.store(true);  // to the next loss gather
      },
      [=](reset_atom, std::uint64_t e) {
        const auto probe = probe_handler(self, monitor::ActorId::optimizer, "reset");
        self->state.epoch = e;
        self->state.running = false;
        return ack_atom::value;
      },
  };
}

}  // namespace

optimizer_actor spawn_optimizer(caf::actor_system& sys, Context* ctx, std::uint64_t epoch) {
  return sys.spawn<caf::detached>(optimizer_fn, ctx, epoch);
}

}  // namespace mt::actors
