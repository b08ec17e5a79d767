// Where a run's state lives, in bytes per tier, from its config alone (before anything is allocated):
// the host tiles, the moment store's staging slots, and the NVMe tier's files. The same figures the
// engine's own accounting gives once it runs (host_model_bytes of the tiles, HostModel::moments()
// ram_bytes() and disk_bytes()), so a planner can state them without running (tested).
#pragma once
#include <cstddef>

#include "config/train_config.hpp"
#include "kernels/model_config.hpp"
#include "storage/offload/staged_moment_store.hpp"

namespace mt::actors {

struct TierBytes {
  std::size_t tiles = 0;          // host RAM: every stage's tile (params or not, grad, moments or not, compute copy)
  std::size_t staging = 0;        // host RAM: the moment store's slots
  std::size_t ram_encodings = 0;  // host RAM, no offload_dir with a codec: every stage's encoding (a bound)
  std::size_t disk = 0;           // the NVMe tier: the stage files at their largest
};

// The staged store's options for this config (train.optimizer_compression, offload_dir, offload_params,
// offload_staging_stages, offload_io_threads).
offload::StagedMomentStoreOptions moment_store_options(const TrainConfig& cfg);

TierBytes tier_bytes(const TrainConfig& cfg, const ModelConfig& model);

}  // namespace mt::actors
