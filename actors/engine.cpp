// The engine entry points: planning (every check before anything starts), initialisation, and the run
// itself (allocate the arena and the copy engine, build the shared context, spawn the node, wait).
#include "actors/engine.hpp"
#include "actors/stage_accumulators.hpp"
#include "actors/tier_failure.hpp"
#include "plan/tier_bytes.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <type_traits>

#include <unistd.h>

#include <caf/all.hpp>

#include "actors/actors.hpp"
#include "actors/monitor_publish.hpp"
#include "cluster/bootstrap_id.hpp"
#include "cluster/grad_reduce.hpp"
#include "cluster/host_grad_transport.hpp"
#include "cluster/world.hpp"
#include "config/node_config.hpp"
#include "device/host_registration.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "monitor/monitor.hpp"
#include "storage/host/aligned_buffer.hpp"
#include "storage/offload/staged_moment_store.hpp"

namespace mt::actors {

namespace {

// Several ranks: the transport of each round's gradients to their owners (device/grad_transport.hpp).
// NCCL between the GPUs where cluster.gpu_transport resolves to it: rank 0's id goes to every rank on the
// gradients channel (cluster/bootstrap_id.hpp; no actor uses the channel yet, and every rank makes its
// pipelines in the same order), then every rank makes its end. Else MPI over host copies.
std::unique_ptr<GradTransport> make_grad_transport(const TrainConfig& cfg, Backend& backend, cluster::World& world,
                                                   std::size_t largest_stage_floats) {
  static_assert(std::is_same_v<RankLinkId, cluster::BootstrapId>, "NCCL's id is the bootstrap's blob");
  if (cfg.rank_grad_transport() != "nccl")
    return std::make_unique<cluster::HostGradTransport>(world, largest_stage_floats);
  const RankLinkId id = cluster::share_bootstrap_id(
      world, cluster::Channel::grads, [&] { return backend.new_rank_link_id(); }, "the ranks' NCCL communicator id");
  return backend.make_rank_transport(id, world.rank(), world.size(), world.timeout_s());
}

}  // namespace

void check_cluster_runs(const TrainConfig& cfg) {
  if (cfg.cluster.ranks <= 1) return;
  if (cfg.device.gpus > 1)
    throw ConfigError("device.gpus", "must be 1 in a job of several ranks (mpirun) in this version");
}

std::unique_ptr<MomentStore> moment_store_for(const TrainConfig& cfg, const ModelConfig& model) {
  if (plan::host_tile_options(cfg).moments_in_tile) return nullptr;
  const offload::StagedMomentStoreOptions o = plan::moment_store_options(cfg, model);  // tier_bytes.hpp
  try {
    return std::make_unique<offload::StagedMomentStore>(plan::stage_floats(model), o);
  } catch (const MomentStoreError& e) {
    throw ConfigError("train.offload_dir", e.what());
  }
}

void init_host_model(HostModel& host, std::uint64_t seed) {
  for (std::int64_t s = 0; s < host.num_stages(); ++s) {
    host.set_masters(s, [&](float* masters) { init_stage_params(host.config(), s, seed, masters); });
  }
}

EngineResult run_engine(EngineJob job) {
  caf::actor_system_config cfg;
  const ThreadBudget tb = job.cfg.thread_budget();
  configure_scheduler(cfg, tb.scheduler);
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  return run_engine(sys, std::move(job));
}

namespace {

// One device of a run: its backend, the arena over the backend's memory, its boundary store (with
// boundaries on the host), and, for devices 1..N-1, its context.
struct DeviceRig {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceArena> arena;
  std::optional<HostBoundaries> host_acts;
  std::vector<HostRegistration> pins;  // host_acts, pinned for this device's copies (released first)
  std::unique_ptr<Context> own;
};

// Device d's context takes the run's read-only state (device 0's context `run`) whole.
void share_run(Context& c, Context& run, int d) {
  static_cast<RunShared&>(c) = static_cast<const RunShared&>(run);
  c.device = d;
  c.run = &run;
}

// An evaluation pass runs no backward: nothing reads kept attention outputs, so none are kept.
void drop_kept_attention(EnginePlan& p, const ModelConfig& model) {
  if (p.attention != plan::AttentionOutputs::kept_mapped) return;
  p.host_boundary_bytes -= plan::kept_attention_bytes(p, model);
  p.attention = plan::AttentionOutputs::recomputed;
  p.attention_floats = 0;
}

// Carves c's arena's activation region (plan_engine sized it): boundaries (per activation set, or the
// ring and activation slots when they live on the host, layer-major with the heads' inputs), two dx
// buffers (layer-major two per set), kept intermediates; and the workspace. Boundaries mapped: the boundaries and dx
// (all_mapped: and the kept intermediates; attention_kv mapped: and the sequence-sized buffers) from
// `mapped` (host RAM) instead, which must be exactly plan.host_boundary_bytes.
void carve_activations(Context& c, float* mapped) {
  DeviceArena& arena = *c.arena;
  const EnginePlan& plan = c.plan;
  const bool mapped_block = plan.boundaries == plan::BoundaryPlacement::mapped;
  const bool host_ring = plan.boundaries == plan::BoundaryPlacement::host_ring;
  float* base = mapped_block ? mapped : reinterpret_cast<float*>(arena.activations());
  std::size_t off = 0;
  auto take = [&](std::size_t n) {
    float* q = base + off;
    off += align_floats(n);
    return q;
  };
  const std::int64_t L = c.model->num_hidden_layers;
  const std::size_t sets = static_cast<std::size_t>(plan.activation_sets);
  if (host_ring) {
    for (int k = 0; k < plan.ring_entries; ++k) c.ring.push_back(take(plan.hidden_floats));
    for (int k = 0; k < plan.activation_slots; ++k) c.act_slots.push_back(take(plan.hidden_floats));
  } else {
    c.acts.resize(sets);
    for (auto& set : c.acts)
      for (std::int64_t i = 0; i <= L; ++i) set.push_back(take(plan.hidden_floats));
  }
  if (plan.order == MicroBatchOrder::layer_major) {
    if (host_ring)
      for (std::size_t k = 0; k < sets; ++k) c.head_inputs.push_back(take(plan.hidden_floats));
    for (std::size_t k = 0; k < 2 * sets; ++k) c.dx_sets.push_back(take(plan.hidden_floats));
  } else {
    c.dx[0] = take(plan.hidden_floats);
    c.dx[1] = take(plan.hidden_floats);
  }
  // saved[set][j]: layer j + 1 in keep mode; kept layer L - kept_layers + 1 + j otherwise.
  const std::int64_t saved_layers = plan.mode == ActivationMode::keep ? L : plan.kept_layers;
  if (saved_layers > 0) {
    c.saved.resize(sets);
    for (auto& set : c.saved)
      for (std::int64_t i = 0; i < saved_layers; ++i) set.push_back(take(plan.saved_floats));
  }
  if (plan.keys_values == plan::KeysValues::mapped) c.sequence = take(plan.sequence_floats);
  if (plan.attention == plan::AttentionOutputs::kept_mapped) {
    c.kept_attention.resize(sets);
    for (auto& set : c.kept_attention)
      for (std::int64_t i = 0; i < L; ++i) set.push_back(take(plan.attention_floats));
  }
  if (!mapped_block)
    arena.claim(ArenaRegionKind::activations, 0, off * sizeof(float));
  else if (off * sizeof(float) != plan.host_boundary_bytes)  // no arena checks this block: its size must be exact
    throw std::logic_error("carve_activations: the mapped block holds " + std::to_string(plan.host_boundary_bytes) +
                           " bytes, its buffers take " + std::to_string(off * sizeof(float)));
  c.workspace = reinterpret_cast<float*>(arena.workspace());
  arena.claim(ArenaRegionKind::workspace, 0, plan.workspace_floats * sizeof(float));
}

void add_link(LinkStats& total, const LinkStats& part) {
  for (int d = 0; d < 2; ++d) {
    total.direction[d].copies += part.direction[d].copies;
    total.direction[d].bytes += part.direction[d].bytes;
    total.direction[d].busy_seconds += part.direction[d].busy_seconds;
  }
}

// The host model matches the plan and the job: its shape, gradient regions, versions and compute copies.
void check_host_model(const EngineJob& job, const EnginePlan& plan) {
  for (std::int64_t s = 0; s < plan.stages; ++s)
    if (job.host->owns(s) && job.host->tile(s).has_grad() == plan.stage_gradients)
      throw std::invalid_argument(
          "run_engine: the host tiles' gradient regions do not match train.gradient_buffer (build the HostModel "
          "with host_tile_options)");
  if (job.host->num_stages() != plan.stages) throw std::invalid_argument("run_engine: host model has another shape");
  for (std::int64_t s = 0; s < plan.stages; ++s)
    if (job.host->tile(s).version() != static_cast<std::uint64_t>(job.first_step))
      throw std::invalid_argument("run_engine: stage " + std::to_string(s) + " is at version " +
                                  std::to_string(job.host->tile(s).version()) + ", expected " +
                                  std::to_string(job.first_step));
  const bool bf16 = job.cfg.precision() == Precision::bf16;
  for (std::int64_t s = 0; s < plan.stages; ++s)
    if (job.host->tile(s).has_compute_copy() != bf16 ||
        (bf16 && job.host->tile(s).compute_copy_bytes() != job.host->tile(s).floats() * sizeof(bf16_t)))
      throw std::invalid_argument(
          "run_engine: the host tiles' compute copy does not match train.bf16=" + std::string(bf16 ? "true" : "false") +
          " (build the HostModel with host_tile_options)");
}

// The compute copies always equal bf16(masters): rebuilt here from whatever the tiles hold (fresh
// initialisation, a checkpoint, a Hugging Face import), then kept equal by the optimizer's fused update.
// Split masters need nothing: the copy is their high half.
void refresh_compute_copies(const EngineJob& job, const EnginePlan& plan) {
  if (job.cfg.precision() != Precision::bf16 || job.host->split_masters()) return;
  for (std::int64_t s = 0; s < plan.stages; ++s) {
    if (!job.host->holds_masters(s)) continue;  // a replica's copy is all it holds (set with it)
    HostTile& t = job.host->tile(s);
    job.host->read_masters(s, [&](const float* masters) {
      cpu::to_bf16(masters, static_cast<bf16_t*>(t.compute_copy()), t.floats(), std::max(1, plan.threads.blas));
    });
  }
}

// The run's context before its devices: the job's inputs, the schedule, the steps and the run-wide knobs.
std::unique_ptr<Context> pipeline_context(EngineJob& job, monitor::Monitor& mon, FaultPlan* on_demand_faults) {
  auto ctx = std::make_unique<Context>();
  ctx->job = &job;
  ctx->cfg = &job.cfg;
  ctx->model = &job.model;
  check_cluster_runs(job.cfg);
  ctx->plan = *job.plan;                                            // run_engine planned the job if the run did not
  if (job.forward_only) drop_kept_attention(ctx->plan, job.model);  // no backward reads it
  ctx->host = job.host;
  ctx->data = job.data;
  ctx->run_data = job.run_data != nullptr ? job.run_data : job.data;
  ctx->evaluations = &job.evaluations;
  ctx->fault = job.fault != nullptr ? job.fault : on_demand_faults;
  ctx->sched = job.forward_only ? Schedule::forward_only(job.model, job.eval_batches)
                                : Schedule(job.model, ctx->plan.device_micro_batches, ctx->plan.order,
                                           ctx->plan.boundaries, ctx->plan.gradient_passes);
  if (!job.forward_only) {
    ctx->stage_gradients = ctx->plan.stage_gradients;
    ctx->passes = ctx->plan.gradient_passes;
  }
  for (std::int64_t s = 0; s < ctx->plan.stages; ++s) ctx->layouts.push_back(stage_layout(job.model, s));
  check_host_model(job, ctx->plan);
  refresh_compute_copies(job, ctx->plan);
  ctx->first_step = job.first_step;
  ctx->cfg_end_step = std::max(job.first_step, job.cfg.train.max_steps);
  ctx->end_step =
      job.stop_after >= 0 ? std::clamp(job.stop_after, job.first_step, ctx->cfg_end_step) : ctx->cfg_end_step;
  if (job.forward_only) ctx->end_step = job.first_step + 1;  // one pass over the evaluation batches
  ctx->checkpointing = !job.checkpoint.root.empty();
  if (job.host->sharded()) {  // every rank's checkpointer takes part, in training and evaluation passes
    if (job.world == nullptr) throw std::invalid_argument("run_engine: a sharded host model needs its world");
    ctx->shard_world = job.world;
  }
  ctx->gate.set_snapshot_budget(job.checkpoint.snapshot_budget_bytes);
  ctx->optimizer_threads = std::max(1, ctx->plan.threads.optimizer);
  ctx->max_grad_norm = static_cast<float>(job.cfg.train.max_grad_norm);
  ctx->serial = job.serial_schedule;
  ctx->monitor = &mon;
  // device.gpus = N: N backends, each with its own arena of the planned size; an evaluation pass runs
  // on device 0 alone. Device 0 uses the run's context; devices 1..N-1 a context of their own.
  ctx->devices = job.forward_only ? 1 : ctx->plan.devices;
  return ctx;
}

// Several ranks: this rank's share of each step; an evaluation pass runs on every rank alone (the same
// batches, the same losses).
void join_ranks(Context& ctx, const EngineJob& job) {
  if (!job.forward_only && ctx.plan.ranks > 1) {
    if (job.world == nullptr || job.world->size() != ctx.plan.ranks)
      throw std::invalid_argument("run_engine: cluster.ranks = " + std::to_string(ctx.plan.ranks) +
                                  " without a world of that many ranks");
    ctx.ranks = ctx.plan.ranks;
    ctx.rank = job.world->rank();
    ctx.world = job.world;
    // cluster.shard_state: the host model holds the state of this rank's stages only.
    const OwnedStages expected = plan::host_owned_stages(job.cfg, job.model);
    for (std::int64_t s = 0; s < ctx.plan.stages; ++s)
      if (job.host->owns(s) != (expected.empty() || expected[static_cast<std::size_t>(s)] != 0))
        throw std::invalid_argument("run_engine: the host model holds stage " + std::to_string(s) +
                                    "'s state where cluster.shard_state does not (build it with host_owned_stages)");
  } else if (!job.forward_only && job.host->sharded()) {
    throw std::invalid_argument("run_engine: a sharded host model needs a job of several ranks");
  }
}

// Device d's backend, arena, boundary store and carved activations; devices 1..N-1 get a context of
// their own sharing the run's.
void build_rig(DeviceRig& rig, Context& run, const EngineJob& job, int d) {
  const EnginePlan& plan = run.plan;
  Context* c = &run;
  if (d > 0) {
    rig.own = std::make_unique<Context>();
    c = rig.own.get();
    share_run(*c, run, d);
  }
  BackendOptions o = plan::backend_options(job.cfg, plan);
  o.device_index = d;
  if (o.kind == "cuda") o.cuda_scratch = plan::cuda_ops_scratch(job.cfg, job.model, plan);
  rig.backend = make_backend(o);
  rig.arena = std::make_unique<DeviceArena>(plan.arena, rig.backend->allocate_device(plan.arena.total_bytes));
  c->backend = rig.backend.get();
  c->arena = rig.arena.get();
  if (plan.boundaries == plan::BoundaryPlacement::host_ring) {
    rig.host_acts.emplace(plan.activation_sets, job.model.num_hidden_layers, plan.hidden_floats);
    c->host_acts = &*rig.host_acts;
    rig.pins.emplace_back(*rig.backend, rig.host_acts->base(), rig.host_acts->bytes(),
                          "the layer boundaries in host RAM (device.keep_intermediates=boundary_host)");
  }
  float* mapped = plan.boundaries == plan::BoundaryPlacement::mapped
                      ? reinterpret_cast<float*>(rig.backend->allocate_mapped_host(plan.host_boundary_bytes))
                      : nullptr;
  carve_activations(*c, mapped);
  RunLedger& dl = c->ledger;
  dl.compute_pos = c->sched.first(job.first_step);
  dl.ring.assign(c->ring.size(), RingEntry{});
  dl.staging.assign(static_cast<std::size_t>(plan.grad_slots), StagingEntry{});
  run.device_contexts.push_back(c);
}

// What a pipeline holds beside its devices, declared after the rigs: released before them (a device
// transport goes before its backend; the pins before the buffers they pin).
struct PipelineBuffers {
  std::unique_ptr<GradTransport> grad_transport;
  std::optional<StageAccumulators> stage_accums;
  std::vector<HostRegistration> landing_pins;
};

// The gradients' way to the host: the ranks' transport, the stage accumulators or landing buffers,
// the collector's buffer over a link, each pinned; and the ledger's per-stage accumulation state.
void set_gradient_path(Context& ctx, const EngineJob& job, PipelineBuffers& bufs) {
  if (ctx.ranks > 1) {
    bufs.grad_transport = make_grad_transport(job.cfg, *ctx.backend, *ctx.world, job.host->largest_stage_floats());
    ctx.grad_transport = bufs.grad_transport.get();
  }
  // Stage gradients: where a slot's gradient lands on the host (one micro-batch per step), or the two
  // accumulators several micro-batches (or every rank's rounds, at the stage's owner) are summed into:
  // a rank holds none for the stages it does not own.
  if (ctx.stage_gradients && plan::sums_into_stage_accumulators(ctx.plan)) {
    bufs.stage_accums.emplace(plan::stage_accumulator_floats(job.cfg, job.model));
    ctx.stage_accums = &*bufs.stage_accums;
  } else if (ctx.stage_gradients && !ctx.backend->shares_host_memory()) {
    for (int k = 0; k < ctx.plan.grad_slots; ++k)
      ctx.grad_landing.push_back(make_aligned_floats(job.host->largest_stage_floats()));
  }
  // Every other gradient over a link lands in the collector's buffer (one stage at a time).
  if (!job.forward_only && !ctx.backend->shares_host_memory() && ctx.grad_landing.empty())
    ctx.link_buffer = make_aligned_floats(job.host->largest_stage_floats());
  // Pinned for the device-to-host copies (device 0's backend registers them for every GPU); released
  // before the rigs' backends and the context's buffers.
  const std::size_t stage_bytes = job.host->largest_stage_floats() * sizeof(float);
  for (const AlignedFloats& l : ctx.grad_landing)
    bufs.landing_pins.emplace_back(*ctx.backend, l.get(), stage_bytes, "a stage gradient landing buffer");
  if (ctx.link_buffer)
    bufs.landing_pins.emplace_back(*ctx.backend, ctx.link_buffer.get(), stage_bytes, "the collector's gradient buffer");
  RunLedger& led = ctx.ledger;
  led.accum_step.assign(static_cast<std::size_t>(ctx.plan.stages), -1);
  led.accum_count.assign(static_cast<std::size_t>(ctx.plan.stages), 0);
  led.sumsq.assign(static_cast<std::size_t>(ctx.plan.stages), 0.0);
}

// Spawns the node over the run's context and waits until it is done.
void run_node(caf::actor_system& sys, Context& ctx, const EngineJob& job, EngineResult& result) {
  // This thread's OpenMP workers (initialisation, the bf16 copies, a planner's measurements) would
  // count against the cores compute's team spins on (release_thread_pool in kernels/cpu/ops.hpp).
  cpu::release_thread_pool();
  ctx.t0 = Clock::now();
  for (Context* c : ctx.device_contexts) {
    c->t0 = ctx.t0;
    if (job.record_intervals) c->intervals.enable(ctx.t0);
  }
  publish_pipeline_start(ctx);
  caf::scoped_actor waiter{sys};
  auto node = spawn_node(sys, &ctx, &result);
  waiter->monitor(node);
  waiter->receive([](const caf::down_msg&) {});
}

// After the node: the moments' last write-behinds, the devices' figures, the steps done.
void collect_result(EngineResult& result, Context& ctx, const EngineJob& job, std::vector<DeviceRig>& rigs,
                    const PipelineBuffers& bufs) {
  result.wall_s = seconds_between(ctx.t0, Clock::now());
  // The moments' last write-behinds: a failure here is the run's error (the last checkpoint holds
  // the consistent state).
  try {
    job.host->moments().flush();
  } catch (const std::exception& e) {
    if (result.error.empty()) result.error = e.what();
  }
  for (DeviceRig& rig : rigs) rig.backend->wait_link_idle();
  if (bufs.grad_transport) {
    result.grad_transport = bufs.grad_transport->name();
    result.grad_transport_bytes = bufs.grad_transport->bytes_sent();
  }
  result.arena = rigs[0].arena->usage();
  for (std::size_t d = 0; d < rigs.size(); ++d) {
    Context* c = ctx.device_contexts[d];
    result.device_arenas.push_back(rigs[d].arena->usage());
    add_link(result.link, rigs[d].backend->link_stats());
    result.slot_reuses += c->slot_reuses.load();
    auto iv = c->intervals.take();
    result.intervals.insert(result.intervals.end(), iv.begin(), iv.end());
  }
  if (rigs.size() > 1)
    std::sort(result.intervals.begin(), result.intervals.end(),
              [](const BusyInterval& x, const BusyInterval& y) { return x.t0 < y.t0; });
  result.checkpoint_wait_s = ctx.gate.waited_s();
  result.checkpoint_copied_bytes = ctx.gate.copied_bytes();
  result.checkpoint_copy_s = ctx.gate.copy_seconds();
  std::uint64_t v = ~std::uint64_t{0};
  for (std::int64_t s = 0; s < ctx.plan.stages; ++s) v = std::min(v, job.host->tile(s).version());
  result.steps_done = static_cast<std::int64_t>(v);
}

// One pipeline: the actors over [job.first_step, end) of training, or one evaluation pass.
EngineResult run_pipeline(caf::actor_system& sys, EngineJob& job, monitor::Monitor& mon) {
  FaultPlan on_demand_faults;  // no test plan: still the target of the monitor's /control/fault
  const std::unique_ptr<Context> ctx = pipeline_context(job, mon, &on_demand_faults);
  join_ranks(*ctx, job);
  std::vector<DeviceRig> rigs(static_cast<std::size_t>(ctx->devices));
  for (int d = 0; d < ctx->devices; ++d) build_rig(rigs[static_cast<std::size_t>(d)], *ctx, job, d);
  PipelineBuffers bufs;
  set_gradient_path(*ctx, job, bufs);
  EngineResult result;
  run_node(sys, *ctx, job, result);
  collect_result(result, *ctx, job, rigs, bufs);
  return result;
}

// Folds a segment's result into the run's.
void append(EngineResult& total, EngineResult&& part) {
  total.steps_done = part.steps_done;
  total.stopped_early = total.stopped_early || part.stopped_early;
  total.stop_requested = total.stop_requested || part.stop_requested;
  total.steps.insert(total.steps.end(), part.steps.begin(), part.steps.end());
  total.restarts += part.restarts;
  total.restart_log.insert(total.restart_log.end(), part.restart_log.begin(), part.restart_log.end());
  total.arena.budget_bytes = part.arena.budget_bytes;
  total.arena.capacity_bytes = part.arena.capacity_bytes;
  total.arena.in_use_bytes = part.arena.in_use_bytes;
  total.arena.peak_bytes = std::max(total.arena.peak_bytes, part.arena.peak_bytes);
  // Per device (an evaluation pass runs on device 0 only).
  if (total.device_arenas.size() < part.device_arenas.size()) total.device_arenas.resize(part.device_arenas.size());
  for (std::size_t d = 0; d < part.device_arenas.size(); ++d) {
    const std::size_t peak = std::max(total.device_arenas[d].peak_bytes, part.device_arenas[d].peak_bytes);
    total.device_arenas[d] = part.device_arenas[d];
    total.device_arenas[d].peak_bytes = peak;
  }
  add_link(total.link, part.link);
  total.slot_reuses += part.slot_reuses;
  total.intervals.insert(total.intervals.end(), part.intervals.begin(), part.intervals.end());
  total.wall_s += part.wall_s;
  if (total.error.empty()) total.error = part.error;
  total.checkpoints.insert(total.checkpoints.end(), part.checkpoints.begin(), part.checkpoints.end());
  total.checkpoint_wait_s += part.checkpoint_wait_s;
  total.evaluations.insert(total.evaluations.end(), part.evaluations.begin(), part.evaluations.end());
}

// The run's monitor (one for the whole run, whatever its segments): the board exists for every run
// (the actors publish to it); the endpoint is served when monitor.enabled.
std::unique_ptr<monitor::Monitor> start_monitor(const EngineJob& job) {
  const EnginePlan& plan = *job.plan;
  auto mon = std::make_unique<monitor::Monitor>(job.cfg.monitor,
                                                job.monitor_dir.empty() ? job.cfg.train.output_dir : job.monitor_dir);
  monitor::RunInfo info;
  info.model = model_description(job.cfg, job.model);
  info.arch = arch_name(job.model.arch);
  info.params = total_param_count(job.model);
  info.layers = job.model.num_hidden_layers;
  info.max_steps = std::max(job.first_step, job.cfg.train.max_steps);
  info.batch = plan.batch;
  info.seq = plan.seq;
  info.micro_batches = plan.micro_batches;
  info.backend = job.cfg.device.backend;
  info.kernel_choices = job.kernel_choices.is_object() ? job.kernel_choices : nlohmann::json::object();
  info.bf16 = job.cfg.precision() == Precision::bf16;
  info.output_dir = job.cfg.train.output_dir;
  info.pid = static_cast<long>(::getpid());
  info.tokens_per_step = plan.batch * plan.seq * plan.micro_batches;
  mon->board().set_run_info(info);
  mon->board().set_devices(plan.devices);
  mon->board().update([&](monitor::RunFigures& f) {
    f.first_step = f.step = job.first_step;
    f.arena_budget = plan.arena.budget_bytes;
  });
  // The events a person looks for after the fact go to log.events_jsonl too (the node binary writes
  // the checkpoint events there itself).
  if (job.cfg.monitor.enabled && job.monitor_dir.empty()) {  // rank 0's run directory only
    const std::filesystem::path events = job.cfg.events_jsonl_path();
    std::error_code ec;
    if (events.has_parent_path()) std::filesystem::create_directories(events.parent_path(), ec);
    mon->events().mirror_to(
        events.string(), {"actor_failed", "actor_restarted", "paused", "resumed", "stopping", "control", "watchdog"});
  }
  mon->start();
  return mon;
}

// The end of the whole run on the board and in the events.
void finish_monitor(monitor::Monitor& mon, const EngineResult& result, std::int64_t first_step) {
  mon.board().update([&](monitor::RunFigures& f) {
    f.state = result.error.empty() ? monitor::RunState::done : monitor::RunState::failed;
    if (!result.error.empty()) f.last_error = result.error;
  });
  for (const auto& c : mon.board().take_controls())  // posted too late to be carried out
    mon.control_progress(c, "failed", {{"error", "the run ended first"}});
  mon.events().append(
      "stopped", {{"step", result.steps.empty() ? first_step : result.steps.back().step}, {"error", result.error}});
}

EngineResult run_with_evaluation(caf::actor_system& sys, EngineJob& job, monitor::Monitor& mon);

}  // namespace

EngineResult run_engine(caf::actor_system& sys, EngineJob job) {
  if (job.host == nullptr || job.data == nullptr)
    throw std::invalid_argument("run_engine: host model and data source are required");
  // A job built by hand (tests, benchmarks) is planned here, once: bad input fails before anything
  // listens.
  if (!job.plan) job.plan = plan::plan_engine(job.cfg, job.model);
  plan::check_placements(*job.plan);  // a plan built by hand, too
  const std::unique_ptr<monitor::Monitor> mon = start_monitor(job);
  EngineResult result = job.eval_data == nullptr || job.eval_batches <= 0 ? run_pipeline(sys, job, *mon)
                                                                          : run_with_evaluation(sys, job, *mon);
  explain_tier_failure(result, *job.host, job.first_step);  // names the newest checkpoint (tier_failure.hpp)
  finish_monitor(*mon, result, job.first_step);
  return result;
}

namespace {

EngineResult run_with_evaluation(caf::actor_system& sys, EngineJob& job, monitor::Monitor& mon) {
  // Training segments cut at the evaluation points, each followed by a forward-only pass over the
  // evaluation batches with the weights as they are then.
  const std::int64_t max_steps = std::max(job.first_step, job.cfg.train.max_steps);
  const std::int64_t end = job.stop_after >= 0 ? std::clamp(job.stop_after, job.first_step, max_steps) : max_steps;
  const std::int64_t every = job.cfg.train.eval_steps;
  auto due = [&](std::int64_t s) { return (every > 0 && s > 0 && s % every == 0) || s == max_steps; };
  auto done = [&](std::int64_t s) {
    for (const auto& e : job.evaluations)
      if (e.step == s) return true;
    return false;
  };
  auto stop_requested = [&] { return job.stop != nullptr && job.stop->load(); };
  const bool at_end = job.checkpoint.at_end;
  // A checkpoint of version s is due (save_steps, or the end of this run). At an evaluation point the
  // evaluation pass writes it, after the evaluation, so its run state holds it (a resume does not
  // evaluate the same weights again).
  auto checkpoint_due = [&](std::int64_t s) {
    return (job.checkpoint.save_steps > 0 && s % job.checkpoint.save_steps == 0) || (at_end && s == end);
  };
  EngineResult total;
  std::int64_t step = job.first_step;
  while (true) {
    if (due(step) && !done(step) && step <= end) {
      EngineJob pass = job;
      pass.forward_only = true;
      pass.run_data = job.data;
      pass.data = job.eval_data;
      pass.first_step = step;
      pass.on_step = nullptr;
      pass.record_intervals = false;
      pass.checkpoint.at_end = checkpoint_due(step) && step > job.first_step;
      EngineResult r = run_pipeline(sys, pass, mon);  // the node reports it (on_eval) and adds it to pass.evaluations
      job.evaluations = pass.evaluations;
      append(total, std::move(r));
      if (!total.error.empty() || total.stop_requested) break;
    }
    if (step >= end || stop_requested() || total.stop_requested) break;
    std::int64_t next = end;
    if (every > 0) next = std::min(end, (step / every + 1) * every);
    EngineJob segment = job;
    segment.first_step = step;
    segment.stop_after = next;
    // The last segment writes the end-of-run checkpoint unless a final evaluation follows (it writes it).
    const bool eval_follows = due(next) && !done(next);
    segment.checkpoint.at_end = at_end && next == end && !eval_follows;
    if (eval_follows && checkpoint_due(next)) segment.checkpoint.deferred_step = next;
    EngineResult r = run_pipeline(sys, segment, mon);
    const bool stopped = r.stopped_early;
    append(total, std::move(r));
    step = total.steps_done;
    if (!total.error.empty() || stopped) break;
  }
  return total;
}

}  // namespace

}  // namespace mt::actors
