// The gradient collector: copies each staged gradient device-to-host (over the backend's link) and
// adds it into the stage's fp32 accumulator in the host tile (cpu::accumulate, the reference's call;
// a backend that shares host memory does both in one pass from the slot, with the same bits, and
// its micro-batch 0 arrives already in the tile: Context::grads_in_place),
// frees the staging slot, and after a stage's last micro-batch reports the stage's gradient sum of
// squares to the optimizer. Its progress (per stage: step, micro-batches accumulated, sum of squares)
// is in the ledger, so re-issued work is recognised and not added twice.
//
// Several devices (device.gpus = N): a stage's gradients of round m (local micro-batch m of every
// device: global micro-batches m * N .. m * N + N - 1) are taken once every device's slot is in: the
// backend sums them on the devices into device 0's slot (Backend::reduce_gradients, device order),
// that one slot is copied out and accumulated, and every device's slot is freed. The ledger counts
// rounds; a round waiting for a device is not durable (a restart re-issues every full slot).
//
// Several ranks (mpirun): reduce_across_ranks below, the sum in rank order of cluster/grad_reduce.hpp.
//
// Stage gradients (train.gradient_buffer=stage): with one micro-batch per step (collect_in_slot below)
// nothing is accumulated; the first of two passes sums a stage's squares and frees the slot, the last
// hands the slot itself to the optimizer, which frees it after the update. With several (layer-major,
// collect_into_accumulator) a stage's micro-batches arrive back to back and are summed into one of the
// two stage accumulators with the tile accumulator's bits; the first pass sums its squares and
// releases it, the last hands it to the optimizer. Work that finds both accumulators taken waits
// (in order) for the optimizer's AccumulatorFree. Several ranks (the host state sharded) always sum
// into the accumulators, at each stage's owner alone, every rank's round in rank order (the bits of one
// rank's accumulation); a rank that does not own the stage sends its slot's gradient and frees it at
// once (stage_accumulator_for says why the owner's wait cannot deadlock the ranks).
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "actors/actors.hpp"
#include "cluster/grad_reduce.hpp"
#include "kernels/step_math.hpp"
#include "kernels/tile.hpp"

namespace mt::actors {
namespace {

struct collector_state {
  Context* ctx = nullptr;
  std::uint64_t epoch = 0;
  bool running = false;
  PeerHandles peers;
  AlignedFloats host_buffer;                 // without the engine's Context::link_buffer: made on first use
  std::map<std::int64_t, double> offload_s;  // per step
  // Several ranks, per step: seconds in transfers with other ranks; the latest hand-over by compute;
  // when the last transfer ended (CollectorStepDone::reduce_s, reduce_tail_s).
  struct Reduction {
    double seconds = 0.0;
    std::int64_t last_handed_ns = 0, last_done_ns = 0;
  };
  std::map<std::int64_t, Reduction> reductions;
  // Rounds not yet complete: (step, round, stage) -> each device's staging slot (-1: not in yet).
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::vector<int>> pending;
  std::deque<LayerGrads> waiting;  // stage gradients: work waiting for a stage accumulator, in arrival order
  static constexpr const char* name = "collector";
};

using self_ptr = collector_actor::stateful_pointer<collector_state>;

std::size_t largest_stage_floats(const Context* ctx) {
  std::size_t largest = 0;
  for (const auto& l : ctx->layouts) largest = std::max(largest, l.total_floats);
  return largest;
}

// Copies `n` floats of the gradient in device slot `slot` into the collector's host buffer over the
// backend's link (the engine's pinned Context::link_buffer, else one made on first use, the largest
// stage's size) and returns it once they landed.
const float* copy_to_host_buffer(self_ptr self, Backend& device, const float* slot, std::size_t n) {
  auto& st = self->state;
  float* buffer = st.ctx->link_buffer.get();
  if (!buffer) {
    if (!st.host_buffer) st.host_buffer = make_aligned_floats(largest_stage_floats(st.ctx));
    buffer = st.host_buffer.get();
  }
  std::promise<void> landed;
  device.copy_async(LinkDirection::device_to_host, slot, buffer, n * sizeof(float), [&landed] { landed.set_value(); });
  landed.get_future().get();
  return buffer;
}

// Several ranks: what a transfer of stage `stage`'s gradients of `round` carries, in errors and in
// the monitor's "waits for" (a replayed pass, stage gradients with clipping, says so).
std::string round_what(const Context& ctx, std::int64_t step, std::int64_t local, std::int64_t stage, int owner) {
  const std::string pass = ctx.passes > 1 ? " of pass " + std::to_string(ctx.pass_of(local) + 1) : "";
  return "the gradients of stage " + std::to_string(stage) + ", step " + std::to_string(step) + ", round " +
         std::to_string(ctx.data_local(local)) + pass + " (owner rank " + std::to_string(owner) + ")";
}

// Several ranks: this rank's gradient of a round as the transport takes it (device/grad_transport.hpp:
// MPI from a host copy, or NCCL straight from the device slot, when this rank needs no host copy
// unless it is the owner, which adds its own on the host).
RoundGradient round_gradient(self_ptr self, float* slot, std::size_t n, int owner) {
  Context* ctx = self->state.ctx;
  RoundGradient mine{slot, nullptr};
  if (ctx->backend->shares_host_memory())
    mine.host = slot;
  else if (owner == ctx->rank || !ctx->grad_transport->sends_from_device())
    mine.host = copy_to_host_buffer(self, *ctx->backend, slot, n);
  return mine;
}

// Runs `transfers` (m's transfers with other ranks) and counts their time as the step's reduction
// (CollectorStepDone::reduce_s, reduce_tail_s).
template <class Transfers>
auto timed_reduction(self_ptr self, const LayerGrads& m, Transfers transfers) {
  const auto r0 = Clock::now();
  auto result = transfers();
  const auto r1 = Clock::now();
  collector_state::Reduction& r = self->state.reductions[m.work.step];
  r.seconds += seconds_between(r0, r1);
  r.last_handed_ns = std::max(r.last_handed_ns, m.handed_ns);
  r.last_done_ns = r1.time_since_epoch().count();
  return result;
}

// One round of a stage on every rank (cluster::reduce_round): this rank's gradient in device slot
// `m.grad_slot` goes to the stage's owner, which adds every rank's in rank order into `accum` (zeroed
// first when `first`; only the owner's is written, others pass null); then the slot is freed. Blocking
// here keeps the transfers in the order the collector takes its work, the same on every rank; compute
// goes on with the next backward into its other staging slots meanwhile.
void reduce_round_of(self_ptr self, const LayerGrads& m, float* accum, std::size_t n, bool first) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const std::int64_t stage = m.work.stage;
  const int owner = cluster::stage_owner(stage, ctx->ranks);
  const RoundGradient mine = round_gradient(self, ctx->arena->grad_slot(m.grad_slot), n, owner);
  cluster::reduce_round(*ctx->world, *ctx->grad_transport, owner, mine, accum, n, first,
                        ctx->granted(ctx->optimizer_threads),
                        round_what(*ctx, m.work.step, m.work.micro_batch, stage, owner));
  self->send(st.peers.computes.at(0), GradSlotFree{st.epoch, m.work, m.grad_slot, 0});
}

// A stage's sum of squares once its sum is complete: of `accum` where this rank holds it; with the host
// state sharded its owner's, sent to every rank (8 bytes, cluster::share_from_owner on the gradients
// channel), so every rank's optimizer has every stage's for the clipping norm.
double stage_sumsq(self_ptr self, const LayerGrads& m, const float* accum) {
  Context* ctx = self->state.ctx;
  const std::int64_t stage = m.work.stage;
  double sumsq = accum != nullptr ? stage_grad_sumsq(ctx->layouts[static_cast<std::size_t>(stage)], accum,
                                                     ctx->granted(ctx->optimizer_threads))
                                  : 0.0;
  if (ctx->ranks > 1 && ctx->host->sharded()) {
    const int owner = cluster::stage_owner(stage, ctx->ranks);
    cluster::share_from_owner(
        *ctx->world, cluster::Channel::grads, owner, &sumsq, sizeof sumsq,
        "the sum of squares of " + round_what(*ctx, m.work.step, m.work.micro_batch, stage, owner));
  }
  return sumsq;
}

// Several ranks, gradient accumulators (cluster/grad_reduce.hpp): the round goes to the stage's owner,
// which adds every rank's in rank order into its tile's accumulator; after the last round the owner
// sends the sum to every rank, so each rank's tile then holds the step's whole gradient and every rank
// runs the optimizer on it. With the host state sharded (cluster.shard_state) only the owner holds an
// accumulator: after the last round it sends the sum's square norm alone, which this returns on every
// rank, and the owner alone updates the stage.
std::optional<double> reduce_across_ranks(self_ptr self, const LayerGrads& m, HostTile& tile, std::size_t n) {
  Context* ctx = self->state.ctx;
  const std::int64_t mb = m.work.micro_batch, stage = m.work.stage;
  float* accum = ctx->host->owns(stage) ? tile.grad() : nullptr;  // only the owner's is written
  reduce_round_of(self, m, accum, n, mb == 0);
  if (mb + 1 != ctx->sched.micro_batches()) return std::nullopt;
  if (ctx->host->sharded()) return stage_sumsq(self, m, accum);
  const int owner = cluster::stage_owner(stage, ctx->ranks);
  cluster::share_stage(*ctx->world, owner, accum, n, round_what(*ctx, m.work.step, mb, stage, owner));
  return std::nullopt;
}

// Adds the gradient in device slot `slot` into the host accumulator `acc` (first: zeroed first), with
// the bits of cpu::accumulate: from the slot in one pass where the backend shares host memory, else
// copied into the host buffer first. `slot_done` runs once the slot is no longer read.
template <class SlotDone>
void add_to_host(self_ptr self, Backend& device, float* slot, float* acc, std::size_t n, bool first,
                 SlotDone slot_done) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  if (device.shares_host_memory()) {
    device.accumulate_to_host(slot, acc, n, first, ctx->granted(ctx->optimizer_threads));
    slot_done();
    return;
  }
  const float* landed = copy_to_host_buffer(self, device, slot, n);
  slot_done();
  if (first) std::memset(acc, 0, n * sizeof(float));
  cpu::accumulate(acc, landed, n, ctx->granted(ctx->optimizer_threads));
}

// Tells the node the step's gradients are all collected once every stage's ledger count reaches `complete`.
void report_if_step_done(self_ptr self, std::int64_t step, std::int64_t complete) {
  auto& st = self->state;
  const RunLedger& led = st.ctx->ledger;
  for (std::size_t s = 0; s < led.accum_step.size(); ++s)
    if (led.accum_step[s] != step || led.accum_count[s] != complete) return;
  const collector_state::Reduction r = st.reductions[step];
  const double tail = r.last_handed_ns > 0 && r.last_done_ns > r.last_handed_ns
                          ? static_cast<double>(r.last_done_ns - r.last_handed_ns) * 1e-9
                          : 0.0;
  self->send(st.peers.node, CollectorStepDone{step, st.offload_s[step], r.seconds, std::min(tail, r.seconds)});
  st.offload_s.erase(step);
  st.reductions.erase(step);
}

// Stage gradients: the slot's gradient as the host sees it (over a link, copied into the slot's landing
// buffer first), its sum of squares or the slot itself handed to the optimizer.
void collect_in_slot(self_ptr self, const LayerGrads& m) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  RunLedger& led = ctx->ledger;
  const std::int64_t step = m.work.step, mb = m.work.micro_batch, stage = m.work.stage;
  const std::size_t si = static_cast<std::size_t>(stage);
  fault_point(ctx->fault, Role::collector, step, ctx->work_micro_batch(mb), stage, Phase::collect);
  const bool sums_only = !ctx->last_pass(mb);
  const std::int64_t passes_done = led.accum_step[si] == step ? led.accum_count[si] : 0;
  if (led.accum_step[si] > step || (sums_only && passes_done > ctx->pass_of(mb))) {  // re-issued, taken before
    self->send(st.peers.computes.at(0), GradSlotFree{st.epoch, m.work, m.grad_slot, 0});
    return;
  }
  // The last pass's slot is handed over again after a restart (the optimizer skips a stage it updated).
  const auto t0 = Clock::now();
  const std::size_t n = ctx->layouts[si].total_floats;
  float* slot = ctx->arena->grad_slot(m.grad_slot);
  const float* g = slot;
  if (!ctx->backend->shares_host_memory()) {
    float* landing = ctx->grad_landing.at(static_cast<std::size_t>(m.grad_slot)).get();
    std::promise<void> landed;
    ctx->backend->copy_async(LinkDirection::device_to_host, slot, landing, n * sizeof(float),
                             [&landed] { landed.set_value(); });
    landed.get_future().get();
    g = landing;
  }
  double sumsq = led.sumsq[si];  // the first pass's, when there were two
  if (ctx->passes == 1 || sums_only)
    sumsq = stage_grad_sumsq(ctx->layouts[si], g, ctx->granted(ctx->optimizer_threads));
  led.sumsq[si] = sumsq;
  led.accum_step[si] = step;
  led.accum_count[si] = ctx->pass_of(mb) + 1;
  if (sums_only) self->send(st.peers.computes.at(0), GradSlotFree{st.epoch, m.work, m.grad_slot, 0});
  const auto t1 = Clock::now();
  st.offload_s[step] += seconds_between(t0, t1);
  ctx->intervals.add(Role::collector, step, t0, t1);
  ctx->monitor->board().probe(monitor::ActorId::collector).unit(step, ctx->work_micro_batch(mb), stage, "collect");
  const bool handed_before = passes_done == ctx->passes;  // only the slot goes again, not the step's report
  if (!sums_only && !handed_before) report_if_step_done(self, step, ctx->passes);
  self->send(st.peers.optimizer, LayerGradsComplete{st.epoch, step, stage, sumsq, sums_only ? -1 : m.grad_slot});
}

// Stage gradients into a stage accumulator: the accumulator the stage's round `data_mb` adds into,
// claimed at its first round of a pass; -1 when both are taken (the work waits for AccumulatorFree).
//
// Several ranks: only the stage's owner claims one, before its part of the round's transfer; every
// other rank sends its gradient at once and holds no accumulator for the stage. Why the owner's wait
// cannot deadlock the ranks, whose collectors wait in that round's transfer for it meanwhile: a first
// pass's accumulator is released as soon as its sum of squares is taken, so only last-pass stages hold
// one, and only once every rank's every round of them is summed (the collector claims at a stage's
// first round and the rounds of a stage come back to back). Their update, which releases them, needs
// nothing from the round waited on: the step's loss gather (every rank reported its losses at its heads,
// before any gradient of the step), and, in backward order, the new weights of the stages completed
// before them, updated by their owners under the same conditions; the transfers of the optimizers (and
// the checkpointers behind the version gate) pair up on their own channels in the same order on every
// rank. So the owner's optimizer frees an accumulator, and by induction over the collector's order
// (the same on every rank) every wait ends. A non-owner never waits for an accumulator, so no rank
// stops in front of a transfer that another rank's owner is already inside.
int stage_accumulator_for(Context* ctx, std::int64_t step, std::int64_t stage, std::int64_t data_mb) {
  StageAccumulators& accums = *ctx->stage_accums;
  const int a = data_mb == 0 ? accums.claim(step, stage) : accums.held_by(step, stage);
  if (a < 0 && data_mb != 0)
    throw std::logic_error("collector: stage " + std::to_string(stage) + " lost its accumulator");
  return a;
}

// Stage gradients of several micro-batches (layer-major), or of several ranks: adds the slot into the
// stage's accumulator (with several ranks: every rank's round, in rank order, at the stage's owner; the
// others send theirs). False when it has to wait for a free accumulator (the optimizer's AccumulatorFree).
bool collect_into_accumulator(self_ptr self, const LayerGrads& m) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  RunLedger& led = ctx->ledger;
  const std::int64_t step = m.work.step, mb = m.work.micro_batch, stage = m.work.stage;
  const std::size_t si = static_cast<std::size_t>(stage);
  const std::int64_t M = ctx->data_micro_batches(), data_mb = ctx->data_local(mb);
  const std::int64_t arrival = ctx->pass_of(mb) * M + data_mb;  // the stage's arrivals count every pass
  auto free_slot = [&] { self->send(st.peers.computes.at(0), GradSlotFree{st.epoch, m.work, m.grad_slot, 0}); };
  fault_point(ctx->fault, Role::collector, step, ctx->work_micro_batch(mb), stage, Phase::collect);
  // Re-issued work, summed (and with several ranks sent) before a restart: every round's transfer ran
  // once on every rank, and the ledger counts it here only after it ran.
  const std::int64_t expected = led.accum_step[si] == step ? led.accum_count[si] : 0;
  if (led.accum_step[si] > step || arrival < expected) {
    free_slot();
    return true;
  }
  if (arrival != expected)
    throw std::logic_error("collector: stage " + std::to_string(stage) + " step " + std::to_string(step) +
                           " got pass " + std::to_string(ctx->pass_of(mb)) + " micro-batch " + std::to_string(data_mb) +
                           ", expected arrival " + std::to_string(expected));
  const bool sums_here = ctx->host->owns(stage);  // one rank: every stage; sharded: its owner alone
  const int a = sums_here ? stage_accumulator_for(ctx, step, stage, data_mb) : -1;
  if (sums_here && a < 0) return false;
  const auto t0 = Clock::now();
  const std::size_t n = ctx->layouts[si].total_floats;
  float* acc = a >= 0 ? ctx->stage_accums->data(a) : nullptr;
  const bool stage_done = data_mb + 1 == M;
  const bool sums_only = !ctx->last_pass(mb);
  const bool takes_sumsq = stage_done && (ctx->passes == 1 || sums_only);
  double sumsq = led.sumsq[si];
  if (ctx->ranks > 1) {
    sumsq = timed_reduction(self, m, [&] {
      reduce_round_of(self, m, acc, n, data_mb == 0);
      return takes_sumsq ? stage_sumsq(self, m, acc) : sumsq;
    });
  } else {
    add_to_host(self, *ctx->backend, ctx->arena->grad_slot(m.grad_slot), acc, n, data_mb == 0, free_slot);
    if (takes_sumsq) sumsq = stage_sumsq(self, m, acc);
  }
  led.sumsq[si] = sumsq;
  led.accum_step[si] = step;
  led.accum_count[si] = arrival + 1;
  const auto t1 = Clock::now();
  st.offload_s[step] += seconds_between(t0, t1);
  ctx->intervals.add(Role::collector, step, t0, t1);
  ctx->monitor->board().probe(monitor::ActorId::collector).unit(step, ctx->work_micro_batch(mb), stage, "collect");
  if (!stage_done) return true;
  if (sums_only) {
    if (a >= 0) ctx->stage_accums->release(a);  // the first pass brings only the sum
  } else {
    report_if_step_done(self, step, ctx->passes * M);
  }
  LayerGradsComplete done{st.epoch, step, stage, sumsq, -1, sums_only ? -1 : a};
  done.owned_elsewhere = !sums_only && !sums_here;  // this rank receives the owner's new weights
  self->send(st.peers.optimizer, done);
  return true;
}

// Stage gradients of several micro-batches: the waiting work first, in order, then m (or m waits too).
void collect_or_wait(self_ptr self, const LayerGrads* m) {
  auto& st = self->state;
  if (m != nullptr) st.waiting.push_back(*m);
  while (!st.waiting.empty()) {
    if (!collect_into_accumulator(self, st.waiting.front())) return;
    st.waiting.pop_front();
  }
}

void collect(self_ptr self, const LayerGrads& m) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  RunLedger& led = ctx->ledger;
  const std::int64_t step = m.work.step, mb = m.work.micro_batch, stage = m.work.stage;
  const std::size_t si = static_cast<std::size_t>(stage);
  const std::int64_t M = ctx->sched.micro_batches();  // rounds per step (local micro-batches per device)
  const int N = ctx->devices;
  auto free_slot = [&](int device, int slot) {
    self->send(st.peers.computes.at(static_cast<std::size_t>(device)),
               GradSlotFree{st.epoch, m.work, slot, static_cast<std::int32_t>(device)});
  };
  fault_point(ctx->fault, Role::collector, step, mb, stage, Phase::collect);
  const bool done = led.accum_step[si] > step || (led.accum_step[si] == step && led.accum_count[si] > mb);
  if (done) {  // re-issued work that had been accumulated before a restart
    free_slot(m.device, m.grad_slot);
    return;
  }
  // Every device's slot of the round, or wait for the others.
  std::vector<int> slots(static_cast<std::size_t>(N), -1);
  if (N > 1) {
    auto& waiting = st.pending[{step, mb, stage}];
    if (waiting.empty()) waiting.assign(static_cast<std::size_t>(N), -1);
    waiting.at(static_cast<std::size_t>(m.device)) = m.grad_slot;
    for (int s : waiting)
      if (s < 0) return;
    slots = waiting;
    st.pending.erase({step, mb, stage});
  } else {
    slots[0] = m.grad_slot;
  }
  const std::int64_t expected = led.accum_step[si] == step ? led.accum_count[si] : 0;
  if (mb != expected)
    throw std::logic_error("collector: stage " + std::to_string(stage) + " step " + std::to_string(step) +
                           " got micro-batch " + std::to_string(mb) + ", expected " + std::to_string(expected));
  const auto t0 = Clock::now();
  const ParamLayout& layout = ctx->layouts[si];
  const std::size_t n = layout.total_floats;
  std::vector<Backend*> devices;
  std::vector<float*> grads;
  for (int d = 0; d < N; ++d) {
    Context* dc = ctx->device_context(d);
    devices.push_back(dc->backend);
    grads.push_back(dc->arena->grad_slot(slots[static_cast<std::size_t>(d)]));
  }
  if (N > 1) devices[0]->reduce_gradients(devices, grads, n);  // into device 0's slot, device order
  HostTile& tile = ctx->host->tile(stage);
  std::optional<double> shared_sumsq;  // sharded: the owner's, after the last round
  if (ctx->ranks > 1) {
    shared_sumsq = timed_reduction(self, m, [&] { return reduce_across_ranks(self, m, tile, n); });
  } else if (N == 1 && ctx->grads_in_place(mb)) {  // compute summed them into the tile already
    free_slot(0, slots[0]);
  } else {
    add_to_host(self, *devices[0], grads[0], tile.grad(), n, mb == 0, [&] {
      for (int d = 0; d < N; ++d) free_slot(d, slots[static_cast<std::size_t>(d)]);
    });
  }
  led.accum_step[si] = step;
  led.accum_count[si] = mb + 1;
  const auto t1 = Clock::now();
  st.offload_s[step] += seconds_between(t0, t1);
  ctx->intervals.add(Role::collector, step, t0, t1);
  ctx->monitor->board().probe(monitor::ActorId::collector).unit(step, mb, stage, "collect");
  if (mb + 1 == M) {
    const double sumsq =
        shared_sumsq ? *shared_sumsq : stage_grad_sumsq(layout, tile.grad(), ctx->granted(ctx->optimizer_threads));
    led.sumsq[si] = sumsq;
    report_if_step_done(self, step, M);
    self->send(st.peers.optimizer, LayerGradsComplete{st.epoch, step, stage, sumsq});
  }
}

collector_actor::behavior_type collector_fn(self_ptr self, Context* ctx, std::uint64_t epoch) {
  self->state.ctx = ctx;
  self->state.epoch = epoch;
  self->set_exception_handler(exception_to_error);
  return {
      [=](const LayerGrads& m) {
        const auto probe = probe_handler(self, monitor::ActorId::collector, "LayerGrads");
        if (m.epoch != self->state.epoch || !self->state.running) return;
        if (ctx->stage_accums != nullptr)
          collect_or_wait(self, &m);
        else if (ctx->stage_gradients)
          collect_in_slot(self, m);
        else
          collect(self, m);
      },
      [=](const AccumulatorFree& m) {
        const auto probe = probe_handler(self, monitor::ActorId::collector, "AccumulatorFree");
        if (m.epoch != self->state.epoch || !self->state.running) return;
        collect_or_wait(self, nullptr);
      },
      [=](const Peers& p) {
        const auto probe = probe_handler(self, monitor::ActorId::collector, "Peers");
        self->state.peers.set(p);
      },
      [=](const Resume& r) {
        const auto probe = probe_handler(self, monitor::ActorId::collector, "Resume");
        self->state.epoch = r.epoch;
        self->state.running = true;
      },
      [=](reset_atom, std::uint64_t e) {
        const auto probe = probe_handler(self, monitor::ActorId::collector, "reset");
        self->state.epoch = e;
        self->state.running = false;
        self->state.pending.clear();  // the node re-issues every full staging slot
        self->state.waiting.clear();
        return ack_atom::value;
      },
  };
}

}  // namespace

collector_actor spawn_collector(caf::actor_system& sys, Context* ctx, std::uint64_t epoch) {
  return sys.spawn<caf::detached>(collector_fn, ctx, epoch);
}

}  // namespace mt::actors
