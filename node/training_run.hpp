// A whole training run as a library call: what `megatrain train` does after parsing its arguments
// (model, data and vocabulary checks, starting weights, resume, JSONL logs, signals, the engine, the
// Hugging Face export), for the node binary and for the Python module alike. No CAF here.
//
// Hooks let an embedding program (the Python binding) replace what the binary reads from files: the
// starting weights (filled stage by stage, e.g. from a torch model), the data source, where the
// messages go, and how a run is stopped; and see every step and the final weights.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "config/train_config.hpp"
#include "storage/host/host_model.hpp"

namespace caf {
class actor_system_config;
}
namespace mt::cluster {
class World;
}

namespace mt::node {

enum class MessageStream { out, err };  // the binary's stdout (progress) and stderr (notes, errors)

struct TrainingHooks {
  // Fills every tile's params of the fresh host model (gradients, moments zero), instead of
  // model.model_name_or_path or the seeded initialisation; returns the config.json text kept in the
  // checkpoints' manifests and the export ("" = none). A resume then loads its checkpoint over it.
  std::function<std::string(HostModel&)> initial_weights;
  // Replaces the shards of data.train_files (the vocabulary check then covers only the tokenizer).
  actors::BatchSource* data = nullptr;
  // Each message line without its newline; default: stdout / stderr, flushed.
  std::function<void(MessageStream, const std::string&)> message;
  // Called once per finished step (after its progress line), on an engine thread.
  std::function<void(const actors::StepRecord&)> on_step;
  // Called once per evaluation (data.validation_files, train.eval_steps), after its progress line.
  std::function<void(const actors::EvalRecord&)> on_eval;
  // Set to stop after the step in progress (a final checkpoint is written). Null: SIGINT and SIGTERM
  // set an internal flag and SIGUSR1 requests a checkpoint, as in the binary.
  const std::atomic<bool>* stop = nullptr;
  // The final weights, before the host model is freed (also when the run stopped early; not after a
  // failure). hf_config: the config.json text of the starting weights ("" = none).
  std::function<void(const HostModel&, const std::string& hf_config)> on_finished;
  // The job's ranks (the node binary under mpirun: cluster/world.hpp), with cfg.cluster.rank / ranks
  // set from it; null = alone. Rank 0 alone prints progress, writes the logs, checkpoints and the export.
  cluster::World* world =
      nullptr;  // Adjusts the checkpointer's job before the run starts: a test harness plants write stalls and
  // failures there (tests/actors/node_with_faults.cpp); the binary and the Python module set none.
  std::function<void(actors::CheckpointJob&)> checkpoint_job;
};

struct TrainingResult {
  int exit_status = 0;          // 0: finished or stopped by the stop flag / a signal; 1: failed
  std::string error;            // exit_status 1: why (the binary prints it after "megatrain: ")
  std::int64_t first_step = 0;  // steps already done when the run began (resume)
  actors::EngineResult engine;  // steps, timings, checkpoints (empty when the run failed before starting)
  double tokens_per_step = 0.0;
  std::string train_jsonl;  // the per-step log written
};

// Runs the validated configuration. `system_config`: the actor system's configuration (the binary's
// NodeConfig); null = a fresh one sized from the thread budget. Never throws for bad input: the
// result carries the error (which was also sent to the message hook's err stream).
TrainingResult run_training(const TrainConfig& cfg, const TrainingHooks& hooks = {},
                            caf::actor_system_config* system_config = nullptr);

// Parses and validates `--section.key=value` arguments (and `--config-file=FILE`) as the binary does,
// into `cfg`; returns "" or the error naming the key or file. CAF's parser without CAF headers here.
// check_files = false checks values only (ranges, choices, combinations), not paths.
std::string parse_train_config(const std::vector<std::string>& args, TrainConfig& cfg, bool check_files = true);

// Every key the binary accepts, "section.key" (e.g. to ask whether this build knows a key).
std::vector<std::string> train_config_keys();

}  // namespace mt::node
