// Internal: what every actor of one run shares by pointer, and the run ledger, the durable record of
// how far the pipeline got. No CAF here.
//
// Restart design: an actor holds nothing that cannot be rebuilt. The tiles (params, gradient
// accumulators, moments, versions) live in HostModel; activations, the backward's dx and gradient
// staging live in the DeviceArena; the ledger records which of them are valid (compute's position in
// the schedule, which staging slot holds which stage's gradients, how many micro-batches each stage's
// accumulator holds, each stage's sum of squares, the losses). Each field has one writer actor; the
// node's supervisor reads the ledger only while every actor is quiescent (after the reset barrier),
// and re-issues the in-flight work from it.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "actors/checkpoint_gate.hpp"
#include "actors/engine.hpp"
#include "actors/schedule.hpp"
#include "actors/stage_accumulators.hpp"
#include "cluster/world.hpp"
#include "device/backend.hpp"
#include "device/grad_transport.hpp"
#include "kernels/tile.hpp"
#include "storage/host/host_boundaries.hpp"

namespace mt::monitor {
class Monitor;
}
namespace mt::cluster {
class World;
}

namespace mt::actors {

struct StagingEntry {
  enum class State { free, filling, full };
  State state = State::free;
  std::int64_t step = -1, micro_batch = -1, stage = -1;
};

// Boundaries on the host: what a forward ring entry holds that is still being copied to the host
// (boundary -1: nothing pending). Compute overwrites the entry only once that copy has landed.
struct RingEntry {
  int set = 0;
  std::int64_t boundary = -1;
  std::uint64_t stamp = 0;
};

struct MbLoss {
  double loss_sum = 0.0;
  std::int64_t counted = 0;
};

// The load-balancing loss (ModelConfig::output_router_logits) of one micro-batch: each layer's statistics
// from its forward (empty for a dense layer; a forward that runs again overwrites its own), and the
// gradient the head made of them for the layers' backward.
struct MbBalance {
  std::vector<std::vector<std::int64_t>> counts;  // per layer
  std::vector<std::vector<float>> prob_sums;      // per layer
  std::vector<float> grad;
};

struct RunLedger {
  // --- written by compute -----------------------------------------------------------------------
  Pos compute_pos;                                     // the next op to run; advanced only after an op is done
  int dx_current = 0;                                  // which dx buffer holds d(loss)/d(input of the next backward op)
  std::vector<StagingEntry> staging;                   // per gradient staging slot
  std::vector<RingEntry> ring;                         // boundaries on the host: per forward ring entry
  std::map<std::int64_t, std::vector<MbLoss>> losses;  // step -> the micro-batches done, in order
  std::map<std::pair<std::int64_t, std::int64_t>, MbBalance> balance;  // (step, data micro-batch)
  // --- written by the collector -------------------------------------------------------------------
  std::vector<std::int64_t> accum_step;   // per stage: the step its accumulator holds
  std::vector<std::int64_t> accum_count;  // per stage: micro-batches of accum_step accumulated
  std::vector<double> sumsq;              // per stage: sum of squares once complete
  // --- written by the optimizer -------------------------------------------------------------------
  // Several ranks: every rank's losses of a step, by global micro-batch, once gathered (a collective
  // runs once per step on every rank, so a respawned optimizer takes them from here, not again).
  std::map<std::int64_t, std::map<std::int64_t, MbLoss>> gathered_losses;
};

// Busy-interval recorder for overlap measurements (only when enabled).
class IntervalLog {
 public:
  void enable(std::chrono::steady_clock::time_point t0) {
    enabled_ = true;
    t0_ = t0;
  }
  bool enabled() const { return enabled_; }
  void add(Role r, std::int64_t step, std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b,
           int phase = -1) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    log_.push_back(BusyInterval{r, step, std::chrono::duration<double>(a - t0_).count(),
                                std::chrono::duration<double>(b - t0_).count(), phase});
  }
  std::vector<BusyInterval> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(log_);
  }

 private:
  bool enabled_ = false;
  std::chrono::steady_clock::time_point t0_;
  std::mutex mutex_;
  std::vector<BusyInterval> log_;
};

// The run-wide state: set by run_pipeline on device 0's context before any actor starts, read-only
// after. Devices 1..N-1 take it whole (share_run), so a field added here reaches every device.
struct RunShared {
  int devices = 1;
  // Several ranks (mpirun; cluster/grad_reduce.hpp): rank r's pipeline runs local micro-batches m of
  // global index m * ranks + r (one device per rank); `world` carries the transfers (null: alone).
  int rank = 0;
  int ranks = 1;
  cluster::World* world = nullptr;
  // train.gradient_buffer=stage (one device): no gradient accumulator in the tiles. With one
  // micro-batch per step each stage's gradient waits in its staging slot (or, over a link, the slot's
  // landing buffer on the host) until the optimizer has used it; with several (layer-major), or with
  // several ranks (the host state sharded: at each stage's owner, every rank's round in rank order),
  // they are summed into one of the two stage accumulators. With clipping a step runs `passes` = 2 passes over
  // its micro-batches: schedule micro-batch p * M + m is pass p of data micro-batch m (the first pass
  // only sums squares, the second updates each stage as its gradient completes, with the first
  // pass's clip factor).
  bool stage_gradients = false;
  int passes = 1;
  EngineJob* job = nullptr;
  const TrainConfig* cfg = nullptr;
  const ModelConfig* model = nullptr;
  EnginePlan plan;
  HostModel* host = nullptr;
  BatchSource* data = nullptr;      // the micro-batches this pipeline runs (an evaluation pass: validation)
  BatchSource* run_data = nullptr;  // the training data (its cursor goes into checkpoints' run state)
  const std::vector<EvalRecord>* evaluations = nullptr;  // done so far (checkpoints' run state)
  FaultPlan* fault = nullptr;
  Schedule sched;                    // the order of every step's ops
  std::vector<ParamLayout> layouts;  // per stage
  std::int64_t first_step = 0;
  std::int64_t end_step = 0;      // exclusive (the actors lower their own copies on a stop request)
  std::int64_t cfg_end_step = 0;  // the run's planned end (before any stop request)
  int optimizer_threads = 1;      // the optimizer's team, and the collector's (config/thread_budget.cpp)
  float max_grad_norm = 0.0f;
  bool serial = false;
  bool checkpointing = false;  // job->checkpoint.root is set
  // The host state sharded (cluster.shard_state): the ranks whose checkpointers write each checkpoint
  // together (rank 0 writes every stage, receiving the moments of the stages it does not own from their
  // owners on the checkpoint channel); set for evaluation passes too, which checkpoint as well. Null:
  // this process holds every stage's state.
  cluster::World* shard_world = nullptr;
  // The monitor (always set by run_engine; its endpoint only when monitor.enabled): actors publish
  // their handler and last unit of work to its board; the node its figures and events.
  monitor::Monitor* monitor = nullptr;
};

struct Context : RunShared {
  // Several devices (device.gpus = N): every device has a Context of its own for its compute actor
  // and prefetcher (its backend, arena, carved buffers, the compute part of the ledger, its schedule
  // of device_micro_batches local micro-batches); device 0's is the run's context, the one the loader,
  // collector, optimizer, checkpointer and node use. Local micro-batch m of device d is the step's
  // global micro-batch m * N + d (data, losses, fault points); gradients are reduced per round m.
  int device = 0;
  Context* run = this;                    // device 0's context (the run's shared state: gate, ...)
  std::vector<Context*> device_contexts;  // the run's context only: every device's, [0] = this
  // Several ranks (mpirun; cluster/grad_reduce.hpp): `grad_transport` carries the gradients to their
  // owners (MPI from host copies, or NCCL from the devices; made by run_pipeline, outliving every actor).
  GradTransport* grad_transport = nullptr;
  std::vector<AlignedFloats> grad_landing;  // one micro-batch over a link: per staging slot (collector writes)
  AlignedFloats link_buffer;  // else over a link: the collector's landing for one stage (the engine pins it)
  StageAccumulators* stage_accums = nullptr;  // several micro-batches or ranks (the run's; made by run_pipeline)
  // A schedule micro-batch (one per pass and local micro-batch) -> its pass, and the local micro-batch
  // of data it runs (every pass runs the same data).
  std::int64_t data_micro_batches() const { return sched.micro_batches() / passes; }
  std::int64_t pass_of(std::int64_t local) const { return local / data_micro_batches(); }
  bool last_pass(std::int64_t local) const { return pass_of(local) + 1 == passes; }
  std::int64_t data_local(std::int64_t local) const { return local % data_micro_batches(); }
  // The global index of the data a schedule micro-batch runs (losses, the loader, data positions).
  std::int64_t global_micro_batch(std::int64_t local) const {
    return (data_local(local) * ranks + rank) * devices + device;
  }
  // Where a unit of work is in the step, counting passes (fault points, the monitor): the global data
  // index, plus the step's micro-batches per earlier pass (equal to global_micro_batch with one pass).
  std::int64_t work_micro_batch(std::int64_t local) const {
    return pass_of(local) * step_micro_batches() + global_micro_batch(local);
  }
  std::int64_t local_micro_batch(std::int64_t global) const {
    return global / (static_cast<std::int64_t>(devices) * ranks);
  }
  // Micro-batches of one step over every device and rank (the data cursor advances by this per step).
  std::int64_t step_micro_batches() const { return data_micro_batches() * devices * ranks; }
  Context* device_context(int d) {
    return device_contexts.empty() ? this : device_contexts[static_cast<std::size_t>(d)];
  }

  Backend* backend = nullptr;    // every touch of device memory: copies, fills, stage operations
  DeviceArena* arena = nullptr;  // the backend's memory, carved and accounted (slot states, peak)
  RunLedger ledger;
  IntervalLog intervals;
  // Host threads granted now (threads.adapt_to_load): fewer while other processes take this run's
  // cores (the run controller measures, device/cpu/core_share.hpp); 0 = as planned. Compute and the
  // optimizer apply it between units of work; results do not depend on it.
  std::atomic<int> threads_granted{0};
  int granted(int planned) const {
    const int g = run->threads_granted.load(std::memory_order_relaxed);
    return g > 0 && g < planned ? g : planned;
  }
  // Several ranks: a stop (signal, /control/stop) is agreed, not taken alone. The run controller sets
  // stop_wanted; each step's loss gather carries every rank's, and the first gather that finds one
  // sets agreed_end = its step + 2 on every rank alike (no rank can have begun that step yet: it needs
  // weights the next step's update publishes after that step's gather). Compute ends there, and the
  // controller lowers every actor's end to it.
  std::atomic<bool> stop_wanted{false};
  std::atomic<std::int64_t> agreed_end{std::numeric_limits<std::int64_t>::max()};
  // The same for a checkpoint request (SIGUSR1, the monitor, train.save_minutes on rank 0) with the
  // host state sharded: every rank's checkpointer takes part in each checkpoint, so every rank must
  // decide it at the same step. The optimizer sets checkpoint_wanted; the gather that carries it sets
  // checkpoint_agreed_step = its step on every rank, and each optimizer's decision of that step takes it.
  std::atomic<bool> checkpoint_wanted{false};
  std::atomic<std::int64_t> checkpoint_agreed_step{-1};
  // Several ranks: each actor's busy seconds at the last loss gather (its share of the step, in the
  // status every rank gathers; written only on the optimizer's thread).
  double busy_at_gather[8] = {};  // by monitor::ActorId (rank_losses.cpp checks the size)
  std::atomic<std::int64_t> slot_reuses{0};
  std::chrono::steady_clock::time_point h2d_last_end;  // written only by the copy engine's host-to-device worker  //
                                                       // loads served by a resident slot (no copy)
  std::chrono::steady_clock::time_point t0;
  // Checkpoints.
  bool state_part() const { return shard_world != nullptr && shard_world->rank() > 0; }
  CheckpointGate gate;

  // Carved from the arena's activation region. Boundaries on the device: per activation set (one per
  // in-flight micro-batch, Schedule::activation_set), L + 1 boundaries: acts[set][i] = input of stage
  // i + 1; keep mode also every layer's intermediates, saved[set][layer - 1].
  std::vector<std::vector<float*>> acts;
  std::vector<std::vector<float*>> saved;
  // Boundaries on the host (host_acts set): the forward writes boundary i into ring[i % ring.size()]
  // and copies boundaries 0..L-1 to host_acts; a layer's backward gets its input streamed back into an
  // activation slot (as the op's second load).
  HostBoundaries* host_acts = nullptr;
  std::vector<float*> ring;
  std::vector<float*> act_slots;
  float* dx[2] = {nullptr, nullptr};
  // Layer-major (MicroBatchOrder::layer_major): a dx pair per activation set, dx_sets[2 * set + k];
  // with boundaries on the host also each set's boundary L (the head's input), which a second pass
  // reads again.
  std::vector<float*> dx_sets;
  std::vector<float*> head_inputs;
  float* workspace = nullptr;
  // KeysValues::mapped (EnginePlan::keys_values): the tiled layers' sequence-sized buffers (keys, values, their
  // gradients) in mapped host memory after the boundaries; null: in the workspace.
  float* sequence = nullptr;
  // AttentionOutputs::kept_mapped (EnginePlan::attention): each layer's attention output and log-sum-exp,
  // kept_attention[set][layer
  // - 1], in mapped host memory after those; empty: the tiled backward runs the attention forward again.
  std::vector<std::vector<float*>> kept_attention;

  // Micro-batch 0's gradients written in place: on a backend that shares host memory, with one device
  // and one rank (several ranks send every micro-batch's gradient from its slot),
  // the stage operation sums them straight into the tile's zero-filled fp32 accumulator (the bits of
  // staging, zeroing and adding). Its staging slot is still claimed, as the bound on gradients in
  // flight, but not written; the collector then has nothing to add. Later micro-batches are staged.
  bool grads_in_place(std::int64_t micro_batch) const {
    return micro_batch == 0 && devices == 1 && ranks == 1 && !stage_gradients && backend->shares_host_memory();
  }

  std::int64_t stages() const { return plan.stages; }
  std::int64_t micro_batches() const { return plan.micro_batches; }
  // The stamp of micro-batch (step, micro_batch)'s boundaries in host_acts: its global index + 1 (a
  // replayed pass reads its first pass's boundaries: their stamp).
  std::uint64_t boundary_stamp(std::int64_t step, std::int64_t micro_batch) const {
    return static_cast<std::uint64_t>(step * sched.micro_batches() + data_local(micro_batch)) + 1;
  }
};

}  // namespace mt::actors
