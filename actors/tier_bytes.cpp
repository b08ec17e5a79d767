#include "actors/tier_bytes.hpp"

#include <vector>

#include "actors/engine.hpp"
#include "kernels/param_layout.hpp"
#include "storage/host/host_model.hpp"

namespace mt::actors {

offload::StagedMomentStoreOptions moment_store_options(const TrainConfig& cfg) {
  offload::StagedMomentStoreOptions o;
  o.codec = offload::parse_moment_codec(optimizer_compression_name(cfg.optimizer_compression()));
  o.dir = cfg.train.offload_dir;
  o.staging_stages = static_cast<int>(cfg.train.offload_staging_stages);
  o.io_threads = static_cast<int>(cfg.train.offload_io_threads);
  o.with_masters = cfg.train.offload_params;
  return o;
}

TierBytes tier_bytes(const TrainConfig& cfg, const ModelConfig& model) {
  TierBytes b;
  const HostTileOptions tiles = host_tile_options(cfg);
  b.tiles = host_model_bytes(model, tiles, host_owned_stages(cfg, model));  // this rank's (cluster.shard_state)
  if (tiles.moments_in_tile) return b;
  std::vector<std::size_t> floats;
  for (std::int64_t s = 0; s < num_stages(model); ++s) floats.push_back(stage_layout(model, s).total_floats);
  const auto f = offload::StagedMomentStore::footprint(floats, moment_store_options(cfg));
  b.staging = f.ram;
  b.ram_encodings = f.ram_encodings;
  b.disk = f.disk;
  return b;
}

}  // namespace mt::actors
