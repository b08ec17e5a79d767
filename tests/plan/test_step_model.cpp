// The step model's NVMe-tier CPU term: the tier's checksums and system calls (CPU seconds per byte,
// measured through the tier's own code by the profile) take compute's cores on the CPU backend, so a
// step whose transfers hide behind compute grows by exactly their CPU seconds; without the tier, or
// with the device's own cores doing compute, it does not grow. And the profile measures those rates.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "kernels/param_layout.hpp"
#include "plan/hardware.hpp"
#include "plan/step_model.hpp"

using namespace mt;

namespace {

// An 8-layer llama small enough to plan in milliseconds; clipping on (the optimizer after the backward).
TrainConfig small_config() {
  TrainConfig c;
  c.model.arch = "llama";
  c.model.hidden_size = 32;
  c.model.layers = 8;
  c.model.heads = 4;
  c.model.kv_heads = 2;
  c.model.intermediate_size = 72;
  c.model.vocab_size = 64;
  c.model.max_position_embeddings = 64;
  c.train.per_device_train_batch_size = 2;
  c.train.max_steps = 5;
  c.train.max_grad_norm = 1.0;
  c.data.seq_length = 8;
  c.device.max_vram_gb = 64 / 1024.0;
  c.device.weight_slots = 2;
  c.device.grad_slots = 2;
  c.device.keep_intermediates = "boundary";
  c.monitor.enabled = false;
  c.threads.total = 2;
  return c;
}

double stage_floats(const ModelConfig& model, std::int64_t s) {
  return static_cast<double>(stage_layout(model, s).total_floats);
}

}  // namespace

TEST_CASE("step model: the tier's CPU work on shared cores adds its CPU seconds, none without the tier", "[plan]") {
  TrainConfig cfg = small_config();
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::EnginePlan ep = plan::plan_engine(cfg, model);
  REQUIRE(ep.stages == 10);
  plan::HardwareProfile hw = plan::parse_hardware_profiles(plan::builtin_hardware_ini(), "built-in").at("h100");
  hw.shared_cores = true;        // the CPU backend: weights mapped, one set of cores for everything
  hw.host_mem = 1e18;            // no accumulation time
  hw.adamw_params_per_s = 1e18;  // no optimizer time: the tier's intervals are the only work beside compute
  plan::OpTimes ops;
  ops.layer_forward = 1.0, ops.layer_backward = 3.0, ops.layer_backward_kept = 3.0, ops.head = 1.0;
  // A disk that moves a layer's moments (8 bytes a parameter) in 0.01 s each way: every read and write
  // is done long before compute needs the stage, so the transfers themselves never delay it.
  const double layer = stage_floats(model, 1);
  hw.disk_read = hw.disk_write = layer * 8.0 / 0.01;

  const plan::StepPrediction ram = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(ram.tier_cpu_s == 0);

  cfg.train.offload_dir = "/nonexistent-plan-only";
  cfg.train.offload_staging_stages = 4;  // 10 stages through 4 slots: every stage read and written each step
  const plan::StepPrediction free_cpu = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(free_cpu.tier_cpu_s == 0);
  CHECK(free_cpu.nvme_s > 0);
  // The disk alone hides behind compute: a steady step is the in-RAM one (the mean over steps 2..N
  // is a little longer: the first of them ends with the first update burst that waits for reads).
  CHECK(free_cpu.steady_s == Approx(ram.steady_s).epsilon(1e-9));
  CHECK(free_cpu.step_s >= ram.step_s);
  CHECK(free_cpu.step_s < ram.step_s + 0.05);

  // Each transfer's CPU: 0.004 s for a layer's read, 0.003 s for its write (inside its 0.01 s).
  hw.disk_read_cpu_s_per_byte = 0.004 / (layer * 8.0);
  hw.disk_write_cpu_s_per_byte = 0.003 / (layer * 8.0);
  double expected = 0;
  for (std::int64_t s = 0; s < ep.stages; ++s)
    expected += stage_floats(model, s) * 8.0 * (hw.disk_read_cpu_s_per_byte + hw.disk_write_cpu_s_per_byte);
  const plan::StepPrediction tier = plan::predict_step(cfg, model, ep, hw, ops);
  INFO("in RAM " << ram.steady_s << " s, tier " << free_cpu.steady_s << " s, with its CPU " << tier.steady_s
                 << " s, the tier's CPU " << tier.tier_cpu_s << " s");
  CHECK(tier.tier_cpu_s == Approx(expected).epsilon(1e-9));
  CHECK(expected > 0.05);
  // The transfers lie inside compute's time (the next step's forward): compute pauses for every one of
  // them. A steady step holds one step's writes and reads; the mean over steps 2..N is a little less
  // (the first of them follows a step that read nothing: fresh moments).
  CHECK(tier.steady_s == Approx(free_cpu.steady_s + expected).epsilon(1e-9));
  CHECK(tier.step_s > free_cpu.step_s + 0.8 * expected);
  CHECK(tier.step_s < free_cpu.step_s + expected);
  CHECK(tier.compute_s == Approx(ram.compute_s).epsilon(1e-12));  // compute's own work is unchanged
  const std::string shown = plan::describe_step(tier, ops);
  CHECK(shown.find("the tier's CPU work") != std::string::npos);
  CHECK(shown.find("pauses compute") != std::string::npos);

  // The same rates without the tier: nothing to charge.
  cfg.train.offload_dir.clear();
  const plan::StepPrediction no_tier = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(no_tier.tier_cpu_s == 0);
  CHECK(no_tier.step_s == Approx(ram.step_s).epsilon(1e-9));

  // A device with cores of its own (a GPU profile): the tier's CPU runs on host cores beside it; its
  // time stays within the transfers, which still hide behind compute.
  cfg.train.offload_dir = "/nonexistent-plan-only";
  hw.shared_cores = false;
  hw.link_h2d = hw.link_d2h = 1e18;
  const plan::StepPrediction device = plan::predict_step(cfg, model, ep, hw, ops);
  hw.disk_read_cpu_s_per_byte = hw.disk_write_cpu_s_per_byte = 0;
  const plan::StepPrediction device_free = plan::predict_step(cfg, model, ep, hw, ops);
  CHECK(device.tier_cpu_s == Approx(expected).epsilon(1e-9));
  CHECK(device.step_s == Approx(device_free.step_s).epsilon(1e-9));
  CHECK(device.steady_s == Approx(device_free.steady_s).epsilon(1e-9));
  CHECK(plan::describe_step(device, ops).find("beside the device") != std::string::npos);
}

TEST_CASE("step model: the tier's CPU work and the optimizer's overlap on shared cores, paused once", "[plan]") {
  // The optimizer's AdamW and a read's checksum verification at the same moment each take a core;
  // compute, whose team needs every core, is paused for the union of their times, not their sum.
  TrainConfig cfg = small_config();
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::EnginePlan ep = plan::plan_engine(cfg, model);
  plan::HardwareProfile hw = plan::parse_hardware_profiles(plan::builtin_hardware_ini(), "built-in").at("h100");
  hw.shared_cores = true;
  hw.host_mem = 1e18;
  const double layer = stage_floats(model, 1);
  hw.adamw_params_per_s = layer / 0.05;
  plan::OpTimes ops;
  ops.layer_forward = 1.0, ops.layer_backward = 3.0, ops.layer_backward_kept = 3.0, ops.head = 1.0;
  cfg.train.offload_dir = "/nonexistent-plan-only";
  cfg.train.offload_staging_stages = 4;
  hw.disk_read = hw.disk_write = layer * 8.0 / 0.01;
  const plan::StepPrediction base = plan::predict_step(cfg, model, ep, hw, ops);
  hw.disk_read_cpu_s_per_byte = 0.004 / (layer * 8.0);
  hw.disk_write_cpu_s_per_byte = 0.003 / (layer * 8.0);
  const plan::StepPrediction tier = plan::predict_step(cfg, model, ep, hw, ops);
  INFO("without the tier's CPU " << base.step_s << " s, with " << tier.step_s << " s, its CPU " << tier.tier_cpu_s);
  CHECK(tier.step_s > base.step_s);                            // some of it falls where compute runs
  CHECK(tier.step_s <= base.step_s + tier.tier_cpu_s + 1e-9);  // never more than all of it
}

TEST_CASE("profile: this machine's tier rates and CPU seconds per byte come from the tier's own code", "[plan]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("megatrain-plan-probe-test-" + std::to_string(::getpid()));
  plan::MeasureOptions mo;
  mo.compute_threads = 1;
  mo.disk_dir = dir.string();
  mo.disk_bytes = 32.0 * (1 << 20);
  mo.disk_queue_depth = 4;
  const plan::HardwareProfile hw = plan::measure_this_machine(mo);
  std::filesystem::remove_all(dir);
  INFO("read " << hw.disk_read / 1e9 << " GB/s at " << hw.disk_read_cpu_s_per_byte * 1e9 << " CPU s/GB, write "
               << hw.disk_write / 1e9 << " GB/s at " << hw.disk_write_cpu_s_per_byte * 1e9 << " CPU s/GB");
  CHECK(hw.disk_read > 0);
  CHECK(hw.disk_write > 0);
  // Every byte is checksummed (and moved by a system call): some CPU, but no more than the probe's
  // threads (the caller and 4 I/O threads) can spend in the transfer's time.
  CHECK(hw.disk_read_cpu_s_per_byte > 0);
  CHECK(hw.disk_write_cpu_s_per_byte > 0);
  CHECK(hw.disk_read_cpu_s_per_byte * hw.disk_read <= 5.0);
  CHECK(hw.disk_write_cpu_s_per_byte * hw.disk_write <= 5.0);
  CHECK_FALSE(std::filesystem::exists(dir / ("megatrain-plan-probe-" + std::to_string(::getpid()))));
}
