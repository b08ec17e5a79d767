// The resource side of `megatrain plan` and of the fit check `train` runs before it starts: the bytes
// each tier holds, where each state lives, and what does not fit with the key that would fix it.
// Every byte figure comes from the functions the engine allocates with (plan_engine's arena plan,
// host_model_bytes with host_tile_options, the moment store's footprint), so plan and engine cannot
// drift; tests/actors/test_plan.cpp checks them against a run's own accounting. No CAF here.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.hpp"
#include "kernels/model_config.hpp"
#include "plan/engine_plan.hpp"

namespace mt::plan {

// What the config alone does not say (device.gpus = N is the config's: N arenas, N x the tokens).
struct PlanExtras {
  // Planning for a GPU profile on another machine: the arena is device memory, not host RAM (the
  // CPU backend's arena is host memory and counts there).
  bool device_is_gpu = false;
};

// One row of the byte table.
struct ByteRow {
  std::string tier;  // "device", "host RAM", "disk"
  std::string what;  // "host tiles: fp32 masters, gradients, Adam m and v"
  double bytes = 0.0;
};

// A tier that does not fit, and the key that would fix it.
struct Misfit {
  std::string tier;
  double need = 0.0, have = 0.0;
  std::string key;  // the first key whose change makes it fit ("train.offload_dir")
  std::string message;
};

struct ResourcePlan {
  std::optional<EnginePlan> engine;  // empty when the device budget does not fit
  std::vector<ByteRow> bytes;
  std::vector<std::string> homes;  // "fp32 master weights: host RAM (the tiles)"
  std::vector<Misfit> misfits;
  double device_bytes = 0.0;         // the arena (per device)
  double device_side_bytes = 0.0;    // a GPU's beside each arena: the ops' scratch and the backend's reserve
  double host_bytes = 0.0;           // what the engine allocates in host RAM (tiles, staging, boundaries, CPU arena)
  double pinned_bytes = 0.0;         // a GPU's: the part of host_bytes page-locked for its copies (exact sizes)
  double host_peak_rss_bytes = 0.0;  // host_bytes + the process's own (predicted peak resident memory)
  double disk_bytes = 0.0;           // offload files
  // The device does not fit the budget: the least arena this run could take (least_device_plan).
  double least_device_bytes = 0.0;
  double host_limit = 0.0, disk_limit = 0.0;
  std::string host_limit_source, disk_limit_source;
  bool fits() const { return misfits.empty(); }
};

// What a process of this build holds beyond the plan's buffers: the code and libraries as loaded (this
// process's resident memory the first time it is asked: about 18 MiB for a CPU-only build, about 230 MiB
// with the CUDA backend linked, whose cuBLAS libraries are resident from the start) plus what running
// adds (the actor system, thread stacks, the GEMM libraries' packing buffers, HDF5 while checkpointing,
// the data loader: kProcessRuntimeBytes). Measured on this machine: a 55M-parameter run of a CPU-only
// build peaks 76 MiB above the engine's buffers; tests/actors/test_plan.cpp checks the sum within 10%.
inline constexpr double kProcessRuntimeBytes = 46.0 * (1 << 20);
double process_baseline_bytes();

struct HardwareProfile;
// A GPU profile (a datasheet one) planned on this machine: the CPU backend stands in for the device (the
// arena's sizes do not depend on the backend, and the CUDA one need not exist here), with
// DeviceSection::copy_bandwidth_gbps at the profile's host-to-device link, so the plan is the engine's plan for a
// device across a link, as the CUDA backend is: gradient slots grown for the link, and no
// keep_intermediates=boundary_mapped (the engine maps boundaries only on a device sharing host memory).
void plan_as_gpu(TrainConfig& cfg, const HardwareProfile& hw);

// Plans `cfg` for `model`. host_limit / disk_limit: bytes the run may use (0 = unchecked), with the
// source of each figure for messages; device_limit: the device's memory (0 = only the config budget).
// Unless plan.host_ram_gb is set, the engine's own choices that weigh host RAM see host_limit.
// run_plan: the run's own plan of cfg (a run plans once), used as it is; null = planned here. The
// alternatives tried for a misfit plan their own configs.
ResourcePlan plan_resources(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& extras,
                            double host_limit, const std::string& host_limit_source, double disk_limit,
                            const std::string& disk_limit_source, double device_limit = 0.0,
                            const EnginePlan* run_plan = nullptr);

// The smallest device plan of this run whatever the budget: the smallest sequence tiles auto tries
// (kMinAutoSeqTile, when the layers have tiles), the boundaries off the device (boundary_host, or
// boundary_mapped on a device sharing host memory), 2 weight slots and 1 gradient slot. Empty when the
// engine refuses the shape itself (a ConfigError).
std::optional<EnginePlan> least_device_plan(const TrainConfig& cfg, const ModelConfig& model);

// The readable report of the byte table, the homes and the misfits.
std::string describe_resources(const ResourcePlan& p);

// `train`'s check before it starts: plans against MemAvailable (or plan.host_ram_gb) and the free
// space under train.offload_dir (or plan.disk_gb). Returns the problems ("" when it fits); the caller
// refuses the run when plan.enforce, else prints them as a warning.
// run_plan: the run's plan of cfg, as for plan_resources.
std::string check_run_fits(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& extras = {},
                           const EnginePlan* run_plan = nullptr);

std::string gib(double bytes);  // "12.34 GiB" / "512.0 MiB"

}  // namespace mt::plan
