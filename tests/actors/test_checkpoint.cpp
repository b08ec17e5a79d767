// Checkpoints through the engine (run_engine): the checkpointer writes stages straight from the tiles
// behind a version gate, a resumed run is bit-identical to the uninterrupted one (weights, moments,
// losses, data order), periodic checkpoints capture exactly the due version, a model mismatch and a
// full disk are handled.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "actors/run_state.hpp"
#include "engine_fixture.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"
#include "tests/actors/run_dir_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;
namespace fs = std::filesystem;
using mt::test::TempDir;

// LeakSanitizer (asan preset): HDF5's global state is never freed because storage/checkpoint turns
// HDF5's exit handler off (H5dont_atexit; see storage/checkpoint/README.md), which LSan would report
// as a leak in every process that wrote or read a checkpoint. Inert in other builds.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name is LSan's interface
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

namespace {

// Records which micro-batches were served (data order), first request of each, in order.
class RecordingSource : public BatchSource {
 public:
  explicit RecordingSource(std::vector<data::Batch> b) : inner_(std::move(b)) {}
  void get(std::uint64_t g, data::Batch& out) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (seen_.insert(g).second) order_.push_back(g);
    }
    inner_.get(g, out);
  }
  std::vector<std::uint64_t> order() {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_;
  }

 private:
  VectorBatchSource inner_;
  std::mutex mutex_;
  std::set<std::uint64_t> seen_;
  std::vector<std::uint64_t> order_;
};

struct Run {
  std::unique_ptr<HostModel> host;
  EngineResult result;
  std::vector<std::uint64_t> order;
  std::vector<CheckpointEvent> events;
};

// Trains cfg (first_step from a checkpoint when resume_dir is set) with checkpoints under `root`.
Run train(const TrainConfig& cfg, const ModelConfig& model, const std::vector<data::Batch>& batches,
          const std::string& root, std::int64_t save_steps, std::int64_t stop_after = -1,
          const fs::path& resume_dir = {}, const std::function<void(CheckpointJob&)>& tweak = {}) {
  Run r;
  r.host = std::make_unique<HostModel>(model, host_tile_options(cfg));
  init_host_model(*r.host, static_cast<std::uint64_t>(cfg.train.seed));
  RecordingSource source(batches);
  EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = r.host.get();
  job.stop_after = stop_after;
  if (!resume_dir.empty()) job.first_step = load_checkpoint(resume_dir, false, cfg, model, *r.host, &source).step;
  job.checkpoint.root = root;
  job.checkpoint.save_steps = save_steps;
  if (tweak) tweak(job.checkpoint);
  job.on_checkpoint = [&](const CheckpointEvent& e) { r.events.push_back(e); };
  r.result = run_engine(std::move(job));
  r.order = source.order();
  return r;
}

bool same_checkpoint_stage(const fs::path& a, const fs::path& b, const ModelConfig& model) {
  const ckpt::CheckpointReader ra(a), rb(b);
  for (std::int64_t s = 0; s < num_stages(model); ++s) {
    const std::size_t n = static_cast<std::size_t>(stage_layout(model, s).total_floats);
    std::vector<float> pa(n), ma(n), va(n), pb(n), mb(n), vb(n);
    ra.read_stage(s, pa.data(), ma.data(), va.data());
    rb.read_stage(s, pb.data(), mb.data(), vb.data());
    if (!same_bits(pa.data(), pb.data(), n) || !same_bits(ma.data(), mb.data(), n) ||
        !same_bits(va.data(), vb.data(), n))
      return false;
  }
  return true;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Byte for byte: every shard file, and the manifest but for its creation time (and the run's recorded
// train.master_weights and train.gradient_buffer when `ignore_state_modes`). Empty when equal, else what differs.
std::string checkpoint_file_difference(const fs::path& a, const fs::path& b, bool ignore_state_modes = false) {
  nlohmann::json ma = nlohmann::json::parse(file_bytes(a / "manifest.json"));
  nlohmann::json mb = nlohmann::json::parse(file_bytes(b / "manifest.json"));
  for (const char* key : {"created_utc", "manifest_xxh3_64"}) {  // the time, and the checksum over it
    ma.erase(key);
    mb.erase(key);
  }
  if (ignore_state_modes)
    for (nlohmann::json* m : {&ma, &mb})
      for (const char* key : {"master_weights", "gradient_buffer"}) (*m)["run"]["train_config"]["train"].erase(key);
  if (ma != mb) return "manifests differ: " + nlohmann::json::diff(ma, mb).dump();
  for (const auto& shard : ma.at("shards")) {
    const std::string name = shard.at("file").get<std::string>();
    const std::string fa = file_bytes(a / name), fb = file_bytes(b / name);
    if (fa.empty() || fa != fb)
      return name + " differs (" + std::to_string(fa.size()) + " vs " + std::to_string(fb.size()) + " bytes)";
  }
  return {};
}

}  // namespace

TEST_CASE("checkpoint: 10 + resume + 10 steps equals 20 steps bit for bit", "[actors][checkpoint]") {
  // bf16: checkpoints hold the fp32 masters; the compute copies are rebuilt on resume.
  for (const auto& [clip, bf16] : {std::pair{1.0, false}, std::pair{0.0, false}, std::pair{1.0, true}}) {
    Tiny t;
    t.steps = 20;
    t.micro_batches = 2;
    t.max_grad_norm = clip;
    t.bf16 = bf16;
    const TrainConfig cfg = tiny_config(t);
    const ModelConfig model = cfg.model_config_from_keys();
    const auto batches = tiny_batches(t, 64);
    TempDir full("full"), part("part");
    INFO("max_grad_norm " << clip << (bf16 ? " bf16" : " fp32"));

    // Uninterrupted, with periodic checkpoints (every 5 steps; the gate must not change anything).
    const Run a = train(cfg, model, batches, full.path.string(), 5);
    REQUIRE(a.result.error.empty());
    REQUIRE(a.result.steps_done == 20);
    const RefRun ref = run_reference(cfg, model, batches, 20);
    CHECK(equals_reference(*a.host, *ref.trainer));
    REQUIRE(a.events.size() == 4);  // 5, 10, 15, 20
    for (const auto& e : a.events) CHECK(e.ok);
    CHECK(fs::is_directory(full.path / "step-00000010"));

    // Interrupted after 10 (same schedule: max_steps 20), then resumed from the final checkpoint.
    const Run b1 = train(cfg, model, batches, part.path.string(), 0, 10);
    REQUIRE(b1.result.error.empty());
    REQUIRE(b1.result.steps_done == 10);
    REQUIRE(b1.events.size() == 1);
    CHECK(b1.events[0].step == 10);
    // The mid-run checkpoint of the uninterrupted run holds exactly version 10: the same files, byte for
    // byte, as the one taken when the run stopped there.
    CHECK(same_checkpoint_stage(full.path / "step-00000010", part.path / "step-00000010", model));
    CHECK(checkpoint_file_difference(full.path / "step-00000010", part.path / "step-00000010") == "");

    const Run b2 = train(cfg, model, batches, part.path.string(), 0, -1, part.path);
    REQUIRE(b2.result.error.empty());
    REQUIRE(b2.result.steps_done == 20);
    CHECK(tiles_equal(*a.host, *b2.host));
    REQUIRE(b2.result.steps.size() == 10);
    for (std::size_t i = 0; i < 10; ++i) {
      CHECK(b2.result.steps[i].step == a.result.steps[10 + i].step);
      CHECK(b2.result.steps[i].loss == a.result.steps[10 + i].loss);  // bit-identical doubles
    }
    // Data order: the resumed run asks for micro-batches 20.. exactly as the uninterrupted one did.
    std::vector<std::uint64_t> tail;
    for (auto g : a.order)
      if (g >= 20 && g < 40) tail.push_back(g);
    std::vector<std::uint64_t> resumed;
    for (auto g : b2.order)
      if (g < 40) resumed.push_back(g);
    CHECK(resumed == tail);
    CHECK(same_checkpoint_stage(full.path / "step-00000020", part.path / "step-00000020", model));
    CHECK(checkpoint_file_difference(full.path / "step-00000020", part.path / "step-00000020") == "");
    // Run state in the manifest.
    const auto rs = ckpt::CheckpointReader::open(part.path).run_state();
    CHECK(rs["step"] == 20);
    CHECK(rs["data"]["global_batch_index"] == 40);
    CHECK(rs["lr_schedule"]["max_steps"] == 20);
    CHECK(rs["train_config"]["train"]["gradient_accumulation_steps"] == 2);
    CHECK(rs["tile_versions"] == std::vector<int>(static_cast<std::size_t>(num_stages(model)), 20));
  }
}

TEST_CASE("checkpoint: documents resume bit for bit, and resuming with the stream is a note naming data.packing",
          "[actors][checkpoint][documents]") {
  Tiny t;
  t.steps = 8;
  t.micro_batches = 2;
  TrainConfig cfg = tiny_config(t);
  cfg.data.packing = "documents";  // recorded in the run config (the batches carry the positions)
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = with_documents(tiny_batches(t, 32));
  TempDir full("docs_full"), part("docs_part");
  const Run a = train(cfg, model, batches, full.path.string(), 0);
  REQUIRE(a.result.error.empty());
  const RefRun ref = run_reference(cfg, model, batches, 8);
  CHECK(equals_reference(*a.host, *ref.trainer));
  const Run b1 = train(cfg, model, batches, part.path.string(), 0, 4);
  REQUIRE(b1.result.error.empty());
  const Run b2 = train(cfg, model, batches, part.path.string(), 0, -1, part.path);
  REQUIRE(b2.result.error.empty());
  CHECK(tiles_equal(*a.host, *b2.host));
  CHECK(ckpt::CheckpointReader::open(part.path).run_state()["train_config"]["data"]["packing"] == "documents");
  TrainConfig stream = cfg;
  stream.data.packing = "stream";
  HostModel host(model, host_tile_options(stream));
  init_host_model(host, static_cast<std::uint64_t>(stream.train.seed));
  const ResumePoint rp = load_checkpoint(part.path, false, stream, model, host, nullptr);
  std::string notes;
  for (const auto& n : rp.notes) notes += n + "\n";
  CHECK_THAT(notes, Catch::Contains("data.packing is \"stream\", the checkpoint's run had \"documents\""));
}

TEST_CASE("checkpoint: the MoE families resume bit for bit (mixtral, qwen3_moe with dense layers, gpt_oss)",
          "[actors][checkpoint][moe]") {
  for (const Arch arch : {Arch::mixtral, Arch::qwen3_moe, Arch::gpt_oss}) {
    Tiny t;
    t.arch = arch;
    t.layers = 4;
    t.steps = 6;
    t.micro_batches = 2;
    t.bf16 = arch == Arch::gpt_oss;
    if (arch == Arch::qwen3_moe) t.decoder_sparse_step = 2;
    if (arch == Arch::gpt_oss) t.sliding_window = 3;
    const TrainConfig cfg = tiny_config(t);
    const ModelConfig model = cfg.model_config_from_keys();
    const auto batches = tiny_batches(t, 32);
    TempDir full("moe_full"), part("moe_part");
    INFO(arch_name(arch));
    const Run a = train(cfg, model, batches, full.path.string(), 0);
    REQUIRE(a.result.error.empty());
    REQUIRE(a.result.steps_done == 6);
    const Run b1 = train(cfg, model, batches, part.path.string(), 0, 3);
    REQUIRE(b1.result.error.empty());
    REQUIRE(b1.result.steps_done == 3);
    const Run b2 = train(cfg, model, batches, part.path.string(), 0, -1, part.path);
    REQUIRE(b2.result.error.empty());
    REQUIRE(b2.result.steps_done == 6);
    CHECK(tiles_equal(*a.host, *b2.host));
    REQUIRE(b2.result.steps.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(b2.result.steps[i].loss == a.result.steps[3 + i].loss);
    CHECK(checkpoint_file_difference(full.path / "step-00000006", part.path / "step-00000006") == "");
  }
}

TEST_CASE("checkpoint: split and fp32 masters write the same files and resume each other's checkpoints",
          "[actors][checkpoint][bf16][master_halves]") {
  // The format holds plain fp32 masters and v either way: a checkpoint does not say how RAM held them.
  Tiny t;
  t.steps = 12;
  t.micro_batches = 2;
  t.bf16 = true;
  Tiny split = t, plain = t;
  split.master_weights = "split";
  plain.master_weights = "fp32";
  const TrainConfig cs = tiny_config(split), cp = tiny_config(plain);
  const ModelConfig model = cs.model_config_from_keys();
  const auto batches = tiny_batches(t, 64);
  TempDir ds("split"), dp("fp32");
  const Run a = train(cs, model, batches, ds.path.string(), 0, 6);
  const Run b = train(cp, model, batches, dp.path.string(), 0, 6);
  REQUIRE(a.result.error.empty());
  REQUIRE(b.result.error.empty());
  CHECK(a.host->split_masters());
  CHECK_FALSE(b.host->split_masters());
  CHECK(checkpoint_file_difference(ds.path / "step-00000006", dp.path / "step-00000006", true) == "");
  // Crossed resumes: split from the fp32 run's checkpoint, fp32 from the split run's.
  const Run a2 = train(cs, model, batches, ds.path.string(), 0, -1, dp.path / "step-00000006");
  const Run b2 = train(cp, model, batches, dp.path.string(), 0, -1, ds.path / "step-00000006");
  REQUIRE(a2.result.error.empty());
  REQUIRE(b2.result.error.empty());
  const RefRun ref = run_reference(cs, model, batches, 12);
  CHECK(equals_reference(*a2.host, *ref.trainer));
  CHECK(equals_reference(*b2.host, *ref.trainer));
  CHECK(checkpoint_file_difference(ds.path / "step-00000012", dp.path / "step-00000012", true) == "");
}

TEST_CASE("checkpoint: stage gradients and accumulators write the same files and resume each other's checkpoints",
          "[actors][checkpoint][stage_gradients]") {
  // Gradients are not part of a checkpoint: two passes with clipping (stage) and one (model) agree on
  // disk, with one micro-batch per step and with two (stage: layer-major).
  for (std::int64_t m : {1, 2}) {
    INFO("micro-batches " << m);
    Tiny t;
    t.steps = 12;
    t.bf16 = true;
    t.micro_batches = m;
    Tiny staged = t, kept = t;
    staged.gradient_buffer = "stage";
    kept.gradient_buffer = "model";
    const TrainConfig cs = tiny_config(staged), ck = tiny_config(kept);
    const ModelConfig model = cs.model_config_from_keys();
    const auto batches = tiny_batches(t, 64);
    TempDir ds("stage"), dk("model");
    const Run a = train(cs, model, batches, ds.path.string(), 0, 6);
    const Run b = train(ck, model, batches, dk.path.string(), 0, 6);
    REQUIRE(a.result.error.empty());
    REQUIRE(b.result.error.empty());
    CHECK_FALSE(a.host->tile(0).has_grad());
    CHECK(b.host->tile(0).has_grad());
    CHECK(checkpoint_file_difference(ds.path / "step-00000006", dk.path / "step-00000006", true) == "");
    const Run a2 = train(cs, model, batches, ds.path.string(), 0, -1, dk.path / "step-00000006");
    const Run b2 = train(ck, model, batches, dk.path.string(), 0, -1, ds.path / "step-00000006");
    REQUIRE(a2.result.error.empty());
    REQUIRE(b2.result.error.empty());
    const RefRun ref = run_reference(cs, model, batches, 12);
    CHECK(equals_reference(*a2.host, *ref.trainer));
    CHECK(equals_reference(*b2.host, *ref.trainer));
    CHECK(checkpoint_file_difference(ds.path / "step-00000012", dk.path / "step-00000012", true) == "");
  }
}

TEST_CASE("checkpoint: the run's plan is written beside the manifest as plan.json, not in it", "[actors][checkpoint]") {
  // Two plans of the same state (the gradient buffers differ): each checkpoint records its own run's
  // plan, and the manifests and shards stay the same files.
  TempDir model_root("model"), stage_root("stage");
  std::map<std::string, fs::path> dirs;
  for (const char* buffer : {"model", "stage"}) {
    INFO("train.gradient_buffer=" << buffer);
    Tiny t;
    t.steps = 4;
    t.micro_batches = 2;
    t.gradient_buffer = buffer;
    const TrainConfig cfg = tiny_config(t);
    const ModelConfig model = cfg.model_config_from_keys();
    const fs::path root = std::string(buffer) == "stage" ? stage_root.path : model_root.path;
    const Run r = train(cfg, model, tiny_batches(t, 64), root.string(), 2);
    REQUIRE(r.result.error.empty());
    REQUIRE(r.events.size() == 2);
    const nlohmann::json expected = plan::plan_summary(plan::plan_engine(cfg, model));
    CHECK(expected.at("stage_gradients") == (std::string(buffer) == "stage"));
    for (const char* step : {"step-00000002", "step-00000004"}) {
      const fs::path dir = root / step;
      REQUIRE(fs::exists(dir / "plan.json"));
      CHECK(nlohmann::json::parse(file_bytes(dir / "plan.json")) == expected);
      CHECK_FALSE(nlohmann::json::parse(file_bytes(dir / "manifest.json")).contains("plan"));
    }
    dirs[buffer] = root / "step-00000004";
  }
  CHECK(file_bytes(dirs["model"] / "plan.json") != file_bytes(dirs["stage"] / "plan.json"));
  CHECK(checkpoint_file_difference(dirs["model"], dirs["stage"], true) == "");
}

TEST_CASE("checkpoint: a slow checkpoint stalls the optimizer at the gate or is copied aside, results unchanged",
          "[actors][checkpoint]") {
  Tiny t;
  t.steps = 8;
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  for (const auto& [deferred, copy] :
       {std::pair{true, false}, std::pair{false, false}, std::pair{true, true}, std::pair{false, true}}) {
    INFO("write_after_step " << deferred << ", copy on write " << copy);
    TempDir dir("stall");
    const Run r = train(cfg, model, batches, dir.path.string(), 4, -1, {}, [&](CheckpointJob& cj) {
      cj.stall_step = 4;
      cj.stall_stage = 0;
      cj.stall_seconds = 0.3;
      cj.write_after_step = deferred;
      cj.snapshot_budget_bytes = copy ? std::uint64_t{64} << 20 : 0;
    });
    REQUIRE(r.result.error.empty());
    if (copy) {
      // Stage 0 (at least) was copied aside: the optimizer did not wait out the slow write.
      CHECK(r.result.checkpoint_copied_bytes > 0);
      CHECK(r.result.checkpoint_copy_s > 0.0);
      CHECK(r.result.checkpoint_wait_s < 0.25);
    } else {
      CHECK(r.result.checkpoint_wait_s > 0.05);
      CHECK(r.result.checkpoint_copied_bytes == 0);
      CHECK(r.result.checkpoint_copy_s == 0.0);
    }
    const RefRun ref = run_reference(cfg, model, batches, 8);
    CHECK(equals_reference(*r.host, *ref.trainer));
    REQUIRE(r.events.size() == 2);
    CHECK(r.events[0].ok);
    CHECK(r.events[0].step == 4);
    // The writer's own CPU time: some (checksums, system calls), and not the 0.3 s it slept in the
    // stall (one thread's CPU clock, not the process's and not the wall clock).
    CHECK(r.events[0].cpu_seconds > 0.0);
    CHECK(r.events[0].cpu_seconds < r.events[0].seconds - 0.25);
    // Both ways write exactly version 4 and 8.
    const Run plain = train(cfg, model, batches, (dir.path / "plain").string(), 4);
    CHECK(same_checkpoint_stage(dir.path / "step-00000004", dir.path / "plain" / "step-00000004", model));
    CHECK(same_checkpoint_stage(dir.path / "step-00000008", dir.path / "plain" / "step-00000008", model));
    CHECK(checkpoint_file_difference(dir.path / "step-00000004", dir.path / "plain" / "step-00000004") == "");
  }
}

TEST_CASE("checkpoint: resuming another model is a clear error", "[actors][checkpoint]") {
  Tiny t;
  t.steps = 2;
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  TempDir dir("mismatch");
  const Run r = train(cfg, model, tiny_batches(t, 4), dir.path.string(), 0);
  REQUIRE(r.events.size() == 1);
  Tiny t2 = t;
  t2.hidden = 48;
  const TrainConfig cfg2 = tiny_config(t2);
  const ModelConfig model2 = cfg2.model_config_from_keys();
  HostModel host(model2);
  init_host_model(host, 1);
  try {
    load_checkpoint(dir.path, false, cfg2, model2, host, nullptr);
    FAIL("no error");
  } catch (const std::exception& e) {
    CHECK_THAT(e.what(), Catch::Contains("another model"));
    CHECK_THAT(e.what(), Catch::Contains("step-00000002"));
  }
}

TEST_CASE("checkpoint: disk full during a checkpoint: training goes on, failure reported, previous intact",
          "[actors][checkpoint]") {
  Tiny t;
  t.steps = 12;
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  TempDir dir("full");
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  Run r;
  {
    r.host = std::make_unique<HostModel>(model);
    init_host_model(*r.host, static_cast<std::uint64_t>(cfg.train.seed));
    VectorBatchSource source(batches);
    EngineJob job;
    job.cfg = cfg;
    job.model = model;
    job.data = &source;
    job.host = r.host.get();
    job.checkpoint.root = dir.path.string();
    job.checkpoint.save_steps = 4;
    job.on_checkpoint = [&](const CheckpointEvent& e) {
      r.events.push_back(e);
      if (e.step == 4) {  // from now on every file write past 16 KiB fails (EFBIG, like ENOSPC)
        struct rlimit small = old;
        small.rlim_cur = 16 * 1024;
        ::setrlimit(RLIMIT_FSIZE, &small);
      }
    };
    r.result = run_engine(std::move(job));
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  REQUIRE(r.result.error.empty());
  CHECK(r.result.steps_done == 12);
  // 4 published; 8 and 12 failed (the end of the run retries the final one once more).
  REQUIRE(r.events.size() >= 3);
  CHECK(r.events[0].ok);
  CHECK(!r.events[1].ok);
  CHECK(r.events[1].step == 8);
  CHECK_THAT(r.events[1].error, Catch::Contains(".h5"));
  for (std::size_t i = 2; i < r.events.size(); ++i) {
    CHECK(!r.events[i].ok);
    CHECK(r.events[i].step == 12);
  }
  const RefRun ref = run_reference(cfg, model, batches, 12);
  CHECK(equals_reference(*r.host, *ref.trainer));
  const auto reader = ckpt::CheckpointReader::open(dir.path);
  CHECK(reader.step() == 4);
  for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
}

TEST_CASE("checkpoint: an optimizer crash in the middle of a due checkpoint's updates", "[actors][checkpoint]") {
  Tiny t;
  t.steps = 10;
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  TempDir dir("crash"), ref_dir("crashref");
  // Step 4's updates produce version 5 (a due checkpoint): crash before stage 2's.
  FaultPlan fault(Role::optimizer, 4, -1, 2, static_cast<int>(Phase::optimize));
  Run r;
  {
    r.host = std::make_unique<HostModel>(model);
    init_host_model(*r.host, static_cast<std::uint64_t>(cfg.train.seed));
    VectorBatchSource source(batches);
    EngineJob job;
    job.cfg = cfg;
    job.model = model;
    job.data = &source;
    job.host = r.host.get();
    job.fault = &fault;
    job.checkpoint.root = dir.path.string();
    job.checkpoint.save_steps = 5;
    job.on_checkpoint = [&](const CheckpointEvent& e) { r.events.push_back(e); };
    r.result = run_engine(std::move(job));
  }
  REQUIRE(r.result.error.empty());
  CHECK(r.result.restarts == 1);
  REQUIRE(r.events.size() == 2);
  CHECK(r.events[0].ok);
  CHECK(r.events[1].ok);
  const RefRun ref = run_reference(cfg, model, batches, 10);
  CHECK(equals_reference(*r.host, *ref.trainer));
  const Run clean = train(cfg, model, batches, ref_dir.path.string(), 5);
  CHECK(same_checkpoint_stage(dir.path / "step-00000005", ref_dir.path / "step-00000005", model));
}

TEST_CASE("checkpoint: every T minutes and on request", "[actors][checkpoint]") {
  Tiny t;
  t.steps = 40;
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  TempDir dir("timer");
  std::atomic<bool> request{false};
  // A slow data source: 25 ms per micro-batch, so 40 steps take at least 1 s; asks for a checkpoint (like
  // SIGUSR1) when serving micro-batch 2.
  struct SlowSource : BatchSource {
    VectorBatchSource inner;
    std::atomic<bool>* request;
    SlowSource(std::vector<data::Batch> b, std::atomic<bool>* r) : inner(std::move(b)), request(r) {}
    void get(std::uint64_t g, data::Batch& out) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      if (g == 2) request->store(true);
      inner.get(g, out);
    }
  };
  Run r;
  {
    r.host = std::make_unique<HostModel>(model);
    init_host_model(*r.host, static_cast<std::uint64_t>(cfg.train.seed));
    SlowSource source(batches, &request);
    EngineJob job;
    job.cfg = cfg;
    job.model = model;
    job.data = &source;
    job.host = r.host.get();
    job.checkpoint.root = dir.path.string();
    job.checkpoint.save_minutes = 0.2 / 60.0;  // every 200 ms
    job.checkpoint.keep_last = 0;
    job.checkpoint.request = &request;
    job.on_checkpoint = [&](const CheckpointEvent& e) { r.events.push_back(e); };
    r.result = run_engine(std::move(job));
  }
  REQUIRE(r.result.error.empty());
  // The request (early), timer checkpoints (>= 200 ms apart, counted from the previous one), the final.
  REQUIRE(r.events.size() >= 3);
  CHECK(r.events.front().step <= 8);
  CHECK(r.events.back().step == 40);
  for (const auto& e : r.events) CHECK(e.ok);
  const RefRun ref = run_reference(cfg, model, batches, 40);
  CHECK(equals_reference(*r.host, *ref.trainer));
}
