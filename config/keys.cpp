// The table of every config key (config/keys.hpp says what is derived from it), and what renders it.
#include "config/keys.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace mt {

const LrSchedule kLrSchedules[3] = {LrSchedule::constant, LrSchedule::linear, LrSchedule::cosine};
const OptimizerCompression kOptimizerCompressions[3] = {OptimizerCompression::none, OptimizerCompression::lossless,
                                                        OptimizerCompression::int8};
const KeepIntermediates kKeepIntermediates[6] = {KeepIntermediates::automatic,     KeepIntermediates::boundary,
                                                 KeepIntermediates::boundary_host, KeepIntermediates::boundary_mapped,
                                                 KeepIntermediates::all,           KeepIntermediates::all_mapped};
const MasterWeights kMasterWeights[3] = {MasterWeights::automatic, MasterWeights::fp32, MasterWeights::split};
const GradientBuffer kGradientBuffers[3] = {GradientBuffer::automatic, GradientBuffer::model, GradientBuffer::stage};
const MicroBatchOrder kMicroBatchOrders[3] = {MicroBatchOrder::interleaved, MicroBatchOrder::sequential,
                                              MicroBatchOrder::layer_major};

namespace {

// The names of an enum's values, in the order the choices are listed.
template <class Enum, std::size_t N>
std::vector<std::string> names_of(const Enum (&values)[N], const char* (*name)(Enum)) {
  std::vector<std::string> names;
  for (Enum e : values) names.emplace_back(name(e));
  return names;
}

// One key: its section and name are written once, as the TrainConfig member they name.
// clang-format off
#define MT_KEY(section, name, help) \
  KeyDesc(#section, #name, +[](TrainConfig& c) -> auto& { return c.section.name; }, help)
// clang-format on

std::vector<KeyDesc> make_keys() {
  return {
      // [train]
      MT_KEY(train, output_dir, "directory for logs, checkpoints and the final model").not_empty(),
      MT_KEY(train, per_device_train_batch_size, "sequences per micro-batch").at_least(1),
      MT_KEY(train, gradient_accumulation_steps, "micro-batches per optimizer step").at_least(1),
      MT_KEY(train, max_steps, "optimizer steps to run").at_least(1),
      MT_KEY(train, learning_rate, "peak learning rate").positive(),
      MT_KEY(train, lr_scheduler_type, "constant | linear | cosine (after warmup)")
          .one_of(names_of(kLrSchedules, lr_schedule_name)),
      MT_KEY(train, warmup_steps, "linear warmup steps from 0 to learning_rate").at_least(0),
      MT_KEY(train, min_lr_ratio, "decay floor as a fraction of learning_rate, in [0, 1]")
          .within(0.0, 1.0, true)
          .expert("a decay floor other than 0 (cosine or linear)"),
      MT_KEY(train, weight_decay, "AdamW decoupled weight decay (matrices only)").non_negative(),
      MT_KEY(train, adam_beta1, "AdamW beta1").within(0.0, 1.0, false),
      MT_KEY(train, adam_beta2, "AdamW beta2").within(0.0, 1.0, false),
      MT_KEY(train, adam_epsilon, "AdamW epsilon").positive().expert("AdamW's epsilon, rarely changed from 1e-8"),
      MT_KEY(train, max_grad_norm, "global gradient-norm clipping; 0 = off").non_negative(),
      MT_KEY(train, bf16, "bf16 compute (weights streamed and multiplied in bf16) with fp32 master weights"),
      MT_KEY(train, tf32, "CUDA, fp32 compute: let the products use TF32 tensor cores (10-bit mantissa inputs)")
          .expert("CUDA fp32 runs that accept TF32's 10-bit mantissa products for speed"),
      MT_KEY(train, seed, "random seed (initialisation, data order)").at_least(0),
      MT_KEY(train, optimizer_compression,
             "Adam moments: none | lossless (zstd, bit-identical) | int8 (block-wise, ~2 bytes/param)")
          .one_of(names_of(kOptimizerCompressions, optimizer_compression_name))
          .expert("when the Adam moments do not fit RAM; `megatrain plan` proposes it"),
      MT_KEY(train, offload_dir, "directory on an NVMe drive for the Adam moments (files, O_DIRECT); empty = host RAM"),
      MT_KEY(train, offload_staging_stages,
             "moments outside the tiles: stages staged in RAM (read ahead, write behind), >= 3")
          .at_least(3)
          .expert("NVMe tier: more read-ahead when the disk's latency shows in the step"),
      MT_KEY(train, offload_io_threads, "NVMe tier: I/O threads (1 MiB chunks in flight)")
          .at_least(1)
          .expert("NVMe tier: a drive that needs a deeper queue to reach its bandwidth"),
      MT_KEY(train, offload_params,
             "the fp32 master weights in offload_dir too (needs bf16: RAM keeps the bf16 copy and the grads)")
          .expert("bf16 runs whose fp32 masters do not fit RAM; `megatrain plan` proposes it"),
      MT_KEY(train, master_weights,
             "bf16 runs: how the exact fp32 masters are held: fp32 (beside the bf16 copy, 6 bytes/param) | split "
             "(the copy is the high half, a 16-bit low half beside it: 4 bytes/param, same bits) | auto (split "
             "when the moments are fp32 in RAM)")
          .one_of(names_of(kMasterWeights, master_weights_name))
          .expert("auto picks split when it can; fp32 keeps the masters apart (6 bytes a parameter)"),
      MT_KEY(train, gradient_buffer,
             "where gradients wait for the optimizer: model (an fp32 accumulator per stage, 4 bytes/param) | stage "
             "(no accumulator kept all step; each stage updated when its gradient is complete; with max_grad_norm > 0 "
             "the head and backward run twice, the first pass for the norm; several micro-batches run layer-major "
             "with two stage accumulators; needs one device, and several ranks need cluster.shard_state, each stage's "
             "owner summing its rounds into its accumulators) | auto (stage when max_grad_norm = 0 and one "
             "micro-batch per step allow it, or when only it fits RAM)")
          .one_of(names_of(kGradientBuffers, gradient_buffer_name))
          .expert("auto picks stage only where it can; force stage when RAM is the limit"),
      MT_KEY(train, save_steps, "checkpoint every N steps; 0 = only at the end").at_least(0),
      MT_KEY(train, save_total_limit, "checkpoints to keep; 0 = all").at_least(0),
      MT_KEY(train, resume_from_checkpoint, "checkpoint directory, 'latest', or empty"),
      MT_KEY(train, resume_fallback, "none | previous_good (skip damaged checkpoints when resuming)")
          .one_of({"none", "previous_good"})
          .expert("unattended runs that should skip a damaged checkpoint instead of stopping"),
      MT_KEY(train, save_minutes, "also checkpoint every T minutes; 0 = off")
          .non_negative()
          .expert("a wall-clock checkpoint cadence on top of save_steps (preemptible machines)"),
      MT_KEY(train, save_snapshot_mib,
             "host RAM (MiB) for stages the optimizer copies aside for a checkpoint not yet written, instead of "
             "waiting for the disk; 0 = always wait")
          .at_least(0)
          .expert("stages larger than it (masters and moments, 12 bytes a parameter: a 7B model's) make the "
                  "optimizer wait for each checkpoint's disk writes; more RAM lets it copy them aside"),
      MT_KEY(train, stop_after_steps, "end this run after N total steps (LR schedule keeps max_steps); 0 = max_steps")
          .at_least(0)
          .expert("splitting one run across job slots: the LR schedule still follows max_steps"),
      MT_KEY(train, eval_steps, "evaluate on data.validation_files every N steps (forward only); 0 = only at the end")
          .at_least(0),
      MT_KEY(train, eval_max_batches,
             "micro-batches per evaluation: the first N of the validation data, the same every time")
          .at_least(1)
          .expert("a longer or shorter evaluation than the default"),
      MT_KEY(train, export_hf_dir, "export the final weights as a Hugging Face model directory; empty = none"),
      // [model]
      MT_KEY(model, config_file, "Hugging Face config.json (or its directory); empty = the keys below"),
      MT_KEY(model, model_name_or_path, "Hugging Face model directory to start from"),
      MT_KEY(model, arch, "llama | qwen2 | qwen3 | mistral | gpt2 | mixtral | qwen3_moe | gpt_oss"),
      MT_KEY(model, hidden_size, "model width").at_least(1),
      MT_KEY(model, layers, "decoder layers (num_hidden_layers)").at_least(1),
      MT_KEY(model, heads, "attention heads").at_least(1),
      MT_KEY(model, kv_heads, "key/value heads (GQA); 0 = heads").at_least(0),
      MT_KEY(model, head_dim, "per-head width; 0 = hidden_size / heads")
          .at_least(0)
          .expert("a model whose head width is not hidden_size / heads (config.json sets it)"),
      MT_KEY(model, intermediate_size, "dense MLP width (mixtral, gpt_oss: each expert's)").at_least(1),
      MT_KEY(model, num_experts, "mixtral, qwen3_moe, gpt_oss: experts per layer; 0 = 8")
          .at_least(0)
          .expert("MoE shape (config.json sets it)"),
      MT_KEY(model, num_experts_per_tok, "mixtral, qwen3_moe, gpt_oss: experts each token is routed to (top-k)")
          .at_least(1)
          .expert("MoE shape (config.json sets it)"),
      MT_KEY(model, moe_intermediate_size, "qwen3_moe: each expert's width; 0 = intermediate_size")
          .at_least(0)
          .expert("MoE shape (config.json sets it)"),
      MT_KEY(model, norm_topk_prob, "qwen3_moe: divide the top-k weights by their sum (mixtral always does)")
          .expert("MoE routing detail (config.json sets it)"),
      MT_KEY(model, decoder_sparse_step, "qwen3_moe: every N-th layer has experts, the others a dense MLP")
          .at_least(1)
          .expert("MoE layout (config.json sets it)"),
      MT_KEY(model, mlp_only_layers, "qwen3_moe: comma-separated layers (0-based) with a dense MLP; empty = none")
          .expert("MoE layout (config.json sets it)"),
      MT_KEY(model, output_router_logits, "mixtral, qwen3_moe, gpt_oss: add the load-balancing loss, as transformers")
          .expert("training an MoE with transformers' load-balancing loss"),
      MT_KEY(model, router_aux_loss_coef, "its weight; 0 = the family's default (0.001; gpt_oss 0.9)")
          .non_negative()
          .expert("the load-balancing loss's weight (config.json sets it)"),
      MT_KEY(model, sliding_window,
             "attention window: gpt_oss's even layers (0 = 128); mistral, mixtral: every layer (0 = none)")
          .at_least(0)
          .expert("sliding-window attention (config.json sets it)"),
      MT_KEY(model, vocab_size, "vocabulary size (must cover the data's tokens)").at_least(1),
      MT_KEY(model, max_position_embeddings, "longest sequence").at_least(1),
      MT_KEY(model, rope_theta, "rotary embedding base")
          .positive()
          .expert("a rotary base other than 10000 (config.json sets it)"),
      MT_KEY(model, norm_eps, "RMSNorm / LayerNorm epsilon")
          .positive()
          .expert("a norm epsilon other than the family's (config.json sets it)"),
      MT_KEY(model, tie_word_embeddings, "LM head shares the embedding matrix")
          .expert("a model whose LM head is its embedding (config.json sets it)"),
      MT_KEY(model, initializer_range, "std of the normal initialisation")
          .positive()
          .expert("a from-scratch model initialised with another std"),
      // [data]
      MT_KEY(data, train_files, "glob of llm.c token shards for training").not_empty(),
      MT_KEY(data, validation_files, "glob of token shards for evaluation; empty = none"),
      MT_KEY(data, tokenizer_file, "tokenizer.json (vocabulary check); empty = none"),
      MT_KEY(data, seq_length, "tokens per sequence").at_least(1),
      MT_KEY(data, packing,
             "stream: one token stream, every token sees its window's earlier tokens | documents: each token sees "
             "only its own document (the shards' .docs), positions restart at each | auto: documents for shards "
             "megatrain-data made from records (instruct, chat, token records), stream for text")
          .one_of({"auto", "stream", "documents"}),
      // [device]
      MT_KEY(device, backend, "cpu | cuda").one_of({"cpu", "cuda"}),
      MT_KEY(device, max_vram_gb, "device memory budget in GiB; fractions allowed (0.0625 = 64 MiB)").positive(),
      MT_KEY(device, weight_slots,
             "K streamed weight slots on the device (>= 2); auto (0) = 2, up to 4 when the budget allows")
          .takes_auto()
          .at_least(2)
          .at_most(64)
          .expert("auto sizes them from the budget; more slots only help a link slower than compute"),
      MT_KEY(device, grad_slots,
             "gradient staging slots on the device (>= 1); auto (0) = 1, up to 4 when the budget allows")
          .takes_auto()
          .at_least(0)
          .at_most(64)
          .expert("auto sizes them from the budget; more only help a slow device-to-host link"),
      MT_KEY(device, seq_tile,
             "tokens per sequence tile (long context: layers and the head run a tile at a time, attention's keys "
             "and values stay sequence-sized); auto (0) = whole sequences when they fit the budget, else the "
             "largest power of two below data.seq_length (down to 128) that fits")
          .takes_auto()
          .at_least(1)
          .expert("auto picks the largest tile that fits; a smaller one trades speed for memory"),
      MT_KEY(device, attention_kv,
             "auto | device | host: where sequence tiles keep attention's sequence-sized keys, values and their "
             "gradients; auto = on the device unless no tile fits the budget with them there and the device "
             "shares host memory, host = mapped in host RAM beside the boundaries (with keep_intermediates auto "
             "or boundary_mapped)")
          .one_of({"auto", "device", "host"})
          .expert("auto keeps keys and values on the device when they fit; host only on shared memory"),
      MT_KEY(device, keep_intermediates,
             "auto | boundary | boundary_host | boundary_mapped | all | all_mapped: what the backward keeps of "
             "the forward; all_mapped = every intermediate in host RAM, used in place (no recomputation); auto = "
             "the first that fits of all, all_mapped (on a device sharing host memory, within half the host "
             "RAM), boundary, boundary_host, boundary_mapped")
          .one_of(names_of(kKeepIntermediates, keep_intermediates_name))
          .expert("auto picks the first that fits; force one to compare memory and speed"),
      MT_KEY(device, prefetch_depth, "stages streamed ahead; 0 = weight_slots - 1")
          .at_least(0)
          .expert("auto streams weight_slots - 1 ahead, which is right unless slots are shared"),
      MT_KEY(device, schedule,
             "interleaved | sequential | layer_major (order of a step's micro-batches; layer_major: each forward and "
             "head in turn, then the backward a layer at a time over every micro-batch)")
          .one_of(names_of(kMicroBatchOrders, micro_batch_order_name))
          .expert("interleaved is fastest with several micro-batches; the others are for comparison"),
      MT_KEY(device, gpus,
             "devices of this node (>= 1), each with its own arena and gradient_accumulation_steps micro-batches per "
             "step; gradients are summed across them before the host accumulates (cpu: N arenas in one process; cuda: "
             "N GPUs, summed on GPU 0 with NCCL in device order, in builds with NCCL)")
          .at_least(1)
          .at_most(64),
      // [threads]
      MT_KEY(threads, total, "the thread budget; 0 = hardware threads").at_least(0).at_most(1024),
      MT_KEY(threads, blas, "compute kernel threads; 0 = the whole budget")
          .at_least(0)
          .at_most(1024)
          .expert("leaving cores to another process; the budget is threads.total"),
      MT_KEY(threads, optimizer,
             "optimizer and collector threads (they share the cores with compute in short bursts); 0 = one per 8 cores "
             "of the budget on the cpu backend, the whole budget with a GPU")
          .at_least(0)
          .at_most(1024)
          .expert("a GPU run whose optimizer should leave cores to other work"),
      MT_KEY(threads, copy,
             "copy engine workers (1 or 2: one per direction); 0 = derived: 2 with 4 or more threads or a modelled "
             "link (the planner's GPU profiles), else 1")
          .at_least(0)
          .at_most(2)
          .expert("auto picks 1 or 2 by cores and link"),
      MT_KEY(threads, scheduler, "CAF scheduler threads; 0 = derived")
          .at_least(0)
          .at_most(1024)
          .expert("CAF's scheduler; auto is right for every run seen so far"),
      MT_KEY(threads, adapt_to_load,
             "run fewer host threads while other processes take this run's cores (measured each step from "
             "/proc/stat), and all of them again once the cores are free; results do not change")
          .expert("shared machines: give cores back while other processes take them"),
      // [log]
      MT_KEY(log, train_jsonl, "per-step JSONL log; empty = <output_dir>/train.jsonl")
          .expert("writing the step log elsewhere than output_dir"),
      MT_KEY(log, events_jsonl, "actor events JSONL log; empty = <output_dir>/events.jsonl")
          .expert("writing the actor events elsewhere than output_dir"),
      MT_KEY(log, logging_steps, "log every N steps").at_least(1),
      // [monitor]
      MT_KEY(monitor, enabled, "serve the monitor endpoint (metrics, status, events, dashboard, control)"),
      MT_KEY(monitor, bind, "listen address of the endpoint (loopback by default)")
          .not_empty("must be an address (e.g. 127.0.0.1)"),
      MT_KEY(monitor, port, "listen port; 0 = any free port (see <output_dir>/monitor.json)")
          .at_least(0)
          .at_most(65535),
      MT_KEY(monitor, token_file,
             "file holding the control bearer token; empty = a random token in <output_dir>/monitor.token (0600)")
          .expert("a control token you choose instead of a random one"),
      MT_KEY(monitor, watchdog_warn_s, "no step nor compute op finished for T s: watchdog warning event; 0 = off")
          .non_negative()
          .expert("runs whose steps take longer than the default allows"),
      MT_KEY(monitor, watchdog_dump_s, "... dump every actor's state into the events; 0 = off")
          .non_negative()
          .expert("runs whose steps take longer than the default allows"),
      MT_KEY(monitor, watchdog_restart_s, "... restart the actor stuck in a handler; 0 = off")
          .non_negative()
          .expert("restarting an actor stuck in a handler, for unattended runs"),
      // [restart]
      MT_KEY(restart, max_restarts, "restarts per actor within window_s; past it: final checkpoint, stop")
          .at_least(0)
          .expert("more or fewer restarts before the run stops with a final checkpoint"),
      MT_KEY(restart, window_s, "the window of max_restarts, in seconds")
          .positive()
          .expert("the window of max_restarts"),
      MT_KEY(restart, backoff_s, "wait before respawning a failed actor (doubles per failure in the window)")
          .non_negative()
          .expert("the wait before a respawn"),
      MT_KEY(restart, per_actor, "per-actor max_restarts, e.g. \"loader:20,compute:2\"; empty = none")
          .expert("a restart allowance per actor"),
      // [plan]
      MT_KEY(plan, hardware,
             "megatrain plan: this (measured now) | h200 | h100 | gh200 | a100 (a section of plan.hardware_file)")
          .not_empty("must name a profile (this, h200, h100, gh200, a100)"),
      MT_KEY(plan, hardware_file, "hardware profiles INI; empty = the built-in config/hardware.ini")
          .expert("planning for hardware that is not built in"),
      MT_KEY(plan, host_ram_gb, "host RAM to plan for (GiB); 0 = MemAvailable (this) or the profile's")
          .non_negative()
          .expert("planning for less host RAM than this machine has"),
      MT_KEY(plan, disk_gb, "free disk for train.offload_dir (GiB); 0 = statvfs (this) or the profile's")
          .non_negative()
          .expert("planning for less disk than offload_dir has"),
      MT_KEY(plan, enforce, "train refuses a run whose plan does not fit host RAM or disk; false = warn only")
          .expert("starting a run the planner says does not fit (it warns instead)"),
      MT_KEY(plan, ranks,
             "megatrain plan: plan one rank of a job of N ranks (mpirun; with cluster.shard_state the rank "
             "holding the most)")
          .at_least(1)
          .expert("planning one rank of a multi-rank job"),
      // [cluster]
      MT_KEY(cluster, mode,
             "auto: join the job when started by mpirun / srun (one rank per process) | on: refuse to run without "
             "one | off: run alone")
          .one_of({"auto", "on", "off"}),
      MT_KEY(
          cluster, collective_timeout_s,
          "seconds a transfer with another rank may take before the run ends naming that rank (a rank died or hangs)")
          .positive()
          .expert("slow networks whose transfers take longer than the default"),
      MT_KEY(cluster, shard_state,
             "several ranks: each rank holds the gradient sums and Adam moments of its own stages only (stage "
             "s on rank s mod N), updates them and sends the new weights to the others; with "
             "train.gradient_buffer=stage a rank holds no gradient of the others' stages"),
      MT_KEY(cluster, checkpoint_writers,
             "with cluster.shard_state, who writes a checkpoint's stages: owners (each rank its own, into one "
             "checkpoint directory that every rank must see) | rank0 (the owners send their state to rank 0, "
             "which writes it all: no shared file system) | auto (owners when every rank sees rank 0's "
             "train.output_dir, else rank0)")
          .one_of({"auto", "owners", "rank0"})
          .expert("auto checks for a shared file system; force rank0 or owners if it guesses wrong"),
      MT_KEY(cluster, gpu_transport,
             "several ranks on device.backend=cuda: how each round's gradients reach their stage's owner: nccl (GPU "
             "to GPU, builds with NCCL; one GPU per rank: a rank's GPU is its rank on its host) | mpi (copied to the "
             "host, sent over MPI) | auto (nccl when built with it); the owner adds them on the host in rank order "
             "either way, so both give the same bits")
          .one_of({"auto", "nccl", "mpi"})
          .expert("auto uses NCCL when built with it; mpi where NCCL cannot reach"),
  };
}

#undef MT_KEY

// The shortest text that reads back to the same double ("1e-08", "0.0003"), always a real ("1.0").
std::string real_text(double value) {
  char buffer[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*g", digits, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  std::string out = buffer;
  if (out.find_first_of(".eni") == std::string::npos) out += ".0";
  return out;
}

// The same number as validation messages have always printed it (stream default: "1e-08", "0.9").
std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

template <class T>
T& value_in(const KeyDesc& key, const TrainConfig& config) {
  // The table's accessors take a mutable config (CAF binds to them); reading through one changes nothing.
  return std::get<T& (*)(TrainConfig&)>(key.field)(const_cast<TrainConfig&>(config));
}

std::string joined(const std::vector<std::string>& names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return list;
}

}  // namespace

const char* KeyDesc::type_name() const {
  static const char* const names[] = {"string", "integer", "real", "boolean"};
  return names[field.index()];
}

std::string KeyDesc::value_text(const TrainConfig& config) const {
  switch (field.index()) {
    case 0: {
      std::string quoted = "\"";
      for (char ch : value_in<std::string>(*this, config)) {
        if (ch == '"' || ch == '\\') quoted += '\\';
        quoted += ch;
      }
      return quoted + "\"";
    }
    case 1:
      return std::to_string(value_in<std::int64_t>(*this, config));
    case 2:
      return real_text(value_in<double>(*this, config));
    default:
      return value_in<bool>(*this, config) ? "true" : "false";
  }
}

std::string KeyDesc::allowed_text() const {
  if (!choices.empty()) return joined(choices);
  if (empty_error != nullptr) return "not empty";
  if (std::holds_alternative<IntegerField>(field)) {
    // With "auto" 0 is taken, so the numbers allowed start above it.
    const std::int64_t low = auto_zero ? std::max<std::int64_t>(min, 1) : min;
    const bool has_min = low != std::numeric_limits<std::int64_t>::min();
    const bool has_max = max != std::numeric_limits<std::int64_t>::max();
    std::string range;
    if (has_min && has_max)
      range = std::to_string(low) + " to " + std::to_string(max);
    else if (has_min)
      range = ">= " + std::to_string(low);
    else if (has_max)
      range = "<= " + std::to_string(max);
    return auto_zero ? "auto (0) or " + range : range;
  }
  if (std::holds_alternative<RealField>(field)) {
    if (std::isfinite(hi))
      return std::string(lo_open ? "(" : "[") + number_text(lo) + ", " + number_text(hi) + (hi_open ? ")" : "]");
    if (std::isfinite(lo)) return std::string(lo_open ? "> " : ">= ") + number_text(lo);
  }
  return "";
}

void KeyDesc::check(const TrainConfig& config) const {
  const std::string key = qualified();
  if (const auto* integer = std::get_if<IntegerField>(&field)) {
    const std::int64_t v = (*integer)(const_cast<TrainConfig&>(config));
    if (auto_zero && v == 0) return;
    if (v < min) throw ConfigError(key, "must be >= " + std::to_string(min) + ", got " + std::to_string(v));
    if (v > max) throw ConfigError(key, "must be <= " + std::to_string(max) + ", got " + std::to_string(v));
  } else if (const auto* real = std::get_if<RealField>(&field)) {
    const double v = (*real)(const_cast<TrainConfig&>(config));
    const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (ok) return;
    if (std::isfinite(hi)) throw ConfigError(key, "must be in " + allowed_text() + ", got " + number_text(v));
    throw ConfigError(key, "must be a finite number " + allowed_text() + ", got " + number_text(v));
  } else if (const auto* text = std::get_if<StringField>(&field)) {
    const std::string& v = (*text)(const_cast<TrainConfig&>(config));
    if (empty_error != nullptr && v.empty()) throw ConfigError(key, empty_error);
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
      throw ConfigError(key, "'" + v + "' is not one of: " + joined(choices));
  }
}

const std::vector<KeyDesc>& config_keys() {
  static const std::vector<KeyDesc> keys = make_keys();
  return keys;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> names;
    for (const KeyDesc& k : config_keys())
      if (names.empty() || names.back() != k.section) names.emplace_back(k.section);
    return names;
  }();
  return sections;
}

const KeyDesc* find_key(const std::string& qualified) {
  for (const KeyDesc& k : config_keys())
    if (k.qualified() == qualified) return &k;
  return nullptr;
}

std::string key_name(const TrainConfig& config, const void* field, std::size_t type_index) {
  for (const KeyDesc& k : config_keys()) {
    const void* where =
        std::visit([&](auto get) -> const void* { return &get(const_cast<TrainConfig&>(config)); }, k.field);
    if (where == field && k.field.index() == type_index) return k.qualified();
  }
  throw std::logic_error("key_name: not the value of a config key");
}

void check_key_values(const TrainConfig& config) {
  for (const KeyDesc& k : config_keys()) k.check(config);
}

}  // namespace mt
