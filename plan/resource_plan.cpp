#include "plan/resource_plan.hpp"

#include <cstdio>
#include <sstream>

#include "actors/tier_bytes.hpp"
#include "plan/hardware.hpp"
#include "storage/host/host_model.hpp"
#include "storage/offload/staged_moment_store.hpp"

namespace mt::plan {

std::string gib(double bytes) {
  char b[64];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024));
  return b;
}

double process_baseline_bytes() {
  // Cached: later calls in the same process must not count the run's own buffers as libraries.
  static const double loaded = [] {
    const double rss = process_status_bytes("VmRSS");
    return rss > 0 ? rss : 18.0 * (1 << 20);  // no /proc: a CPU-only build's figure
  }();
  return kProcessRuntimeBytes + loaded;
}

namespace {

// The byte side alone (no misfits): fills p.bytes, p.homes and the totals.
void count_bytes(ResourcePlan& p, const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x) {
  const HostTileOptions tiles = actors::host_tile_options(cfg);
  const bool bf16 = cfg.precision() == Precision::bf16;
  const bool masters_on_tier = cfg.train.offload_params;
  // The engine's own sizing (tested equal to a run's accounting): tiles, staging slots, files.
  const actors::TierBytes tb = actors::tier_bytes(cfg, model);
  double host_tiles = static_cast<double>(tb.tiles);
  std::string tiles_what = masters_on_tier ? "host tiles: fp32 gradients" : "host tiles: fp32 masters, fp32 gradients";
  if (tiles.moments_in_tile) tiles_what += ", Adam m and v";
  if (bf16) tiles_what += ", bf16 compute copy";
  const double staging = static_cast<double>(tb.staging + tb.ram_encodings);
  const double disk = static_cast<double>(tb.disk);
  p.bytes.push_back({"host RAM", tiles_what, host_tiles});
  if (staging > 0)
    p.bytes.push_back({"host RAM",
                       cfg.train.offload_dir.empty()
                           ? std::string("Adam moments, ") + optimizer_compression_name(cfg.optimizer_compression()) +
                                 " in RAM (staging slots + every stage's encoding at its bound)"
                           : std::string(masters_on_tier ? "fp32 master and " : "") + "Adam moment staging slots (" +
                                 std::to_string(cfg.train.offload_staging_stages) + ")",
                       staging});
  double host = host_tiles + staging;
  if (p.engine) {
    const actors::EnginePlan& e = *p.engine;
    p.device_bytes = static_cast<double>(e.arena.total_bytes);
    p.bytes.push_back({"device",
                       "arena: " + std::to_string(e.weight_slots) + " weight slots, " + std::to_string(e.grad_slots) +
                           " gradient slots, workspace, activations",
                       p.device_bytes});
    if (e.host_boundary_bytes > 0) {
      p.bytes.push_back({"host RAM", "layer boundaries (keep_intermediates=boundary_host)",
                         static_cast<double>(e.host_boundary_bytes)});
      host += static_cast<double>(e.host_boundary_bytes);
    }
    if (cfg.device.backend == "cpu" && !x.device_is_gpu) {
      const double arenas = static_cast<double>(cfg.device.gpus) * p.device_bytes;
      p.bytes.push_back({"host RAM",
                         cfg.device.gpus > 1
                             ? "the CPU backend's " + std::to_string(cfg.device.gpus) + " device arenas (host memory)"
                             : std::string("the CPU backend's device arena (host memory)"),
                         arenas});
      host += arenas;
    }
  }
  if (disk > 0)
    p.bytes.push_back(
        {"disk",
         std::string(masters_on_tier ? "fp32 master and " : "") + "Adam moment files in " + cfg.train.offload_dir,
         disk});
  p.host_bytes = host;
  p.host_peak_rss_bytes = host + process_baseline_bytes();
  p.disk_bytes = disk;

  const std::string moments =
      tiles.moments_in_tile ? "host RAM (the tiles)"
      : cfg.train.offload_dir.empty()
          ? std::string("host RAM, ") + optimizer_compression_name(cfg.optimizer_compression()) +
                " encoded (staged through " + std::to_string(cfg.train.offload_staging_stages) + " slots)"
          : "files in " + cfg.train.offload_dir + " (" + optimizer_compression_name(cfg.optimizer_compression()) +
                ", " + std::to_string(cfg.train.offload_staging_stages) + " stages staged in RAM)";
  p.homes.push_back(
      std::string("fp32 master weights: ") +
      (masters_on_tier ? "files in " + cfg.train.offload_dir + ", with the moments" : "host RAM (the tiles)"));
  p.homes.push_back("fp32 gradient accumulators: host RAM (the tiles)");
  p.homes.push_back("Adam m and v: " + moments);
  if (bf16) p.homes.push_back("bf16 compute copy (what streams): host RAM (the tiles)");
  if (p.engine) {
    const actors::EnginePlan& e = *p.engine;
    p.homes.push_back("weights in flight: device, " + std::to_string(e.weight_slots) + " slots (prefetch depth " +
                      std::to_string(e.prefetch_depth) + ")");
    p.homes.push_back(std::string("activations: ") +
                      (e.mode == ActivationMode::keep ? "device, every intermediate kept (no recomputation)"
                       : e.boundaries_on_host         ? "layer boundaries in host RAM, recomputed once in backward"
                       : e.kept_layers > 0
                           ? "layer boundaries on the device, recomputed once in backward except the last " +
                                 std::to_string(e.kept_layers) + " layer(s), whose intermediates are kept"
                           : "layer boundaries on the device, recomputed once in backward") +
                      ", " + std::to_string(e.activation_sets) + " activation set(s)");
  }
  if (cfg.device.gpus > 1)
    p.homes.push_back(std::to_string(cfg.device.gpus) + " devices, one arena each (the arena above is per device)");
}

ResourcePlan plan_once(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x, std::string* device_error,
                       std::string* device_key) {
  ResourcePlan p;
  try {
    p.engine = actors::plan_engine(cfg, model);
  } catch (const ConfigError& e) {
    *device_error = e.what();
    *device_key = e.key();
  } catch (const ArenaBudgetError& e) {
    *device_error = e.what();
    *device_key = cfg.device_budget_name().substr(0, cfg.device_budget_name().find('='));
  }
  count_bytes(p, cfg, model, x);
  return p;
}

double host_need(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x) {
  std::string err, key;
  return plan_once(cfg, model, x, &err, &key).host_bytes;
}

}  // namespace

ResourcePlan plan_resources(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x, double host_limit,
                            const std::string& host_source, double disk_limit, const std::string& disk_source,
                            double device_limit) {
  std::string device_error, device_key;
  ResourcePlan p = plan_once(cfg, model, x, &device_error, &device_key);
  p.host_limit = host_limit;
  p.disk_limit = disk_limit;
  p.host_limit_source = host_source;
  p.disk_limit_source = disk_source;
  const double budget = static_cast<double>(cfg.device_budget_bytes());
  if (device_limit > 0 && budget > device_limit) {
    p.misfits.push_back({"device", budget, device_limit,
                         cfg.device_budget_name().substr(0, cfg.device_budget_name().find('=')),
                         cfg.device_budget_name() + " asks for more than the device's " + gib(device_limit) +
                             ": lower it to at most " + gib(device_limit)});
  }
  if (!device_error.empty()) {
    Misfit m{"device", 0, budget, device_key, device_error};
    if (cfg.keep_intermediates() != KeepIntermediates::boundary_host) {
      TrainConfig c2 = cfg;
      c2.device.keep_intermediates = "boundary_host";
      try {
        actors::plan_engine(c2, model);
        m.key = "device.keep_intermediates";
        m.message += "; device.keep_intermediates=boundary_host fits (layer boundaries in host RAM)";
      } catch (const std::exception&) {
      }
    }
    if (m.key != "device.keep_intermediates")
      m.message += "; raise the budget, or lower train.per_device_train_batch_size or data.seq_length";
    p.misfits.push_back(m);
  }
  if (host_limit > 0 && p.host_peak_rss_bytes > host_limit) {
    Misfit m{"host RAM", p.host_peak_rss_bytes, host_limit, "", ""};
    std::ostringstream why;
    why << "host RAM: the run needs " << gib(p.host_peak_rss_bytes) << " (" << gib(p.host_bytes)
        << " allocated by the engine + " << gib(process_baseline_bytes()) << " the process itself), " << host_source
        << " is " << gib(host_limit);
    // The first change that fits names the key; the others are listed as alternatives.
    std::vector<std::pair<std::string, std::string>> options;
    auto try_change = [&](const std::string& key, const std::string& text, const TrainConfig& c2,
                          const PlanExtras& x2) {
      const double need = host_need(c2, model, x2) + process_baseline_bytes();
      options.emplace_back(key, text + " needs " + gib(need) + (need <= host_limit ? " (fits)" : " (still too much)"));
      if (need <= host_limit && m.key.empty()) m.key = key;
    };
    if (cfg.train.offload_dir.empty()) {
      TrainConfig c2 = cfg;
      c2.train.offload_dir = "/path/on/nvme";
      try_change("train.offload_dir", "train.offload_dir=DIR (Adam moments in files)", c2, x);
      c2.train.optimizer_compression = "int8";
      try_change("train.optimizer_compression", "train.offload_dir=DIR with train.optimizer_compression=int8", c2, x);
    } else if (!cfg.train.offload_params) {
      TrainConfig c2 = cfg;
      c2.train.offload_params = true;
      c2.train.bf16 = true;  // offload_params keeps only the bf16 compute copy in RAM
      try_change("train.offload_params",
                 std::string("train.offload_params=true (fp32 masters in files too") +
                     (cfg.train.bf16 ? ")" : ", with train.bf16=true)"),
                 c2, x);
    }
    if (cfg.optimizer_compression() == OptimizerCompression::none) {
      TrainConfig c2 = cfg;
      c2.train.optimizer_compression = "int8";
      try_change("train.optimizer_compression", "train.optimizer_compression=int8 (moments ~2 bytes/parameter, lossy)",
                 c2, x);
    }
    if (m.key.empty()) m.key = "plan.host_ram_gb";
    why << "; fix: " << m.key;
    for (const auto& [k, t] : options) why << "; " << t;
    if (m.key == "plan.host_ram_gb") why << "; nothing here fits: a host with more RAM or a smaller model";
    m.message = why.str();
    p.misfits.push_back(m);
  }
  if (disk_limit > 0 && p.disk_bytes > disk_limit) {
    Misfit m{"disk", p.disk_bytes, disk_limit, "train.offload_dir", ""};
    std::ostringstream why;
    why << "disk: the offload files need " << gib(p.disk_bytes) << ", " << disk_source << " is " << gib(disk_limit)
        << "; fix: train.offload_dir on a larger drive";
    if (cfg.optimizer_compression() != OptimizerCompression::int8) {
      m.key = "train.optimizer_compression";
      why.str("");
      why << "disk: the offload files need " << gib(p.disk_bytes) << ", " << disk_source << " is " << gib(disk_limit)
          << "; fix: train.optimizer_compression=int8 (about a quarter of the bytes) or train.offload_dir on a larger "
             "drive";
    }
    m.message = why.str();
    p.misfits.push_back(m);
  }
  return p;
}

std::string describe_resources(const ResourcePlan& p) {
  std::ostringstream out;
  out << "bytes per tier (from the engine's own sizing functions):\n";
  for (const char* tier : {"device", "host RAM", "disk"}) {
    double total = 0;
    for (const auto& b : p.bytes)
      if (b.tier == tier) total += b.bytes;
    if (total == 0 && std::string(tier) == "disk") {
      out << "  disk: nothing (no train.offload_dir)\n";
      continue;
    }
    out << "  " << tier << ": " << gib(total);
    if (std::string(tier) == "host RAM")
      out << " (predicted peak resident memory " << gib(p.host_peak_rss_bytes) << " with the process's own "
          << gib(process_baseline_bytes()) << ")";
    if (std::string(tier) == "host RAM" && p.host_limit > 0)
      out << " of " << gib(p.host_limit) << " (" << p.host_limit_source << ")";
    if (std::string(tier) == "disk" && p.disk_limit > 0)
      out << " of " << gib(p.disk_limit) << " (" << p.disk_limit_source << ")";
    out << "\n";
    for (const auto& b : p.bytes)
      if (b.tier == tier) out << "    " << gib(b.bytes) << "  " << b.what << "\n";
  }
  out << "where each state lives:\n";
  for (const auto& h : p.homes) out << "  " << h << "\n";
  if (p.misfits.empty()) {
    out << "fits: yes\n";
  } else {
    out << "DOES NOT FIT:\n";
    for (const auto& m : p.misfits) out << "  [" << m.tier << "] " << m.message << "\n";
  }
  return out.str();
}

std::string check_run_fits(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& extras) {
  const double host = cfg.plan.host_ram_gb > 0 ? cfg.plan.host_ram_gb * 1073741824.0 : mem_available_bytes();
  const std::string host_source = cfg.plan.host_ram_gb > 0 ? "plan.host_ram_gb" : "MemAvailable";
  double disk = 0;
  std::string disk_source;
  if (!cfg.train.offload_dir.empty()) {
    disk = cfg.plan.disk_gb > 0 ? cfg.plan.disk_gb * 1073741824.0 : free_disk_bytes(cfg.train.offload_dir);
    disk_source = cfg.plan.disk_gb > 0 ? "plan.disk_gb" : "the free space under " + cfg.train.offload_dir;
  }
  const ResourcePlan p = plan_resources(cfg, model, extras, host, host_source, disk, disk_source);
  std::string out;
  for (const auto& m : p.misfits) {
    if (m.tier == "device") continue;  // plan_engine's own error, raised by the engine itself
    out += (out.empty() ? "" : "\n") + m.message;
  }
  return out;
}

}  // namespace mt::plan
