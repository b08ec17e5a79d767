// The streaming engine's entry point: trains a model held in host tiles by running the actor pipeline
// (node supervising loader, prefetcher, compute, gradient collector, optimizer) for cfg.train.max_steps
// steps. This header includes no CAF: tests and tools that only drive the engine compile quickly.
//
// The engine executes a device plan (plan/engine_plan.hpp: plan::plan_engine). The run plans once and
// hands the plan to run_engine in its job (EngineJob::plan); a job without one is planned at
// run_engine's entry, so bad input fails before any actor starts.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/batch_source.hpp"
#include "actors/fault.hpp"
#include "config/train_config.hpp"
#include "device/arena_plan.hpp"
#include "device/backend.hpp"
#include "device/cpu/copy_engine.hpp"
#include "device/device_arena.hpp"
#include "kernels/model_config.hpp"
#include "kernels/stage_api.hpp"
#include "plan/engine_plan.hpp"
#include "storage/host/host_model.hpp"

namespace caf {
class actor_system;
}
namespace mt::cluster {
class World;
}

namespace mt::actors {

using plan::EnginePlan;  // the plan the engine executes

// What a job of several ranks cannot run yet (several devices per rank): ConfigError naming the key. `train` and
// run_engine check it; plan_engine plans such a job anyway
// (`megatrain plan --plan.ranks=N` for a GPU profile).
void check_cluster_runs(const TrainConfig& cfg);

// One line of progress: what `megatrain train` prints and writes as JSONL.
struct StepRecord {
  std::int64_t step = 0;  // 1-based: the update just made
  double loss = 0.0;      // mean over counted tokens of the step
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double clip = 1.0;
  std::int64_t tokens = 0;  // counted tokens of the step
  double tokens_per_s = 0.0;
  double step_s = 0.0;             // wall time since the previous step finished
  double wait_weights_s = 0.0;     // compute idle, waiting for a weight slot to be filled
  double compute_s = 0.0;          // compute busy (forward, head, backward)
  double offload_s = 0.0;          // collector: device-to-host copies and accumulation
  double reduce_s = 0.0;           // several ranks: the collector's time in transfers with other ranks
  double reduce_tail_s = 0.0;      // ... of it, after compute handed over the step's last gradient (not hidden)
  double optimizer_s = 0.0;        // optimizer busy (norm + AdamW of the step)
  double checkpoint_wait_s = 0.0;  // optimizer waited for the checkpointer (version gate) in this step
  std::int64_t restarts = 0;       // actor restarts so far
  // Cores (threads.adapt_to_load, device/cpu/core_share.hpp): the compute threads this step ran with,
  // the cores other processes took over the last measured window, and a note when the count changed.
  int compute_threads = 0;
  double others_cores = 0.0;
  std::string cores_note;
};

// One evaluation (train.eval_steps): the validation loss of the weights after `step` updates, over the
// first eval_max_batches micro-batches of data.validation_files (the same batches every time), run
// forward only through the same streamed pipeline (no gradients, no recomputation, no optimizer).
struct EvalRecord {
  std::int64_t step = 0;     // updates the weights hold
  double loss = 0.0;         // mean over counted tokens of every evaluated micro-batch
  double perplexity = 0.0;   // exp(loss)
  std::int64_t tokens = 0;   // counted tokens
  std::int64_t batches = 0;  // micro-batches evaluated
  double seconds = 0.0;      // wall time of the evaluation pass
};

// Checkpointing of a run (checkpointer.cpp). Stage s of a due checkpoint is written straight from its
// host tile (params, exp_avg, exp_avg_sq; no staging copy) right after the optimizer published the
// due version; the optimizer does not update stage s again before it is written (version gate).
struct CheckpointJob {
  std::string root;             // ROOT of step-N directories + `latest`; "" = no checkpoints
  std::int64_t save_steps = 0;  // every N steps (tile versions that are multiples of N); 0 = none
  bool at_end = true;           // a final checkpoint when the run ends (also after a stop signal)
  int keep_last = 0;            // retention (train.save_total_limit); 0 = keep all
  double save_minutes = 0.0;    // also every T minutes of wall clock; 0 = off
  // true (default): once every stage of the due step is updated (the optimizer's burst is over),
  // write them in stage order while compute runs the next step; false: write stage s as soon as it
  // is updated (competes with the optimizer for the cores; tools/bench/README.md, "checkpoint").
  bool write_after_step = true;
  // Host RAM for copies of stages the optimizer must update before this checkpoint wrote them (copy on
  // write, checkpoint_gate.hpp; train.save_snapshot_mib); 0 = the optimizer waits for the disk.
  std::uint64_t snapshot_budget_bytes = std::uint64_t{1} << 30;
  std::atomic<bool>* request = nullptr;  // set (e.g. by SIGUSR1): checkpoint at the next step boundary
  // A version this pipeline does not write: the evaluation pass that follows writes it (with the
  // evaluation in its run state) rather than the same checkpoint twice. -1 = none.
  std::int64_t deferred_step = -1;
  std::string hf_config_json;  // config.json the model came from (kept in the manifest), "" = none
  // The host state sharded (cluster.shard_state) with cluster.checkpoint_writers resolved to owners:
  // every rank writes its own stages into one temporary directory under `root` (which every rank sees)
  // named with `shared_tag` (rank 0's pid), and rank 0 publishes the checkpoint once every part is
  // durable. false: rank 0 writes every stage (the owners send their state).
  bool owners_write = false;
  std::string shared_tag;
  // Test-only: sleep `stall_seconds` before writing stage `stall_stage` of checkpoint `stall_step`
  // (kill -9 during a checkpoint write; stall measurements). -1 = off.
  std::int64_t stall_step = -1, stall_stage = -1;
  double stall_seconds = 0.0;
  // Test-only: the write of stage `fail_stage` of checkpoint `fail_step` fails (as a full disk would).
  std::int64_t fail_step = -1, fail_stage = -1;
};

// A checkpoint published or failed (EngineJob::on_checkpoint, EngineResult::checkpoints).
struct CheckpointEvent {
  std::int64_t step = 0;
  bool ok = false;
  std::string path;      // published directory (ok)
  std::string error;     // why it failed (!ok); names the file
  double seconds = 0.0;  // CheckpointNow to publish
  std::uint64_t bytes = 0;
  double cpu_seconds = 0.0;  // the checkpointer thread's CPU time for it (CheckpointDone::cpu_seconds)
};

// A busy interval of one actor, for overlap measurements (recorded when EngineJob::record_intervals).
struct BusyInterval {
  Role role = Role::compute;
  std::int64_t step = 0;
  double t0 = 0.0, t1 = 0.0;  // seconds since the engine started
  int phase = -1;             // compute: the op's Phase (forward, head, backward); -1 for the others
};

struct EngineJob {
  TrainConfig cfg;    // validated
  ModelConfig model;  // the resolved model (cfg's [model] keys or a config.json)
  // The run's plan (plan_engine of cfg and model), computed once by the run; empty: run_engine plans
  // the job at its entry. Every pipeline of the run uses it (an evaluation pass without kept attention).
  std::optional<EnginePlan> plan;
  BatchSource* data = nullptr;                     // micro-batches by global index
  HostModel* host = nullptr;                       // initialised tiles; versions say how many updates they hold
  std::int64_t first_step = 0;                     // steps already done (tile versions must equal it)
  FaultPlan* fault = nullptr;                      // test-only crash injection
  const std::atomic<bool>* stop = nullptr;         // set (e.g. by SIGINT) to stop after the step in progress
  std::function<void(const StepRecord&)> on_step;  // called once per finished step, in step order
  bool record_intervals = false;
  // Ends the run after this many total steps (< cfg.train.max_steps); the LR schedule still uses
  // max_steps, so a later resume continues the same run. -1 = max_steps.
  std::int64_t stop_after = -1;
  CheckpointJob checkpoint;
  std::function<void(const CheckpointEvent&)> on_checkpoint;  // node thread, as each one ends
  // Non-overlapped schedule (benchmarks): each stage's weights are streamed only when compute asks,
  // and the next step waits for the optimizer. Same results, no overlap.
  bool serial_schedule = false;
  // Evaluation: with eval_data set, the weights are evaluated after every cfg.train.eval_steps steps
  // and after the last step (cfg.train.max_steps), on micro-batches 0..eval_batches-1 of eval_data.
  // The run is then cut into training segments and evaluation passes (each its own pipeline: the
  // optimizer's last update of a segment is not overlapped with the next segment's forward).
  BatchSource* eval_data = nullptr;
  std::int64_t eval_batches = 0;
  std::function<void(const EvalRecord&)> on_eval;  // as each evaluation ends
  std::vector<EvalRecord> evaluations;             // done before this run (a checkpoint's run state)
  // Internal to run_engine's evaluation passes: forward-only ops over `data`; the run state's data
  // cursor comes from `run_data` (the training data).
  bool forward_only = false;
  BatchSource* run_data = nullptr;
  // The run's kernel choices and why (plan/kernel_choice.hpp), shown in the monitor's /status; {} = none
  // made (the kernels' defaults).
  nlohmann::json kernel_choices = nlohmann::json::object();
  // The job's ranks (mpirun), when cfg.cluster.ranks > 1: every rank runs this job on its own
  // micro-batches and the collector sums each stage's gradients across them. null = alone.
  cluster::World* world = nullptr;
  // Where the monitor writes monitor.json, its token and audit log; empty = cfg.train.output_dir. A
  // rank other than 0 serves its own monitor from <output_dir>/rank-R (the run directory is rank 0's).
  std::string monitor_dir;
};

struct EngineResult {
  std::int64_t steps_done = 0;  // tile versions at the end
  bool stopped_early = false;   // by the stop flag
  bool stop_requested = false;  // the monitor's /control/stop (the run ends after what is in progress)
  std::vector<StepRecord> steps;
  std::int64_t restarts = 0;
  std::vector<std::string> restart_log;   // "compute crashed (...) at ..., restarted"
  ArenaUsage arena;                       // device 0's
  std::vector<ArenaUsage> device_arenas;  // each device's (device.gpus), [0] = arena
  LinkStats link;                // summed over the devices                // bytes and copies per link direction
  std::int64_t slot_reuses = 0;  // weight loads served by a still-resident slot (no copy)
  std::vector<BusyInterval> intervals;
  double wall_s = 0.0;
  std::string error;  // non-empty: the run failed (an unrecoverable error)
  std::vector<CheckpointEvent> checkpoints;
  double checkpoint_wait_s = 0.0;             // total time the optimizer waited on the version gate
  std::uint64_t checkpoint_copied_bytes = 0;  // stages it copied aside instead (copy on write)
  double checkpoint_copy_s = 0.0;             // the optimizer's time copying them
  std::vector<EvalRecord> evaluations;        // this run's evaluations, in step order
  // Several ranks: the transport of the rounds' gradients ("mpi", "nccl": device/grad_transport.hpp) and
  // the bytes it sent itself (NCCL's; MPI's are the World's, counted per channel).
  std::string grad_transport;
  std::uint64_t grad_transport_bytes = 0;
};

// The evaluation records as a checkpoint's run state keeps them, and back.
nlohmann::json evaluations_json(const std::vector<EvalRecord>& evals);
std::vector<EvalRecord> evaluations_from_json(const nlohmann::json& j);

// Where the run keeps its Adam moments: nullptr = in the tiles (the default), else a staged store
// (storage/offload): compressed in RAM, or files in train.offload_dir; with the host state sharded it
// holds this rank's own stages only (moment_store_options). Pass it to HostModel with
// host_tile_options(cfg) and host_owned_stages(cfg, model).
std::unique_ptr<MomentStore> moment_store_for(const TrainConfig& cfg, const ModelConfig& model);

// Deterministic initialisation of every tile's params (init_stage_params per stage, the reference
// trainer's seeding); gradients and moments zero, versions 0.
void init_host_model(HostModel& host, std::uint64_t seed);

// Runs the job on a fresh actor system sized from the thread budget.
EngineResult run_engine(EngineJob job);
// Runs the job on the caller's actor system (the node binary's, configured by NodeConfig).
EngineResult run_engine(caf::actor_system& sys, EngineJob job);

}  // namespace mt::actors
