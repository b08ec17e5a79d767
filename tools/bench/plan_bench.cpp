// tools/bench/run plan [--steps N] [--dir DIR] [--threads N (2)] [--only NAME_PART] [--published]: the planner's
// predicted step time (plan) against the engine's measured one, same run, for several CPU configurations of the demo
// model's family (depth, width, K weight slots, interleaved micro-batches, the NVMe tier for the moments):
// plan_step_error = the worst |predicted - measured| / measured (target <= 0.10). The planner gets this machine's
// profile measured in the same run (memcpy as the link, the AdamW rate, the disk's rates and the tier's CPU seconds per
// byte through the tier's own code) and the op times of the engine's stage kernels at each shape; nothing is fitted to
// the engine runs. Then the planner's prediction for the published system's reported points, printed beside them
// (datasheet profiles of config/hardware.ini; no run: this machine has no GPU).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "actors/engine.hpp"
#include "kernels/cpu/ops.hpp"
#include "plan/hardware.hpp"
#include "plan/resource_plan.hpp"
#include "plan/state_modes.hpp"
#include "plan/step_model.hpp"
#include "storage/offload/staged_moment_store.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/child_process.hpp"
#include "tools/bench/demo_model.hpp"

using namespace mt;

namespace {

struct Config {
  std::string name;
  std::int64_t hidden = 384, layers = 8, heads = 6, kv_heads = 2, intermediate = 1024;
  std::int64_t weight_slots = 2, micro_batches = 1;
  bool tier = false;
};

struct Measured {
  double step = 0, compute = 0, wait = 0;  // medians over steps 2..N: step, compute busy, compute waited
  double optimizer = 0;                    // median optimizer busy
  offload::MomentStoreStats tier;          // the NVMe tier's store over the whole run (all steps)
  double cpu_s = 0, wall_s = 0;            // the process's CPU time (user + system) and wall time of the run
};

double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

Measured measured_step(const TrainConfig& cfg, const ModelConfig& model) {
  HostModel host(model, plan::host_tile_options(cfg), nullptr, actors::moment_store_for(cfg, model));
  actors::init_host_model(host, 1337);
  const std::vector<data::Batch> batches = bench::random_batches(cfg, 8, 2024);
  actors::VectorBatchSource source(batches);
  actors::EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = &host;
  const double cpu0 = process_cpu_s();
  const auto t0 = std::chrono::steady_clock::now();
  const actors::EngineResult r = actors::run_engine(std::move(job));
  if (!r.error.empty()) throw std::runtime_error("plan bench: " + r.error);
  Measured m;
  m.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.cpu_s = process_cpu_s() - cpu0;
  if (const auto* staged = dynamic_cast<const offload::StagedMomentStore*>(&host.moments())) m.tier = staged->stats();
  // Steps 2..N (the first pays for first touches and warm-ups), their median: this VM's speed drifts
  // (the same GEMM ran at 120 and 235 GFLOP/s a minute apart), and one disturbed step should not
  // decide the figure.
  std::vector<double> step, compute, wait, optimizer;
  for (std::size_t s = 1; s < r.steps.size(); ++s) {
    step.push_back(r.steps[s].step_s);
    compute.push_back(r.steps[s].compute_s);
    wait.push_back(r.steps[s].wait_weights_s);
    optimizer.push_back(r.steps[s].optimizer_s);
  }
  m.step = bench::median(step), m.compute = bench::median(compute), m.wait = bench::median(wait);
  m.optimizer = bench::median(optimizer);
  return m;
}

std::string cpu_line() {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  char line[512];
  std::string model = "unknown CPU", flags;
  while (f != nullptr && std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "model name", 10) == 0 && model == "unknown CPU") model = std::strchr(line, ':') + 2;
    if (std::strncmp(line, "flags", 5) == 0 && flags.empty()) flags = line;
  }
  if (f != nullptr) std::fclose(f);
  if (!model.empty() && model.back() == '\n') model.pop_back();
  std::string isa;
  for (const char* x : {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"})
    if (flags.find(std::string(" ") + x) != std::string::npos) isa += std::string(isa.empty() ? "" : " ") + x;
  return model + " [" + isa + "]";
}

// A published point: the planner's view of it on a datasheet profile. shares_host_memory: plan the
// device as one that shares host memory (the engine's boundary_mapped, which it allows only there: the
// CPU backend today) instead of as the CUDA backend across a link (plan::plan_as_gpu).
void published(const char* what, const char* reported, const std::string& profile, TrainConfig cfg,
               const plan::PlanExtras& extras = {}, bool shares_host_memory = false, bool modes = false) {
  const plan::HardwareProfile hw = plan::load_hardware_profile(profile, "");
  const ModelConfig model = cfg.model_config_from_keys();
  plan::plan_as_gpu(cfg, hw);
  if (shares_host_memory) cfg.device.copy_bandwidth_gbps = 0;
  cfg.device.max_vram_gb = 0.9 * hw.device_memory_bytes / 1073741824.0;
  plan::PlanExtras x = extras;
  x.device_is_gpu = true;
  const plan::ResourcePlan rp = plan::plan_resources(cfg, model, x, hw.host_ram_bytes, hw.key + " host RAM",
                                                     hw.disk_bytes, hw.key + " disk", hw.device_memory_bytes);
  std::printf(
      "\n%s on %s\n  reported: %s\n  planner: %.1fB parameters, %s; host RAM %s of %s, device %s, disk %s: %s\n", what,
      profile.c_str(), reported, static_cast<double>(total_param_count(model)) / 1e9, cfg.train.bf16 ? "bf16" : "fp32",
      plan::gib(rp.host_peak_rss_bytes).c_str(), plan::gib(hw.host_ram_bytes).c_str(),
      plan::gib(rp.device_bytes).c_str(), plan::gib(rp.disk_bytes).c_str(), rp.fits() ? "fits" : "DOES NOT FIT");
  for (const auto& m : rp.misfits)
    std::printf("    [%s] (key %s) %s\n", m.tier.c_str(), m.key.c_str(), m.message.c_str());
  if (rp.engine) {
    const plan::EnginePlan& e = *rp.engine;
    for (const auto& b : rp.bytes)
      if (b.tier == "device") std::printf("    device %s  %s\n", plan::gib(b.bytes).c_str(), b.what.c_str());
    const plan::OpTimes ops = plan::op_times_from_flops(cfg, model, e, hw);
    const plan::StepPrediction sp = plan::predict_step(cfg, model, e, hw, ops, x);
    const std::string tile =
        e.seq_tile > 0 ? "sequence tiles of " + std::to_string(e.seq_tile) + " tokens" : std::string("whole sequences");
    std::printf("  planner: keep_intermediates %s, %s, %d weight slots; step %.2f s, %.0f tokens/s, %.0f TFLOP/s\n",
                keep_intermediates_name(plan::planned_keep(e)), tile.c_str(), e.weight_slots, sp.step_s,
                sp.tokens / sp.step_s, sp.tflops());
    std::printf("    busy: compute %.2f s, link in %.2f s, out %.2f s, optimizer %.2f s, NVMe %.2f s\n", sp.compute_s,
                sp.h2d_s, sp.d2h_s, sp.optimizer_s, sp.nvme_s);
    if (ops.attention_forward > 0)
      std::printf(
          "    attention: %.0f%% of a layer's time (%.2f s forward, %.2f s backward of %.2f + %.2f s), at the "
          "layers' assumed rate\n",
          100.0 * (ops.attention_forward + ops.attention_backward) / (ops.layer_forward + ops.layer_backward),
          ops.attention_forward, ops.attention_backward, ops.layer_forward, ops.layer_backward);
    std::printf("  reported beside predicted: %s | predicted %.0f tokens/s, %.0f TFLOP/s\n", reported,
                sp.tokens / sp.step_s, sp.tflops());
    if (modes)  // every way of holding the state, side by side (what `megatrain plan` prints)
      std::fputs(plan::describe_state_modes(plan::state_modes(cfg, model, x, hw, ops, hw.host_ram_bytes, hw.disk_bytes,
                                                              hw.device_memory_bytes))
                     .c_str(),
                 stdout);
  }
}

TrainConfig shaped(std::int64_t hidden, std::int64_t layers, std::int64_t heads, std::int64_t kv, std::int64_t inter,
                   std::int64_t vocab, std::int64_t batch, std::int64_t seq, std::int64_t micro) {
  TrainConfig c;
  c.model.arch = "llama";
  c.model.hidden_size = hidden;
  c.model.layers = layers;
  c.model.heads = heads;
  c.model.kv_heads = kv;
  c.model.intermediate_size = inter;
  c.model.vocab_size = vocab;
  c.model.max_position_embeddings = seq;
  c.data.seq_length = seq;
  c.train.per_device_train_batch_size = batch;
  c.train.gradient_accumulation_steps = micro;
  c.train.bf16 = true;
  c.train.max_grad_norm = 1.0;
  return c;
}

struct ConfigResult {
  double predicted = 0, measured = 0;
};

// This machine's profile, the op times at the configuration's shape, the prediction, and the engine's
// run, all in this process; prints the configuration's lines.
ConfigResult run_config(const Config& c, int steps, int threads, const std::string& dir) {
  plan::MeasureOptions mo;
  mo.compute_threads = threads;
  {
    TrainConfig budget = bench::demo_train_config(steps);
    budget.threads.total = threads;
    mo.optimizer_threads =
        budget.thread_budget().optimizer;  // the engine's optimizer team, as `megatrain plan` measures
  }
  mo.disk_dir = dir;
  mo.disk_queue_depth = static_cast<int>(bench::demo_train_config(steps).train.offload_io_threads);
  const plan::HardwareProfile hw = plan::measure_this_machine(mo);
  std::printf(
      "this machine: fp32 GEMM %.1f GFLOP/s, bf16 GEMM %.1f GFLOP/s, memcpy %.1f GB/s, AdamW %.2f Gparam/s, "
      "disk %.2f / %.2f GB/s read / write, the tier's CPU %.3f / %.3f s per GB (%s)\n",
      hw.device_flops_fp32 / 1e9, hw.device_flops_bf16 / 1e9, hw.link_h2d / 1e9, hw.adamw_params_per_s / 1e9,
      hw.disk_read / 1e9, hw.disk_write / 1e9, hw.disk_read_cpu_s_per_byte * 1e9, hw.disk_write_cpu_s_per_byte * 1e9,
      dir.c_str());

  TrainConfig cfg = bench::demo_train_config(steps);
  cfg.model.hidden_size = c.hidden;
  cfg.model.layers = c.layers;
  cfg.model.heads = c.heads;
  cfg.model.kv_heads = c.kv_heads;
  cfg.model.intermediate_size = c.intermediate;
  cfg.threads.total = threads;
  cfg.device.weight_slots = c.weight_slots;
  cfg.device.grad_slots = 1;
  cfg.device.keep_intermediates = "boundary";
  cfg.device.max_vram_gb = 256 / 1024.0;
  cfg.train.gradient_accumulation_steps = c.micro_batches;
  if (c.tier) {
    cfg.train.offload_dir = dir;
    cfg.train.offload_staging_stages = 4;  // 14 stages through 4 slots: every step reads and writes them all
  }
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::EnginePlan ep = plan::plan_engine(cfg, model);
  const plan::OpTimes ops = plan::measure_op_times(cfg, model, ep);
  const plan::StepPrediction sp = plan::predict_step(cfg, model, ep, hw, ops, {}, steps);
  const Measured m = measured_step(cfg, model);
  const double measured = m.step;
  std::printf(
      "  %-40s op times: layer forward %.4f s, backward %.4f s, head %.4f s; the engine's compute busy %.4f s "
      "(%+.1f%% on the op times), waited %.4f s\n",
      "", ops.layer_forward, ops.layer_backward, ops.head, m.compute, 100.0 * (m.compute - sp.compute_s) / sp.compute_s,
      m.wait);
  std::printf(
      "  %-40s predicted %.4f s (compute %.4f, link %.4f/%.4f, optimizer %.4f, NVMe %.4f, the tier's CPU %.4f), "
      "measured %.4f s: %+.1f%%\n",
      c.name.c_str(), sp.step_s, sp.compute_s, sp.h2d_s, sp.d2h_s, sp.optimizer_s, sp.nvme_s, sp.tier_cpu_s, measured,
      100.0 * (sp.step_s - measured) / measured);
  if (c.tier) {
    // The engine's tier over the whole run (the first step writes only): its workers' time (I/O,
    // checksums, coding) and how long the optimizer's acquires waited, beside the process's CPU use.
    const double n = static_cast<double>(steps);
    std::printf(
        "  %-40s the engine's tier per step: %.0f loads, %.0f stores, %.1f / %.1f MB read / written, workers "
        "%.4f s loading, %.4f s storing, optimizer waited %.4f s; optimizer busy %.4f s; the process used %.2f "
        "cores over the run\n",
        "", static_cast<double>(m.tier.loads) / n, static_cast<double>(m.tier.stores) / n,
        static_cast<double>(m.tier.file_bytes_read) / n / 1e6, static_cast<double>(m.tier.file_bytes_written) / n / 1e6,
        m.tier.load_s / n, m.tier.store_s / n, m.tier.acquire_wait_s / n, m.optimizer, m.cpu_s / m.wall_s);
  }
  std::fflush(stdout);
  return {sp.step_s, measured};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 9, threads = 2;
  std::string only;             // run only the configurations whose name contains this (and skip the published points)
  bool published_only = false;  // --published: only the published points (no engine runs, a second)
  std::string dir = (std::filesystem::current_path() / "run" / "plan-bench-tier").string();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--threads" && i + 1 < argc)
      threads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--published")
      published_only = true;
    else {
      std::fprintf(
          stderr, "usage: bench_plan [--steps N] [--dir OFFLOAD_DIR] [--threads N] [--only NAME_PART] [--published]\n");
      return 2;
    }
  }
  steps = std::max(3, steps);
  std::printf("plan bench: predicted vs measured step time (median of steps 2..%d); %s; %s\n", steps,
              cpu_line().c_str(), cpu::gemm_backend_name());
  std::vector<Config> configs;
  configs.push_back({"demo (d=384, 8 layers, K=2)"});
  {
    Config c{"deeper (16 layers)"};
    c.layers = 16;
    configs.push_back(c);
  }
  {
    Config c{"wider (d=640, 6 layers)"};
    c.hidden = 640, c.layers = 6, c.heads = 10, c.kv_heads = 2, c.intermediate = 1728;
    configs.push_back(c);
  }
  {
    Config c{"K=4, 2 interleaved micro-batches"};
    c.weight_slots = 4, c.micro_batches = 2;
    configs.push_back(c);
  }
  {
    Config c{"moments on the NVMe tier (12 layers)"};
    c.layers = 12, c.tier = true;
    configs.push_back(c);
  }
  bench::Report report("plan");
  double worst = 0;
  // Each configuration in a child process of its own, as a user runs `megatrain train`
  // (child_process.hpp: one process's engine runs would slow down the later ones).
  for (const Config& c : configs) {
    if (published_only || (!only.empty() && c.name.find(only) == std::string::npos)) continue;
    const std::optional<ConfigResult> r =
        bench::in_child_process<ConfigResult>([&] { return run_config(c, steps, threads, dir); });
    if (!r) {
      std::fprintf(stderr, "plan bench: configuration '%s' failed (see above)\n", c.name.c_str());
      return 1;
    }
    worst = std::max(worst, std::abs(r->predicted - r->measured) / r->measured);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!only.empty()) {
    report.add({"plan_step_error", worst, "fraction", 0.0, 0.10, "lower"});
    report.print();
    return 0;
  }

  // The published system's points (the MegaTrain paper, arXiv 2604.05091: 120B on one H200 with 1.5 TB
  // of host RAM, 264 TFLOP/s at 14B on one GH200 against ZeRO-3 offload's 143.6, 7B at 512k tokens). Shapes:
  // Qwen2.5-14B's config for 14B (batch and sequence not given with the figure: 8 x 1024 = 8k tokens
  // per step here); a Llama-shaped 120B (d 10240, 108 layers, 8 KV heads, MLP 28672); Llama-2-7B at 512k tokens.
  published("14B", "264 TFLOP/s on one GH200 (ZeRO-3 offload: 143.6)", "gh200",
            shaped(5120, 48, 40, 8, 13824, 152064, 8, 1024, 1));
  published("14B, 4 micro-batches (32k tokens per step)", "264 TFLOP/s on one GH200", "gh200",
            shaped(5120, 48, 40, 8, 13824, 152064, 8, 1024, 4));
  {
    TrainConfig c = shaped(10240, 108, 80, 8, 28672, 32000, 4, 2048, 1);
    published("120B, fp32 masters + fp32 Adam in RAM", "fits one H200 with 1.5 TB of host RAM", "h200", c);
    c.train.optimizer_compression = "int8";
    published("120B, int8 moments in RAM", "fits one H200 with 1.5 TB of host RAM", "h200", c);
    // Exact fp32 masters in 12 bytes per parameter: split masters and no gradient accumulators (the
    // second forward and backward of the clip is in the step).
    c.train.optimizer_compression = "none";
    c.train.master_weights = "split";
    c.train.gradient_buffer = "stage";
    published("120B, split fp32 masters + stage gradients (12 bytes/parameter, exact)",
              "fits one H200 with 1.5 TB of host RAM (bf16 weights and gradients, no fp32 master)", "h200", c, {},
              false, true);
  }
  {
    // The paper reports that 7B trains at 512k tokens on one GH200 and gives no throughput or step time
    // for it (abstract, the authors' README: searched 2026-12-02); its batch is taken as 1 sequence.
    const char* reported = "trains on one GH200; no throughput given";
    for (std::int64_t seq : {std::int64_t{524288}, std::int64_t{1048576}}) {
      TrainConfig c = shaped(4096, 32, 32, 32, 11008, 32000, 1, seq, 1);
      c.device.keep_intermediates = "auto";
      const std::string k = seq == 524288 ? "512k" : "1M";
      published(("7B at " + k + " context, as the CUDA backend plans it (a link)").c_str(),
                seq == 524288 ? reported : "not reported", "gh200", c);
      published(("7B at " + k + " context, boundaries mapped in host RAM (a device sharing host memory)").c_str(),
                seq == 524288 ? reported : "not reported", "gh200", c, {}, true);
    }
  }
  std::printf("\n");
  if (published_only) return 0;
  report.add({"plan_step_error", worst, "fraction", 0.0, 0.10, "lower"});
  report.print();
  return 0;
}
