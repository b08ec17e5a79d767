// TrainConfig::validate: every key's range and choices (the key table), the rules that combine keys,
// then the files the keys name.
// Each failure is a ConfigError whose message starts with the key, so users see exactly what to fix.
#include <glob.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <utility>

#include "config/keys.hpp"
#include "config/train_config.hpp"

namespace mt {

namespace {

namespace fs = std::filesystem;

void at_most(const std::string& key, std::int64_t value, std::int64_t max) {
  if (value > max) throw ConfigError(key, "must be <= " + std::to_string(max) + ", got " + std::to_string(value));
}

std::size_t glob_count(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  const std::size_t n = rc == 0 ? g.gl_pathc : 0;
  globfree(&g);
  return n;
}

void files_exist(const std::string& key, const std::string& pattern) {
  if (glob_count(pattern) == 0) throw ConfigError(key, "no file matches '" + pattern + "'");
}

void file_exists(const std::string& key, const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw ConfigError(key, "file '" + path + "' does not exist");
}

// The rules that span several keys (each key's own range and choices come from the table: keys.cpp).
void train_values(const TrainConfig& c) {
  const auto& t = c.train;
  // TF32 is a tensor-core input format: the CPU backend has no such products, and under bf16 the
  // products already take bf16 inputs, so the key would do nothing there; say so rather than ignore it.
  if (t.tf32 && c.device.backend != "cuda")
    throw ConfigError(key_of(c, t.tf32),
                      "needs " + key_of(c, c.device.backend) + " = cuda (TF32 is a GPU tensor-core format)");
  if (t.tf32 && t.bf16)
    throw ConfigError(key_of(c, t.tf32),
                      "applies to fp32 compute; " + key_of(c, t.bf16) + " = true already multiplies in bf16");
  if (t.offload_params && t.offload_dir.empty())
    throw ConfigError(key_of(c, t.offload_params),
                      "needs " + key_of(c, t.offload_dir) + " (the directory the masters live in)");
  // In fp32 compute the masters are what the device streams (there is no separate compute copy), so
  // moving them would make the prefetcher read every stage from the tier twice a step; the RAM they
  // take is the same as a compute copy's. With bf16 the copy the device streams is 2 bytes.
  if (t.offload_params && !t.bf16)
    throw ConfigError(key_of(c, t.offload_params),
                      "needs " + key_of(c, t.bf16) +
                          " = true: in fp32 the masters are the weights the device streams, so they "
                          "stay in RAM (the moments alone go to offload_dir)");
}

// Split masters keep the rounding's tie bit in the sign of Adam's v (kernels/master_halves.hpp): they need
// bf16 (in fp32 the master is itself the copy that is streamed) and v held exactly beside them, in the tiles.
void master_weights_values(const TrainConfig& c) {
  const auto& t = c.train;
  if (c.master_weights() != MasterWeights::split) return;
  if (!t.bf16)
    throw ConfigError(key_of(c, t.master_weights), "split needs " + key_of(c, t.bf16) +
                                                       " = true (an fp32 run computes with the masters themselves)");
  if (t.offload_params)
    throw ConfigError(key_of(c, t.master_weights), "split keeps the masters in RAM; " + key_of(c, t.offload_params) +
                                                       " = true moves them to " + key_of(c, t.offload_dir) +
                                                       " (choose one)");
  if (!t.offload_dir.empty() || c.optimizer_compression() != OptimizerCompression::none)
    throw ConfigError(key_of(c, t.master_weights),
                      "split needs the Adam moments fp32 in the host tiles (its tie bit lives in v's sign): unset " +
                          key_of(c, t.offload_dir) + " and " + key_of(c, t.optimizer_compression) + " = none");
}

void gradient_buffer_values(const TrainConfig& c) {
  if (c.gradient_buffer() != GradientBuffer::stage) return;
  if (const std::string why = c.stage_gradients_unsupported(); !why.empty())
    throw ConfigError(key_of(c, c.train.gradient_buffer),
                      "stage needs each stage's gradient complete after one backward: " + why);
}

void model_values(const TrainConfig& c) {
  const auto& m = c.model;
  if (!m.config_file.empty() && !m.model_name_or_path.empty())
    throw ConfigError(key_of(c, m.config_file), "set either " + key_of(c, m.config_file) + " or " +
                                                    key_of(c, m.model_name_or_path) + ", not both");
  if (m.config_file.empty() && m.model_name_or_path.empty()) {
    const ModelConfig model = c.model_config_from_keys();  // throws naming the key
    if (model.max_position_embeddings < c.data.seq_length)
      throw ConfigError(key_of(c, c.data.seq_length), std::to_string(c.data.seq_length) + " exceeds " +
                                                          key_of(c, m.max_position_embeddings) + "=" +
                                                          std::to_string(model.max_position_embeddings));
  }
}

void device_values(const TrainConfig& c) {
  const auto& d = c.device;
  // Not a key (set through the C++ API), so no range in the key table checks it.
  if (!(d.copy_bandwidth_gbps >= 0.0) || !std::isfinite(d.copy_bandwidth_gbps))
    throw ConfigError("device.copy_bandwidth_gbps", "must be a finite number >= 0");
  // With weight_slots = auto the engine checks it against the slots it plans.
  if (d.weight_slots > 0) at_most(key_of(c, d.prefetch_depth), d.prefetch_depth, d.weight_slots - 1);
    // Several GPUs sum their gradients on the devices with NCCL (device/cuda/nccl_reduce.hpp); a build
    // without it runs the cuda backend on one GPU (the CPU backend runs N arenas with a host reduction).
    // Whether the machine has that many GPUs is checked with the backend, before anything starts.
#if !MEGATRAIN_HAVE_NCCL
  if (d.backend == "cuda" && d.gpus > 1)
    throw ConfigError(key_of(c, d.gpus), std::to_string(d.gpus) +
                                             " GPUs need the cross-device gradient reduction (NCCL), which this "
                                             "build does not have (configured without CUDA or without NCCL); use " +
                                             key_of(c, d.gpus) + " = 1");
#endif
}

void cluster_values(const TrainConfig& c) {
  const std::string key = key_of(c, c.cluster.gpu_transport);
  if (c.cluster.gpu_transport != "nccl") return;
#if !MEGATRAIN_HAVE_NCCL
  throw ConfigError(key, "nccl: this build has no NCCL (configured without CUDA or without NCCL); use auto or mpi");
#endif
  if (c.device.backend != "cuda")
    throw ConfigError(key, "nccl moves the GPUs' gradients and needs " + key_of(c, c.device.backend) + "=cuda (" +
                               key_of(c, c.device.backend) + "=" + c.device.backend +
                               " sends its ranks' gradients over MPI); use auto or mpi");
}

void thread_values(const TrainConfig& c) {
  // Each pool may use the whole budget (they take turns: the optimizer's bursts are short), not more.
  const ThreadBudget b = c.thread_budget();
  const std::string total = key_of(c, c.threads.total);
  for (auto [key, v] :
       {std::pair<std::string, int>{key_of(c, c.threads.blas), b.blas}, {key_of(c, c.threads.optimizer), b.optimizer}})
    if (v > b.total)
      throw ConfigError(key, std::to_string(v) + " exceeds " + total + "=" + std::to_string(b.total) +
                                 " (more threads than the budget oversubscribes the cores and slows every pool)");
}

// The actor names restart.per_actor may name (the node's pipeline actors).
const char* const kRestartableActors[] = {"loader", "prefetcher", "compute", "collector", "optimizer"};

}  // namespace

std::int64_t TrainConfig::max_restarts_of(const std::string& actor) const {
  std::int64_t result = restart.max_restarts;
  std::istringstream items(restart.per_actor);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto colon = item.find(':');
    const std::string name = item.substr(0, colon);
    bool known = false;
    for (const char* a : kRestartableActors) known = known || name == a;
    if (colon == std::string::npos || !known)
      throw ConfigError(key_of(*this, restart.per_actor),
                        "'" + item +
                            "' is not ACTOR:MAX with ACTOR one of loader, prefetcher, "
                            "compute, collector, optimizer");
    std::size_t used = 0;
    long long max = -1;
    try {
      max = std::stoll(item.substr(colon + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() - colon - 1 || max < 0)
      throw ConfigError(key_of(*this, restart.per_actor), "'" + item + "': MAX must be an integer >= 0");
    if (name == actor) result = max;
  }
  return result;
}

void TrainConfig::validate_values() const {
  check_key_values(*this);
  train_values(*this);
  master_weights_values(*this);
  gradient_buffer_values(*this);
  model_values(*this);
  device_values(*this);
  cluster_values(*this);
  thread_values(*this);
  max_restarts_of("loader");  // parses restart.per_actor, throws naming it
}

void TrainConfig::validate_files() const {
  files_exist(key_of(*this, data.train_files), data.train_files);
  if (!data.validation_files.empty()) files_exist(key_of(*this, data.validation_files), data.validation_files);
  if (!data.tokenizer_file.empty()) file_exists(key_of(*this, data.tokenizer_file), data.tokenizer_file);
  std::error_code ec;
  if (!model.config_file.empty()) {
    const bool ok = fs::is_regular_file(model.config_file, ec) ||
                    fs::is_regular_file(fs::path(model.config_file) / "config.json", ec);
    if (!ok)
      throw ConfigError(key_of(*this, model.config_file),
                        "'" + model.config_file + "' is neither a config.json nor a directory holding one");
  }
  if (!model.model_name_or_path.empty() && !fs::is_regular_file(fs::path(model.model_name_or_path) / "config.json", ec))
    throw ConfigError(key_of(*this, model.model_name_or_path),
                      "'" + model.model_name_or_path + "' is not a model directory (no config.json)");
  if (!train.offload_dir.empty() && fs::exists(train.offload_dir, ec) && !fs::is_directory(train.offload_dir, ec))
    throw ConfigError(key_of(*this, train.offload_dir), "'" + train.offload_dir + "' exists and is not a directory");
  if (fs::exists(train.output_dir, ec) && !fs::is_directory(train.output_dir, ec))
    throw ConfigError(key_of(*this, train.output_dir), "'" + train.output_dir + "' exists and is not a directory");
  if (!monitor.token_file.empty() && !fs::is_regular_file(monitor.token_file, ec))
    throw ConfigError(key_of(*this, monitor.token_file), "'" + monitor.token_file + "' is not a readable file");
  const auto& resume = train.resume_from_checkpoint;
  if (!resume.empty() && resume != "latest" && !fs::is_directory(resume, ec))
    throw ConfigError(key_of(*this, train.resume_from_checkpoint),
                      "checkpoint directory '" + resume + "' does not exist");
}

void TrainConfig::validate() const {
  validate_values();
  validate_files();
}

}  // namespace mt
