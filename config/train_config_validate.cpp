// TrainConfig::validate: every key's range, choice and combination, then the files the keys name.
// Each failure is a ConfigError whose message starts with the key, so users see exactly what to fix.
#include <glob.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <utility>

#include "config/train_config.hpp"

namespace mt {

namespace {

namespace fs = std::filesystem;

template <class T>
std::string text(const T& v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

void at_least(const char* key, std::int64_t value, std::int64_t min) {
  if (value < min) throw ConfigError(key, "must be >= " + std::to_string(min) + ", got " + std::to_string(value));
}

void at_most(const char* key, std::int64_t value, std::int64_t max) {
  if (value > max) throw ConfigError(key, "must be <= " + std::to_string(max) + ", got " + std::to_string(value));
}

// lo <= value (< or <=) hi, and finite.
void in_range(const char* key, double value, double lo, double hi, bool hi_inclusive) {
  const bool ok = std::isfinite(value) && value >= lo && (hi_inclusive ? value <= hi : value < hi);
  if (!ok)
    throw ConfigError(
        key, "must be in [" + text(lo) + ", " + text(hi) + (hi_inclusive ? "]" : ")") + ", got " + text(value));
}

void positive(const char* key, double value) {
  if (!(std::isfinite(value) && value > 0.0)) throw ConfigError(key, "must be a finite number > 0, got " + text(value));
}

void non_negative(const char* key, double value) {
  if (!(std::isfinite(value) && value >= 0.0))
    throw ConfigError(key, "must be a finite number >= 0, got " + text(value));
}

void not_empty(const char* key, const std::string& value) {
  if (value.empty()) throw ConfigError(key, "must not be empty");
}

std::size_t glob_count(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  const std::size_t n = rc == 0 ? g.gl_pathc : 0;
  globfree(&g);
  return n;
}

void files_exist(const char* key, const std::string& pattern) {
  if (glob_count(pattern) == 0) throw ConfigError(key, "no file matches '" + pattern + "'");
}

void file_exists(const char* key, const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw ConfigError(key, "file '" + path + "' does not exist");
}

void train_values(const TrainConfig& c) {
  const auto& t = c.train;
  not_empty("train.output_dir", t.output_dir);
  at_least("train.per_device_train_batch_size", t.per_device_train_batch_size, 1);
  at_least("train.gradient_accumulation_steps", t.gradient_accumulation_steps, 1);
  at_least("train.max_steps", t.max_steps, 1);
  positive("train.learning_rate", t.learning_rate);
  c.lr_schedule();
  at_least("train.warmup_steps", t.warmup_steps, 0);
  in_range("train.min_lr_ratio", t.min_lr_ratio, 0.0, 1.0, true);
  non_negative("train.weight_decay", t.weight_decay);
  in_range("train.adam_beta1", t.adam_beta1, 0.0, 1.0, false);
  in_range("train.adam_beta2", t.adam_beta2, 0.0, 1.0, false);
  positive("train.adam_epsilon", t.adam_epsilon);
  non_negative("train.max_grad_norm", t.max_grad_norm);
  at_least("train.seed", t.seed, 0);
  c.optimizer_compression();
  at_least("train.offload_staging_stages", t.offload_staging_stages, 3);
  at_least("train.offload_io_threads", t.offload_io_threads, 1);
  // TF32 is a tensor-core input format: the CPU backend has no such products, and under bf16 the
  // products already take bf16 inputs, so the key would do nothing there; say so rather than ignore it.
  if (t.tf32 && c.device.backend != "cuda")
    throw ConfigError("train.tf32", "needs device.backend = cuda (TF32 is a GPU tensor-core format)");
  if (t.tf32 && t.bf16)
    throw ConfigError("train.tf32", "applies to fp32 compute; train.bf16 = true already multiplies in bf16");
  if (t.offload_params && t.offload_dir.empty())
    throw ConfigError("train.offload_params", "needs train.offload_dir (the directory the masters live in)");
  // In fp32 compute the masters are what the device streams (there is no separate compute copy), so
  // moving them would make the prefetcher read every stage from the tier twice a step; the RAM they
  // take is the same as a compute copy's. With bf16 the copy the device streams is 2 bytes.
  if (t.offload_params && !t.bf16)
    throw ConfigError("train.offload_params",
                      "needs train.bf16 = true: in fp32 the masters are the weights the device streams, so they "
                      "stay in RAM (the moments alone go to offload_dir)");
  at_least("train.save_steps", t.save_steps, 0);
  at_least("train.save_total_limit", t.save_total_limit, 0);
  if (t.resume_fallback != "none" && t.resume_fallback != "previous_good")
    throw ConfigError("train.resume_fallback", "'" + t.resume_fallback + "' is not one of none, previous_good");
  non_negative("train.save_minutes", t.save_minutes);
  at_least("train.stop_after_steps", t.stop_after_steps, 0);
  at_least("train.eval_steps", t.eval_steps, 0);
  at_least("train.eval_max_batches", t.eval_max_batches, 1);
}

void model_values(const TrainConfig& c) {
  const auto& m = c.model;
  if (!m.config_file.empty() && !m.model_name_or_path.empty())
    throw ConfigError("model.config_file", "set either model.config_file or model.model_name_or_path, not both");
  for (auto [key, v] : {std::pair<const char*, std::int64_t>{"model.hidden_size", m.hidden_size},
                        {"model.layers", m.layers},
                        {"model.heads", m.heads},
                        {"model.intermediate_size", m.intermediate_size},
                        {"model.vocab_size", m.vocab_size},
                        {"model.max_position_embeddings", m.max_position_embeddings}})
    at_least(key, v, 1);
  at_least("model.kv_heads", m.kv_heads, 0);
  at_least("model.head_dim", m.head_dim, 0);
  positive("model.rope_theta", m.rope_theta);
  positive("model.norm_eps", m.norm_eps);
  positive("model.initializer_range", m.initializer_range);
  if (m.config_file.empty() && m.model_name_or_path.empty()) {
    const ModelConfig model = c.model_config_from_keys();  // throws naming the key
    if (model.max_position_embeddings < c.data.seq_length)
      throw ConfigError("data.seq_length",
                        std::to_string(c.data.seq_length) +
                            " exceeds model.max_position_embeddings=" + std::to_string(model.max_position_embeddings));
  }
}

void device_values(const TrainConfig& c) {
  const auto& d = c.device;
  if (d.backend != "cpu" && d.backend != "cuda")
    throw ConfigError("device.backend", "'" + d.backend + "' is not one of: cpu, cuda");
  non_negative("device.max_vram_gb", d.max_vram_gb);
  at_least("device.device_memory_mb", d.device_memory_mb, 0);
  if (d.max_vram_gb > 0.0 && d.device_memory_mb > 0)
    throw ConfigError("device.max_vram_gb",
                      "set either device.max_vram_gb or device.device_memory_mb (the other to 0), not both");
  if (d.max_vram_gb == 0.0 && d.device_memory_mb == 0)
    throw ConfigError("device.device_memory_mb", "no device budget: set device.device_memory_mb or device.max_vram_gb");
  if (d.weight_slots != 0) at_least("device.weight_slots", d.weight_slots, 2);  // 0 = auto
  at_most("device.weight_slots", d.weight_slots, 64);
  at_least("device.grad_slots", d.grad_slots, 0);  // 0 = auto
  at_most("device.grad_slots", d.grad_slots, 64);
  c.keep_intermediates();
  non_negative("device.copy_bandwidth_gbps", d.copy_bandwidth_gbps);
  at_least("device.prefetch_depth", d.prefetch_depth, 0);
  // With weight_slots = auto the engine checks it against the slots it plans.
  if (d.weight_slots > 0) at_most("device.prefetch_depth", d.prefetch_depth, d.weight_slots - 1);
  c.micro_batch_order();
  at_least("device.gpus", d.gpus, 1);
  at_most("device.gpus", d.gpus, 64);
  // Several GPUs sum their gradients on the devices with NCCL (kernels/cuda/nccl_reduce.hpp); a build
  // without it runs the cuda backend on one GPU (the CPU backend runs N arenas with a host reduction).
  // Whether the machine has that many GPUs is checked with the backend, before anything starts.
#if !MEGATRAIN_HAVE_NCCL
  if (d.backend == "cuda" && d.gpus > 1)
    throw ConfigError("device.gpus", std::to_string(d.gpus) +
                                         " GPUs need the cross-device gradient reduction (NCCL), which this build "
                                         "does not have (configured without CUDA or without NCCL); use "
                                         "device.gpus = 1");
#endif
}

void thread_values(const TrainConfig& c) {
  const auto& t = c.threads;
  for (auto [key, v] : {std::pair<const char*, std::int64_t>{"threads.total", t.total},
                        {"threads.blas", t.blas},
                        {"threads.optimizer", t.optimizer},
                        {"threads.copy", t.copy},
                        {"threads.scheduler", t.scheduler}}) {
    at_least(key, v, 0);
    at_most(key, v, 1024);
  }
  at_most("threads.copy", t.copy, 2);
  // Each pool may use the whole budget (they take turns: the optimizer's bursts are short), not more.
  const ThreadBudget b = c.thread_budget();
  for (auto [key, v] : {std::pair<const char*, int>{"threads.blas", b.blas}, {"threads.optimizer", b.optimizer}})
    if (v > b.total)
      throw ConfigError(key, std::to_string(v) + " exceeds threads.total=" + std::to_string(b.total) +
                                 " (more threads than the budget oversubscribes the cores and slows every pool)");
}

// The actor names restart.per_actor may name (the node's pipeline actors).
const char* const kRestartableActors[] = {"loader", "prefetcher", "compute", "collector", "optimizer"};

void monitor_values(const TrainConfig& c) {
  const auto& m = c.monitor;
  if (m.bind.empty()) throw ConfigError("monitor.bind", "must be an address (e.g. 127.0.0.1)");
  at_least("monitor.port", m.port, 0);
  at_most("monitor.port", m.port, 65535);
  non_negative("monitor.watchdog_warn_s", m.watchdog_warn_s);
  non_negative("monitor.watchdog_dump_s", m.watchdog_dump_s);
  non_negative("monitor.watchdog_restart_s", m.watchdog_restart_s);
  const auto& r = c.restart;
  at_least("restart.max_restarts", r.max_restarts, 0);
  positive("restart.window_s", r.window_s);
  non_negative("restart.backoff_s", r.backoff_s);
  c.max_restarts_of("loader");  // parses restart.per_actor, throws naming it
  non_negative("plan.host_ram_gb", c.plan.host_ram_gb);
  non_negative("plan.disk_gb", c.plan.disk_gb);
  if (c.plan.hardware.empty())
    throw ConfigError("plan.hardware", "must name a profile (this, h200, h100, gh200, a100)");
}

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
      throw ConfigError("restart.per_actor", "'" + item +
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
      throw ConfigError("restart.per_actor", "'" + item + "': MAX must be an integer >= 0");
    if (name == actor) result = max;
  }
  return result;
}

void TrainConfig::validate_values() const {
  train_values(*this);
  at_least("data.seq_length", data.seq_length, 1);
  not_empty("data.train_files", data.train_files);
  model_values(*this);
  device_values(*this);
  thread_values(*this);
  at_least("log.logging_steps", log.logging_steps, 1);
  monitor_values(*this);
}

void TrainConfig::validate_files() const {
  files_exist("data.train_files", data.train_files);
  if (!data.validation_files.empty()) files_exist("data.validation_files", data.validation_files);
  if (!data.tokenizer_file.empty()) file_exists("data.tokenizer_file", data.tokenizer_file);
  std::error_code ec;
  if (!model.config_file.empty()) {
    const bool ok = fs::is_regular_file(model.config_file, ec) ||
                    fs::is_regular_file(fs::path(model.config_file) / "config.json", ec);
    if (!ok)
      throw ConfigError("model.config_file",
                        "'" + model.config_file + "' is neither a config.json nor a directory holding one");
  }
  if (!model.model_name_or_path.empty() && !fs::is_regular_file(fs::path(model.model_name_or_path) / "config.json", ec))
    throw ConfigError("model.model_name_or_path",
                      "'" + model.model_name_or_path + "' is not a model directory (no config.json)");
  if (!train.offload_dir.empty() && fs::exists(train.offload_dir, ec) && !fs::is_directory(train.offload_dir, ec))
    throw ConfigError("train.offload_dir", "'" + train.offload_dir + "' exists and is not a directory");
  if (fs::exists(train.output_dir, ec) && !fs::is_directory(train.output_dir, ec))
    throw ConfigError("train.output_dir", "'" + train.output_dir + "' exists and is not a directory");
  if (!monitor.token_file.empty() && !fs::is_regular_file(monitor.token_file, ec))
    throw ConfigError("monitor.token_file", "'" + monitor.token_file + "' is not a readable file");
  const auto& resume = train.resume_from_checkpoint;
  if (!resume.empty() && resume != "latest" && !fs::is_directory(resume, ec))
    throw ConfigError("train.resume_from_checkpoint", "checkpoint directory '" + resume + "' does not exist");
}

void TrainConfig::validate() const {
  validate_values();
  validate_files();
}

}  // namespace mt
