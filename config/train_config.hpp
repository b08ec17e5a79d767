// Everything a training run is configured with, as plain values (no CAF here: kernels, storage and
// their tests include this without compiling CAF). A member's initialiser is its key's default; the key
// itself (name, help, range or choices) is described in config/keys.cpp, from which node_config binds it
// to CAF. Names follow Hugging Face TrainingArguments where one exists; command line: --section.key=value.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/model_config.hpp"
#include "kernels/precision.hpp"

namespace mt {

// Thrown by validate(): what() names the key ("train.learning_rate") and the bad value.
class ConfigError : public std::invalid_argument {
 public:
  ConfigError(const std::string& key, const std::string& message)
      : std::invalid_argument(key + ": " + message), key_(key) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

struct TrainSection {                  // [train]
  std::string output_dir = "run/out";  // logs, checkpoints, final model
  std::int64_t per_device_train_batch_size = 4;
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t max_steps = 100;              // optimizer steps
  double learning_rate = 3e-4;               // peak
  std::string lr_scheduler_type = "cosine";  // constant | linear | cosine (each after warmup)
  std::int64_t warmup_steps = 0;             // linear 0 -> learning_rate over these steps
  double min_lr_ratio = 0.0;                 // decay floor as a fraction of learning_rate
  double weight_decay = 0.0;                 // AdamW, on matrices only
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;  // global-norm clipping; 0 = off
  bool bf16 = false;           // bf16 compute with fp32 masters (Hugging Face's TrainingArguments.bf16)
  bool tf32 = false;           // CUDA, fp32 compute: TF32 tensor-core products (TrainingArguments.tf32)
  std::int64_t seed = 42;
  std::string optimizer_compression = "none";  // none | lossless | int8 (block-wise, lossy)
  std::string offload_dir;                     // NVMe tier for the Adam moments; "" = none (host RAM)
  std::int64_t offload_staging_stages = 4;     // moments outside the tiles: stages staged in RAM (>= 3)
  std::int64_t offload_io_threads = 4;         // NVMe tier: 1 MiB chunks in flight per transfer
  bool offload_params = false;                 // the fp32 masters on the NVMe tier too (needs offload_dir and bf16)
  std::string master_weights = "auto";         // bf16: fp32 (a master beside the copy) | split (the copy + low halves)
  std::string gradient_buffer = "auto";        // model (an fp32 accumulator per stage) | stage (staging slots only)
  std::int64_t save_steps = 0;                 // checkpoint every N steps; 0 = only at the end
  std::int64_t save_total_limit = 2;           // keep-last-N checkpoints; 0 = keep all
  std::string resume_from_checkpoint;          // checkpoint dir, "latest", or "" (start fresh)
  std::string resume_fallback = "none";        // none | previous_good: a damaged checkpoint is an error / skipped
  double save_minutes = 0.0;                   // also checkpoint every T minutes (wall clock); 0 = off
  std::int64_t save_snapshot_mib = 1024;       // RAM for stages copied aside for a checkpoint; 0 = wait
  std::int64_t stop_after_steps =
      0;                      // end this invocation after N total steps (schedule still uses max_steps); 0 = max_steps
  std::string export_hf_dir;  // write the final weights as a Hugging Face directory here; "" = no export
  // Evaluation on data.validation_files (when set): every eval_steps steps and at the end of the run.
  std::int64_t eval_steps = 0;         // evaluate after every N steps; 0 = only at the end
  std::int64_t eval_max_batches = 16;  // micro-batches per evaluation (the first N of the validation data)
};

struct ModelSection {              // [model]
  std::string config_file;         // a Hugging Face config.json (or its directory); "" = the keys below
  std::string model_name_or_path;  // a Hugging Face model directory to start from (config + weights)
  std::string arch = "llama";  // llama | qwen2 | qwen3 | mistral | gpt2 | mixtral | qwen3_moe | gpt_oss (HF model_type)
  std::int64_t hidden_size = 384;
  std::int64_t layers = 8;                 // num_hidden_layers
  std::int64_t heads = 6;                  // num_attention_heads
  std::int64_t kv_heads = 0;               // num_key_value_heads; 0 = heads
  std::int64_t head_dim = 0;               // 0 = hidden_size / heads
  std::int64_t intermediate_size = 1024;   // dense MLP width (mixtral: each expert's)
  std::int64_t num_experts = 0;            // mixtral / qwen3_moe: experts per layer; 0 = 8
  std::int64_t num_experts_per_tok = 2;    // top-k
  std::int64_t moe_intermediate_size = 0;  // qwen3_moe: each expert's width; 0 = intermediate_size
  bool norm_topk_prob = false;             // qwen3_moe: renormalise the top-k weights (mixtral always does)
  std::int64_t decoder_sparse_step = 1;    // qwen3_moe: every step-th layer has experts
  std::string mlp_only_layers;             // qwen3_moe: comma-separated layers with a dense MLP ("0,5")
  bool output_router_logits = false;       // MoE: add the load-balancing loss (transformers' aux loss)
  double router_aux_loss_coef = 0.0;       // its coefficient; 0 = the family's default (mixtral 0.001, qwen3_moe
                                           // 0.001, gpt_oss 0.9)
  std::int64_t sliding_window = 0;  // gpt_oss: the even layers' window (0 = 128); mistral, mixtral: every layer's
  std::int64_t vocab_size = 4096;
  std::int64_t max_position_embeddings = 1024;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;  // rms_norm_eps / layer_norm_epsilon
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
};

struct DataSection {                                      // [data]
  std::string train_files = "run/demo-data/train_*.bin";  // glob of llm.c token shards
  std::string validation_files;                           // glob; "" = no evaluation
  std::string tokenizer_file;     // tokenizer.json; "" = none (vocab checked against the shards)
  std::int64_t seq_length = 256;  // tokens per sequence
  std::string packing = "auto";   // auto | stream | documents (data/loader.hpp; auto resolved by the run)
};

struct DeviceSection {                      // [device]
  std::string backend = "cpu";              // cpu | cuda
  double max_vram_gb = 1.0;                 // device budget in GiB (the CPU arena); fractions for small ones
  std::int64_t weight_slots = 0;            // K >= 2 streamed weight slots; 0 = auto (see plan_engine)
  std::int64_t grad_slots = 0;              // gradient staging slots; 0 = auto
  std::string keep_intermediates = "auto";  // auto | boundary | boundary_host | boundary_mapped | all | all_mapped
  std::int64_t prefetch_depth = 0;          // stages streamed ahead; 0 = weight_slots - 1
  std::string schedule = "interleaved";     // interleaved | sequential (see MicroBatchOrder)
  std::int64_t gpus = 1;                    // devices of this node on one schedule (each its own micro-batches)
  std::int64_t seq_tile = 0;                // tokens per sequence tile (long context); 0 = auto (see plan_engine)
  std::string attention_kv = "auto";        // auto | device | host: where tiles keep attention's keys and values
  // Not a key: a modelled link on the CPU backend, GB/s (1e9) per direction; 0 = none (the arena is host
  // memory, weights mapped). The planner sets it to a GPU profile's link (plan_as_gpu); benchmarks and
  // tests set it through the C++ API (the test node binary: --test.copy_bandwidth_gbps). Switches the
  // CPU backend to copies.
  double copy_bandwidth_gbps = 0.0;
};

struct ThreadsSection {        // [threads]; 0 = derived from total (see ThreadBudget)
  std::int64_t total = 0;      // the budget; 0 = the machine's hardware threads
  std::int64_t blas = 0;       // OpenBLAS / compute kernels
  std::int64_t optimizer = 0;  // AdamW pool
  std::int64_t copy = 0;       // copy engine workers (1 or 2)
  std::int64_t scheduler = 0;  // CAF scheduler
  bool adapt_to_load = true;   // fewer host threads while other processes take this run's cores
};

struct LogSection {                // [log]
  std::string train_jsonl;         // per-step JSONL; "" = <output_dir>/train.jsonl
  std::string events_jsonl;        // actor events JSONL; "" = <output_dir>/events.jsonl
  std::int64_t logging_steps = 1;  // a JSONL line every N steps
};

// The node's monitor endpoint (monitor/README.md): HTTP on loopback by default, a bearer token
// for control, the progress watchdog and the restart policy.
struct MonitorSection {            // [monitor]
  bool enabled = true;             // serve /metrics, /status, /events, /history, / and /control/*
  std::string bind = "127.0.0.1";  // listen address (loopback by default)
  std::int64_t port = 0;           // 0 = any free port (printed and written to <output_dir>/monitor.json)
  std::string token_file;          // bearer token file; "" = a fresh random token in <output_dir>/monitor.token (0600)
  double watchdog_warn_s = 60.0;   // no progress for this long: a watchdog warning event; 0 = off
  double watchdog_dump_s = 120.0;  // ... a dump of every actor's state into the events; 0 = off
  double watchdog_restart_s = 0;   // ... restart the actor stuck longest in a handler; 0 = off
  // Not a key: accept POST /control/fault?actor=NAME (a client may crash an actor). Tests set it through
  // the C++ API (the test node binary: --test.allow_fault_injection); the shipped binary never does.
  bool allow_fault_injection = false;
};

// Restarting a crashed (or stuck, or on-demand restarted) pipeline actor.
struct RestartSection {           // [restart]
  std::int64_t max_restarts = 5;  // failures per actor within window_s that are restarted; more stop the run
  double window_s = 600.0;        // the window of max_restarts
  double backoff_s = 0.0;         // wait before respawning a failed actor (doubles each failure in the window)
  std::string per_actor;          // overrides "ACTOR:MAX[,ACTOR:MAX...]" (e.g. "loader:20,compute:2")
};

// `megatrain plan` and the fit check `train` runs before it starts (plan/README.md).
struct PlanSection {              // [plan]
  std::string hardware = "this";  // this (measured now) | a section of the hardware file (h200, h100, gh200, a100)
  std::string hardware_file;      // hardware profiles (INI); "" = the built-in copy of config/hardware.ini
  double host_ram_gb = 0.0;       // host RAM to plan for, GiB; 0 = MemAvailable (this) or the profile's
  // Not a key: MemAvailable as the run read it once before allocating (TrainConfig::pin_host_ram), or
  // the profile's RAM a planner plans for, so every plan of the run sees the same host RAM. 0 = unread.
  double host_ram_read_bytes = 0.0;
  double disk_gb = 0.0;    // free disk for train.offload_dir, GiB; 0 = statvfs (this) or the profile's
  bool enforce = true;     // train: refuse a run whose plan does not fit host RAM or disk
  std::int64_t ranks = 1;  // megatrain plan: plan one rank of a job of this many ranks
};

// A job of several ranks (`mpirun -np N megatrain train ...`; cluster/world.hpp): every rank reads the
// same config. rank and ranks are not keys: the node sets them from MPI when it joins the job.
struct ClusterSection {                 // [cluster]
  std::string mode = "auto";            // auto (join when an MPI launcher started us) | on (must) | off (run alone)
  double collective_timeout_s = 300.0;  // a transfer with another rank not done in this time ends the run
  bool shard_state = false;             // each rank holds and updates only its stages' state (ZeRO-style)
  // With shard_state, who writes a checkpoint's stages: auto (owners when every rank sees rank 0's
  // train.output_dir, else rank0) | owners (each rank its own stages, into one shared directory) |
  // rank0 (the owners send their state to rank 0, which writes it all: no shared file system needed).
  std::string checkpoint_writers = "auto";
  std::string gpu_transport = "auto";  // cuda: the gradients to their owners: auto | nccl | mpi
  int rank = 0;                        // this process's rank (set by the node, not a key)
  int ranks = 1;                       // ranks in the job (set by the node, not a key)
  int local_rank = 0;                  // its rank among the job's ranks on its host: its GPU (set by the node)
  int local_ranks = 1;                 // the job's ranks on this host (set by the node, not a key)
};

enum class LrSchedule { constant, linear, cosine };
enum class KeepIntermediates {
  boundary,       // keep layer-boundary hidden states on the device, recompute each layer once in backward
  boundary_host,  // the same, boundaries offloaded to host RAM (long context; device memory flat in depth)
  all,            // keep every intermediate of every layer on the device: no recomputation, most memory
  // Boundaries (and the backward's dx) in host RAM, read and written in place by the stage operations
  // (CPU: its own memory, as the weights are mapped; CUDA: mapped pinned memory, over the link): nothing
  // of them on the device, no copies (long context: the arena holds weights, gradients and one layer's
  // work).
  boundary_mapped,
  // Every intermediate of every layer kept (no recomputation), in host RAM with the boundaries and dx,
  // read and written in place as boundary_mapped's are: the arena holds the slots and one layer's
  // workspace. Where the device's memory is the host's (the CPU backend without a modelled link) this
  // costs what keeping them in the arena costs, and host RAM is what bounds it.
  all_mapped,
  // "auto": the first of all, all_mapped (a device sharing host memory, the mapped bytes within half
  // the host RAM: TrainConfig::host_ram_bytes), boundary, boundary_host (then boundary_mapped) that fits
  automatic,
};
enum class OptimizerCompression { none, lossless, int8 };
// How a bf16 run holds its fp32 masters (kernels/master_halves.hpp). Both are exact: the same bits.
enum class MasterWeights {
  fp32,       // an fp32 master beside the bf16 compute copy: 6 bytes per parameter
  split,      // the bf16 copy is the master's high half, a 16-bit low half beside it: 4 bytes per parameter
  automatic,  // "auto": split where it applies (bf16, moments fp32 in the tiles), else fp32
};
// Where a step's gradients live between the backward and the optimizer. Both give the same bits.
enum class GradientBuffer {
  model,      // an fp32 accumulator for every stage in the host tiles (4 bytes per parameter)
  stage,      // only the staging slots: each stage is updated as soon as its gradient is complete; with
              // clipping the step runs forward and backward twice (the first pass sums the squares only)
  automatic,  // "auto": stage when it costs no second pass, else model (the run's fit check may still pick stage)
};
// The order of a step's micro-batches. Each forward op streams one layer for little compute and each
// backward op one layer for about 3x the compute, so a micro-batch's forward is link-bound and its
// backward compute-bound; interleaving micro-batch m's backward op by op with m+1's forward keeps
// both busy (two micro-batches' activations alive at once). layer_major runs every micro-batch's
// forward and head in turn, then the backward a layer at a time, that layer's micro-batches back to
// back: a stage's gradient is complete when its backward ends (what train.gradient_buffer=stage
// needs with several micro-batches), and each layer's weights stream once per backward, for every
// micro-batch's activations alive at once. Results are bit-identical in every order.
enum class MicroBatchOrder {
  interleaved,  // forward of m+1 alternates with backward of m
  sequential,   // forward then backward of each micro-batch in turn
  layer_major,  // forwards and heads in turn, then each layer's backward over every micro-batch
};

// How one thread budget is split. blas and optimizer are the compute-heavy pools and may run at the
// same time (the optimizer overlaps the next forward), so blas + optimizer <= total; the copy workers
// and the CAF scheduler mostly wait (on memory, on mailboxes) and are not counted against it.
struct ThreadBudget {
  int total = 0;
  int blas = 0;
  int optimizer = 0;
  int copy = 0;
  int scheduler = 0;
};

struct TrainConfig {
  TrainSection train;
  ModelSection model;
  DataSection data;
  DeviceSection device;
  ThreadsSection threads;
  LogSection log;
  MonitorSection monitor;
  RestartSection restart;
  PlanSection plan;
  ClusterSection cluster;

  // Checks every key: types are already right, this checks ranges, choices, combinations and that
  // named files exist (data.train_files must match at least one file). Throws ConfigError naming the
  // first bad key and its value. Does not read the model's config.json (storage/hf does that).
  void validate() const;
  void validate_values() const;  // ranges, choices, combinations: no filesystem access
  void validate_files() const;   // data globs, tokenizer, model paths, output / offload / resume dirs

  // The model from the [model] keys (when model.config_file and model.model_name_or_path are empty).
  // Throws ConfigError for keys that do not make a valid ModelConfig.
  // A config.json's model with the [model] keys that are training switches, not architecture, applied:
  // model.output_router_logits=true turns the load-balancing loss on, model.router_aux_loss_coef > 0
  // sets its weight (refused, naming the key, for a model without experts).
  ModelConfig with_training_switches(ModelConfig m) const;
  ModelConfig model_config_from_keys() const;
  // The config the data has to match: throws ConfigError naming model.vocab_size / data.* when token
  // ids in the data (max_token_id, -1 = unknown) or the tokenizer's vocabulary (0 = unknown) exceed it.
  static void check_vocab(const ModelConfig& model, std::int64_t tokenizer_vocab, std::int64_t max_token_id);

  LrSchedule lr_schedule() const;
  KeepIntermediates keep_intermediates() const;
  OptimizerCompression optimizer_compression() const;
  MasterWeights master_weights() const;
  // train.master_weights resolved: true when the masters are held as two halves (auto: bf16 runs whose
  // moments sit fp32 in the host tiles, the layout the tie bit needs).
  bool split_masters() const;
  GradientBuffer gradient_buffer() const;
  // train.gradient_buffer resolved: true when no gradient accumulator is kept per stage (auto: when it
  // applies, costs no second pass (max_grad_norm = 0) and changes no schedule (one micro-batch per
  // step); plan::without_accumulators_if_only_that_fits goes further when only it fits RAM).
  // stage_gradient_passes(): 2 with clipping.
  bool stage_gradients() const;
  int stage_gradient_passes() const { return stage_gradients() && train.max_grad_norm > 0.0 ? 2 : 1; }
  // Why train.gradient_buffer=stage cannot apply to this run ("" when it can): several devices, or
  // several ranks without cluster.shard_state.
  std::string stage_gradients_unsupported() const;
  // device.schedule resolved: layer_major whenever stage gradients run several micro-batches per step.
  MicroBatchOrder micro_batch_order() const;
  Precision precision() const { return train.bf16 ? Precision::bf16 : Precision::fp32; }
  // cluster.shard_state in a job of several ranks: each rank holds the state of its own stages only.
  bool shards_host_state() const { return cluster.shard_state && cluster.ranks > 1; }
  // How a job of several ranks moves each round's gradients to their owners (cluster.gpu_transport
  // resolved; device/grad_transport.hpp): "nccl" (the cuda backend in a build with NCCL, unless the key
  // says mpi) or "mpi" (the cpu backend always: its device memory is host memory).
  std::string rank_grad_transport() const;

  // The device budget in bytes from device.max_vram_gb, and the key=value text that set it
  // ("device.max_vram_gb=0.0625") for error messages.
  std::size_t device_budget_bytes() const;
  std::string device_budget_name() const;
  double copy_bandwidth_bytes_per_s() const { return device.copy_bandwidth_gbps * 1e9; }
  // The CPU backend with no modelled link: its "device" memory is host memory, so weights are mapped
  // into slots rather than copied and gradients are summed straight from them (CpuBackend's
  // shares_host_memory for this config's backend_options; the auto slot budget and the planner use it).
  bool device_shares_host_memory() const { return device.backend == "cpu" && copy_bandwidth_bytes_per_s() <= 0; }
  // The host RAM a run is planned against: plan.host_ram_gb, else MemAvailable as pin_host_ram read it
  // (or now, when unpinned); and the name of where it came from, for messages.
  double host_ram_bytes() const;
  // Reads MemAvailable once into plan.host_ram_read_bytes (when neither it nor plan.host_ram_gb is set):
  // a run calls it before it allocates its host state, so that state is not counted out of the RAM
  // and every later plan of the run (the engine plans again per pipeline) chooses alike.
  void pin_host_ram();
  std::string host_ram_source() const { return plan.host_ram_gb > 0 ? "plan.host_ram_gb" : "MemAvailable"; }
  std::int64_t prefetch_depth() const;

  // Learning rate for optimizer step `step` (0-based: the first update uses step 0), as Hugging Face's
  // schedulers do: warmup lr * step / warmup_steps, then constant, or linear / cosine decay from
  // learning_rate to min_lr_ratio * learning_rate at max_steps.
  double learning_rate_at(std::int64_t step) const;
  // AdamW hyper-parameters for that step (lr from the schedule).
  AdamWHyper adamw_at(std::int64_t step) const;

  // The explicit split of threads.total (hardware_threads when 0) across the pools.
  ThreadBudget thread_budget(int hardware_threads) const;
  ThreadBudget thread_budget() const;  // with std::thread::hardware_concurrency()

  std::string train_jsonl_path() const;
  std::string events_jsonl_path() const;
  // restart.max_restarts, or the actor's override in restart.per_actor.
  std::int64_t max_restarts_of(const std::string& actor) const;
};

// The learning-rate schedule as a free function (used by TrainConfig::learning_rate_at).
double learning_rate_at(LrSchedule schedule, double peak_lr, std::int64_t warmup_steps, std::int64_t max_steps,
                        double min_lr_ratio, std::int64_t step);

const char* lr_schedule_name(LrSchedule s);
const char* keep_intermediates_name(KeepIntermediates k);
const char* optimizer_compression_name(OptimizerCompression c);
const char* master_weights_name(MasterWeights w);
const char* gradient_buffer_name(GradientBuffer b);
const char* micro_batch_order_name(MicroBatchOrder o);

}  // namespace mt
