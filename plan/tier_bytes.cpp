#include "plan/tier_bytes.hpp"

#include <vector>

#include "kernels/param_layout.hpp"
#include "plan/engine_plan.hpp"
#include "storage/host/host_model.hpp"

namespace mt::plan {

std::vector<std::int64_t> optimizer_stage_order(const TrainConfig& cfg, const ModelConfig& model) {
  const OwnedStages owned = host_owned_stages(cfg, model);
  const std::int64_t S = num_stages(model);
  const bool forward = cfg.train.max_grad_norm > 0.0 && !cfg.stage_gradients();
  std::vector<std::int64_t> order;
  for (std::int64_t k = 0; k < S; ++k) {
    const std::int64_t s = forward ? k : S - 1 - k;
    if (owned.empty() || owned[static_cast<std::size_t>(s)] != 0) order.push_back(s);
  }
  return order;
}

std::vector<std::size_t> stage_floats(const ModelConfig& model) {
  std::vector<std::size_t> floats;
  for (std::int64_t s = 0; s < num_stages(model); ++s) floats.push_back(stage_layout(model, s).total_floats);
  return floats;
}

offload::StagedMomentStoreOptions moment_store_options(const TrainConfig& cfg, const ModelConfig& model) {
  offload::StagedMomentStoreOptions o;
  o.codec = offload::parse_moment_codec(optimizer_compression_name(cfg.optimizer_compression()));
  o.dir = cfg.train.offload_dir;
  o.staging_stages = static_cast<int>(cfg.train.offload_staging_stages);
  o.io_threads = static_cast<int>(cfg.train.offload_io_threads);
  o.with_masters = cfg.train.offload_params;
  o.visit_order = optimizer_stage_order(cfg, model);
  o.rank = cfg.cluster.ranks > 1 ? cfg.cluster.rank : -1;
  return o;
}

namespace {

TierBytes tier_bytes_held(const TrainConfig& cfg, const ModelConfig& model, bool every_stage) {
  TierBytes b;
  const HostTileOptions tiles = host_tile_options(cfg);
  b.tiles = host_model_bytes(model, tiles, every_stage ? OwnedStages{} : host_owned_stages(cfg, model));
  if (tiles.moments_in_tile) return b;
  offload::StagedMomentStoreOptions o = moment_store_options(cfg, model);
  if (every_stage) o.visit_order.clear();
  const auto f = offload::StagedMomentStore::footprint(stage_floats(model), o);
  b.staging = f.ram;
  b.ram_encodings = f.ram_encodings;
  b.disk = f.disk;
  return b;
}

}  // namespace

TierBytes tier_bytes(const TrainConfig& cfg, const ModelConfig& model) { return tier_bytes_held(cfg, model, false); }

TierBytes tier_bytes_of_every_stage(const TrainConfig& cfg, const ModelConfig& model) {
  return tier_bytes_held(cfg, model, true);
}

}  // namespace mt::plan
