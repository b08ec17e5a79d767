#include "plan/state_modes.hpp"

#include <cstdio>

#include "kernels/param_layout.hpp"
#include "plan/engine_plan.hpp"
#include "plan/tier_bytes.hpp"
#include "storage/host/host_tile.hpp"

namespace mt::plan {
namespace {

// The keys of each mode, applied to a copy of the config.
struct ModeKeys {
  std::string name, master_weights, gradient_buffer, compression, offload_dir;
  bool exact = true;
};

std::vector<ModeKeys> candidate_modes(const TrainConfig& cfg) {
  std::vector<ModeKeys> r;
  const bool bf16 = cfg.train.bf16;
  const std::string stage = cfg.train.max_grad_norm > 0 ? "stage gradients (2 passes)" : "stage gradients (1 pass)";
  const std::string masters = bf16 ? "fp32 masters" : "fp32 weights";
  r.push_back({masters + ", gradient accumulators", bf16 ? "fp32" : "auto", "model", "none", ""});
  if (bf16) r.push_back({"split masters, gradient accumulators", "split", "model", "none", ""});
  if (cfg.stage_gradients_unsupported().empty())
    r.push_back({(bf16 ? "split masters, " : masters + ", ") + stage, bf16 ? "split" : "auto", "stage", "none", ""});
  r.push_back({masters + ", int8 moments in RAM", bf16 ? "fp32" : "auto", "model", "int8", "", false});
  r.push_back({masters + ", moments on NVMe", bf16 ? "fp32" : "auto", "model", "none", "/path/on/nvme"});
  return r;
}

// The tiles' bytes per parameter: of a stage's tile (a large aligned one); with the host state
// sharded this rank's tiles over the model's parameters, its own stages whole and the others' replicas
// (split masters and stage gradients: 2 + 10/N, about).
double tile_bytes_per_param(const TrainConfig& c, const ModelConfig& model) {
  if (c.shards_host_state())
    return static_cast<double>(tier_bytes(c, model).tiles) / static_cast<double>(total_param_count(model));
  constexpr std::size_t kFloats = std::size_t{1} << 20;
  return static_cast<double>(HostTile::allocation_bytes(kFloats, host_tile_options(c))) / kFloats;
}

}  // namespace

std::vector<StateMode> state_modes(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& extras,
                                   const HardwareProfile& hw, const OpTimes& ops, double host_limit, double disk_limit,
                                   double device_limit) {
  std::vector<StateMode> out;
  for (const ModeKeys& k : candidate_modes(cfg)) {
    TrainConfig c = cfg;
    c.train.master_weights = k.master_weights;
    c.train.gradient_buffer = k.gradient_buffer;
    c.train.optimizer_compression = k.compression;
    c.train.offload_dir = k.offload_dir;
    c.train.offload_params = false;
    StateMode m;
    m.name = k.name;
    m.exact = k.exact;
    m.settings = "train.gradient_buffer=" + k.gradient_buffer;
    if (cfg.train.bf16) m.settings = "train.master_weights=" + k.master_weights + " " + m.settings;
    if (k.compression != "none") m.settings += " train.optimizer_compression=" + k.compression;
    if (!k.offload_dir.empty()) m.settings += " train.offload_dir=DIR";
    m.configured = c.split_masters() == cfg.split_masters() && c.stage_gradients() == cfg.stage_gradients() &&
                   c.optimizer_compression() == cfg.optimizer_compression() &&
                   c.train.offload_dir.empty() == cfg.train.offload_dir.empty() && !cfg.train.offload_params;
    m.tile_bytes_per_param = tile_bytes_per_param(c, model);
    if (!k.offload_dir.empty() || k.compression != "none")
      m.tile_bytes_per_param += k.compression == "int8" ? 2.0 : 0.0;
    const ResourcePlan rp =
        plan_resources(c, model, extras, host_limit, "", k.offload_dir.empty() ? 0.0 : disk_limit, "", device_limit);
    m.host_bytes = rp.host_peak_rss_bytes;
    m.disk_bytes = rp.disk_bytes;
    m.fits = rp.fits();
    if (rp.engine) m.step_s = predict_step(c, model, *rp.engine, hw, ops, extras).step_s;
    out.push_back(m);
  }
  return out;
}

std::string describe_state_modes(const std::vector<StateMode>& modes, int sharded_rank) {
  std::string s = "state modes (host bytes per parameter in the tiles" +
                  (sharded_rank >= 0 ? " of rank " + std::to_string(sharded_rank) + ", the host state sharded" : "") +
                  ", host RAM in all, the predicted step):\n";
  for (const StateMode& m : modes) {
    char line[512];
    std::snprintf(line, sizeof line, "  %s %-52s %4.1f B/param  %10s%s  %-13s %s  [%s]\n", m.configured ? "*" : " ",
                  (m.name + (m.exact ? "" : " (lossy)")).c_str(), m.tile_bytes_per_param, gib(m.host_bytes).c_str(),
                  m.disk_bytes > 0 ? (" + " + gib(m.disk_bytes) + " NVMe").c_str() : "",
                  m.fits ? "fits" : "does not fit",
                  m.step_s > 0 ? ("step " + std::to_string(m.step_s).substr(0, 6) + " s").c_str() : "no step",
                  m.settings.c_str());
    s += line;
  }
  return s;
}

bool may_drop_accumulators(const TrainConfig& cfg) {
  return cfg.gradient_buffer() == GradientBuffer::automatic && !cfg.stage_gradients() &&
         cfg.stage_gradients_unsupported().empty();
}

std::optional<TrainConfig> without_accumulators_if_only_that_fits(const TrainConfig& cfg,
                                                                  const std::function<bool(const TrainConfig&)>& fits) {
  if (!may_drop_accumulators(cfg) || fits(cfg)) return std::nullopt;
  TrainConfig staged = cfg;
  staged.train.gradient_buffer = "stage";
  if (!fits(staged)) return std::nullopt;
  return staged;
}

}  // namespace mt::plan
