// Several devices of one node (device.gpus = N) on the CPU backend: N arenas, a prefetcher and a
// compute actor per device, each device its own micro-batches (device d: global micro-batches d, d + N,
// ...), each stage's gradients summed across the devices (Backend::reduce_gradients, device order)
// before one copy to the host. Oracles: one device with N x the accumulation steps (the engine and the
// reference trainer), bit for bit when every device runs one micro-batch per step; repeated runs; an
// uninterrupted run for restarts and for a checkpoint resumed with another device count.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "actors/run_state.hpp"
#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;
namespace fs = std::filesystem;

// LeakSanitizer (asan preset): HDF5's global state is never freed (storage/checkpoint/README.md).
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name is LSan's interface
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

namespace {

Tiny base() {
  Tiny t;
  t.layers = 3;
  t.steps = 6;
  return t;
}

// cfg for N devices, each running `per_device` micro-batches per step.
TrainConfig devices_config(Tiny t, std::int64_t n, std::int64_t per_device) {
  t.micro_batches = per_device;
  TrainConfig c = tiny_config(t);
  c.device.gpus = n;
  return c;
}

void check_losses(const EngineResult& r, const std::vector<double>& expected) {
  REQUIRE(r.steps.size() == expected.size());
  for (std::size_t s = 0; s < expected.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(r.steps[s].loss == expected[s]);
  }
}

// N devices x 1 micro-batch equals one device with N micro-batches (and the reference trainer) bit for
// bit: the host accumulates 0 + ((g0 + g1) + ...), one device ((0 + g0) + g1) + ..., the same sums.
void check_bit_exact(const Tiny& t, std::int64_t n) {
  const TrainConfig multi = devices_config(t, n, 1);
  const TrainConfig single = devices_config(t, 1, n);
  const ModelConfig model = multi.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  INFO("N=" << n << " arch " << arch_name(t.arch) << (t.bf16 ? " bf16" : " fp32") << " keep=" << t.keep
            << " clip=" << t.max_grad_norm);
  EngineRun eng = run_pipeline(multi, model, batches);
  REQUIRE(eng.result.error.empty());
  REQUIRE(eng.result.steps_done == t.steps);
  RefRun ref = run_reference(single, model, batches, t.steps);
  check_losses(eng.result, ref.losses);
  CHECK(equals_reference(*eng.host, *ref.trainer));
  CHECK(ref.losses.back() < ref.losses.front());
  // Device memory is per device: N arenas of the same plan, each used.
  REQUIRE(eng.result.device_arenas.size() == static_cast<std::size_t>(n));
  for (const ArenaUsage& a : eng.result.device_arenas) {
    CHECK(a.capacity_bytes == eng.result.arena.capacity_bytes);
    CHECK(a.peak_bytes > 0);
    CHECK(a.peak_bytes <= a.capacity_bytes);
  }
}

}  // namespace

TEST_CASE("multi-device: N devices equal one device with N x accumulation bit for bit", "[actors][multidev]") {
  check_bit_exact(base(), 2);
  check_bit_exact(base(), 3);
  Tiny g = base();
  g.arch = Arch::gpt2;    // tied embeddings: the head's embedding gradient is staged on each device
  g.max_grad_norm = 0.0;  // updates during backward, as each stage's last round is in
  check_bit_exact(g, 2);
  Tiny h = base();
  h.keep = "boundary_host";  // each device its own host boundary store
  h.bf16 = true;
  check_bit_exact(h, 2);
}

TEST_CASE("multi-device: several micro-batches per device, deterministic and within rounding of one device",
          "[actors][multidev]") {
  // 2 devices x 2 micro-batches: the host adds round sums, (g0 + g1) then (g2 + g3), where one device
  // adds g0, g1, g2, g3 one by one: fp32 addition is not associative, so the bits may differ
  // (structural: the host's running sum never goes back to the devices). Runs repeat bit for bit.
  Tiny t = base();
  const TrainConfig multi = devices_config(t, 2, 2);
  const TrainConfig single = devices_config(t, 1, 4);
  const ModelConfig model = multi.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  EngineRun a = run_pipeline(multi, model, batches);
  EngineRun b = run_pipeline(multi, model, batches);
  REQUIRE(a.result.error.empty());
  REQUIRE(b.result.error.empty());
  CHECK(tiles_equal(*a.host, *b.host));
  for (std::size_t s = 0; s < a.result.steps.size(); ++s) CHECK(a.result.steps[s].loss == b.result.steps[s].loss);
  RefRun ref = run_reference(single, model, batches, t.steps);
  REQUIRE(a.result.steps.size() == ref.losses.size());
  for (std::size_t s = 0; s < ref.losses.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(std::abs(a.result.steps[s].loss - ref.losses[s]) <= 1e-5 * std::abs(ref.losses[s]));
  }
  double worst = 0.0;
  for (std::int64_t s = 0; s < a.host->num_stages(); ++s) {
    const std::size_t n = static_cast<std::size_t>(ref.trainer->layout(s).total_floats);
    const float* p = a.host->tile(s).params();
    const float* q = ref.trainer->params(s);
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(static_cast<double>(p[i]) - q[i]));
  }
  INFO("largest parameter difference " << worst);
  CHECK(worst <= 1e-6);  // measured 6e-8: a rounding difference, not a wrong sum
}

TEST_CASE("multi-device: a crash of one device's compute or prefetcher is restarted, bit for bit",
          "[actors][multidev][restart]") {
  const Tiny t = base();
  const TrainConfig multi = devices_config(t, 2, 1);
  const TrainConfig single = devices_config(t, 1, 2);
  const ModelConfig model = multi.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  const RefRun ref = run_reference(single, model, batches, t.steps);
  struct Fault {
    Role role;
    std::int64_t mb, stage;
    Phase phase;
  };
  // Global micro-batch 1 runs on device 1, 0 on device 0.
  const Fault faults[] = {{Role::compute, 1, 2, Phase::backward},
                          {Role::compute, 0, 2, Phase::forward},
                          {Role::prefetcher, 1, 2, Phase::prefetch},
                          {Role::collector, 0, 2, Phase::collect},
                          {Role::loader, 1, -1, Phase::data}};
  for (const Fault& f : faults) {
    FaultPlan plan(f.role, 3, f.mb, f.stage, static_cast<int>(f.phase));
    INFO("fault: " << plan.describe());
    EngineRun eng = run_pipeline(multi, model, batches, &plan);
    INFO("restart log: " << restart_log_text(eng.result));
    REQUIRE(eng.result.error.empty());
    CHECK(plan.fired.load() == 1);
    CHECK(eng.result.restarts == 1);
    // The log names the device's actor: "compute[1]" for device 1's, plain names for device 0's.
    const bool per_device = f.role == Role::compute || f.role == Role::prefetcher;
    const std::string who = std::string(role_name(f.role)) + (per_device && f.mb % 2 == 1 ? "[1]" : "") + " crashed";
    REQUIRE(eng.result.restart_log.size() == 1);
    CHECK_THAT(eng.result.restart_log[0], Catch::StartsWith(who));
    REQUIRE(eng.result.steps_done == t.steps);
    check_losses(eng.result, ref.losses);
    CHECK(equals_reference(*eng.host, *ref.trainer));
  }
}

TEST_CASE("multi-device: restarts with tied embeddings and with several micro-batches per device",
          "[actors][multidev][restart]") {
  // GPT-2 (tied): device 1's head stages the embedding gradient until its embed backward.
  Tiny g = base();
  g.arch = Arch::gpt2;
  {
    const TrainConfig multi = devices_config(g, 2, 1);
    const ModelConfig model = multi.model_config_from_keys();
    const auto batches = tiny_batches(g, 16);
    const RefRun ref = run_reference(devices_config(g, 1, 2), model, batches, g.steps);
    for (const Phase phase : {Phase::head, Phase::backward}) {
      FaultPlan plan(Role::compute, 2, 1, phase == Phase::head ? g.layers + 1 : 0, static_cast<int>(phase));
      INFO("fault: " << plan.describe());
      EngineRun eng = run_pipeline(multi, model, batches, &plan);
      REQUIRE(eng.result.error.empty());
      CHECK(plan.fired.load() == 1);
      check_losses(eng.result, ref.losses);
      CHECK(equals_reference(*eng.host, *ref.trainer));
    }
  }
  // 2 devices x 2 micro-batches, boundaries on the host: equals the uninterrupted run of the same shape.
  Tiny t = base();
  t.keep = "boundary_host";
  const TrainConfig multi = devices_config(t, 2, 2);
  const ModelConfig model = multi.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  EngineRun plain = run_pipeline(multi, model, batches);
  REQUIRE(plain.result.error.empty());
  std::vector<double> losses;
  for (const auto& r : plain.result.steps) losses.push_back(r.loss);
  // Global micro-batch 3 = device 1's second; 2 = device 0's second.
  const FaultPlan faults[] = {FaultPlan(Role::compute, 3, 3, 2, static_cast<int>(Phase::backward)),
                              FaultPlan(Role::prefetcher, 3, 2, 1, static_cast<int>(Phase::prefetch_boundary)),
                              FaultPlan(Role::collector, 3, 1, 2, static_cast<int>(Phase::collect))};
  for (const FaultPlan& f : faults) {
    FaultPlan plan(f.role, f.step, f.micro_batch, f.stage, f.phase);
    INFO("fault: " << plan.describe());
    EngineRun eng = run_pipeline(multi, model, batches, &plan);
    INFO("restart log: " << restart_log_text(eng.result));
    REQUIRE(eng.result.error.empty());
    CHECK(plan.fired.load() == 1);
    CHECK(eng.result.restarts == 1);
    check_losses(eng.result, losses);
    CHECK(tiles_equal(*eng.host, *plain.host));
  }
}

TEST_CASE("multi-device: a stop request ends every device at one step", "[actors][multidev]") {
  Tiny t = base();
  t.steps = 12;
  t.bandwidth_gbps = 0.002;  // slow the link: steps take longer than the node's 50 ms stop poll
  const TrainConfig multi = devices_config(t, 3, 1);
  const ModelConfig model = multi.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  HostModel host(model, host_tile_options(multi));
  init_host_model(host, static_cast<std::uint64_t>(multi.train.seed));
  VectorBatchSource source(batches);
  std::atomic<bool> stop{false};
  EngineJob job;
  job.cfg = multi;
  job.model = model;
  job.data = &source;
  job.host = &host;
  job.stop = &stop;
  job.on_step = [&](const StepRecord& r) {
    if (r.step == 4) stop.store(true);
  };
  const EngineResult r = run_engine(std::move(job));
  REQUIRE(r.error.empty());
  CHECK(r.stopped_early);
  REQUIRE(r.steps_done >= 4);
  REQUIRE(r.steps_done < t.steps);
  for (std::int64_t s = 0; s < host.num_stages(); ++s)
    CHECK(host.tile(s).version() == static_cast<std::uint64_t>(r.steps_done));
  const RefRun ref = run_reference(devices_config(t, 1, 3), model, batches, r.steps_done);
  CHECK(equals_reference(host, *ref.trainer));
}

TEST_CASE("multi-device: a checkpoint resumes with another device count", "[actors][multidev][checkpoint]") {
  // Checkpoints hold host state only; the data cursor counts micro-batches of the whole step. 2 devices
  // x 1 micro-batch for 3 steps, then 1 device x 2 micro-batches: equals 6 steps on one device.
  const Tiny t = base();
  const TrainConfig multi = devices_config(t, 2, 1);
  const TrainConfig single = devices_config(t, 1, 2);
  const ModelConfig model = multi.model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  const fs::path root = fs::temp_directory_path() / ("mt_multidev_" + std::to_string(::getpid()));
  fs::remove_all(root);
  {
    HostModel host(model, host_tile_options(multi));
    init_host_model(host, static_cast<std::uint64_t>(multi.train.seed));
    VectorBatchSource source(batches);
    EngineJob job;
    job.cfg = multi;
    job.model = model;
    job.data = &source;
    job.host = &host;
    job.stop_after = 3;
    job.checkpoint.root = root.string();
    const EngineResult r = run_engine(std::move(job));
    REQUIRE(r.error.empty());
    REQUIRE(r.steps_done == 3);
  }
  HostModel host(model, host_tile_options(single));
  VectorBatchSource source(batches);
  EngineJob job;
  job.cfg = single;
  job.model = model;
  job.data = &source;
  job.host = &host;
  job.first_step = load_checkpoint(root, false, single, model, host, &source).step;
  REQUIRE(job.first_step == 3);
  const EngineResult r = run_engine(std::move(job));
  fs::remove_all(root);
  REQUIRE(r.error.empty());
  REQUIRE(r.steps_done == t.steps);
  const RefRun ref = run_reference(single, model, batches, t.steps);
  REQUIRE(r.steps.size() == 3);
  for (std::size_t s = 0; s < 3; ++s) CHECK(r.steps[s].loss == ref.losses[s + 3]);
  CHECK(equals_reference(host, *ref.trainer));
}

TEST_CASE("multi-device: device.gpus is validated", "[actors][multidev][config]") {
  TrainConfig c = tiny_config(base());
  c.data.train_files = "unused";
  auto error_of = [](TrainConfig cfg) -> std::string {
    try {
      plan_engine(cfg, cfg.model_config_from_keys());
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  c.device.gpus = 0;
  CHECK_THAT(error_of(c), Catch::Contains("device.gpus") && Catch::Contains(">= 1"));
  c.device.gpus = -2;
  CHECK_THAT(error_of(c), Catch::Contains("device.gpus"));
  c.device.gpus = 4;
  CHECK(error_of(c).empty());
  const EnginePlan p = plan_engine(c, c.model_config_from_keys());
  CHECK(p.devices == 4);
  CHECK(p.micro_batches == 4 * c.train.gradient_accumulation_steps);
}
