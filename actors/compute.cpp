// The compute actor: runs the schedule's ops on the CPU backend with the stateless stage templates
// bound by pointer to the weight slots the prefetcher filled (zero copy). Keeps the layer-boundary
// activations in the arena (and, in keep mode, every layer's intermediates); recomputes each layer
// once in backward otherwise. Gradients go into a zeroed staging slot, handed to the collector at once.
//
// Durable progress: the ledger's compute_pos is advanced only after an op completed; activations,
// dx and staging live in the arena, so a restarted compute actor continues at compute_pos (a crash
// mid-micro-batch does not redo the micro-batch's earlier ops).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "actors/actors.hpp"

namespace mt::actors {
namespace {

struct compute_state {
  Context* ctx = nullptr;
  std::uint64_t epoch = 0;
  bool running = false;
  PeerHandles peers;
  Pos pos;
  std::int64_t end_step = 0;
  std::shared_ptr<const data::Batch> batch;  // for (pos.step, pos.micro_batch)
  std::int64_t batch_step = -1, batch_mb = -1;
  bool requested = false;
  std::map<std::pair<Pos, int>, WeightsReady> ready;
  std::optional<Clock::time_point> waiting_since;
  double step_wait = 0.0, step_compute = 0.0;
  static constexpr const char* name = "compute";
};

using self_ptr = compute_actor::stateful_pointer<compute_state>;

// A free gradient staging slot, or -1.
int free_staging(Context* ctx, int skip = -1) {
  auto& st = ctx->ledger.staging;
  for (int k = 0; k < static_cast<int>(st.size()); ++k)
    if (k != skip && st[static_cast<std::size_t>(k)].state == StagingEntry::State::free) return k;
  return -1;
}

// Opens staging slot k for `stage`: zeroed, claimed, marked filling.
float* open_staging(Context* ctx, int k, const Pos& p, std::int64_t stage) {
  const std::size_t n = ctx->layouts[static_cast<std::size_t>(stage)].total_floats;
  float* g = ctx->arena->grad_slot(k);
  std::memset(g, 0, n * sizeof(float));
  ctx->arena->claim(ArenaRegionKind::grad_slot, k, n * sizeof(float));
  ctx->ledger.staging[static_cast<std::size_t>(k)] =
      StagingEntry{StagingEntry::State::filling, p.step, p.micro_batch, stage};
  return g;
}

int find_filling(Context* ctx, const Pos& p, std::int64_t stage) {
  auto& st = ctx->ledger.staging;
  for (int k = 0; k < static_cast<int>(st.size()); ++k) {
    const auto& e = st[static_cast<std::size_t>(k)];
    if (e.state == StagingEntry::State::filling && e.step == p.step && e.micro_batch == p.micro_batch &&
        e.stage == stage)
      return k;
  }
  return -1;
}

void hand_over(self_ptr self, int k, const Pos& p, std::int64_t stage, Phase phase) {
  Context* ctx = self->state.ctx;
  ctx->ledger.staging[static_cast<std::size_t>(k)].state = StagingEntry::State::full;
  self->send(self->state.peers.collector,
             LayerGrads{self->state.epoch, WorkId{p.step, p.micro_batch, stage, static_cast<std::int32_t>(phase)}, k});
}

bool tied(const ModelConfig& c) { return c.tie_word_embeddings || c.is_gpt2(); }

void try_advance(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const ModelConfig& c = *ctx->model;
  const std::int64_t B = ctx->plan.batch, T = ctx->plan.seq, L = c.num_hidden_layers, S = ctx->stages();
  const bool keep = ctx->plan.mode == ActivationMode::keep;
  while (st.running && st.pos.step < st.end_step) {
    const Pos p = st.pos;
    if (!st.batch || st.batch_step != p.step || st.batch_mb != p.micro_batch) {
      if (!st.requested) {
        self->send(st.peers.loader, BatchRequest{st.epoch, p.step, p.micro_batch});
        st.requested = true;
      }
      return;
    }
    const Op& op = ctx->ops[static_cast<std::size_t>(p.op)];
    float* w[2] = {nullptr, nullptr};
    for (int li = 0; li < op.loads; ++li) {
      auto it = st.ready.find({p, li});
      if (it == st.ready.end()) {
        if (!st.waiting_since) st.waiting_since = Clock::now();
        return;
      }
      w[li] = ctx->arena->weight_slot(it->second.slot);
    }
    // Gradient staging this op needs.
    const bool is_tied = tied(c);
    int k_main = -1, k_embed = -1;
    if (op.kind == OpKind::head) {
      k_main = free_staging(ctx);
      if (k_main < 0) return;
      if (is_tied) {
        k_embed = free_staging(ctx, k_main);
        if (k_embed < 0) return;
      }
    } else if (op.kind == OpKind::layer_backward) {
      k_main = free_staging(ctx);
      if (k_main < 0) return;
    } else if (op.kind == OpKind::embed_backward) {
      k_main = is_tied ? find_filling(ctx, p, 0) : free_staging(ctx);
      if (k_main < 0) {
        if (is_tied) throw std::logic_error("compute: the tied embedding's staging slot is missing");
        return;
      }
    }
    if (st.waiting_since) {
      st.step_wait += seconds_between(*st.waiting_since, Clock::now());
      st.waiting_since.reset();
    }
    fault_point(ctx->fault, Role::compute, p.step, p.micro_batch, op.stage, op.phase());
    const auto t0 = Clock::now();
    const token_t* tokens = st.batch->inputs.data();
    const token_t* targets = st.batch->targets.data();
    float* ws = ctx->workspace;
    int& dxc = ctx->ledger.dx_current;
    switch (op.kind) {
      case OpKind::embed_forward:
        embedding_forward(c, w[0], tokens, B, T, ctx->acts[0], ctx->compute_ctx);
        break;
      case OpKind::layer_forward: {
        const std::size_t i = static_cast<std::size_t>(op.stage);
        layer_forward(c, w[0], ctx->acts[i - 1], ctx->acts[i], B, T, keep ? ctx->saved[i - 1] : nullptr, ws,
                      ctx->compute_ctx);
        break;
      }
      case OpKind::head: {
        float* gh = open_staging(ctx, k_main, p, S - 1);
        float* g0 = is_tied ? open_staging(ctx, k_embed, p, 0) : nullptr;
        const LossSum loss =
            head_forward_backward(c, w[0], is_tied ? w[1] : nullptr, ctx->acts[static_cast<std::size_t>(L)], targets, B,
                                  T, ctx->dx[dxc], gh, g0, ws, ctx->compute_ctx);
        hand_over(self, k_main, p, S - 1, Phase::head);
        auto& v = ctx->ledger.losses[p.step];
        const MbLoss ml{loss.loss_sum, loss.counted};
        if (static_cast<std::int64_t>(v.size()) > p.micro_batch)
          v[static_cast<std::size_t>(p.micro_batch)] = ml;
        else
          v.push_back(ml);
        const LossReport rep{st.epoch, p.step, p.micro_batch, loss.loss_sum, loss.counted};
        self->send(st.peers.optimizer, rep);
        self->send(st.peers.node, rep);
        break;
      }
      case OpKind::layer_backward: {
        const std::size_t i = static_cast<std::size_t>(op.stage);
        float* g = open_staging(ctx, k_main, p, op.stage);
        layer_backward(c, w[0], ctx->acts[i - 1], keep ? ctx->saved[i - 1] : nullptr, ctx->dx[dxc], ctx->dx[1 - dxc], g,
                       B, T, ws, ctx->compute_ctx);
        hand_over(self, k_main, p, op.stage, Phase::backward);
        break;
      }
      case OpKind::embed_backward: {
        float* g = is_tied ? ctx->arena->grad_slot(k_main) : open_staging(ctx, k_main, p, 0);
        embedding_backward(c, tokens, B, T, ctx->dx[dxc], g, ctx->compute_ctx);
        hand_over(self, k_main, p, 0, Phase::backward);
        break;
      }
    }
    const auto t1 = Clock::now();
    st.step_compute += seconds_between(t0, t1);
    ctx->intervals.add(Role::compute, p.step, t0, t1);
    for (int li = 0; li < op.loads; ++li) {
      auto it = st.ready.find({p, li});
      self->send(st.peers.prefetcher, SlotFree{st.epoch, p, it->second.slot});
      st.ready.erase(it);
    }
    // Commit: the op is done.
    if (op.kind == OpKind::layer_backward) dxc = 1 - dxc;
    const Pos n = next_pos(p, ctx->ops_per_mb(), ctx->micro_batches());
    ctx->ledger.compute_pos = n;
    st.pos = n;
    if (n.micro_batch != p.micro_batch || n.step != p.step) {
      st.batch.reset();
      st.requested = false;
    }
    if (n.step != p.step) {
      self->send(st.peers.node, ComputeStepDone{p.step, st.step_wait, st.step_compute});
      st.step_wait = st.step_compute = 0.0;
      // Losses of steps the optimizer has finished are no longer needed for a restart.
      auto& losses = ctx->ledger.losses;
      while (!losses.empty() && losses.begin()->first < p.step - 1) losses.erase(losses.begin());
    }
  }
}

compute_actor::behavior_type compute_fn(self_ptr self, Context* ctx, std::uint64_t epoch) {
  self->state.ctx = ctx;
  self->state.epoch = epoch;
  self->set_exception_handler(exception_to_error);
  return {
      [=](const WeightsReady& m) {
        auto& st = self->state;
        if (m.epoch != st.epoch) return;
        if (m.pos < st.pos) {  // stale (cannot happen in one epoch); give the slot back
          self->send(st.peers.prefetcher, SlotFree{st.epoch, m.pos, m.slot});
          return;
        }
        st.ready[{m.pos, m.load}] = m;
        try_advance(self);
      },
      [=](const MicroBatch& m) {
        auto& st = self->state;
        if (m.epoch != st.epoch || m.step != st.pos.step || m.micro_batch != st.pos.micro_batch) return;
        st.batch = m.batch;
        st.batch_step = m.step;
        st.batch_mb = m.micro_batch;
        try_advance(self);
      },
      [=](const GradSlotFree& m) {
        auto& st = self->state;
        if (m.epoch != st.epoch) return;
        auto& e = ctx->ledger.staging.at(static_cast<std::size_t>(m.grad_slot));
        if (e.state == StagingEntry::State::full) {
          e = StagingEntry{};
          ctx->arena->release(ArenaRegionKind::grad_slot, m.grad_slot);
        }
        try_advance(self);
      },
      [=](const StopAt& m) -> StopAt {
        auto& st = self->state;
        const bool started = st.pos.op != 0 || st.pos.micro_batch != 0;
        const std::int64_t end = std::min(st.end_step, std::max(m.end_step, st.pos.step + (started ? 1 : 0)));
        st.end_step = end;
        return StopAt{end};
      },
      [=](const Peers& p) { self->state.peers.set(p); },
      [=](const Resume& r) {
        auto& st = self->state;
        st.epoch = r.epoch;
        st.pos = r.pos;
        st.end_step = r.end_step;
        st.ready.clear();
        st.batch.reset();
        st.requested = false;
        st.waiting_since.reset();
        // Staging slots: `full` ones wait for the collector (the node re-issued them); a `filling` one
        // is kept only if it is the tied embedding's slot whose head contribution is already in.
        const std::int64_t head_op = ctx->model->num_hidden_layers + 1;
        for (int k = 0; k < static_cast<int>(ctx->ledger.staging.size()); ++k) {
          auto& e = ctx->ledger.staging[static_cast<std::size_t>(k)];
          if (e.state != StagingEntry::State::filling) continue;
          const bool keep =
              e.stage == 0 && e.step == r.pos.step && e.micro_batch == r.pos.micro_batch && r.pos.op > head_op;
          if (!keep) {
            e = StagingEntry{};
            ctx->arena->release(ArenaRegionKind::grad_slot, k);
          }
        }
        st.running = true;
        try_advance(self);
      },
      [=](reset_atom, std::uint64_t e) {
        self->state.epoch = e;
        self->state.running = false;
        self->state.ready.clear();
        return ack_atom::value;
      },
  };
}

}  // namespace

compute_actor spawn_compute(caf::actor_system& sys, Context* ctx, std::uint64_t epoch) {
  return sys.spawn<caf::detached>(compute_fn, ctx, epoch);
}

}  // namespace mt::actors
