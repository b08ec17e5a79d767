// The planner (plan) against the engine: its bytes per tier equal what the engine allocates,
// read from the engine's own accounting (HostModel::host_bytes, the moment store's ram_bytes, the
// arena's capacity, the offload files on disk) for the default tiles, bf16 compute copies, boundaries
// on the host and the NVMe tier; its predicted peak resident memory is within 10% of the peak RSS
// `megatrain train` measures (getrusage of the child); `megatrain plan` and `train`'s fit check name
// the key that fixes a plan that does not fit.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "node/training_run.hpp"
#include "plan/hardware.hpp"
#include "plan/resource_plan.hpp"
#include "plan/step_model.hpp"
#include "plan/tier_bytes.hpp"
#include "storage/offload/staged_moment_store.hpp"
#include "tests/actors/engine_fixture.hpp"
#include "tests/actors/node_binary_fixture.hpp"
#include "tests/actors/run_dir_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::node;
using namespace mt::actors::test;
namespace fs = std::filesystem;
using mt::test::TempDir;

namespace {

// What `megatrain plan ARGS` prints; the plan must fit (exit 0).
std::string plan_output(const std::string& args) {
  const fs::path log = fs::temp_directory_path() / ("mt_plan_output_" + std::to_string(::getpid()) + ".log");
  const int rc =
      std::system((std::string(MEGATRAIN_BINARY) + " plan " + args + " > " + log.string() + " 2>&1").c_str());
  const std::string out = mt::test::slurp(log);
  fs::remove(log);
  INFO(out);
  REQUIRE(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 0);
  return out;
}

double tier_total(const plan::ResourcePlan& p, const std::string& tier) {
  double total = 0;
  for (const auto& b : p.bytes)
    if (b.tier == tier) total += b.bytes;
  return total;
}

// A node run of a tiny Llama on a shard of 4096 tokens made in `dir`, with `train` for its train.* keys.
std::string tiny_run_args(const TempDir& dir, const std::string& train) {
  mt::test::make_shard(dir.path / "data", 4096);
  return " --model.hidden_size=64 --model.layers=2 --model.heads=4 --model.intermediate_size=128"
         " --model.vocab_size=64 --model.max_position_embeddings=32 --data.seq_length=16"
         " --train.per_device_train_batch_size=2 " +
         train + " --device.max_vram_gb=0.015625 --threads.total=2 --monitor.enabled=false --data.train_files=" +
         (dir.path / "data" / "train_*.bin").string() + " --train.output_dir=" + (dir.path / "out").string();
}

std::uintmax_t dir_bytes(const fs::path& dir) {
  std::uintmax_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

}  // namespace

TEST_CASE("plan: bytes per tier equal what the engine allocates", "[plan]") {
  struct Case {
    const char* name;
    std::string keep;
    bool bf16;
    bool offload;
    std::string compression;
    std::string gradient_buffer = "model";
    double link_gbps = 0.0;
    std::int64_t micro_batches = 0;  // 0: 1 with stage gradients, else 2
  };
  const Case cases[] = {
      {"tiles", "boundary", false, false, "none"},
      {"bf16 compute copy, boundaries on the host", "boundary_host", true, false, "none"},
      {"moments on the NVMe tier", "boundary", false, true, "none"},
      {"int8 moments on the NVMe tier", "all", false, true, "int8"},
      {"stage gradients, split masters", "boundary", true, false, "none", "stage"},
      {"stage gradients over a link (landing buffers)", "boundary", false, false, "none", "stage", 100},
      {"stage gradients of two micro-batches (two accumulators)", "boundary_host", true, false, "none", "stage", 0, 2},
      {"stage gradients of three micro-batches over a link", "boundary", false, false, "none", "stage", 100, 3},
      {"every intermediate mapped in host RAM", "all_mapped", true, false, "none"},
      {"every intermediate mapped, two activation sets", "all_mapped", false, false, "none", "stage", 0, 2}};
  for (const Case& c : cases) {
    SECTION(c.name) {
      TempDir dir("bytes");
      Tiny t;
      t.layers = 4;
      t.steps = 2;
      t.micro_batches = c.micro_batches > 0 ? c.micro_batches : c.gradient_buffer == "stage" ? 1 : 2;
      t.keep = c.keep;
      t.bf16 = c.bf16;
      t.gradient_buffer = c.gradient_buffer;
      t.bandwidth_gbps = c.link_gbps;
      TrainConfig cfg = tiny_config(t);
      cfg.train.optimizer_compression = c.compression;
      if (c.offload) {
        cfg.train.offload_dir = (dir.path / "tier").string();
        cfg.train.offload_staging_stages = 3;
      }
      const ModelConfig model = cfg.model_config_from_keys();
      const plan::ResourcePlan p = plan::plan_resources(cfg, model, {}, 0, "", 0, "");
      REQUIRE(p.fits());
      REQUIRE(p.engine.has_value());
      EngineRun r = run_pipeline(cfg, model, tiny_batches(t, 8));
      REQUIRE(r.result.error.empty());
      // Device: the arena the run allocated.
      CHECK(tier_total(p, "device") == static_cast<double>(r.result.arena.capacity_bytes));
      // Host: the tiles and the moment store (HostModel::host_bytes), the boundary store, and the CPU
      // backend's arena (host memory).
      // Stage gradients over a link: a landing buffer per staging slot, each the largest stage; of
      // several micro-batches two stage accumulators and (over a link) the collector's host buffer.
      const double largest = static_cast<double>(r.host->largest_stage_floats()) * sizeof(float);
      double landing = 0.0;
      if (c.gradient_buffer == "stage" && t.micro_batches > 1)
        landing = (2.0 + (c.link_gbps > 0 ? 1.0 : 0.0)) * largest;
      else if (c.gradient_buffer == "stage" && c.link_gbps > 0)
        landing = static_cast<double>(p.engine->grad_slots) * largest;
      if (t.micro_batches > 1 && c.gradient_buffer == "stage") {
        CHECK(p.engine->order == MicroBatchOrder::layer_major);
        CHECK(p.engine->activation_sets == t.micro_batches);
      }
      const double host =
          static_cast<double>(r.host->host_bytes() + p.engine->host_boundary_bytes + r.result.arena.capacity_bytes) +
          landing;
      if (c.gradient_buffer == "stage") CHECK(!r.host->tile(0).has_grad());
      CHECK(tier_total(p, "host RAM") == host);
      CHECK(p.host_bytes == host);
      if (c.keep == "boundary_host") CHECK(p.engine->host_boundary_bytes > 0);
      if (c.keep == "all_mapped") CHECK(p.engine->host_boundary_bytes > p.engine->saved_floats * sizeof(float));
      // Disk: the offload files as they are after the run.
      if (c.offload) {
        const auto& store = dynamic_cast<offload::StagedMomentStore&>(r.host->moments());
        REQUIRE(r.host->moments().ram_bytes() > 0);
        CHECK(tier_total(p, "disk") == static_cast<double>(dir_bytes(store.files_dir())));
      } else {
        CHECK(tier_total(p, "disk") == 0.0);
      }
    }
  }
}

// auto's all_mapped weighs the host RAM planned for (host_limit), not this machine's.
TEST_CASE("plan: auto keeps every intermediate mapped only in the host RAM planned for", "[plan]") {
  Tiny t;
  t.layers = 4;
  t.keep = "auto";
  t.budget_bytes = 0;
  TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  cfg.device.keep_intermediates = "all";
  const std::size_t all = plan_engine(cfg, model).arena.total_bytes;
  cfg.device.keep_intermediates = "auto";
  cfg.device.max_vram_gb = static_cast<double>(all - 1024) / 1073741824.0;  // all does not fit the arena
  const plan::ResourcePlan roomy = plan::plan_resources(cfg, model, {}, 64.0 * 1073741824.0, "test", 0, "");
  REQUIRE(roomy.engine.has_value());
  CHECK(planned_keep(*roomy.engine) == KeepIntermediates::all_mapped);
  CHECK(roomy.fits());
  // A host whose half does not hold the host state with the mapped block: recomputed.
  const plan::ResourcePlan tight = plan::plan_resources(cfg, model, {}, 1.5 * roomy.host_bytes, "test", 0, "");
  REQUIRE(tight.engine.has_value());
  CHECK(tight.engine->mode == ActivationMode::recompute);
  CHECK(tight.engine->host_boundary_bytes == 0);
}

TEST_CASE("plan: predicted peak resident memory is within 10% of the measured peak RSS", "[plan]") {
  TempDir dir("rss");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 1 << 14);
  // About 55M parameters: 0.9 GiB of host tiles, so the process's own memory is a small part.
  const std::vector<std::string> args = {"--model.hidden_size=512",
                                         "--model.layers=16",
                                         "--model.heads=8",
                                         "--model.kv_heads=8",
                                         "--model.intermediate_size=1408",
                                         "--model.vocab_size=4096",
                                         "--model.max_position_embeddings=64",
                                         "--data.seq_length=32",
                                         "--train.per_device_train_batch_size=2",
                                         "--train.max_steps=2",
                                         "--device.max_vram_gb=0.25",
                                         "--threads.total=2",
                                         "--monitor.enabled=false",
                                         "--data.train_files=" + (dir.path / "data" / "train_*.bin").string(),
                                         "--train.output_dir=" + (dir.path / "out").string()};
  TrainConfig cfg;
  REQUIRE(parse_train_config(args, cfg) == "");
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::ResourcePlan p = plan::plan_resources(cfg, model, {}, 0, "", 0, "");
  std::string line;
  for (const auto& a : args) line += " '" + a + "'";
  const mt::test::Outcome o = mt::test::run_node(line);
  INFO(o.out);
  REQUIRE(o.code == 0);
  struct rusage ru {};
  REQUIRE(::getrusage(RUSAGE_CHILDREN, &ru) == 0);
  const double measured = static_cast<double>(ru.ru_maxrss) * 1024.0;  // KiB on Linux
  INFO("predicted " << p.host_peak_rss_bytes / 1048576.0 << " MiB, measured " << measured / 1048576.0 << " MiB");
  CHECK(p.host_bytes > 0.8 * measured);  // the engine's buffers are most of it
  CHECK(std::abs(p.host_peak_rss_bytes - measured) <= 0.10 * measured);
}

TEST_CASE("plan: a run that cannot fit is refused naming the key, megatrain plan says the same", "[plan]") {
  TempDir dir("refuse");
  const std::string common = tiny_run_args(dir, "--train.max_steps=1");
  // 0.01 GiB of host RAM cannot hold the process, whatever the offload keys.
  const mt::test::Outcome refused = mt::test::run_node(common + " --plan.host_ram_gb=0.01");
  INFO(refused.out);
  CHECK(refused.code == 1);
  CHECK(refused.out.find("host RAM") != std::string::npos);
  CHECK(refused.out.find("plan.enforce=false") != std::string::npos);
  CHECK(!fs::exists(dir.path / "out" / "latest"));
  // plan.enforce=false: a warning, and the run goes ahead.
  const mt::test::Outcome warned = mt::test::run_node(common + " --plan.host_ram_gb=0.01 --plan.enforce=false");
  INFO(warned.out);
  CHECK(warned.code == 0);
  CHECK(warned.out.find("warning") != std::string::npos);
  // gradient_buffer=auto: RAM that holds the run without gradient accumulators but not with them (about
  // 50M parameters: 200 MB of accumulators, far more than two processes' baselines differ by): the run
  // drops them (two passes with clipping) rather than being refused.
  {
    const std::vector<std::string> args = {"--model.hidden_size=1024",
                                           "--model.layers=4",
                                           "--model.heads=8",
                                           "--model.intermediate_size=2816",
                                           "--model.vocab_size=64",
                                           "--model.max_position_embeddings=32",
                                           "--data.seq_length=16",
                                           "--train.per_device_train_batch_size=2",
                                           "--train.max_steps=1",
                                           "--device.max_vram_gb=0.25",
                                           "--threads.total=2",
                                           "--monitor.enabled=false",
                                           "--data.train_files=" + (dir.path / "data" / "train_*.bin").string(),
                                           "--train.output_dir=" + (dir.path / "staged").string()};
    TrainConfig cfg;
    REQUIRE(parse_train_config(args, cfg) == "");
    const ModelConfig model = cfg.model_config_from_keys();
    const double with = plan::plan_resources(cfg, model, {}, 0, "", 0, "").host_peak_rss_bytes;
    TrainConfig staged = cfg;
    staged.train.gradient_buffer = "stage";
    const double without = plan::plan_resources(staged, model, {}, 0, "", 0, "").host_peak_rss_bytes;
    REQUIRE(with - without > 150e6);
    std::string line;
    for (const auto& a : args) line += " '" + a + "'";
    const mt::test::Outcome dropped =
        mt::test::run_node(line + " --plan.host_ram_gb=" + std::to_string(0.5 * (with + without) / 1073741824.0));
    INFO(dropped.out);
    CHECK(dropped.code == 0);
    CHECK(dropped.out.find("train.gradient_buffer=auto: stage") != std::string::npos);
    // Two micro-batches per step: the same choice, run layer-major, summed in two stage accumulators
    // (the plan counts them: two of the largest stage, a layer here).
    TrainConfig two = cfg;
    two.train.gradient_accumulation_steps = 2;
    TrainConfig two_staged = two;
    two_staged.train.gradient_buffer = "stage";
    const plan::ResourcePlan two_plan = plan::plan_resources(two_staged, model, {}, 0, "", 0, "");
    std::size_t largest = 0;
    for (std::int64_t st = 0; st < num_stages(model); ++st)
      largest = std::max(largest, stage_layout(model, st).total_floats);
    const double accumulators = 2.0 * static_cast<double>(largest) * 4.0;
    bool listed = false;
    for (const auto& b : two_plan.bytes)
      if (b.what.find("two stage accumulators") != std::string::npos) listed = b.bytes == Approx(accumulators);
    CHECK(listed);
    const double two_with = plan::plan_resources(two, model, {}, 0, "", 0, "").host_peak_rss_bytes;
    REQUIRE(two_with - two_plan.host_peak_rss_bytes > 100e6);
    const mt::test::Outcome layer_major =
        mt::test::run_node(line + " --train.gradient_accumulation_steps=2 --plan.host_ram_gb=" +
                           std::to_string(0.5 * (two_with + two_plan.host_peak_rss_bytes) / 1073741824.0));
    INFO(layer_major.out);
    CHECK(layer_major.code == 0);
    CHECK(layer_major.out.find("train.gradient_buffer=auto: stage") != std::string::npos);
    CHECK(layer_major.out.find("gives way to layer_major") != std::string::npos);
  }

  // A model whose moments do not fit RAM but fit in files: the key named is train.offload_dir.
  const std::string big =
      " --model.hidden_size=4096 --model.layers=32 --model.heads=32 --model.kv_heads=8"
      " --model.intermediate_size=11008 --model.vocab_size=32000"
      " --model.max_position_embeddings=4096 --data.seq_length=4096"
      " --train.per_device_train_batch_size=1 --train.bf16=true";
  auto plan_cmd = [](const std::string& a) {
    const fs::path log = fs::temp_directory_path() / ("mt_plan_cmd_" + std::to_string(::getpid()) + ".log");
    const int rc = std::system((std::string(MEGATRAIN_BINARY) + " plan " + a + " > " + log.string() + " 2>&1").c_str());
    mt::test::Outcome o;
    o.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    o.out = mt::test::slurp(log);
    fs::remove(log);
    return o;
  };
  // 7B with gradient accumulators: 16 bytes/parameter = 108 GB; 80 GB of host RAM does not hold it.
  const mt::test::Outcome over =
      plan_cmd(big + " --plan.hardware=h100 --plan.host_ram_gb=80 --train.gradient_buffer=model");
  INFO(over.out);
  CHECK(over.code == 1);
  CHECK(over.out.find("DOES NOT FIT") != std::string::npos);
  // Without gradient accumulators (12 bytes/parameter, exact) it fits: the first fix; files are the next.
  CHECK(over.out.find("fix: train.gradient_buffer") != std::string::npos);
  CHECK(over.out.find("train.offload_dir=DIR (Adam moments in files) needs") != std::string::npos);
  CHECK(over.out.find("predicted step") != std::string::npos);
  CHECK(over.out.find("state modes") != std::string::npos);
  // gradient_buffer=auto plans what `train` runs: without the accumulators, and it fits.
  const mt::test::Outcome dropped = plan_cmd(big + " --plan.hardware=h100 --plan.host_ram_gb=80");
  INFO(dropped.out);
  CHECK(dropped.code == 0);
  CHECK(dropped.out.find("train.gradient_buffer=auto: stage") != std::string::npos);
  // 64 GB: only the moments in files fit.
  const mt::test::Outcome files = plan_cmd(big + " --plan.hardware=h100 --plan.host_ram_gb=64");
  INFO(files.out);
  CHECK(files.code == 1);
  CHECK(files.out.find("fix: train.offload_dir") != std::string::npos);
  const mt::test::Outcome fits = plan_cmd(big + " --plan.hardware=h100");
  INFO(fits.out);
  CHECK(fits.code == 0);
  CHECK(fits.out.find("fits: yes") != std::string::npos);
  // A device budget the device does not have.
  const mt::test::Outcome device = plan_cmd(big + " --plan.hardware=a100 --device.max_vram_gb=100");
  INFO(device.out);
  CHECK(device.code == 1);
  CHECK(device.out.find("device.max_vram_gb") != std::string::npos);
  // Bad input names the key.
  const mt::test::Outcome bad = plan_cmd(big + " --plan.hardware=tpu");
  CHECK(bad.code == 1);
  CHECK(bad.out.find("plan.hardware") != std::string::npos);
}

TEST_CASE("plan: a checkpoint records the plan the run printed, the one megatrain plan prints", "[plan]") {
  TempDir dir("recorded");
  const std::string args = tiny_run_args(dir, "--train.gradient_accumulation_steps=2 --train.max_steps=2");
  const mt::test::Outcome run = mt::test::run_node(args);
  INFO(run.out);
  REQUIRE(run.code == 0);
  const fs::path ckpt = dir.path / "out" / "step-00000002";
  REQUIRE(fs::exists(ckpt / "plan.json"));
  const nlohmann::json recorded = nlohmann::json::parse(mt::test::slurp(ckpt / "plan.json"));
  CHECK_FALSE(nlohmann::json::parse(mt::test::slurp(ckpt / "manifest.json")).contains("plan"));
  // The object after `prefix` on a line of `out` (the first such line).
  auto printed = [](const std::string& out, const std::string& prefix) {
    const std::size_t at = out.find(prefix);
    REQUIRE(at != std::string::npos);
    const std::size_t from = at + prefix.size();
    return nlohmann::json::parse(out.substr(from, out.find('\n', from) - from));
  };
  CHECK(printed(run.out, "megatrain: plan ") == recorded);
  CHECK(printed(plan_output(args), "\nplan ") == recorded);
  CHECK(recorded.at("boundaries") == "device");
  CHECK(recorded.at("micro_batches") == 2);
}

TEST_CASE("plan: hardware profiles parse strictly, the step model follows the pipeline's limits", "[plan]") {
  const auto profiles = plan::parse_hardware_profiles(plan::builtin_hardware_ini(), "built-in");
  for (const char* k : {"h200", "h100", "gh200", "a100"}) REQUIRE(profiles.count(k) == 1);
  CHECK(profiles.at("gh200").link_h2d == 450e9);
  CHECK_THROWS_WITH(plan::parse_hardware_profiles("[x]\nname = \"x\"\nbogus = 1\n", "f.ini"),
                    Catch::Contains("f.ini:3") && Catch::Contains("bogus"));
  CHECK_THROWS_WITH(plan::parse_hardware_profiles("[x]\nname = \"x\"\n", "f.ini"), Catch::Contains("lacks"));

  // A link-bound plan (slow link) is predicted at the link's time, a compute-bound one at compute's.
  Tiny t;
  t.layers = 8;
  t.micro_batches = 1;
  TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const EnginePlan ep = plan_engine(cfg, model);
  plan::HardwareProfile hw = profiles.at("h100");
  plan::OpTimes ops;
  ops.layer_forward = 1.0, ops.layer_backward = 3.0, ops.head = 1.0;
  hw.link_h2d = hw.link_d2h = 1e18;
  hw.host_mem = 1e18;
  const plan::StepPrediction fast = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(fast.step_s == Approx(8 * 1.0 + 1.0 + 8 * 3.0).epsilon(1e-6));
  // Each layer load now takes 10 s: forward is link-bound, one load per op.
  const double layer_bytes = static_cast<double>(stage_layout(model, 1).total_floats) * 4.0;
  hw.link_h2d = layer_bytes / 10.0;
  const plan::StepPrediction slow = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(slow.step_s >= 10.0 * 15);  // 8 forward loads, 7 backward (the last layer stays resident)
  CHECK(slow.wait_link_s > 0);
}

TEST_CASE("plan: on shared cores compute fills the time the optimizer waits for NVMe reads", "[plan]") {
  Tiny t;
  t.layers = 8;
  TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const EnginePlan ep = plan_engine(cfg, model);
  plan::HardwareProfile hw = plan::parse_hardware_profiles(plan::builtin_hardware_ini(), "built-in").at("h100");
  hw.shared_cores = true;  // the CPU backend: no link (weights mapped), one set of cores for everything
  hw.host_mem = 1e18;      // no time for the gradient accumulation
  plan::OpTimes ops;
  ops.layer_forward = 1.0, ops.layer_backward = 3.0, ops.layer_backward_kept = 3.0, ops.head = 1.0;
  const double layer_floats = static_cast<double>(stage_layout(model, 1).total_floats);
  hw.adamw_params_per_s = layer_floats / 0.25;  // a layer's update: 0.25 s
  double optimizer = 0;
  for (std::int64_t s = 0; s < ep.stages; ++s) optimizer += static_cast<double>(stage_layout(model, s).total_floats);
  optimizer /= hw.adamw_params_per_s;

  // In RAM: the cores do compute, then the optimizer's burst (nothing to wait for): their sum.
  const plan::StepPrediction ram = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(ram.step_s == Approx(8 * 1.0 + 1.0 + 8 * 3.0 + optimizer).epsilon(1e-6));
  CHECK(ram.wait_nvme_s == 0);

  // Moments on a disk that reads or writes a layer's moments in 0.3 s: the optimizer waits for reads
  // (4 staging slots read 2 stages ahead), and compute's forward runs while it waits. An in-order
  // model of the cores would add the waits to the step; the forward (1 s a layer) outpaces the disk
  // (0.6 s a stage) only a little, so the step stays within a few seconds of the in-RAM one.
  cfg.train.offload_dir = "/nonexistent-plan-only";
  cfg.train.offload_staging_stages = 4;
  hw.disk_read = hw.disk_write = layer_floats * 8.0 / 0.3;
  const plan::StepPrediction tier = plan::predict_step(cfg, model, ep, hw, ops);
  INFO("in RAM " << ram.step_s << " s, tier " << tier.step_s << " s, optimizer waited " << tier.wait_nvme_s << " s");
  CHECK(tier.wait_nvme_s > 1.0);
  CHECK(tier.step_s >= ram.step_s);
  CHECK(tier.step_s < ram.step_s + 0.5 * tier.wait_nvme_s);
  // A disk slower than the forward: the next step's forward follows the updates, a stage per read + write.
  hw.disk_read = hw.disk_write = layer_floats * 8.0 / 2.0;
  const plan::StepPrediction slow = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(slow.step_s > ram.step_s + 8 * (4.0 - 1.0 - 0.25) - 4.0);

  // int8 moments in RAM, 4 slots for 10 stages: every stage decoded before its update and encoded
  // after it (a layer: 0.1 + 0.2 s), on the same cores: the step grows by the codec's work.
  cfg.train.offload_dir.clear();
  cfg.train.optimizer_compression = "int8";
  hw.codec_encode_params_per_s = layer_floats / 0.2;
  hw.codec_decode_params_per_s = layer_floats / 0.1;
  double codec = 0;
  for (std::int64_t s = 0; s < ep.stages; ++s)
    codec += static_cast<double>(stage_layout(model, s).total_floats) *
             (1.0 / hw.codec_encode_params_per_s + 1.0 / hw.codec_decode_params_per_s);
  const plan::StepPrediction coded = plan::predict_step(cfg, model, ep, hw, ops);
  INFO("int8 in RAM " << coded.step_s << " s, codec " << codec << " s");
  CHECK(coded.step_s == Approx(ram.step_s + codec).epsilon(0.01));
}

TEST_CASE("plan: gpt-oss-120b from its hub config.json fits the h200 profile at 12 bytes per parameter",
          "[plan][moe]") {
  // The hub's config.json of openai/gpt-oss-120b (MXFP4 experts: the planner sizes the bf16/fp32 training state).
  nlohmann::json cfg = {
      {"architectures", nlohmann::json::array({"GptOssForCausalLM"})},
      {"model_type", "gpt_oss"},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"eos_token_id", 200002},
      {"pad_token_id", 199999},
      {"experts_per_token", 4},
      {"num_experts_per_tok", 4},
      {"num_local_experts", 128},
      {"head_dim", 64},
      {"hidden_act", "silu"},
      {"hidden_size", 2880},
      {"intermediate_size", 2880},
      {"initial_context_length", 4096},
      {"initializer_range", 0.02},
      {"max_position_embeddings", 131072},
      {"num_attention_heads", 64},
      {"num_key_value_heads", 8},
      {"num_hidden_layers", 36},
      {"output_router_logits", false},
      {"rms_norm_eps", 1e-05},
      {"rope_scaling",
       {{"beta_fast", 32.0},
        {"beta_slow", 1.0},
        {"factor", 32.0},
        {"original_max_position_embeddings", 4096},
        {"rope_type", "yarn"},
        {"truncate", false}}},
      {"rope_theta", 150000},
      {"router_aux_loss_coef", 0.9},
      {"sliding_window", 128},
      {"swiglu_limit", 7.0},
      {"tie_word_embeddings", false},
      {"transformers_version", "4.55.0.dev0"},
      {"use_cache", true},
      {"vocab_size", 201088},
      {"quantization_config",
       {{"quant_method", "mxfp4"},
        {"modules_to_not_convert", nlohmann::json::array({"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                          "model.embed_tokens", "lm_head"})}}}};
  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < 36; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  cfg["layer_types"] = types;
  TempDir dir("plan_gpt_oss");
  std::ofstream(dir.path / "config.json") << cfg.dump(2);
  const std::string out = plan_output("--model.config_file=" + (dir.path / "config.json").string() +
                                      " --plan.hardware=h200 --train.bf16=true");
  INFO(out);
  CHECK(out.find("gpt_oss, 36 layers, 116.829B parameters") != std::string::npos);
  CHECK(out.find("fits: yes") != std::string::npos);
  CHECK(out.find("predicted step") != std::string::npos);
  // Only the exact 12-byte mode (split masters, stage gradients) and the lossy or NVMe ones fit.
  auto mode_line = [&](const std::string& what) {
    const std::size_t at = out.find(what);
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  CHECK(mode_line("fp32 masters, gradient accumulators").find("does not fit") != std::string::npos);
  CHECK(mode_line("split masters, gradient accumulators").find("does not fit") != std::string::npos);
  const std::string twelve = mode_line("split masters, stage gradients (2 passes)");
  CHECK(twelve.find("12.0 B/param") != std::string::npos);
  CHECK(twelve.find(" fits ") != std::string::npos);
  CHECK(out.find("* split masters, stage gradients") != std::string::npos);  // the one auto picks
  // The link cover: on the order of 10^5 tokens per micro-batch hide a layer's transfer on an H200.
  const std::string cover = mode_line("link cover:");
  const std::size_t so = cover.find(", so ");
  REQUIRE(so != std::string::npos);
  const double tokens = std::stod(cover.substr(so + 5));
  CHECK(tokens > 1e5);
  CHECK(tokens < 1e6);
}

// A job of several ranks with the host state sharded (cluster.shard_state): the plan counts this rank's
// tiles as the engine allocates them, and `megatrain plan --plan.ranks=N` lists every rank's and plans
// the largest, also for a GPU profile the cluster cannot run yet (said, with the key).
namespace {

// A small Llama of `layers` layers on 2 ranks with the host state sharded.
TrainConfig sharded_on_two_ranks(std::int64_t layers) {
  TrainConfig cfg;
  cfg.model.layers = layers;
  cfg.model.hidden_size = 64;
  cfg.model.intermediate_size = 128;
  cfg.model.heads = 4;
  cfg.model.kv_heads = 2;
  cfg.model.vocab_size = 256;
  cfg.cluster.ranks = 2;
  cfg.cluster.shard_state = true;
  return cfg;
}

// What `megatrain plan` prints for a small Llama with these extra arguments; it must fit (exit 0).
std::string plan_of_small_llama(const std::string& args) {
  return plan_output(
      "--model.layers=6 --model.hidden_size=256 --model.intermediate_size=512 --model.heads=4 --model.kv_heads=2"
      " --model.vocab_size=1024 --plan.hardware=h200 " +
      args);
}

}  // namespace

TEST_CASE("plan: a sharded rank's host tiles as the engine allocates them, plan.ranks lists every rank", "[plan]") {
  TrainConfig cfg = sharded_on_two_ranks(3);
  const ModelConfig model = cfg.model_config_from_keys();
  std::size_t sum = 0;
  for (int r = 0; r < 2; ++r) {
    cfg.cluster.rank = r;
    HostModel host(model, host_tile_options(cfg), nullptr, nullptr, host_owned_stages(cfg, model));
    CHECK(tier_bytes(cfg, model).tiles == host.host_bytes());
    sum += host.host_bytes();
  }
  const std::size_t whole = host_model_bytes(model, host_tile_options(cfg));
  CHECK(sum < 2 * whole);
  CHECK(sum > whole);

  const std::string out = plan_of_small_llama("--train.bf16=true --plan.ranks=4 --cluster.shard_state=true");
  INFO(out);
  CHECK(out.find("cluster: 4 ranks (plan.ranks), the host state sharded (cluster.shard_state); host tiles per "
                 "rank: 0: ") != std::string::npos);
  CHECK(out.find("planned below: rank ") != std::string::npos);
  CHECK(out.find("for the 3 other ranks'") != std::string::npos);
  // A GPU profile's ranks run on the cuda backend (one GPU each), their gradients over NCCL where built.
  CHECK(out.find("note: train would refuse this job today") == std::string::npos);
  CHECK(out.find("cluster: each round's gradients go to their stage's owner over ") != std::string::npos);
  CHECK(out.find("predicted step") != std::string::npos);
}

// The moment store sharded (cluster.shard_state with train.offload_dir, offload_params, a codec): the
// plan counts this rank's store, its slots and its own stages' files, as each rank's engine allocates
// them (the store's own accounting); the ranks' files add up to one unsharded store's; `megatrain plan
// --plan.ranks=N` lists every rank's files and plans the rank with the most host RAM.
TEST_CASE("plan: a sharded rank's moment store and files as the engine allocates them", "[plan]") {
  TempDir dir("plan_shard_tier");
  TrainConfig cfg = sharded_on_two_ranks(5);  // 7 stages: 4 on rank 0, 3 on rank 1
  cfg.train.bf16 = true;
  cfg.train.offload_dir = dir.path.string();
  cfg.train.offload_params = true;
  cfg.train.optimizer_compression = "lossless";
  cfg.train.offload_staging_stages = 3;
  const ModelConfig model = cfg.model_config_from_keys();
  std::size_t files = 0;
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    cfg.cluster.rank = r;
    HostModel host(model, host_tile_options(cfg), nullptr, moment_store_for(cfg, model), host_owned_stages(cfg, model));
    init_host_model(host, 1);
    const TierBytes tb = tier_bytes(cfg, model);
    CHECK(tb.tiles + tb.staging == host.host_bytes());
    CHECK(tb.staging == host.moments().ram_bytes());
    CHECK(tb.disk == host.moments().disk_bytes());
    for (std::int64_t s = 0; s < host.num_stages(); ++s) CHECK(host.moments().holds(s) == (s % 2 == r));
    files += tb.disk;
  }
  CHECK(tier_bytes_of_every_stage(cfg, model).disk == files);

  const std::string out =
      plan_of_small_llama("--train.bf16=true --train.offload_params=true --train.offload_dir=" + dir.path.string() +
                          " --plan.ranks=3 --cluster.shard_state=true");
  INFO(out);
  CHECK(out.find("host tiles and moment store per rank: 0: ") != std::string::npos);
  CHECK(out.find(" 2: ") != std::string::npos);
  CHECK(out.find("(files ") != std::string::npos);
  CHECK(out.find("fp32 master and Adam moment files of rank ") != std::string::npos);
}

// Stage gradients with the host state sharded (train.gradient_buffer=stage, cluster.shard_state): a
// rank's tiles hold no gradient (split masters: 12 bytes a parameter of its own stages, the bf16 copy of
// the others'), as the engine allocates them, and two stage accumulators of its largest own stage; the
// state modes of `megatrain plan --plan.ranks=N` show the planned rank's bytes (about 2 + 10/N a
// parameter) and auto's pick of stage gradients for a sharded run without clipping at one micro-batch.
TEST_CASE("plan: stage gradients sharded, each rank's tiles and accumulators, the state modes per rank", "[plan]") {
  TrainConfig cfg = sharded_on_two_ranks(3);
  cfg.train.bf16 = true;
  cfg.train.gradient_buffer = "stage";
  const ModelConfig model = cfg.model_config_from_keys();
  const std::size_t whole = host_model_bytes(model, host_tile_options(cfg));
  const double params = static_cast<double>(total_param_count(model));
  std::size_t sum = 0;
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    cfg.cluster.rank = r;
    HostModel host(model, host_tile_options(cfg), nullptr, nullptr, host_owned_stages(cfg, model));
    CHECK(tier_bytes(cfg, model).tiles == host.host_bytes());
    for (std::int64_t s = 0; s < host.num_stages(); ++s) CHECK_FALSE(host.tile(s).has_grad());
    std::size_t largest_own = 0;
    for (std::int64_t s = r; s < num_stages(model); s += 2)
      largest_own = std::max(largest_own, stage_layout(model, s).total_floats);
    CHECK(stage_accumulator_floats(cfg, model) == largest_own);
    const plan::ResourcePlan p = plan::plan_resources(cfg, model, {}, 0, "", 0, "");
    REQUIRE(p.engine);
    CHECK(sums_into_stage_accumulators(*p.engine));
    bool counted = false;
    for (const auto& b : p.bytes)
      if (b.what.find("two stage accumulators of rank " + std::to_string(r) + "'s stages") != std::string::npos)
        counted = b.bytes == Approx(2.0 * static_cast<double>(largest_own) * sizeof(float));
    CHECK(counted);
    sum += host.host_bytes();
  }
  // The ranks hold the model's 12 bytes a parameter once, plus the 2 of the bf16 copy on the other rank.
  CHECK(static_cast<double>(whole) / params == Approx(12.0).epsilon(0.02));
  CHECK(static_cast<double>(sum) == Approx(static_cast<double>(whole) + 2.0 * params).epsilon(0.02));

  const std::string out =
      plan_of_small_llama("--train.bf16=true --train.max_grad_norm=0 --plan.ranks=4 --cluster.shard_state=true");
  INFO(out);
  CHECK(out.find("state modes (host bytes per parameter in the tiles of rank ") != std::string::npos);
  const std::size_t at = out.find("* split masters, stage gradients (1 pass)");  // auto's pick, as one rank's
  REQUIRE(at != std::string::npos);
  const std::string row = out.substr(at, out.find('\n', at) - at);
  const std::size_t unit = row.find(" B/param");
  REQUIRE(unit != std::string::npos);
  const double per_param = std::stod(row.substr(row.rfind(' ', unit - 1) + 1));
  CHECK(per_param > 2.0);
  CHECK(per_param < 12.0 / 2);  // 2 + 10/4 on average; the planned rank holds the most
  CHECK(out.find("two stage accumulators of rank ") != std::string::npos);
  CHECK(out.find("summed there into a stage accumulator") != std::string::npos);
}
