#include "node/training_run.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/monitor_publish.hpp"
#include "actors/run_state.hpp"
#include "cluster/grad_reduce.hpp"
#include "cluster/world.hpp"
#include "config/keys.hpp"
#include "config/node_config.hpp"
#include "data/dataset_builder.hpp"
#include "data/loader.hpp"
#include "data/shard.hpp"
#include "data/tokenizer.hpp"
#include "kernels/cpu/cpu_info.hpp"
#include "monitor/status_board.hpp"
#include "node/host_pinning.hpp"
#include "plan/kernel_choice.hpp"
#include "plan/resource_plan.hpp"
#include "plan/state_modes.hpp"
#include "plan/tier_bytes.hpp"
#include "storage/hf/file_util.hpp"
#include "storage/hf/hf_config.hpp"

namespace mt::node {

using namespace mt::actors;  // the engine this folder runs
using namespace mt::plan;

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_checkpoint{false};

extern "C" void on_signal(int) { g_stop.store(true); }
extern "C" void on_checkpoint_signal(int) { g_checkpoint.store(true); }

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction su {};
  su.sa_handler = on_checkpoint_signal;
  sigemptyset(&su.sa_mask);
  sigaction(SIGUSR1, &su, nullptr);
}

// A file-size limit (ulimit -f) makes a write fail with EFBIG, which the NVMe tier and the
// checkpointer report by file name, instead of killing the process with no message. Before the
// starting weights: initialising train.offload_params writes the tier's files.
void ignore_file_size_signal() {
  struct sigaction si {};
  si.sa_handler = SIG_IGN;
  sigemptyset(&si.sa_mask);
  sigaction(SIGXFSZ, &si, nullptr);
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buffer[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buffer, sizeof buffer, fmt, ap);
  va_end(ap);
  return buffer;
}

void print_default(MessageStream stream, const std::string& line) {
  std::FILE* f = stream == MessageStream::out ? stdout : stderr;
  std::fputs(line.c_str(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

// A run's setup (model, data, starting weights, logs) and its outcome. Each step that fails records
// the error and the run ends with exit status 1.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& cfg, const TrainingHooks& hooks)
      : cfg_(cfg),
        hooks_(hooks),
        sink_(hooks.message ? hooks.message : print_default),
        rank_(hooks.world != nullptr && cfg.cluster.ranks > 1 ? cfg.cluster.rank : 0) {
    // Several ranks: rank 0 speaks for the job; the others say only why they failed.
    if (rank_ == 0)
      say_ = sink_;
    else
      say_ = [](MessageStream, const std::string&) {};
    // Several ranks on one host share its cores: threads.total = auto gives each its share, not all of
    // them (N ranks each spinning a team on every core would oversubscribe them N times over).
    if (hooks.world != nullptr && cfg_.cluster.ranks > 1 && cfg_.threads.total == 0 && hooks.world->local_size() > 1) {
      const int local = hooks.world->local_size();
      const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
      cfg_.threads.total = std::max(1, hardware / local);
      threads_note_ = "threads.total=auto: " + std::to_string(cfg_.threads.total) + " thread(s) per rank (" +
                      std::to_string(local) + " ranks share this host's " + std::to_string(hardware) +
                      " hardware threads)";
    }
  }

  TrainingResult run(caf::actor_system_config* system_config);

 private:
  bool fail(const std::string& error) {
    sink_(MessageStream::err,
          "megatrain: " + (cfg_.cluster.ranks > 1 ? "rank " + std::to_string(cfg_.cluster.rank) + ": " : "") + error);
    result_.exit_status = 1;
    result_.error = error;
    return false;
  }
  bool check_model_and_data();
  bool drop_accumulators_if_only_that_fits();
  bool load_starting_weights();
  bool open_logs();
  bool report_host_bytes_per_rank();
  bool choose_checkpoint_writers();
  bool export_final_weights(const EngineResult& res);
  bool report_cluster_end(const EngineResult& res);
  bool gather_per_rank(std::uint64_t mine, const std::string& what, std::vector<std::uint64_t>& every);
  bool choose_kernel_paths();
  EngineJob make_job();

  TrainConfig cfg_;           // the caller's, with train.gradient_buffer=auto resolved by the fit check
  std::string threads_note_;  // several ranks on one host: their share of its cores
  const TrainingHooks& hooks_;
  std::function<void(MessageStream, const std::string&)> sink_;  // where messages go
  int rank_ = 0;  // several ranks: this one (only rank 0 prints and writes into the run directory)
  std::function<void(MessageStream, const std::string&)> say_;  // sink_ on rank 0, nothing on the others
  TrainingResult result_;
  ModelConfig model_;
  std::unique_ptr<ShardBatchSource> shards_;
  BatchSource* data_ = nullptr;
  std::unique_ptr<VectorBatchSource> eval_data_;  // data.validation_files; null = no evaluation
  std::unique_ptr<MomentStore> moments_;          // train.offload_dir / optimizer_compression; null = in the tiles
  std::vector<EvalRecord> evaluations_;           // a resumed run's evaluations so far
  EnginePlan plan_;
  std::unique_ptr<BackendPinning> pinning_;  // before host_: the tiles are unpinned before it goes
  std::unique_ptr<HostModel> host_;
  std::string hf_config_;
  bool resuming_ = false;
  nlohmann::json resumed_run_state_ = nlohmann::json::object();  // the checkpoint's run state (resuming)
  nlohmann::json kernel_choices_ = nlohmann::json::object();
  bool owners_write_ = false;  // cluster.checkpoint_writers resolved: every rank writes its own stages
  std::string shared_tag_;     // rank 0's pid: names the checkpoints' shared temporary directories
  std::ofstream jsonl_, events_;
};

// Everything that can fail on bad input, before training starts.
bool TrainingRun::check_model_and_data() {
  try {
    cfg_.data.packing = data::resolved_packing(cfg_.data.packing, cfg_.data.train_files);  // once, recorded
    // An error about a file a key names starts with the key ("data.tokenizer_file: /etc/passwd: ...").
    const auto& m = cfg_.model;
    if (!m.model_name_or_path.empty())
      model_ = naming_key(key_of(cfg_, m.model_name_or_path), [&] { return hf::load_config(m.model_name_or_path); });
    else if (!m.config_file.empty())
      model_ = naming_key(key_of(cfg_, m.config_file), [&] { return hf::load_config(m.config_file); });
    else
      model_ = cfg_.model_config_from_keys();
    model_ = cfg_.with_training_switches(model_);  // the load-balancing loss over a config.json's model
    check_cluster_runs(cfg_);
    cfg_.pin_host_ram();  // before the host state is allocated: every plan of the run sees the same RAM
    plan_ = plan_engine(cfg_, model_);
    // Host RAM and disk against the plan (plan): refused only when it genuinely cannot fit.
    if (!drop_accumulators_if_only_that_fits()) return false;
    if (const std::string fit = plan::check_run_fits(cfg_, model_, {}, &plan_); !fit.empty()) {
      if (cfg_.plan.enforce)
        throw std::runtime_error(fit + " (`megatrain plan` prints the whole plan; --plan.enforce=false starts anyway)");
      say_(MessageStream::err, "megatrain: warning: " + fit);
    }
    // The tokenizer the data was made with must fit the model's vocabulary (its largest id + 1).
    std::int64_t tokenizer_vocab = 0;
    if (!cfg_.data.tokenizer_file.empty())
      tokenizer_vocab = naming_key(key_of(cfg_, cfg_.data.tokenizer_file),
                                   [&] { return data::Tokenizer::load(cfg_.data.tokenizer_file).vocab_size(); });
    if (hooks_.data != nullptr) {
      TrainConfig::check_vocab(model_, tokenizer_vocab, -1);
      data_ = hooks_.data;
    } else {
      data::LoaderOptions lo;
      lo.shards = data::expand_shard_paths({cfg_.data.train_files});
      lo.batch_size = static_cast<int>(cfg_.train.per_device_train_batch_size);
      lo.seq_len = static_cast<int>(cfg_.data.seq_length);
      lo.seed = static_cast<std::uint64_t>(cfg_.train.seed);
      lo.vocab_size = static_cast<std::uint32_t>(model_.vocab_size);
      lo.documents = cfg_.data.packing == "documents";
      TrainConfig::check_vocab(model_, tokenizer_vocab, -1);
      // Shard headers and sizes are checked here (the loader opens every shard); token ids where they
      // are read (every window the loader serves is checked against the vocabulary, naming the file
      // and offset), so start-up does not grow with the corpus.
      shards_ = naming_key(key_of(cfg_, cfg_.data.train_files), [&] { return std::make_unique<ShardBatchSource>(lo); });
      data_ = shards_.get();
    }
    moments_ = moment_store_for(cfg_, model_);  // nullptr: the moments live in the host tiles
    if (!cfg_.data.validation_files.empty()) {
      std::string too_short;  // valid files, too short for one micro-batch (long context): no evaluation
      eval_data_ = naming_key(key_of(cfg_, cfg_.data.validation_files), [&]() -> std::unique_ptr<VectorBatchSource> {
        try {
          return make_eval_source(cfg_.data.validation_files, static_cast<int>(plan_.batch),
                                  static_cast<int>(plan_.seq), static_cast<std::uint32_t>(model_.vocab_size),
                                  cfg_.train.eval_max_batches, cfg_.data.packing == "documents");
        } catch (const data::TooFewTokens& e) {
          too_short = e.what();
          return nullptr;
        }
      });
      if (!too_short.empty())
        say_(MessageStream::err, "megatrain: note: data.validation_files: " + too_short +
                                     ": this run does not evaluate (give longer validation files, or set "
                                     "data.validation_files=\"\" to say so)");
    }
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (!threads_note_.empty()) say_(MessageStream::err, "megatrain: note: " + threads_note_);

  for (const auto& n : plan_.notes) say_(MessageStream::err, "megatrain: note: " + n);
  say_(MessageStream::out, "megatrain: plan " + plan_summary(plan_).dump());  // the engine runs this plan
  return true;
}

// train.gradient_buffer=auto: stage gradients when only they fit host RAM (plan). Several ranks decide
// alike, as their collectors must (their transfers pair up): each rank holds other stages and may see
// another host's RAM, so the accumulators go on every rank when they do not fit one.
bool TrainingRun::drop_accumulators_if_only_that_fits() {
  std::optional<TrainConfig> staged = plan::without_accumulators_if_only_that_fits(
      cfg_, [&](const TrainConfig& c) { return plan::check_run_fits(c, model_).empty(); });
  if (cfg_.cluster.ranks > 1 && hooks_.world != nullptr && plan::may_drop_accumulators(cfg_)) {
    std::vector<std::uint64_t> wanted;
    if (!gather_per_rank(staged ? 1 : 0, "every rank's train.gradient_buffer", wanted)) return false;
    if (!staged && std::find(wanted.begin(), wanted.end(), 1) != wanted.end()) {
      staged = cfg_;
      staged->train.gradient_buffer = "stage";
    }
  }
  if (!staged) return true;
  cfg_ = *staged;
  plan_ = plan_engine(cfg_, model_);
  say_(MessageStream::out, std::string("megatrain: ") + plan::kDroppedAccumulatorsNote);
  return true;
}

// Starting weights: a checkpoint to resume, the hook's, Hugging Face weights, or the seeded random init.
bool TrainingRun::load_starting_weights() {
  resuming_ = !cfg_.train.resume_from_checkpoint.empty();
  try {
    pinning_ = host_pinning_for(cfg_, plan_);  // null on the CPU backend
    host_ = std::make_unique<HostModel>(model_, host_tile_options(cfg_), pinning_.get(), std::move(moments_),
                                        host_owned_stages(cfg_, model_));
    if (hooks_.initial_weights) {
      hf_config_ = hooks_.initial_weights(*host_);
    } else if (!cfg_.model.model_name_or_path.empty()) {
      hf_config_ = load_hf_weights(cfg_.model.model_name_or_path, *host_).dump();
      say_(MessageStream::out, "megatrain: initial weights from " + cfg_.model.model_name_or_path);
    } else {
      init_host_model(*host_, static_cast<std::uint64_t>(cfg_.train.seed));
    }
    if (resuming_) {
      const auto path = resume_path(cfg_, cfg_.train.output_dir);
      const auto rp = load_checkpoint(path, cfg_.train.resume_fallback == "previous_good", cfg_, model_, *host_, data_);
      for (const auto& k : rp.skipped) say_(MessageStream::err, "megatrain: skipped damaged checkpoint: " + k);
      for (const auto& n : rp.notes) say_(MessageStream::err, "megatrain: note: " + n);
      if (rp.run_state.contains("model_name_or_path") && hf_config_.empty()) {
        const auto hf = rp.run_state["model_name_or_path"].get<std::string>();
        if (!hf.empty() && std::filesystem::is_regular_file(std::filesystem::path(hf) / "config.json"))
          hf_config_ = hf::read_json_file(std::filesystem::path(hf) / "config.json").dump();
      }
      result_.first_step = rp.step;
      resumed_run_state_ = rp.run_state;
      if (rp.run_state.contains("evaluations")) evaluations_ = evaluations_from_json(rp.run_state["evaluations"]);
      say_(MessageStream::out,
           format("megatrain: resumed from %s at step %lld", rp.dir.c_str(), static_cast<long long>(rp.step)));
    }
  } catch (const std::exception& e) {
    return fail(std::string("cannot ") + (resuming_ ? "resume" : "load the initial weights") + ": " + e.what());
  }
  return true;
}

bool TrainingRun::open_logs() {
  result_.train_jsonl = cfg_.train_jsonl_path();
  if (rank_ > 0) return true;  // rank 0 writes the job's logs
  const std::string events_path = cfg_.events_jsonl_path();
  try {
    const auto dir = std::filesystem::path(result_.train_jsonl).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    jsonl_.open(result_.train_jsonl, resuming_ ? std::ios::app : std::ios::trunc);
    const auto edir = std::filesystem::path(events_path).parent_path();
    if (!edir.empty()) std::filesystem::create_directories(edir);
    events_.open(events_path, std::ios::app);
    if (!events_) throw std::runtime_error("cannot write " + events_path + " (log.events_jsonl / train.output_dir)");
    if (!jsonl_)
      throw std::runtime_error("cannot write " + result_.train_jsonl + " (log.train_jsonl / train.output_dir)");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return true;
}

// The products' libraries and paths, before the first product (plan/kernel_choice.hpp), said once and logged.
bool TrainingRun::choose_kernel_paths() {
  KernelChoice c;
  try {
    cpu::avx512_allowed();  // a malformed MEGATRAIN_MAX_CPU_ISA is refused here, before any kernel runs
    nlohmann::json state = resumed_run_state_;
    cluster::World* world = cfg_.cluster.ranks > 1 ? hooks_.world : nullptr;
    // Several ranks take rank 0's choice (as a resume takes the checkpoint's): every rank must run the
    // same products for the same bits, and a probe on each could measure differently.
    if (world != nullptr && world->rank() > 0) {
      std::string text;
      world->broadcast(cluster::Channel::control, 0, text, "rank 0's kernel choice");
      if (!text.empty()) state["kernel_choices"] = nlohmann::json::parse(text);
    }
    c = choose_kernels(cfg_, model_, plan_, state);
    if (world != nullptr && world->rank() == 0) {
      std::string text = c.applies ? c.json().dump() : "";
      world->broadcast(cluster::Channel::control, 0, text, "rank 0's kernel choice");
    }
  } catch (const std::exception& e) {
    return fail(std::string("choosing the kernels: ") + e.what());
  }
  if (!c.applies) return true;
  for (const auto& n : c.notes) say_(MessageStream::err, "megatrain: warning: " + n);
  say_(MessageStream::out, "megatrain: " + c.fp32_line());
  if (c.bf16) {
    say_(MessageStream::out, "megatrain: " + c.line());
    say_(MessageStream::out, "megatrain: " + c.attention_line());
  }
  kernel_choices_ = c.json();
  nlohmann::json ev{{"event", "kernel_choice"}, {"t", monitor::unix_seconds()}, {"step", result_.first_step}};
  ev.update(kernel_choices_);
  events_ << ev.dump() << '\n';
  events_.flush();
  return true;
}

// Several ranks: every rank's `mine` into `every` (in rank order, on the control channel); false (the
// run failed, said) when a rank does not answer.
bool TrainingRun::gather_per_rank(std::uint64_t mine, const std::string& what, std::vector<std::uint64_t>& every) {
  every.assign(static_cast<std::size_t>(cfg_.cluster.ranks), 0);
  try {
    hooks_.world->allgather(cluster::Channel::control, &mine, sizeof mine, every.data(), what);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return true;
}

// " rank 0 1.2 MiB, rank 1 3.4 MiB" for bytes per rank.
std::string per_rank_mib(const std::vector<std::uint64_t>& bytes, int decimals) {
  std::string line;
  for (std::size_t r = 0; r < bytes.size(); ++r)
    line += format(" rank %zu %.*f MiB%s", r, decimals, static_cast<double>(bytes[r]) / (1 << 20),
                   r + 1 < bytes.size() ? "," : "");
  return line;
}

// The end of a job of several ranks: what this rank sent, its reduction's hidden share, and every
// rank's peak memory (a collective: every rank calls it).
bool TrainingRun::report_cluster_end(const EngineResult& res) {
  if (cfg_.cluster.ranks <= 1 || hooks_.world == nullptr || res.steps.empty()) return true;
  // What this rank sent (cluster/grad_reduce.hpp: with one micro-batch per step every rank sends
  // 2(N-1)/N of the model's fp32 gradient a step), against that gradient.
  double gradient_bytes = 0;
  for (std::int64_t s = 0; s < num_stages(model_); ++s)
    gradient_bytes += static_cast<double>(stage_layout(model_, s).total_floats) * sizeof(float);
  const auto steps = static_cast<double>(res.steps.size());
  // With the host state sharded the owners' sums go out as new weights (the weights channel) instead.
  // Over NCCL the rounds' gradients bypass the World: the transport counts them (EngineResult).
  const auto sent = static_cast<double>(hooks_.world->bytes_sent(cluster::Channel::grads) +
                                        hooks_.world->bytes_sent(cluster::Channel::weights) + res.grad_transport_bytes);
  say_(MessageStream::out,
       format("megatrain: rank %d sent %.0f bytes of gradients%s in %lld steps (%.4f x the model's fp32 gradient "
              "a step), %llu bytes of losses",
              rank_, sent, cfg_.shards_host_state() ? " and new weights" : "", static_cast<long long>(res.steps.size()),
              sent / steps / gradient_bytes,
              static_cast<unsigned long long>(hooks_.world->bytes_sent(cluster::Channel::losses))));
  // The reduction as rank 0's collector timed it: its transfers with the other ranks, and the part after
  // compute handed over each step's last gradient (nothing of the backward left to hide it behind).
  double reduce = 0, tail = 0;
  for (const auto& r : res.steps) reduce += r.reduce_s, tail += r.reduce_tail_s;
  if (reduce > 0)
    say_(MessageStream::out,
         format("megatrain: rank %d's reduction: %.4f s a step, %.4f s of it after the step's last gradient: "
                "%.3f of it hidden behind the backward",
                rank_, reduce / steps, tail / steps, 1.0 - tail / reduce));
  // Every rank's peak resident memory (getrusage), said by rank 0: what sharding the host state saves.
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  std::vector<std::uint64_t> peaks;
  if (!gather_per_rank(static_cast<std::uint64_t>(usage.ru_maxrss) * 1024, "every rank's peak memory", peaks))
    return false;
  say_(MessageStream::out, "megatrain: peak resident memory per rank:" + per_rank_mib(peaks, 1));
  return true;
}

// train.export_hf_dir: rank 0 writes the final weights. With the host state sharded under bf16 the
// other stages' fp32 masters live on their owners: rank 0 asks for each as it writes it (the stage's
// number on the control channel; -1 ends), and every other rank serves those requests meanwhile, so
// rank 0 holds one stage's masters at a time beyond its own.
bool TrainingRun::export_final_weights(const EngineResult& res) {
  if (cfg_.train.export_hf_dir.empty()) return true;
  cluster::World* world = cfg_.shards_host_state() ? hooks_.world : nullptr;
  // Whether any rank needs the others' masters is the same on every rank (the same config).
  const bool gather = world != nullptr && cfg_.precision() == Precision::bf16;
  if (rank_ > 0) {
    if (!gather) return true;
    try {
      for (;;) {
        std::int64_t stage = -1;
        world->recv(cluster::Channel::control, 0, &stage, sizeof stage, "rank 0's request for masters to export");
        if (stage < 0) return true;
        host_->read_masters(stage, [&](const float* m) {
          world->send(cluster::Channel::control, 0, m, host_->tile(stage).region_bytes(),
                      "the masters of stage " + std::to_string(stage) + " for the export");
        });
      }
    } catch (const std::exception& e) {
      return fail(std::string("serving the export: ") + e.what());
    }
  }
  FetchMasters fetch;  // called only for a stage this rank holds no masters of
  if (gather)
    fetch = [&](std::int64_t stage, float* into) {
      const int owner = cluster::stage_owner(stage, world->size());
      world->send(cluster::Channel::control, owner, &stage, sizeof stage, "a request for masters to export");
      world->recv(cluster::Channel::control, owner, into, host_->tile(stage).region_bytes(),
                  "the masters of stage " + std::to_string(stage) + " for the export");
    };
  std::string error;
  try {
    export_hf(cfg_.train.export_hf_dir, *host_, hf_config_, fetch);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (gather)  // every other rank stops serving, also after a failed export
    for (int r = 1; r < world->size(); ++r) {
      const std::int64_t done = -1;
      try {
        world->send(cluster::Channel::control, r, &done, sizeof done, "the end of the export");
      } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
      }
    }
  if (!error.empty()) return fail("export to " + cfg_.train.export_hf_dir + " failed: " + error);
  say_(MessageStream::out, format("megatrain: exported the final weights (step %lld) to %s",
                                  static_cast<long long>(res.steps_done), cfg_.train.export_hf_dir.c_str()));
  return true;
}

// Several ranks: every rank's host bytes (the tiles and the moment store), gathered on the control
// channel and said by rank 0 beside what one rank would hold unsharded (cluster.shard_state); with a
// moment store also its part of them and its files on the tier, each rank's for its own stages.
bool TrainingRun::report_host_bytes_per_rank() {
  if (cfg_.cluster.ranks <= 1 || hooks_.world == nullptr) return true;
  std::vector<std::uint64_t> every, store_ram, store_disk;
  if (!gather_per_rank(host_->host_bytes(), "every rank's host bytes", every)) return false;
  const bool store = !host_tile_options(cfg_).moments_in_tile;
  if (store && (!gather_per_rank(host_->moments().ram_bytes(), "every rank's moment store bytes", store_ram) ||
                !gather_per_rank(host_->moments().disk_bytes(), "every rank's offload file bytes", store_disk)))
    return false;
  if (rank_ > 0) return true;
  const TierBytes whole = tier_bytes_of_every_stage(cfg_, model_);  // the store's encodings in RAM at their bound
  const auto mib = [](std::size_t b) { return static_cast<double>(b) / (1 << 20); };
  say_(MessageStream::out,
       "megatrain: host tiles per rank (" +
           std::string(cfg_.shards_host_state() ? "the state sharded: cluster.shard_state" : "unsharded") +
           "):" + per_rank_mib(every, 4) +
           format("; one rank unsharded %.4f MiB", mib(whole.tiles + whole.staging + whole.ram_encodings)));
  if (store)
    say_(MessageStream::out, "megatrain: moment store per rank (rank 0's: " + host_->moments().describe() + "): RAM" +
                                 per_rank_mib(store_ram, 4) + "; files" + per_rank_mib(store_disk, 4) +
                                 format("; one rank unsharded: RAM %.4f MiB, files %.4f MiB",
                                        mib(whole.staging + whole.ram_encodings), mib(whole.disk)));
  return true;
}

// The host state sharded: who writes the checkpoints (cluster.checkpoint_writers). Owners need one
// directory every rank sees (a shared file system across hosts): rank 0 writes a token file into
// train.output_dir, every rank looks for it, and the answers are gathered, so every rank decides alike.
bool TrainingRun::choose_checkpoint_writers() {
  const std::string& want = cfg_.cluster.checkpoint_writers;
  if (!cfg_.shards_host_state() || hooks_.world == nullptr || want == "rank0") return true;
  cluster::World& world = *hooks_.world;
  namespace fs = std::filesystem;
  const fs::path dir(cfg_.train.output_dir);
  std::string token = std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
  const fs::path probe = dir / (".ranks-see-" + token);
  std::uint64_t seen = 1;
  try {
    if (rank_ == 0) {
      std::ofstream out(probe);
      out << token;
      if (!out.flush()) throw std::runtime_error("cannot write " + probe.string() + " (train.output_dir)");
    }
    world.broadcast(cluster::Channel::control, 0, token, "rank 0's token in train.output_dir");
    if (rank_ > 0) {
      std::ifstream in(dir / (".ranks-see-" + token));
      std::string read;
      seen = (in >> read) && read == token ? 1 : 0;
    }
  } catch (const cluster::ClusterError& e) {
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::vector<std::uint64_t> every;
  const bool gathered = gather_per_rank(seen, "whether every rank sees train.output_dir", every);
  if (rank_ == 0) {
    std::error_code ec;
    fs::remove(probe, ec);
  }
  if (!gathered) return false;
  std::string blind;
  for (std::size_t r = 0; r < every.size(); ++r)
    if (every[r] == 0) blind += (blind.empty() ? "" : ", ") + std::to_string(r);
  if (blind.empty()) {
    owners_write_ = true;
    shared_tag_ = token.substr(0, token.find('-'));
    say_(MessageStream::out, "megatrain: checkpoints: every rank writes the stages it owns into " + dir.string() +
                                 " (cluster.checkpoint_writers=" + want + "), rank 0 publishes them");
    return true;
  }
  const std::string why = "rank(s) " + blind + " do not see rank 0's train.output_dir " + dir.string() +
                          " (not one file system shared by every rank)";
  if (want == "owners")
    return fail("cluster.checkpoint_writers=owners needs a checkpoint directory every rank sees: " + why +
                "; share it, or set cluster.checkpoint_writers=rank0");
  say_(MessageStream::out, "megatrain: note: checkpoints: rank 0 writes every stage, the owners send it their state (" +
                               why + "; cluster.checkpoint_writers=auto)");
  return true;
}

EngineJob TrainingRun::make_job() {
  EngineJob job;
  job.kernel_choices = kernel_choices_;
  job.cfg = cfg_;
  job.plan = plan_;  // planned once (check_model_and_data): the engine does not plan again
  job.world = cfg_.cluster.ranks > 1 ? hooks_.world : nullptr;
  // Ranks other than 0 write nothing into the run directory: no checkpoints (rank 0's hold the same
  // state). Each serves its own monitor, its files in <output_dir>/rank-R and, with a fixed
  // monitor.port, on port + R (ranks may share a host).
  if (rank_ > 0) {
    job.monitor_dir = (std::filesystem::path(cfg_.train.output_dir) / ("rank-" + std::to_string(rank_))).string();
    if (job.cfg.monitor.port != 0) job.cfg.monitor.port += rank_;
  }
  job.model = model_;
  job.data = data_;
  job.host = host_.get();
  job.stop = hooks_.stop != nullptr ? hooks_.stop : &g_stop;
  job.first_step = result_.first_step;
  if (cfg_.train.stop_after_steps > 0) job.stop_after = cfg_.train.stop_after_steps;
  // With the host state sharded every rank's checkpointer takes part: each writes its own stages into
  // the checkpoint's shared temporary directory (owners_write), or sends their state to rank 0, which
  // alone writes into the run directory (cluster.checkpoint_writers=rank0).
  job.checkpoint.root = rank_ == 0 || cfg_.shards_host_state() ? cfg_.train.output_dir : "";
  job.checkpoint.save_steps = cfg_.train.save_steps;
  job.checkpoint.keep_last = static_cast<int>(cfg_.train.save_total_limit);
  // Rank 0's timer alone asks (with the host state sharded every rank takes part in what it asks).
  job.checkpoint.save_minutes = rank_ == 0 ? cfg_.train.save_minutes : 0.0;
  job.checkpoint.snapshot_budget_bytes = static_cast<std::uint64_t>(cfg_.train.save_snapshot_mib) << 20;
  job.checkpoint.request = &g_checkpoint;
  job.checkpoint.hf_config_json = hf_config_;
  job.checkpoint.owners_write = owners_write_;
  job.checkpoint.shared_tag = shared_tag_;
  if (hooks_.checkpoint_job) hooks_.checkpoint_job(job.checkpoint);
  job.on_checkpoint = [this](const CheckpointEvent& ev) {
    if (ev.ok)
      say_(MessageStream::out,
           format("checkpoint step %lld saved to %s (%.1f MiB in %.2fs)", static_cast<long long>(ev.step),
                  ev.path.c_str(), static_cast<double>(ev.bytes) / (1 << 20), ev.seconds));
    else
      say_(MessageStream::out,
           format("checkpoint step %lld FAILED (training continues; previous checkpoints intact): %s",
                  static_cast<long long>(ev.step), ev.error.c_str()));
    nlohmann::json j{{"event", ev.ok ? "checkpoint_saved" : "checkpoint_failed"}, {"step", ev.step}};
    if (ev.ok) {
      j["path"] = ev.path;
      j["bytes"] = ev.bytes;
      j["seconds"] = ev.seconds;
      j["cpu_seconds"] = ev.cpu_seconds;  // what it took from training's cores (the writer thread's CPU)
    } else {
      j["error"] = ev.error;
    }
    events_ << j.dump() << '\n';
    events_.flush();
  };
  if (eval_data_) {
    job.eval_data = eval_data_.get();
    job.eval_batches = static_cast<std::int64_t>(eval_data_->batches().size());
    job.evaluations = evaluations_;
    if (job.eval_batches < cfg_.train.eval_max_batches)
      say_(MessageStream::err,
           format("megatrain: note: data.validation_files holds %lld micro-batches, fewer than "
                  "train.eval_max_batches=%lld: each evaluation uses all of them",
                  static_cast<long long>(job.eval_batches), static_cast<long long>(cfg_.train.eval_max_batches)));
  }
  job.on_eval = [this](const EvalRecord& e) {
    say_(MessageStream::out, format("eval  %5lld | val loss %.4f | val ppl %.2f | %lld micro-batches, %lld tokens in "
                                    "%.2fs",
                                    static_cast<long long>(e.step), e.loss, e.perplexity,
                                    static_cast<long long>(e.batches), static_cast<long long>(e.tokens), e.seconds));
    jsonl_ << nlohmann::json{{"step", e.step},          {"eval_loss", e.loss},       {"eval_perplexity", e.perplexity},
                             {"eval_tokens", e.tokens}, {"eval_batches", e.batches}, {"eval_s", e.seconds}}
                  .dump()
           << '\n';
    jsonl_.flush();
    if (hooks_.on_eval) hooks_.on_eval(e);
  };
  const std::int64_t log_every = std::max<std::int64_t>(1, cfg_.log.logging_steps);
  job.on_step = [this, log_every](const StepRecord& r) {
    // The loss is the mean over the step's target tokens; a step whose labels mask every token has none
    // (loss 0, no gradient enters the update): said so rather than printed as a loss.
    const std::string loss = r.tokens > 0 ? format("%.4f | %lld targets", r.loss, static_cast<long long>(r.tokens))
                                          : std::string("none | 0 targets (every token of the step is masked)");
    say_(MessageStream::out,
         format("step %5lld | loss %s | lr %.3e | grad norm %.3f | %8.0f tok/s | step %.3fs (weights wait %.3f, "
                "compute %.3f, grad offload %.3f, optimizer %.3f%s)%s",
                static_cast<long long>(r.step), loss.c_str(), r.lr, r.grad_norm, r.tokens_per_s, r.step_s,
                r.wait_weights_s, r.compute_s, r.offload_s, r.optimizer_s,
                r.checkpoint_wait_s > 0 ? (", checkpoint wait " + std::to_string(r.checkpoint_wait_s)).c_str() : "",
                r.restarts ? " [restarted]" : ""));
    if (!r.cores_note.empty()) say_(MessageStream::out, "megatrain: note: " + r.cores_note);
    if (r.step % log_every == 0 || r.step == cfg_.train.max_steps) {
      const nlohmann::json j = step_record_json(r);  // the same fields as the monitor's step events
      jsonl_ << j.dump() << '\n';
      jsonl_.flush();
    }
    if (hooks_.on_step) hooks_.on_step(r);
  };
  return job;
}

TrainingResult TrainingRun::run(caf::actor_system_config* system_config) {
  if (hooks_.stop == nullptr) ignore_file_size_signal();
  if (!check_model_and_data() || !load_starting_weights() || !open_logs()) return result_;
  result_.tokens_per_step = static_cast<double>(plan_.batch * plan_.seq * plan_.micro_batches);

  say_(MessageStream::out,
       format("megatrain: %s, %lld layers, %.2fM parameters; %lld steps of %lld x %lld x %lld tokens; host %.1f MiB, "
              "device arena %.1f MiB of %.1f MiB budget (%d weight slots)",
              arch_name(model_.arch), static_cast<long long>(model_.num_hidden_layers),
              static_cast<double>(total_param_count(model_)) / 1e6, static_cast<long long>(cfg_.train.max_steps),
              static_cast<long long>(plan_.micro_batches), static_cast<long long>(plan_.batch),
              static_cast<long long>(plan_.seq),
              static_cast<double>(host_->host_bytes() + plan_.host_boundary_bytes) / (1 << 20),
              static_cast<double>(plan_.arena.total_bytes) / (1 << 20),
              static_cast<double>(plan_.arena.budget_bytes) / (1 << 20), plan_.weight_slots));
  if (!report_host_bytes_per_rank() || !choose_checkpoint_writers()) return result_;
  if (plan_.ranks > 1)
    say_(MessageStream::out,
         format("megatrain: %d ranks (MPI): each runs %lld micro-batch(es) per step, gradients summed in rank order%s",
                plan_.ranks, static_cast<long long>(plan_.device_micro_batches),
                cfg_.rank_grad_transport() == "nccl" ? ", sent GPU to GPU over NCCL (cluster.gpu_transport)" : ""));
  if (plan_.devices > 1)  // device memory is per device: the arena above on each
    say_(MessageStream::out,
         format("megatrain: device.gpus = %d: one arena per device, %lld micro-batch(es) per device per step",
                plan_.devices, static_cast<long long>(plan_.device_micro_batches)));

  if (!choose_kernel_paths()) return result_;

  if (hooks_.stop == nullptr) install_signal_handlers();
  EngineResult& res = result_.engine;
  try {
    if (system_config != nullptr) {
      caf::actor_system sys{*system_config};
      res = run_engine(sys, make_job());
    } else {
      res = run_engine(make_job());
    }
  } catch (const std::exception& e) {
    fail(e.what());
    return result_;
  }
  for (const auto& l : res.restart_log) say_(MessageStream::err, "megatrain: " + l);
  if (!res.error.empty()) {
    fail("training failed: " + res.error);
    return result_;
  }
  if (!export_final_weights(res)) return result_;
  if (hooks_.on_finished) {
    try {
      hooks_.on_finished(*host_, hf_config_);
    } catch (const std::exception& e) {
      fail(std::string("reading back the final weights failed: ") + e.what());
      return result_;
    }
  }
  if (!res.evaluations.empty())
    say_(MessageStream::out,
         format("megatrain: validation loss %.4f (perplexity %.2f) after %lld steps", res.evaluations.back().loss,
                res.evaluations.back().perplexity, static_cast<long long>(res.evaluations.back().step)));
  double secs = 0;
  for (const auto& r : res.steps) secs += r.step_s;
  const double tok = result_.tokens_per_step * static_cast<double>(res.steps.size());
  say_(MessageStream::out,
       format("megatrain: %s after %lld steps in %.1fs (%.0f tokens/s); final loss %.4f; device arena peak %.2f MiB "
              "of %.2f MiB budget; log %s",
              res.stopped_early ? "stopped by signal" : "done", static_cast<long long>(res.steps_done), res.wall_s,
              secs > 0 ? tok / secs : 0.0, res.steps.empty() ? 0.0 : res.steps.back().loss,
              static_cast<double>(res.arena.peak_bytes) / (1 << 20),
              static_cast<double>(res.arena.budget_bytes) / (1 << 20), result_.train_jsonl.c_str()));
  if (!report_cluster_end(res)) return result_;

  if (res.device_arenas.size() > 1)
    for (std::size_t d = 0; d < res.device_arenas.size(); ++d)
      say_(MessageStream::out, format("megatrain: device %zu arena peak %.2f MiB of %.2f MiB budget", d,
                                      static_cast<double>(res.device_arenas[d].peak_bytes) / (1 << 20),
                                      static_cast<double>(res.device_arenas[d].budget_bytes) / (1 << 20)));
  return result_;
}

}  // namespace

TrainingResult run_training(const TrainConfig& cfg, const TrainingHooks& hooks,
                            caf::actor_system_config* system_config) {
  return TrainingRun(cfg, hooks).run(system_config);
}

std::string parse_train_config(const std::vector<std::string>& args, TrainConfig& cfg, bool check_files) {
  NodeConfig node;
  node.check_files = check_files;
  const NodeConfigLoad load = node.load(args);
  if (load.outcome == NodeConfigLoad::Outcome::exit_failure) return load.error;
  if (load.outcome == NodeConfigLoad::Outcome::exit_success) return "help and dump arguments do not configure a run";
  cfg = node.values;
  return "";
}

std::vector<std::string> train_config_keys() { return NodeConfig().registered_keys(); }

}  // namespace mt::node
