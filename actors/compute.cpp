// The compute actor: runs the schedule's ops through the backend (device/backend.hpp), the stateless
// stage templates bound by pointer to the slots the prefetcher filled (zero copy). Keeps the layer-boundary
// activations in the arena, one set per in-flight micro-batch (and, in keep mode, every layer's
// intermediates), or, with boundaries on the host, writes the forward's boundaries into a small ring
// and copies them out to the host store as it goes; in backward recomputes each layer once (or uses
// the kept intermediates). Gradients go into a zeroed staging slot, handed to the collector at once.
//
// Durable progress: the ledger's compute_pos is advanced only after an op completed; activations,
// dx and staging live in the arena (boundaries on the host: in the host store, with each ring entry's
// pending copy in the ledger), so a restarted compute actor continues at compute_pos (a crash
// mid-micro-batch does not redo the micro-batch's earlier ops).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "actors/actors.hpp"
#include "kernels/step_math.hpp"

namespace mt::actors {
namespace {

using BatchKey = std::pair<std::int64_t, std::int64_t>;  // (step, micro-batch)

struct compute_state {
  Context* ctx = nullptr;
  std::uint64_t epoch = 0;
  bool running = false;
  PeerHandles peers;
  Pos pos;
  std::int64_t end_step = 0;
  std::map<BatchKey, std::shared_ptr<const data::Batch>> batches;  // the in-flight micro-batches' data
  std::set<BatchKey> requested;
  std::map<std::pair<Pos, int>, WeightsReady> ready;
  std::optional<Clock::time_point> waiting_since;
  double step_wait = 0.0, step_compute = 0.0;
  int threads_applied = 0;  // the compute threads last given to the backend (Context::granted)
  // Pause (the node's PauseRequest until wake): hold before a step's first op. Kept across a reset
  // (the supervisor sends it again to a respawned compute); held_reported: PauseHeld sent for this hold.
  std::uint64_t pause = 0;  // the pause request in force, 0 = none
  bool held_reported = false;
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

// Where staging slot k's gradients of (p, stage) go: the slot, or the tile itself (Context::grads_in_place).
float* staging_buffer(Context* ctx, int k, const Pos& p, std::int64_t stage) {
  return ctx->grads_in_place(p.micro_batch) ? ctx->host->tile(stage).grad() : ctx->arena->grad_slot(k);
}

// Opens staging slot k for `stage`: zeroed, claimed, marked filling.
float* open_staging(Context* ctx, int k, const Pos& p, std::int64_t stage) {
  const std::size_t n = ctx->layouts[static_cast<std::size_t>(stage)].total_floats;
  float* g = staging_buffer(ctx, k, p, stage);
  ctx->backend->fill_zero(g, n * sizeof(float));
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
             LayerGrads{self->state.epoch, WorkId{p.step, p.micro_batch, stage, static_cast<std::int32_t>(phase)}, k,
                        ctx->device, Clock::now().time_since_epoch().count()});
}

// train.gradient_buffer=stage with clipping: the second pass recomputes the first pass's forward and
// backward on the same weights and data, and its clip factor is the first pass's; a loss that differs
// would mean the backend is not deterministic, and the update would not be the one-pass step's.
void check_pass_loss(const std::vector<MbLoss>& first, std::int64_t mb, const MbLoss& again, std::int64_t step) {
  const MbLoss& a = first.at(static_cast<std::size_t>(mb));
  if (std::memcmp(&a.loss_sum, &again.loss_sum, sizeof(double)) != 0 || a.counted != again.counted)
    throw std::logic_error("compute: step " + std::to_string(step) + " micro-batch " + std::to_string(mb) +
                           ": the second pass's loss " + std::to_string(again.loss_sum) + " differs from the first's " +
                           std::to_string(a.loss_sum) + " (train.gradient_buffer=stage needs a deterministic backend)");
}

bool tied(const ModelConfig& c) { return c.tie_word_embeddings || c.is_gpt2(); }

// The load-balancing loss's ledger entry of the data micro-batch at p (a second pass shares its first's).
MbBalance& balance_of(Context* ctx, const Pos& p) {
  return ctx->ledger.balance[{p.step, ctx->data_local(p.micro_batch)}];
}

// Boundaries on the host: the boundary op `op` writes (into the forward ring), or -1. Boundary L (the
// head's input) stays on the device; boundaries 0..L-1 are copied out for the backward.
std::int64_t boundary_written(const Op& op) {
  if (op.kind == OpKind::embed_forward) return 0;
  if (op.kind == OpKind::layer_forward) return op.stage;
  return -1;
}

// Boundaries on the host: true when ring entry `k` may be overwritten (its last copy to the host has
// landed).
bool ring_entry_free(Context* ctx, std::size_t k) {
  const RingEntry& e = ctx->ledger.ring[k];
  return e.boundary < 0 || ctx->host_acts->stamp(e.set, e.boundary) >= e.stamp;
}

// Boundaries on the host: copies boundary b of the op's micro-batch from its ring entry to the host
// store; the copy engine's worker publishes it and tells compute and the prefetcher.
void offload_boundary(self_ptr self, const Pos& p, std::int64_t b) {
  Context* ctx = self->state.ctx;
  const std::size_t k = static_cast<std::size_t>(b) % ctx->ring.size();
  const int set = ctx->sched.activation_set(p.micro_batch);
  const std::uint64_t stamp = ctx->boundary_stamp(p.step, p.micro_batch);
  ctx->ledger.ring[k] = RingEntry{set, b, stamp};
  const BoundarySaved saved{self->state.epoch, p.step, p.micro_batch, b};
  HostBoundaries* store = ctx->host_acts;
  compute_actor me = caf::actor_cast<compute_actor>(self);
  prefetcher_actor prefetcher = self->state.peers.prefetcher;
  ctx->backend->copy_async(LinkDirection::device_to_host, ctx->ring[k], ctx->host_acts->data(set, b),
                           ctx->plan.hidden_floats * sizeof(float), [store, set, b, stamp, saved, me, prefetcher] {
                             store->mark_saved(set, b, stamp);
                             caf::anon_send(me, saved);
                             caf::anon_send(prefetcher, saved);
                           });
}

// A micro-batch's ids where the backend computes: the inputs, the targets (for the head's ops) and, with
// data.packing = documents, the positions within documents (BatchRows).
struct BatchIds {
  const token_t* tokens = nullptr;
  const token_t* targets = nullptr;
  BatchRows rows;
};
BatchIds upload_batch(Backend& be, const data::Batch& batch, bool head, std::int64_t B, std::int64_t T, int slot) {
  BatchIds ids;
  ids.tokens = be.upload_tokens(batch.inputs.data(), batch.inputs.size(), slot);
  if (head) ids.targets = be.upload_tokens(batch.targets.data(), batch.targets.size(), 2 + slot);
  ids.rows = {B, T, nullptr};
  if (!batch.positions.empty())
    ids.rows.positions = be.upload_tokens(batch.positions.data(), batch.positions.size(), 4 + slot);
  return ids;
}

void try_advance(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const ModelConfig& c = *ctx->model;
  const Schedule& sched = ctx->sched;
  const std::int64_t B = ctx->plan.batch, T = ctx->plan.seq, L = c.num_hidden_layers, S = ctx->stages();
  const bool keep = ctx->plan.mode == ActivationMode::keep;
  const bool on_host = ctx->host_acts != nullptr;
  const bool balanced = c.output_router_logits && !sched.is_forward_only();  // evaluation: the LM loss only
  while (st.running) {
    // Several ranks: a stop every rank agreed on (Context::agreed_end; never inside a begun step).
    const std::int64_t agreed = ctx->run->agreed_end.load();
    if (agreed < st.end_step) st.end_step = std::max(agreed, st.pos.step + (st.pos.index != 0 ? 1 : 0));
    if (st.pos.step >= st.end_step) break;
    const Pos p = st.pos;
    // Paused (a control request): hold before the step's first op until the node sends wake.
    if (p.index == 0 && st.pause != 0) {
      if (!st.held_reported) self->send(st.peers.node, PauseHeld{st.pause, p.step, ctx->device});
      st.held_reported = true;
      return;
    }
    const int threads = ctx->granted(ctx->plan.threads.blas);
    if (threads != st.threads_applied) {
      ctx->backend->set_compute_threads(threads);
      st.threads_applied = threads;
    }
    const BatchKey key{p.step, ctx->data_local(p.micro_batch)};  // every pass runs the same data
    auto bit = st.batches.find(key);
    if (bit == st.batches.end()) {
      if (st.requested.insert(key).second)
        self->send(st.peers.loader, BatchRequest{st.epoch, p.step, ctx->global_micro_batch(p.micro_batch)});
      return;
    }
    const data::Batch& batch = *bit->second;
    const Op& op = sched.op(p);
    int slot[2] = {-1, -1};
    for (int li = 0; li < op.loads; ++li) {
      auto it = st.ready.find({p, li});
      if (it == st.ready.end()) {
        if (!st.waiting_since) st.waiting_since = Clock::now();
        return;
      }
      slot[li] = it->second.slot;
    }
    auto weights = [&](int li) -> const void* { return ctx->arena->weights(slot[li]); };
    // Boundaries on the host: the ring entry this op writes must have been copied out (layer-major the
    // head's input has a buffer of its own per micro-batch).
    const bool head_input_own = on_host && !ctx->head_inputs.empty();
    std::int64_t written = on_host ? boundary_written(op) : -1;
    if (written == L && head_input_own) written = -1;
    if (written >= 0 && !ring_entry_free(ctx, static_cast<std::size_t>(written) % ctx->ring.size())) {
      if (!st.waiting_since) st.waiting_since = Clock::now();
      return;
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
    fault_point(ctx->fault, Role::compute, p.step, ctx->work_micro_batch(p.micro_batch), op.stage, op.phase());
    const auto t0 = Clock::now();
    Backend& be = *ctx->backend;
    const bool layer_op = op.kind == OpKind::layer_forward || op.kind == OpKind::layer_backward;
    be.set_position(p.step, p.micro_batch, layer_op ? op.stage - 1 : -1);  // named by a failure's message
    const int token_slot = sched.activation_set(p.micro_batch) % 2;
    const auto [tokens, targets, rows] =
        upload_batch(be, batch, op.kind == OpKind::head || op.kind == OpKind::head_loss, B, T, token_slot);
    float* ws = ctx->workspace;
    int& dxc = ctx->ledger.dx_current;
    const std::size_t set = static_cast<std::size_t>(sched.activation_set(p.micro_batch));
    // Boundary i of this micro-batch as the forward and head see it.
    auto boundary = [&](std::int64_t i) {
      if (i == L && head_input_own) return ctx->head_inputs[set];
      return on_host ? ctx->ring[static_cast<std::size_t>(i) % ctx->ring.size()]
                     : ctx->acts[set][static_cast<std::size_t>(i)];
    };
    // d(loss)/d(boundary): the head writes it, each layer backward reads one buffer and writes the
    // other, the embed backward reads it. One pair in turn (the ledger's dx_current), or layer-major a
    // pair per micro-batch, the buffer fixed by the stage: the head writes buffer 0, layer i reads
    // buffer (L - i) % 2.
    const bool dx_per_set = !ctx->dx_sets.empty();
    auto dx_buffer = [&](std::int64_t parity) {
      return dx_per_set ? ctx->dx_sets[2 * set + static_cast<std::size_t>(parity & 1)] : ctx->dx[(dxc + parity) & 1];
    };
    std::int64_t dx_read = 0;  // the buffer the op reads (the head: writes)
    if (dx_per_set && op.kind == OpKind::layer_backward) dx_read = L - op.stage;
    if (dx_per_set && op.kind == OpKind::embed_backward) dx_read = L;
    auto saved = [&](std::int64_t layer) {
      const std::int64_t first_saved = keep ? 1 : L - ctx->plan.kept_layers + 1;  // kept_layers: the last ones
      return layer >= first_saved ? ctx->saved[set][static_cast<std::size_t>(layer - first_saved)] : nullptr;
    };
    auto kept_attention = [&](std::int64_t layer) -> float* {
      return ctx->kept_attention.empty() ? nullptr : ctx->kept_attention[set][static_cast<std::size_t>(layer - 1)];
    };
    switch (op.kind) {
      case OpKind::embed_forward:
        be.embedding_forward(c, weights(0), tokens, rows, boundary(0));
        break;
      case OpKind::layer_forward: {
        MoeBalance stats;  // the load-balancing loss's statistics of an expert layer, into the ledger
        if (balanced && c.layer_is_moe(op.stage - 1)) {
          MbBalance& mb = balance_of(ctx, p);
          const auto E = static_cast<std::size_t>(c.num_experts), l = static_cast<std::size_t>(op.stage - 1);
          mb.counts.resize(static_cast<std::size_t>(L));
          mb.prob_sums.resize(static_cast<std::size_t>(L));
          mb.counts[l].resize(E);  // layer_forward overwrites them
          mb.prob_sums[l].resize(E);
          stats.counts = mb.counts[l].data();
          stats.prob_sums = mb.prob_sums[l].data();
        }
        be.layer_forward(c.layer_config(op.stage - 1), weights(0), boundary(op.stage - 1), boundary(op.stage), rows,
                         saved(op.stage), ws, stats.counts ? &stats : nullptr, ctx->sequence, kept_attention(op.stage));
        break;
      }
      case OpKind::head: {
        float* gh = open_staging(ctx, k_main, p, S - 1);
        float* g0 = is_tied ? open_staging(ctx, k_embed, p, 0) : nullptr;
        LossSum loss = be.head_forward_backward(c, weights(0), is_tied ? weights(1) : nullptr, boundary(L), targets, B,
                                                T, dx_buffer(dx_read), gh, g0, ws);
        if (balanced) {  // the micro-batch's load-balancing term: its loss, and the layers' gradient
          MbBalance& mb = balance_of(ctx, p);  // per layer; a dense layer's slots stay empty
          const MoeBalanceTerm term = moe_balance(mb.counts, mb.prob_sums, B * T, c.router_aux_loss_coef, loss.counted);
          loss.loss_sum += term.loss_add;
          mb.grad = term.grad;
          // Steps before the previous one are done: their statistics go.
          while (!ctx->ledger.balance.empty() && ctx->ledger.balance.begin()->first.first < p.step - 1)
            ctx->ledger.balance.erase(ctx->ledger.balance.begin());
        }
        hand_over(self, k_main, p, S - 1, Phase::head);
        auto& v = ctx->ledger.losses[p.step];
        const MbLoss ml{loss.loss_sum, loss.counted};
        const std::int64_t mb = ctx->data_local(p.micro_batch);
        if (ctx->pass_of(p.micro_batch) > 0) {  // a later pass of two: the same bits, reported by the first
          check_pass_loss(v, mb, ml, p.step);
          break;
        }
        if (static_cast<std::int64_t>(v.size()) > mb)
          v[static_cast<std::size_t>(mb)] = ml;
        else
          v.push_back(ml);
        const LossReport rep{st.epoch, p.step, ctx->global_micro_batch(p.micro_batch), loss.loss_sum, loss.counted};
        self->send(st.peers.optimizer, rep);
        self->send(st.peers.node, rep);
        break;
      }
      case OpKind::head_loss: {  // evaluation: the loss only (dx == nullptr: no gradients touched)
        const LossSum loss = be.head_forward_backward(c, weights(0), is_tied ? weights(1) : nullptr, boundary(L),
                                                      targets, B, T, nullptr, nullptr, nullptr, ws);
        self->send(st.peers.node,
                   LossReport{st.epoch, p.step, ctx->global_micro_batch(p.micro_batch), loss.loss_sum, loss.counted});
        break;
      }
      case OpKind::layer_backward: {
        // The layer's input: streamed back from the host into an activation slot, or kept on the device.
        const float* x_in = on_host ? ctx->act_slots[static_cast<std::size_t>(slot[1])] : boundary(op.stage - 1);
        float* g = open_staging(ctx, k_main, p, op.stage);
        MoeBalance grad;  // the head's load-balancing gradient, where the backend computes
        if (balanced && c.layer_is_moe(op.stage - 1)) {
          const std::vector<float>& host = balance_of(ctx, p).grad;
          if (host.size() != static_cast<std::size_t>(c.num_experts))
            throw std::logic_error("compute: a layer backward before its micro-batch's head (load-balancing loss)");
          grad.grad = be.upload_floats(host.data(), host.size(), token_slot);
        }
        be.layer_backward(c.layer_config(op.stage - 1), weights(0), x_in, saved(op.stage), dx_buffer(dx_read),
                          dx_buffer(dx_read + 1), g, rows, ws, grad.grad ? &grad : nullptr, ctx->sequence,
                          kept_attention(op.stage));
        hand_over(self, k_main, p, op.stage, Phase::backward);
        break;
      }
      case OpKind::embed_backward: {
        float* g = is_tied ? staging_buffer(ctx, k_main, p, 0) : open_staging(ctx, k_main, p, 0);
        be.embedding_backward(c, tokens, rows, dx_buffer(dx_read), g);
        hand_over(self, k_main, p, 0, Phase::backward);
        break;
      }
    }
    const auto t1 = Clock::now();
    st.step_compute += seconds_between(t0, t1);
    ctx->intervals.add(Role::compute, p.step, t0, t1, static_cast<int>(op.phase()));
    ctx->monitor->board()
        .probe(monitor::ActorId::compute, ctx->device)
        .unit(p.step, ctx->work_micro_batch(p.micro_batch), op.stage, phase_name(op.phase()));
    if (written >= 0) {
      if (written < L && !sched.is_forward_only())  // an evaluation pass has no backward to feed
        offload_boundary(self, p, written);
      else
        ctx->ledger.ring[static_cast<std::size_t>(written) % ctx->ring.size()] = RingEntry{};
    }
    for (int li = 0; li < op.loads; ++li) {
      auto it = st.ready.find({p, li});
      self->send(st.peers.prefetcher, SlotFree{st.epoch, p, li, it->second.slot});
      st.ready.erase(it);
    }
    // Commit: the op is done.
    if (op.kind == OpKind::layer_backward) dxc = 1 - dxc;
    const Pos n = sched.next(p);
    ctx->ledger.compute_pos = n;
    st.pos = n;
    if (p.op + 1 == sched.ops_per_micro_batch() && ctx->last_pass(p.micro_batch)) {  // its data is done
      st.batches.erase(key);
      st.requested.erase(key);
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
        const auto probe = probe_handler(self, monitor::ActorId::compute, "WeightsReady");
        auto& st = self->state;
        if (m.epoch != st.epoch) return;
        if (m.pos < st.pos) {  // stale (cannot happen in one epoch); give the slot back
          self->send(st.peers.prefetcher, SlotFree{st.epoch, m.pos, m.load, m.slot});
          return;
        }
        st.ready[{m.pos, m.load}] = m;
        try_advance(self);
      },
      [=](const MicroBatch& m) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "MicroBatch");
        auto& st = self->state;
        const BatchKey key{m.step, ctx->local_micro_batch(m.micro_batch)};  // global -> this device's local index
        if (m.epoch != st.epoch || st.requested.count(key) == 0) return;
        st.batches[key] = m.batch;
        try_advance(self);
      },
      [=](const GradSlotFree& m) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "GradSlotFree");
        auto& st = self->state;
        if (m.epoch != st.epoch) return;
        auto& e = ctx->ledger.staging.at(static_cast<std::size_t>(m.grad_slot));
        if (e.state == StagingEntry::State::full) {
          e = StagingEntry{};
          ctx->arena->release(ArenaRegionKind::grad_slot, m.grad_slot);
        }
        try_advance(self);
      },
      // A wake-up only (the stamps in the host store are the state), so one sent in an older epoch
      // still counts: its copy may have landed after this epoch's Resume checked the stamps.
      [=](const BoundarySaved&) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "BoundarySaved");
        try_advance(self);
      },
      [=](const StopAt& m) -> StopAt {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "StopAt");
        auto& st = self->state;
        const bool started = st.pos.index != 0;
        const std::int64_t end = std::min(st.end_step, std::max(m.end_step, st.pos.step + (started ? 1 : 0)));
        st.end_step = end;
        return StopAt{end};
      },
      [=](const Peers& p) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "Peers");
        self->state.peers.set(p);
      },
      [=](const Resume& r) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "Resume");
        auto& st = self->state;
        st.epoch = r.epoch;
        st.pos = r.pos;
        st.end_step = r.end_step;
        st.ready.clear();
        st.batches.clear();
        st.requested.clear();
        st.waiting_since.reset();
        // Staging slots: `full` ones wait for the collector (the node re-issued them); a `filling` one
        // is kept only if it is the tied embedding's slot of a micro-batch whose head is done and whose
        // embed backward is not.
        const Schedule& sched = ctx->sched;
        const std::int64_t head_op = ctx->model->num_hidden_layers + 1;
        const std::int64_t embed_backward_op = sched.ops_per_micro_batch() - 1;
        for (int k = 0; k < static_cast<int>(ctx->ledger.staging.size()); ++k) {
          auto& e = ctx->ledger.staging[static_cast<std::size_t>(k)];
          if (e.state != StagingEntry::State::filling) continue;
          const bool keep = e.stage == 0 && e.step == r.pos.step &&
                            sched.index_of(e.micro_batch, head_op) < r.pos.index &&
                            r.pos.index <= sched.index_of(e.micro_batch, embed_backward_op);
          if (!keep) {
            e = StagingEntry{};
            ctx->arena->release(ArenaRegionKind::grad_slot, k);
          }
        }
        st.running = true;
        st.held_reported = false;  // a pause in force is reported again from the resumed position
        try_advance(self);
      },
      [=](const PauseRequest& m) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "PauseRequest");
        auto& st = self->state;
        if (st.pause != m.request) st.held_reported = false;
        st.pause = m.request;
        try_advance(self);
      },
      [=](wake_atom) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "wake");
        self->state.pause = 0;
        self->state.held_reported = false;
        try_advance(self);
      },
      [=](reset_atom, std::uint64_t e) {
        const auto probe = probe_handler(self, monitor::ActorId::compute, "reset");
        self->state.epoch = e;
        self->state.running = false;
        self->state.ready.clear();
        // Boundary copies to the host this actor queued (possibly after the prefetcher's reset waited
        // for the copy engine) must land before the barrier ends: Resume reads their stamps.
        ctx->backend->wait_link_idle();
        return ack_atom::value;
      },
  };
}

}  // namespace

compute_actor spawn_compute(caf::actor_system& sys, Context* ctx, std::uint64_t epoch) {
  return sys.spawn<caf::detached>(compute_fn, ctx, epoch);
}

}  // namespace mt::actors
