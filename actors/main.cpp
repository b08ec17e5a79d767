// megatrain: the node binary.
//   megatrain train [--config-file=FILE.ini] [--section.key=value ...]   train (see --help for every key)
//   megatrain train --help | --dump-config
// Reads and validates the whole configuration (INI file, command-line overrides), the model and the
// data before anything starts; a bad key, value or file is a clear error and exit code 1. Then trains,
// printing one progress line per step and writing the same as JSONL.
// Checkpoints go to train.output_dir (step-N directories + `latest`): every train.save_steps steps,
// every train.save_minutes minutes, on SIGUSR1 (at the next step boundary), and always at the end of
// the run. SIGTERM / SIGINT: finish the step in progress, write the final checkpoint, exit 0.
// train.resume_from_checkpoint=latest|DIR continues a run bit-identically; model.model_name_or_path
// starts from Hugging Face weights; train.export_hf_dir writes the final weights as a HF directory.
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
#include "actors/run_state.hpp"
#include "config/node_config.hpp"
#include "data/loader.hpp"
#include "data/shard.hpp"
#include "data/tokenizer.hpp"
#include "storage/hf/file_util.hpp"
#include "storage/hf/hf_config.hpp"

// LeakSanitizer (asan preset): HDF5's global state is never freed because storage/checkpoint turns
// HDF5's exit handler off (H5dont_atexit; see storage/checkpoint/README.md), which LSan would report
// as a leak in every process that wrote or read a checkpoint. Inert in other builds.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name is LSan's interface
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_checkpoint{false};

extern "C" void on_signal(int) { g_stop.store(true); }
extern "C" void on_checkpoint_signal(int) { g_checkpoint.store(true); }

// Test-only: MEGATRAIN_TEST_CKPT_STALL=STEP:STAGE:SECONDS sleeps inside the write of that stage of that
// checkpoint (kill -9 during a checkpoint write).
void parse_stall(mt::actors::CheckpointJob& cj) {
  const char* e = std::getenv("MEGATRAIN_TEST_CKPT_STALL");
  if (e == nullptr || *e == 0) return;
  long long step = -1, stage = -1;
  double secs = 0;
  if (std::sscanf(e, "%lld:%lld:%lf", &step, &stage, &secs) == 3) {
    cj.stall_step = step;
    cj.stall_stage = stage;
    cj.stall_seconds = secs;
  }
}

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
  std::unique_ptr<mt::MomentStore> moments;  // nullptr: the moments live in the host tiles
  try {
    if (!cfg.model.model_name_or_path.empty())
      model = mt::hf::load_config(cfg.model.model_name_or_path);
    else
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
    // The tokenizer the data was made with must fit the model's vocabulary too (its largest id + 1).
    std::int64_t tokenizer_vocab = 0;
    if (!cfg.data.tokenizer_file.empty())
      tokenizer_vocab = mt::data::Tokenizer::load(cfg.data.tokenizer_file).vocab_size();
    mt::TrainConfig::check_vocab(model, tokenizer_vocab, max_token);
    data = std::make_unique<mt::actors::ShardBatchSource>(lo);
    moments = mt::actors::moment_store_for(cfg, model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: %s\n", e.what());
    return 1;
  }
  for (const auto& n : plan.notes) std::fprintf(stderr, "megatrain: note: %s\n", n.c_str());

  // Starting weights: a checkpoint to resume, Hugging Face weights, or the seeded random init.
  mt::HostModel host(model, mt::actors::host_tile_options(cfg), nullptr, std::move(moments));
  std::int64_t first_step = 0;
  std::string hf_config;
  const bool resuming = !cfg.train.resume_from_checkpoint.empty();
  try {
    if (!cfg.model.model_name_or_path.empty()) {
      hf_config = mt::actors::load_hf_weights(cfg.model.model_name_or_path, host).dump();
      std::printf("megatrain: initial weights from %s\n", cfg.model.model_name_or_path.c_str());
    } else {
      mt::actors::init_host_model(host, static_cast<std::uint64_t>(cfg.train.seed));
    }
    if (resuming) {
      const auto path = mt::actors::resume_path(cfg, cfg.train.output_dir);
      const auto rp =
          mt::actors::load_checkpoint(path, cfg.train.resume_fallback == "previous_good", cfg, model, host, data.get());
      for (const auto& k : rp.skipped) std::fprintf(stderr, "megatrain: skipped damaged checkpoint: %s\n", k.c_str());
      for (const auto& n : rp.notes) std::fprintf(stderr, "megatrain: note: %s\n", n.c_str());
      if (rp.run_state.contains("model_name_or_path") && hf_config.empty()) {
        const auto hf = rp.run_state["model_name_or_path"].get<std::string>();
        if (!hf.empty() && std::filesystem::is_regular_file(std::filesystem::path(hf) / "config.json"))
          hf_config = mt::hf::read_json_file(std::filesystem::path(hf) / "config.json").dump();
      }
      first_step = rp.step;
      std::printf("megatrain: resumed from %s at step %lld\n", rp.dir.c_str(), static_cast<long long>(first_step));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: cannot %s: %s\n", resuming ? "resume" : "load the initial weights", e.what());
    return 1;
  }

  const std::string jsonl_path = cfg.train_jsonl_path();
  const std::string events_path = cfg.events_jsonl_path();
  std::ofstream jsonl, events;
  try {
    const auto dir = std::filesystem::path(jsonl_path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    jsonl.open(jsonl_path, resuming ? std::ios::app : std::ios::trunc);
    const auto edir = std::filesystem::path(events_path).parent_path();
    if (!edir.empty()) std::filesystem::create_directories(edir);
    events.open(events_path, std::ios::app);
    if (!events) throw std::runtime_error("cannot write " + events_path + " (log.events_jsonl / train.output_dir)");
    if (!jsonl) throw std::runtime_error("cannot write " + jsonl_path + " (log.train_jsonl / train.output_dir)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: %s\n", e.what());
    return 1;
  }

  std::printf(
      "megatrain: %s, %lld layers, %.2fM parameters; %lld steps of %lld x %lld x %lld tokens; host %.1f MiB, "
      "device arena %.1f MiB of %.1f MiB budget (%d weight slots)\n",
      mt::arch_name(model.arch), static_cast<long long>(model.num_hidden_layers),
      static_cast<double>(mt::total_param_count(model)) / 1e6, static_cast<long long>(cfg.train.max_steps),
      static_cast<long long>(plan.micro_batches), static_cast<long long>(plan.batch), static_cast<long long>(plan.seq),
      static_cast<double>(host.host_bytes() + plan.host_boundary_bytes) / (1 << 20),
      static_cast<double>(plan.arena.total_bytes) / (1 << 20), static_cast<double>(plan.arena.budget_bytes) / (1 << 20),
      plan.weight_slots);
  std::fflush(stdout);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction su {};
  su.sa_handler = on_checkpoint_signal;
  sigemptyset(&su.sa_mask);
  sigaction(SIGUSR1, &su, nullptr);

  mt::actors::EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = data.get();
  job.host = &host;
  job.stop = &g_stop;
  job.first_step = first_step;
  if (cfg.train.stop_after_steps > 0) job.stop_after = cfg.train.stop_after_steps;
  job.checkpoint.root = cfg.train.output_dir;
  job.checkpoint.save_steps = cfg.train.save_steps;
  job.checkpoint.keep_last = static_cast<int>(cfg.train.save_total_limit);
  job.checkpoint.save_minutes = cfg.train.save_minutes;
  job.checkpoint.request = &g_checkpoint;
  job.checkpoint.hf_config_json = hf_config;
  parse_stall(job.checkpoint);
  job.on_checkpoint = [&](const mt::actors::CheckpointEvent& ev) {
    if (ev.ok)
      std::printf("checkpoint step %lld saved to %s (%.1f MiB in %.2fs)\n", static_cast<long long>(ev.step),
                  ev.path.c_str(), static_cast<double>(ev.bytes) / (1 << 20), ev.seconds);
    else
      std::printf("checkpoint step %lld FAILED (training continues; previous checkpoints intact): %s\n",
                  static_cast<long long>(ev.step), ev.error.c_str());
    std::fflush(stdout);
    nlohmann::json j{{"event", ev.ok ? "checkpoint_saved" : "checkpoint_failed"}, {"step", ev.step}};
    if (ev.ok) {
      j["path"] = ev.path;
      j["bytes"] = ev.bytes;
      j["seconds"] = ev.seconds;
    } else {
      j["error"] = ev.error;
    }
    events << j.dump() << '\n';
    events.flush();
  };
  const std::int64_t log_every = std::max<std::int64_t>(1, cfg.log.logging_steps);
  job.on_step = [&](const mt::actors::StepRecord& r) {
    std::printf(
        "step %5lld | loss %.4f | lr %.3e | grad norm %.3f | %8.0f tok/s | step %.3fs (weights wait %.3f, "
        "compute %.3f, grad offload %.3f, optimizer %.3f%s)%s\n",
        static_cast<long long>(r.step), r.loss, r.lr, r.grad_norm, r.tokens_per_s, r.step_s, r.wait_weights_s,
        r.compute_s, r.offload_s, r.optimizer_s,
        r.checkpoint_wait_s > 0 ? (", checkpoint wait " + std::to_string(r.checkpoint_wait_s)).c_str() : "",
        r.restarts ? " [restarted]" : "");
    std::fflush(stdout);
    if (r.step % log_every == 0 || r.step == cfg.train.max_steps) {
      nlohmann::json j{{"step", r.step},
                       {"loss", r.loss},
                       {"lr", r.lr},
                       {"grad_norm", r.grad_norm},
                       {"clip", r.clip},
                       {"tokens", r.tokens},
                       {"tokens_per_s", r.tokens_per_s},
                       {"step_s", r.step_s},
                       {"wait_weights_s", r.wait_weights_s},
                       {"compute_s", r.compute_s},
                       {"offload_s", r.offload_s},
                       {"optimizer_s", r.optimizer_s},
                       {"checkpoint_wait_s", r.checkpoint_wait_s},
                       {"restarts", r.restarts}};
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
  if (!cfg.train.export_hf_dir.empty()) {
    try {
      mt::actors::export_hf(cfg.train.export_hf_dir, host, hf_config);
      std::printf("megatrain: exported the final weights (step %lld) to %s\n", static_cast<long long>(res.steps_done),
                  cfg.train.export_hf_dir.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megatrain: export to %s failed: %s\n", cfg.train.export_hf_dir.c_str(), e.what());
      return 1;
    }
  }
  double tok = 0, secs = 0;
  for (const auto& r : res.steps) {
    tok += static_cast<double>(plan.batch * plan.seq * plan.micro_batches);
    secs += r.step_s;
  }
  std::printf(
      "megatrain: %s after %lld steps in %.1fs (%.0f tokens/s); final loss %.4f; device arena peak %.2f MiB "
      "of %.2f MiB budget; log %s\n",
      res.stopped_early ? "stopped by signal" : "done", static_cast<long long>(res.steps_done), res.wall_s,
      secs > 0 ? tok / secs : 0.0, res.steps.empty() ? 0.0 : res.steps.back().loss,
      static_cast<double>(res.arena.peak_bytes) / (1 << 20), static_cast<double>(res.arena.budget_bytes) / (1 << 20),
      jsonl_path.c_str());
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
