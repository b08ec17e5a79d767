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

// One op of the schedule at compute's position: what it reads and writes, resolved once its inputs are
// ready (the micro-batch's data, its weight slots, a free ring entry, gradient staging).
struct OpFrame {
  self_ptr self = nullptr;
  Context* ctx = nullptr;
  const ModelConfig* c = nullptr;
  Pos p;
  const Op* op = nullptr;
  const data::Batch* batch = nullptr;
  std::int64_t B = 0, T = 0, L = 0, S = 0;
  bool keep = false, on_host = false, head_input_own = false, balanced = false, is_tied = false;
  int slot[2] = {-1, -1};
  int k_main = -1, k_embed = -1;  // gradient staging slots the op fills
  std::int64_t written = -1;      // boundaries on the host: the boundary this op writes into the ring
  // Set when the op runs.
  BatchIds ids;
  int token_slot = 0;
  std::size_t set = 0;
  std::int64_t dx_read = 0;  // the dx buffer the op reads (the head: writes)

  const void* weights(int li) const { return ctx->arena->weights(slot[li]); }
  // Boundary i of this micro-batch as the forward and head see it.
  float* boundary(std::int64_t i) const {
    if (i == L && head_input_own) return ctx->head_inputs[set];
    return on_host ? ctx->ring[static_cast<std::size_t>(i) % ctx->ring.size()]
                   : ctx->acts[set][static_cast<std::size_t>(i)];
  }
  // d(loss)/d(boundary): the head writes it, each layer backward reads one buffer and writes the
  // other, the embed backward reads it. One pair in turn (the ledger's dx_current), or layer-major a
  // pair per micro-batch, the buffer fixed by the stage: the head writes buffer 0, layer i reads
  // buffer (L - i) % 2.
  float* dx_buffer(std::int64_t parity) const {
    return !ctx->dx_sets.empty() ? ctx->dx_sets[2 * set + static_cast<std::size_t>(parity & 1)]
                                 : ctx->dx[(ctx->ledger.dx_current + parity) & 1];
  }
  float* saved(std::int64_t layer) const {
    const std::int64_t first_saved = keep ? 1 : L - ctx->plan.kept_layers + 1;  // kept_layers: the last ones
    return layer >= first_saved ? ctx->saved[set][static_cast<std::size_t>(layer - first_saved)] : nullptr;
  }
  float* kept_attention(std::int64_t layer) const {
    return ctx->kept_attention.empty() ? nullptr : ctx->kept_attention[set][static_cast<std::size_t>(layer - 1)];
  }
};

void mark_waiting(compute_state& st) {
  if (!st.waiting_since) st.waiting_since = Clock::now();
}

// Before the op at st.pos: the agreed stop, a pause, the granted threads. False: stop advancing.
bool may_start(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  // Several ranks: a stop every rank agreed on (Context::agreed_end; never inside a begun step).
  const std::int64_t agreed = ctx->run->agreed_end.load();
  if (agreed < st.end_step) st.end_step = std::max(agreed, st.pos.step + (st.pos.index != 0 ? 1 : 0));
  if (st.pos.step >= st.end_step) return false;
  // Paused (a control request): hold before the step's first op until the node sends wake.
  if (st.pos.index == 0 && st.pause != 0) {
    if (!st.held_reported) self->send(st.peers.node, PauseHeld{st.pause, st.pos.step, ctx->device});
    st.held_reported = true;
    return false;
  }
  const int threads = ctx->granted(ctx->plan.threads.blas);
  if (threads != st.threads_applied) {
    ctx->backend->set_compute_threads(threads);
    st.threads_applied = threads;
  }
  return true;
}

// The op's micro-batch data (requested from the loader when missing) and weight slots. False: wait.
bool inputs_ready(self_ptr self, OpFrame& f) {
  auto& st = self->state;
  const BatchKey key{f.p.step, f.ctx->data_local(f.p.micro_batch)};  // every pass runs the same data
  auto bit = st.batches.find(key);
  if (bit == st.batches.end()) {
    if (st.requested.insert(key).second)
      self->send(st.peers.loader, BatchRequest{st.epoch, f.p.step, f.ctx->global_micro_batch(f.p.micro_batch)});
    return false;
  }
  f.batch = bit->second.get();
  for (int li = 0; li < f.op->loads; ++li) {
    auto it = st.ready.find({f.p, li});
    if (it == st.ready.end()) {
      mark_waiting(st);
      return false;
    }
    f.slot[li] = it->second.slot;
  }
  return true;
}

// Boundaries on the host: the ring entry this op writes must have been copied out (layer-major the
// head's input has a buffer of its own per micro-batch). False: wait.
bool ring_ready(compute_state& st, OpFrame& f) {
  f.written = f.on_host ? boundary_written(*f.op) : -1;
  if (f.written == f.L && f.head_input_own) f.written = -1;
  if (f.written >= 0 && !ring_entry_free(f.ctx, static_cast<std::size_t>(f.written) % f.ctx->ring.size())) {
    mark_waiting(st);
    return false;
  }
  return true;
}

// The gradient staging slots this op fills. False: none free yet.
bool staging_ready(OpFrame& f) {
  Context* ctx = f.ctx;
  switch (f.op->kind) {
    case OpKind::head:
      f.k_main = free_staging(ctx);
      if (f.k_main < 0) return false;
      if (f.is_tied) f.k_embed = free_staging(ctx, f.k_main);
      return !f.is_tied || f.k_embed >= 0;
    case OpKind::layer_backward:
      f.k_main = free_staging(ctx);
      return f.k_main >= 0;
    case OpKind::embed_backward:
      f.k_main = f.is_tied ? find_filling(ctx, f.p, 0) : free_staging(ctx);
      if (f.k_main < 0 && f.is_tied) throw std::logic_error("compute: the tied embedding's staging slot is missing");
      return f.k_main >= 0;
    default:
      return true;
  }
}

void run_embed_forward(OpFrame& f) {
  f.ctx->backend->embedding_forward(*f.c, f.weights(0), f.ids.tokens, f.ids.rows, f.boundary(0));
}

void run_layer_forward(OpFrame& f) {
  const ModelConfig& c = *f.c;
  const std::int64_t stage = f.op->stage;
  MoeBalance stats;  // the load-balancing loss's statistics of an expert layer, into the ledger
  if (f.balanced && c.layer_is_moe(stage - 1)) {
    MbBalance& mb = balance_of(f.ctx, f.p);
    const auto E = static_cast<std::size_t>(c.num_experts), l = static_cast<std::size_t>(stage - 1);
    mb.counts.resize(static_cast<std::size_t>(f.L));
    mb.prob_sums.resize(static_cast<std::size_t>(f.L));
    mb.counts[l].resize(E);  // layer_forward overwrites them
    mb.prob_sums[l].resize(E);
    stats.counts = mb.counts[l].data();
    stats.prob_sums = mb.prob_sums[l].data();
  }
  LayerBuffers b;
  b.x_in = f.boundary(stage - 1);
  b.x_out = f.boundary(stage);
  b.saved = f.saved(stage);
  b.workspace = f.ctx->workspace;
  b.sequence = f.ctx->sequence;
  b.attention = f.kept_attention(stage);
  b.balance = stats.counts ? &stats : nullptr;
  f.ctx->backend->layer_forward(c.layer_config(stage - 1), f.weights(0), f.ids.rows, b);
}

// The micro-batch's load-balancing term: its loss, and the layers' gradient per layer (a dense layer's
// slots stay empty).
void add_balance_term(OpFrame& f, LossSum& loss) {
  Context* ctx = f.ctx;
  MbBalance& mb = balance_of(ctx, f.p);
  const MoeBalanceTerm term = moe_balance(mb.counts, mb.prob_sums, f.B * f.T, f.c->router_aux_loss_coef, loss.counted);
  loss.loss_sum += term.loss_add;
  mb.grad = term.grad;
  // Steps before the previous one are done: their statistics go.
  while (!ctx->ledger.balance.empty() && ctx->ledger.balance.begin()->first.first < f.p.step - 1)
    ctx->ledger.balance.erase(ctx->ledger.balance.begin());
}

void run_head(OpFrame& f) {
  auto& st = f.self->state;
  Context* ctx = f.ctx;
  const Pos& p = f.p;
  float* gh = open_staging(ctx, f.k_main, p, f.S - 1);
  HeadBuffers b;
  b.x_in = f.boundary(f.L);
  b.targets = f.ids.targets;
  b.dx = f.dx_buffer(f.dx_read);
  b.head_grads = gh;
  b.embed_grads = f.is_tied ? open_staging(ctx, f.k_embed, p, 0) : nullptr;
  b.workspace = ctx->workspace;
  LossSum loss =
      ctx->backend->head_forward_backward(*f.c, f.weights(0), f.is_tied ? f.weights(1) : nullptr, {f.B, f.T}, b);
  if (f.balanced) add_balance_term(f, loss);
  hand_over(f.self, f.k_main, p, f.S - 1, Phase::head);
  auto& v = ctx->ledger.losses[p.step];
  const MbLoss ml{loss.loss_sum, loss.counted};
  const std::int64_t mb = ctx->data_local(p.micro_batch);
  if (ctx->pass_of(p.micro_batch) > 0) {  // a later pass of two: the same bits, reported by the first
    check_pass_loss(v, mb, ml, p.step);
    return;
  }
  if (static_cast<std::int64_t>(v.size()) > mb)
    v[static_cast<std::size_t>(mb)] = ml;
  else
    v.push_back(ml);
  const LossReport rep{st.epoch, p.step, ctx->global_micro_batch(p.micro_batch), loss.loss_sum, loss.counted};
  f.self->send(st.peers.optimizer, rep);
  f.self->send(st.peers.node, rep);
}

// Evaluation: the loss only (dx == nullptr: no gradients touched).
void run_head_loss(OpFrame& f) {
  auto& st = f.self->state;
  HeadBuffers b;
  b.x_in = f.boundary(f.L);
  b.targets = f.ids.targets;
  b.workspace = f.ctx->workspace;
  const LossSum loss =
      f.ctx->backend->head_forward_backward(*f.c, f.weights(0), f.is_tied ? f.weights(1) : nullptr, {f.B, f.T}, b);
  f.self->send(st.peers.node,
               LossReport{st.epoch, f.p.step, f.ctx->global_micro_batch(f.p.micro_batch), loss.loss_sum, loss.counted});
}

void run_layer_backward(OpFrame& f) {
  Context* ctx = f.ctx;
  const ModelConfig& c = *f.c;
  const std::int64_t stage = f.op->stage;
  Backend& be = *ctx->backend;
  // The layer's input: streamed back from the host into an activation slot, or kept on the device.
  const float* x_in = f.on_host ? ctx->act_slots[static_cast<std::size_t>(f.slot[1])] : f.boundary(stage - 1);
  float* g = open_staging(ctx, f.k_main, f.p, stage);
  MoeBalance grad;  // the head's load-balancing gradient, where the backend computes
  if (f.balanced && c.layer_is_moe(stage - 1)) {
    const std::vector<float>& host = balance_of(ctx, f.p).grad;
    if (host.size() != static_cast<std::size_t>(c.num_experts))
      throw std::logic_error("compute: a layer backward before its micro-batch's head (load-balancing loss)");
    grad.grad = be.upload_floats(host.data(), host.size(), f.token_slot);
  }
  LayerBuffers b;
  b.x_in = x_in;
  b.dy = f.dx_buffer(f.dx_read);
  b.dx = f.dx_buffer(f.dx_read + 1);
  b.grads = g;
  b.saved = f.saved(stage);
  b.workspace = ctx->workspace;
  b.sequence = ctx->sequence;
  b.attention = f.kept_attention(stage);
  b.balance = grad.grad ? &grad : nullptr;
  be.layer_backward(c.layer_config(stage - 1), f.weights(0), f.ids.rows, b);
  hand_over(f.self, f.k_main, f.p, stage, Phase::backward);
}

void run_embed_backward(OpFrame& f) {
  Context* ctx = f.ctx;
  float* g = f.is_tied ? staging_buffer(ctx, f.k_main, f.p, 0) : open_staging(ctx, f.k_main, f.p, 0);
  ctx->backend->embedding_backward(*f.c, f.ids.tokens, f.ids.rows, f.dx_buffer(f.dx_read), g);
  hand_over(f.self, f.k_main, f.p, 0, Phase::backward);
}

// Runs the op (its inputs ready): uploads the micro-batch's ids, then the op kind's backend call.
void run_op(OpFrame& f) {
  Context* ctx = f.ctx;
  const Op& op = *f.op;
  Backend& be = *ctx->backend;
  const bool layer_op = op.kind == OpKind::layer_forward || op.kind == OpKind::layer_backward;
  be.set_position(f.p.step, f.p.micro_batch, layer_op ? op.stage - 1 : -1);  // named by a failure's message
  f.token_slot = ctx->sched.activation_set(f.p.micro_batch) % 2;
  f.ids = upload_batch(be, *f.batch, op.kind == OpKind::head || op.kind == OpKind::head_loss, f.B, f.T, f.token_slot);
  f.set = static_cast<std::size_t>(ctx->sched.activation_set(f.p.micro_batch));
  const bool dx_per_set = !ctx->dx_sets.empty();
  if (dx_per_set && op.kind == OpKind::layer_backward) f.dx_read = f.L - op.stage;
  if (dx_per_set && op.kind == OpKind::embed_backward) f.dx_read = f.L;
  switch (op.kind) {
    case OpKind::embed_forward:
      run_embed_forward(f);
      break;
    case OpKind::layer_forward:
      run_layer_forward(f);
      break;
    case OpKind::head:
      run_head(f);
      break;
    case OpKind::head_loss:
      run_head_loss(f);
      break;
    case OpKind::layer_backward:
      run_layer_backward(f);
      break;
    case OpKind::embed_backward:
      run_embed_backward(f);
      break;
  }
}

// After the op ran: timing, the boundary copy, the weight slots back, and the committed position.
void finish_op(OpFrame& f, Clock::time_point t0) {
  auto& st = f.self->state;
  Context* ctx = f.ctx;
  const Schedule& sched = ctx->sched;
  const Pos& p = f.p;
  const Op& op = *f.op;
  const auto t1 = Clock::now();
  st.step_compute += seconds_between(t0, t1);
  ctx->intervals.add(Role::compute, p.step, t0, t1, static_cast<int>(phase_of(op)));
  ctx->monitor->board()
      .probe(monitor::ActorId::compute, ctx->device)
      .unit(p.step, ctx->work_micro_batch(p.micro_batch), op.stage, phase_name(phase_of(op)));
  if (f.written >= 0) {
    if (f.written < f.L && !sched.is_forward_only())  // an evaluation pass has no backward to feed
      offload_boundary(f.self, p, f.written);
    else
      ctx->ledger.ring[static_cast<std::size_t>(f.written) % ctx->ring.size()] = RingEntry{};
  }
  for (int li = 0; li < op.loads; ++li) {
    auto it = st.ready.find({p, li});
    f.self->send(st.peers.prefetcher, SlotFree{st.epoch, p, li, it->second.slot});
    st.ready.erase(it);
  }
  // Commit: the op is done.
  if (op.kind == OpKind::layer_backward) ctx->ledger.dx_current = 1 - ctx->ledger.dx_current;
  const Pos n = sched.next(p);
  ctx->ledger.compute_pos = n;
  st.pos = n;
  if (p.op + 1 == sched.ops_per_micro_batch() && ctx->last_pass(p.micro_batch)) {  // its data is done
    const BatchKey key{p.step, ctx->data_local(p.micro_batch)};
    st.batches.erase(key);
    st.requested.erase(key);
  }
  if (n.step != p.step) {
    f.self->send(st.peers.node, ComputeStepDone{p.step, st.step_wait, st.step_compute});
    st.step_wait = st.step_compute = 0.0;
    // Losses of steps the optimizer has finished are no longer needed for a restart.
    auto& losses = ctx->ledger.losses;
    while (!losses.empty() && losses.begin()->first < p.step - 1) losses.erase(losses.begin());
  }
}

OpFrame frame_at(self_ptr self) {
  Context* ctx = self->state.ctx;
  const ModelConfig& c = *ctx->model;
  OpFrame f;
  f.self = self;
  f.ctx = ctx;
  f.c = &c;
  f.p = self->state.pos;
  f.op = &ctx->sched.op(f.p);
  f.B = ctx->plan.batch;
  f.T = ctx->plan.seq;
  f.L = c.num_hidden_layers;
  f.S = ctx->stages();
  f.keep = ctx->plan.mode == ActivationMode::keep;
  f.on_host = ctx->host_acts != nullptr;
  f.head_input_own = f.on_host && !ctx->head_inputs.empty();
  f.balanced = c.output_router_logits && !ctx->sched.is_forward_only();  // evaluation: the LM loss only
  f.is_tied = tied(c);
  return f;
}

void try_advance(self_ptr self) {
  auto& st = self->state;
  while (st.running) {
    if (!may_start(self)) return;
    OpFrame f = frame_at(self);
    if (!inputs_ready(self, f) || !ring_ready(st, f) || !staging_ready(f)) return;
    if (st.waiting_since) {
      st.step_wait += seconds_between(*st.waiting_since, Clock::now());
      st.waiting_since.reset();
    }
    fault_point(f.ctx->fault, Role::compute, f.p.step, f.ctx->work_micro_batch(f.p.micro_batch), f.op->stage,
                phase_of(*f.op));
    const auto t0 = Clock::now();
    run_op(f);
    finish_op(f, t0);
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
