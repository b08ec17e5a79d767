#include "node/plan_command.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "config/node_config.hpp"
#include "data/dataset_builder.hpp"
#include "kernels/param_layout.hpp"
#include "node/training_run.hpp"
#include "plan/hardware.hpp"
#include "plan/kernel_choice.hpp"
#include "plan/resource_plan.hpp"
#include "plan/state_modes.hpp"
#include "plan/step_model.hpp"
#include "plan/tier_bytes.hpp"
#include "storage/hf/hf_config.hpp"

namespace mt::node {

using namespace mt::plan;  // the planner this command prints

namespace {

const char* kUsage =
    "usage: megatrain plan [--config-file=FILE.ini] [--section.key=value ...]\n"
    "  The run `megatrain train` would make with the same arguments, planned without running it: the bytes\n"
    "  each tier holds (device region by region, host RAM, disk), where each state lives, the sequence tile at\n"
    "  long context, what does not fit and the key that would fix it, and the predicted step time split\n"
    "  into compute, link, optimizer and NVMe (and attention's share of a layer).\n"
    "  --plan.hardware=this (default: this machine, measured now in a few seconds) | h200 | h100 | gh200 |\n"
    "    a100 (datasheet profiles of config/hardware.ini; --plan.hardware_file=FILE for an edited copy;\n"
    "    a GPU is planned as the CUDA backend runs it, across its host link)\n"
    "  --plan.host_ram_gb=N / --plan.disk_gb=N: plan for that much RAM / free disk instead of the\n"
    "    profile's (this machine: MemAvailable and the free space under train.offload_dir)\n"
    "  Data files need not exist. Exit status: 0 the plan fits, 1 it does not (or bad input).\n";

void print_profile(const HardwareProfile& hw, double measure_s) {
  std::printf("hardware: %s\n  %s", hw.name.c_str(), hw.source.c_str());
  if (measure_s > 0) std::printf(" (in %.1f s; not cached)", measure_s);
  std::printf("\n  device: bf16 %.1f TFLOP/s, fp32 %.1f TFLOP/s", hw.device_flops_bf16 / 1e12,
              hw.device_flops_fp32 / 1e12);
  if (hw.achievable_fraction < 1) std::printf(" (a layer reaches %.0f%%, assumed)", hw.achievable_fraction * 100);
  std::printf(", memory %s\n", gib(hw.device_memory_bytes).c_str());
  std::printf("  link: %.1f GB/s in, %.1f GB/s out%s; host memory %.1f GB/s", hw.link_h2d / 1e9, hw.link_d2h / 1e9,
              hw.shared_cores ? " (memcpy: the CPU backend's copy engine)" : "", hw.host_mem / 1e9);
  if (hw.adamw_params_per_s > 0) std::printf(", AdamW %.2f Gparam/s", hw.adamw_params_per_s / 1e9);
  if (hw.codec_encode_params_per_s > 0)
    std::printf(", moment codec %.0f / %.0f Mparam/s encode / decode", hw.codec_encode_params_per_s / 1e6,
                hw.codec_decode_params_per_s / 1e6);
  std::printf("\n  host RAM %s", gib(hw.host_ram_bytes).c_str());
  if (hw.disk_read > 0)
    std::printf("; disk %.2f GB/s read, %.2f GB/s write, %s free", hw.disk_read / 1e9, hw.disk_write / 1e9,
                gib(hw.disk_bytes).c_str());
  if (hw.disk_read_cpu_s_per_byte > 0 || hw.disk_write_cpu_s_per_byte > 0)
    std::printf(" (the tier's CPU: %.3f / %.3f s per GB read / written: checksums, system calls)",
                hw.disk_read_cpu_s_per_byte * 1e9, hw.disk_write_cpu_s_per_byte * 1e9);
  std::printf("\n");
}

// A rank's host RAM by the engine's sizing: its tiles and its moment store (slots, encodings in RAM).
double host_ram_of(const plan::TierBytes& b) { return static_cast<double>(b.tiles + b.staging + b.ram_encodings); }

// plan.ranks = N: a job of N ranks, each with the config's micro-batches. Every rank holds the same
// host tiles unless the state is sharded (cluster.shard_state: stage s's state on rank s mod N, of the
// others only what compute streams; a moment store, and its files, for its own stages only); then the
// rank holding the most host RAM is planned, and every rank's bytes are listed.
void plan_one_rank_of(TrainConfig& cfg, const ModelConfig& model, bool gpu) {
  cfg.cluster.ranks = static_cast<int>(cfg.plan.ranks);
  std::vector<plan::TierBytes> bytes;
  int largest = 0;
  for (int r = 0; r < cfg.cluster.ranks; ++r) {
    cfg.cluster.rank = r;
    bytes.push_back(plan::tier_bytes(cfg, model));
    if (host_ram_of(bytes.back()) > host_ram_of(bytes[static_cast<std::size_t>(largest)])) largest = r;
  }
  cfg.cluster.rank = largest;
  std::printf("cluster: %d ranks (plan.ranks), %s; host tiles%s per rank:", cfg.cluster.ranks,
              cfg.shards_host_state() ? "the host state sharded (cluster.shard_state)"
                                      : "every rank holds the whole state (cluster.shard_state=false)",
              bytes[0].staging > 0 ? " and moment store" : "");
  const std::size_t shown = std::min<std::size_t>(bytes.size(), 8);
  for (std::size_t r = 0; r < shown; ++r) {
    std::printf(" %zu: %s", r, gib(host_ram_of(bytes[r])).c_str());
    if (bytes[r].disk > 0) std::printf(" (files %s)", gib(static_cast<double>(bytes[r].disk)).c_str());
  }
  if (shown < bytes.size()) std::printf(" ...");
  const plan::TierBytes whole = plan::tier_bytes_of_every_stage(cfg, model);
  std::printf("; unsharded %s", gib(host_ram_of(whole)).c_str());
  if (whole.disk > 0) std::printf(" (files %s)", gib(static_cast<double>(whole.disk)).c_str());
  std::printf("; planned below: rank %d (the most), its share of the step\n", largest);
  TrainConfig as_run = cfg;
  if (gpu) as_run.device.backend = "cuda";  // the profile is planned as the CUDA backend runs it
  std::printf("cluster: each round's gradients go to their stage's owner over %s (cluster.gpu_transport)\n",
              as_run.rank_grad_transport() == "nccl" ? "NCCL, GPU to GPU" : "MPI, from host copies");
  try {
    actors::check_cluster_runs(as_run);
  } catch (const ConfigError& e) {
    std::printf("note: train would refuse this job today: %s\n", e.what());
  }
}

}  // namespace

int run_plan_command(const std::vector<std::string>& args) {
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    std::fputs(kUsage, stdout);
    NodeConfig node;
    node.load(std::vector<std::string>{"--help"});
    return 0;
  }
  TrainConfig cfg;
  const std::string error = parse_train_config(args, cfg, false);
  if (!error.empty()) {
    std::fprintf(stderr, "megatrain plan: %s\n", error.c_str());
    return 1;
  }
  try {
    cfg.data.packing = data::resolved_packing(cfg.data.packing, cfg.data.train_files);
    ModelConfig model;
    if (!cfg.model.model_name_or_path.empty())
      model = hf::load_config(cfg.model.model_name_or_path);
    else
      model = cfg.model.config_file.empty() ? cfg.model_config_from_keys() : hf::load_config(cfg.model.config_file);
    model = cfg.with_training_switches(model);
    model.validate();
    HardwareProfile hw;
    PlanExtras extras;
    double measure_s = 0, host_limit = 0, disk_limit = 0, device_limit = 0;
    std::string host_source, disk_source;
    std::string kernel_note;
    if (cfg.plan.hardware == "this") {
      // The fp32 products' libraries, the bf16 products' path and the attention's products `train` would
      // take here (the cache, else the probes), set before anything runs a product, so the machine's figures and the op
      // times come from the kernels the run uses.
      try {
        const KernelChoice kc = choose_kernels(cfg, model, plan::plan_engine(cfg, model), nlohmann::json::object());
        if (kc.applies) kernel_note = kc.fp32_line();
        if (kc.bf16) kernel_note += "\nnote: " + kc.line() + "\nnote: " + kc.attention_line();
      } catch (const ConfigError&) {
        // a device budget that does not fit: the plan below reports it
      }
      MeasureOptions mo;
      const ThreadBudget tb = cfg.thread_budget();
      mo.compute_threads = std::max(1, tb.blas);
      mo.optimizer_threads = std::max(1, tb.optimizer);
      mo.disk_dir = cfg.train.offload_dir;
      mo.disk_queue_depth = static_cast<int>(cfg.train.offload_io_threads);
      mo.codec = optimizer_compression_name(cfg.optimizer_compression());
      const auto t0 = std::chrono::steady_clock::now();
      hw = measure_this_machine(mo);
      measure_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      host_limit = hw.host_ram_bytes;
      host_source = "MemAvailable";
      if (!cfg.train.offload_dir.empty()) {
        disk_limit = hw.disk_bytes;
        disk_source = "the free space under " + cfg.train.offload_dir;
      }
    } else {
      hw = load_hardware_profile(cfg.plan.hardware, cfg.plan.hardware_file);
      extras.device_is_gpu = true;
      plan_as_gpu(cfg, hw);
      device_limit = hw.device_memory_bytes;
      if (cfg.device.max_vram_gb == TrainConfig{}.device.max_vram_gb) {
        // No budget given: the device's memory less 10% for the runtime (CUDA context, allocator).
        cfg.device.max_vram_gb = 0.9 * hw.device_memory_bytes / 1073741824.0;
        std::printf("note: no device budget given: device.max_vram_gb=%.1f (90%% of the %s's memory)\n",
                    cfg.device.max_vram_gb, hw.key.c_str());
      }
      host_limit = hw.host_ram_bytes;
      host_source = "the " + hw.key + " profile's host RAM";
      disk_limit = hw.disk_bytes;
      disk_source = "the " + hw.key + " profile's disk";
    }
    if (cfg.plan.host_ram_gb > 0) host_limit = cfg.plan.host_ram_gb * 1073741824.0, host_source = "plan.host_ram_gb";
    if (cfg.plan.disk_gb > 0) disk_limit = cfg.plan.disk_gb * 1073741824.0, disk_source = "plan.disk_gb";

    const double tokens = static_cast<double>(cfg.train.per_device_train_batch_size * cfg.data.seq_length *
                                              cfg.train.gradient_accumulation_steps);
    const std::string active =
        model.is_moe() ? " (" + std::to_string(active_param_count(model) / 1000000) + "M active per token)" : "";
    std::printf("megatrain plan: %s, %lld layers, %.3fB parameters%s; %lld x %lld x %lld = %.0f tokens per step; %s\n",
                arch_name(model.arch), static_cast<long long>(model.num_hidden_layers),
                static_cast<double>(total_param_count(model)) / 1e9, active.c_str(),
                static_cast<long long>(cfg.train.gradient_accumulation_steps),
                static_cast<long long>(cfg.train.per_device_train_batch_size),
                static_cast<long long>(cfg.data.seq_length), tokens, cfg.train.bf16 ? "bf16 compute" : "fp32 compute");
    print_profile(hw, measure_s);
    if (cfg.plan.ranks > 1) plan_one_rank_of(cfg, model, extras.device_is_gpu);
    auto plan_of = [&](const TrainConfig& c) {
      return plan_resources(c, model, extras, host_limit, host_source, disk_limit, disk_source, device_limit);
    };
    if (const auto staged =
            without_accumulators_if_only_that_fits(cfg, [&](const TrainConfig& c) { return plan_of(c).fits(); })) {
      cfg = *staged;  // as `train` resolves it
      std::printf("note: %s\n", kDroppedAccumulatorsNote);
    }
    const ResourcePlan rp = plan_of(cfg);
    std::fputs(describe_resources(rp).c_str(), stdout);
    if (rp.engine) {
      for (const auto& n : rp.engine->notes) std::printf("note: %s\n", n.c_str());
      std::printf("plan %s\n", plan::plan_summary(*rp.engine).dump().c_str());  // as `train` prints it
      if (!kernel_note.empty()) std::printf("note: %s\n", kernel_note.c_str());
      const OpTimes ops =
          hw.key == "this" ? measure_op_times(cfg, model, *rp.engine) : op_times_from_flops(cfg, model, *rp.engine, hw);
      const StepPrediction sp = predict_step(cfg, model, *rp.engine, hw, ops, extras);
      std::fputs(describe_step(sp, ops).c_str(), stdout);
      std::fputs(describe_transfer_cover(transfer_cover(cfg, model, *rp.engine, hw, ops), model).c_str(), stdout);
      std::fputs(describe_state_modes(state_modes(cfg, model, extras, hw, ops, host_limit, disk_limit, device_limit),
                                      cfg.shards_host_state() ? cfg.cluster.rank : -1)
                     .c_str(),
                 stdout);
    } else {
      std::printf("no step time: the device budget does not fit (see above)\n");
    }
    std::fflush(stdout);
    return rp.fits() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain plan: %s\n", e.what());
    return 1;
  }
}

}  // namespace mt::node
