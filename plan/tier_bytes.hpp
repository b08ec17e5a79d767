// Where a run's state lives, in bytes per tier, from its config alone (before anything is allocated):
// the host tiles, the moment store's staging slots, and the NVMe tier's files. The same figures the
// engine's own accounting gives once it runs (host_model_bytes of the tiles, HostModel::moments()
// ram_bytes() and disk_bytes()), so a planner can state them without running (tested).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/train_config.hpp"
#include "kernels/model_config.hpp"
#include "storage/offload/staged_moment_store.hpp"

namespace mt::plan {

struct TierBytes {
  std::size_t tiles = 0;          // host RAM: every stage's tile (params or not, grad, moments or not, compute copy)
  std::size_t staging = 0;        // host RAM: the moment store's slots
  std::size_t ram_encodings = 0;  // host RAM, no offload_dir with a codec: every held stage's encoding (a bound)
  std::size_t disk = 0;           // the NVMe tier: the held stages' files at their largest
};

// The stages this rank's optimizer updates, in the order it updates them every step
// (actors/optimizer.cpp): with clipping in stage order (after every stage's norm is in), otherwise (and
// with stage gradients) in backward order as the collector completes them; with the host state sharded
// (cluster.shard_state) only the stages this rank owns.
std::vector<std::int64_t> optimizer_stage_order(const TrainConfig& cfg, const ModelConfig& model);

// The staged store's options for this config (train.optimizer_compression, offload_dir, offload_params,
// offload_staging_stages, offload_io_threads): it holds the stages of optimizer_stage_order and reads
// ahead in that order; in a job of several ranks its files are named with the rank.
offload::StagedMomentStoreOptions moment_store_options(const TrainConfig& cfg, const ModelConfig& model);

// Every stage's parameter count (what a staged store is built over).
std::vector<std::size_t> stage_floats(const ModelConfig& model);

// This rank's: with the host state sharded the tiles and the store of its own stages (and the replicas
// of the others'), as the engine allocates them.
TierBytes tier_bytes(const TrainConfig& cfg, const ModelConfig& model);
// As tier_bytes for one rank that holds every stage with this config's tiles and store (the same
// masters: what sharding saves is measured against it).
TierBytes tier_bytes_of_every_stage(const TrainConfig& cfg, const ModelConfig& model);

}  // namespace mt::plan
