// megatrain: the node binary.
//   megatrain train [--config-file=FILE.ini] [--section.key=value ...]   train (see --help for every key)
//   megatrain train --help | --dump-config
// Reads and validates the whole configuration (INI file, command-line overrides), the model and the
// data before anything starts; a bad key, value or file is a clear error and exit code 1. Then trains,
// printing one progress line per step and writing the same as JSONL; SIGINT/SIGTERM stop it cleanly
// after the step in progress.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "config/node_config.hpp"
#include "data/loader.hpp"
#include "data/shard.hpp"
#include "storage/hf/hf_config.hpp"

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) { g_stop.store(true); }

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: megatrain train [--config-file=FILE.ini] [--section.key=value ...]\n"
               "       megatrain train --help         every key, its default and meaning\n"
               "       megatrain train --dump-config  the effective configuration\n");
}

int train(int argc, char** argv) {
  std::vector<std::string> args(argv + 2, argv + argc);
  mt::NodeConfig node;
  const mt::NodeConfigLoad load = node.load(args);
  if (load.outcome == mt::NodeConfigLoad::Outcome::exit_success) return 0;
  if (load.outcome == mt::NodeConfigLoad::Outcome::exit_failure) {
    std::fprintf(stderr, "megatrain: %s\n", load.error.c_str());
    return 1;
  }
  const mt::TrainConfig& cfg = node.values;

  // Everything that can fail on bad input, before training starts.
  mt::ModelConfig model;
  std::unique_ptr<mt::actors::ShardBatchSource> data;
  mt::actors::EnginePlan plan;
  try {
    if (!cfg.model.model_name_or_path.empty())
      throw mt::ConfigError("model.model_name_or_path", "starting from pretrained weights is not supported by the engine yet");
    if (!cfg.train.resume_from_checkpoint.empty())
      throw mt::ConfigError("train.resume_from_checkpoint", "resuming needs the checkpointer, which is not part of the node yet");
    model = cfg.model.config_file.empty() ? cfg.model_config_from_keys() : mt::hf::load_config(cfg.model.config_file);
    plan = mt::actors::plan_engine(cfg, model);
    mt::data::LoaderOptions lo;
    lo.shards = mt::data::expand_shard_paths({cfg.data.train_files});
    lo.batch_size = static_cast<int>(cfg.train.per_device_train_batch_size);
    lo.seq_len = static_cast<int>(cfg.data.seq_length);
    lo.seed = static_cast<std::uint64_t>(cfg.train.seed);
    lo.vocab_size = static_cast<std::uint32_t>(model.vocab_size);
    // Every token id must fit the model's vocabulary: checked over the whole data now, not mid-run.
    std::int64_t max_token = -1;
    for (const auto& path : lo.shards) {
      const auto shard = mt::data::TokenShard::open(path, lo.format, false);
      for (std::size_t i = 0; i < shard.size(); ++i) max_token = std::max<std::int64_t>(max_token, shard[i]);
    }
    mt::TrainConfig::check_vocab(model, 0, max_token);
    data = std::make_unique<mt::actors::ShardBatchSource>(lo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: %s\n", e.what());
    return 1;
  }
  for (const auto& n : plan.notes) std::fprintf(stderr, "megatrain: note: %s\n", n.c_str());

  const std::string jsonl_path = cfg.train_jsonl_path();
  std::ofstream jsonl;
  try {
    const auto dir = std::filesystem::path(jsonl_path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    jsonl.open(jsonl_path, std::ios::trunc);
    if (!jsonl) throw std::runtime_error("cannot write " + jsonl_path + " (log.train_jsonl / train.output_dir)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: %s\n", e.what());
    return 1;
  }

  mt::HostModel host(model);
  mt::actors::init_host_model(host, static_cast<std::uint64_t>(cfg.train.seed));
  std::printf("megatrain: %s, %lld layers, %.2fM parameters; %lld steps of %lld x %lld x %lld tokens; host %.1f MiB, "
              "device arena %.1f MiB of %.1f MiB budget (%d weight slots)\n",
              mt::arch_name(model.arch), static_cast<long long>(model.num_hidden_layers),
              static_cast<double>(mt::total_param_count(model)) / 1e6, static_cast<long long>(cfg.train.max_steps),
              static_cast<long long>(plan.micro_batches), static_cast<long long>(plan.batch),
              static_cast<long long>(plan.seq), static_cast<double>(host.host_bytes()) / (1 << 20),
              static_cast<double>(plan.arena.total_bytes) / (1 << 20),
              static_cast<double>(plan.arena.budget_bytes) / (1 << 20), plan.weight_slots);
  std::fflush(stdout);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  mt::actors::EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = data.get();
  job.host = &host;
  job.stop = &g_stop;
  const std::int64_t log_every = std::max<std::int64_t>(1, cfg.log.logging_steps);
  job.on_step = [&](const mt::actors::StepRecord& r) {
    std::printf("step %5lld | loss %.4f | lr %.3e | grad norm %.3f | %8.0f tok/s | step %.3fs (weights wait %.3f, "
                "compute %.3f, grad offload %.3f, optimizer %.3f)%s\n",
                static_cast<long long>(r.step), r.loss, r.lr, r.grad_norm, r.tokens_per_s, r.step_s, r.wait_weights_s,
                r.compute_s, r.offload_s, r.optimizer_s, r.restarts ? " [restarted]" : "");
    std::fflush(stdout);
    if (r.step % log_every == 0 || r.step == cfg.train.max_steps) {
      nlohmann::json j{{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                       {"clip", r.clip}, {"tokens", r.tokens}, {"tokens_per_s", r.tokens_per_s},
                       {"step_s", r.step_s}, {"wait_weights_s", r.wait_weights_s}, {"compute_s", r.compute_s},
                       {"offload_s", r.offload_s}, {"optimizer_s", r.optimizer_s}, {"restarts", r.restarts}};
      jsonl << j.dump() << '\n';
      jsonl.flush();
    }
  };

  mt::actors::EngineResult res;
  try {
    caf::actor_system sys{node};
    res = mt::actors::run_engine(sys, std::move(job));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: %s\n", e.what());
    return 1;
  }
  for (const auto& l : res.restart_log) std::fprintf(stderr, "megatrain: %s\n", l.c_str());
  if (!res.error.empty()) {
    std::fprintf(stderr, "megatrain: training failed: %s\n", res.error.c_str());
    return 1;
  }
  double tok = 0, secs = 0;
  for (const auto& r : res.steps) {
    tok += static_cast<double>(plan.batch * plan.seq * plan.micro_batches);
    secs += r.step_s;
  }
  std::printf("megatrain: %s after %lld steps in %.1fs (%.0f tokens/s); final loss %.4f; device arena peak %.2f MiB "
              "of %.2f MiB budget; log %s\n",
              res.stopped_early ? "stopped by signal" : "done", static_cast<long long>(res.steps_done), res.wall_s,
              secs > 0 ? tok / secs : 0.0, res.steps.empty() ? 0.0 : res.steps.back().loss,
              static_cast<double>(res.arena.peak_bytes) / (1 << 20),
              static_cast<double>(res.arena.budget_bytes) / (1 << 20), jsonl_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "train") != 0) {
    std::fprintf(stderr, "megatrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  return train(argc, argv);
}
