// Every persistent tensor of a model in host RAM: one HostTile per stage (0 embedding, 1..L layers,
// L+1 head), sized from the ParamLayout of that stage. Host memory grows linearly with depth and is
// reported; device memory (DeviceArena) does not depend on depth at all.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/model_config.hpp"
#include "kernels/param_layout.hpp"
#include "storage/host/host_tile.hpp"
#include "storage/host/moment_store.hpp"

namespace mt {

// Registers host memory with the device driver so copies can use DMA (cudaHostRegister on CUDA).
// The CPU backend needs nothing: the default hook does nothing.
class HostPinningHook {
 public:
  virtual ~HostPinningHook() = default;
  virtual void pin(void* /*data*/, std::size_t /*bytes*/) {}
  virtual void unpin(void* /*data*/, std::size_t /*bytes*/) {}
};

// Which stages' optimizer state (gradient accumulator, moments) this process holds: every stage (empty),
// or, in a job of several ranks with the host state sharded (cluster.shard_state), the stages this rank
// owns. A stage held elsewhere is a replica here: its tile holds only what compute streams (the fp32
// masters; with bf16 the compute copy alone), and its owner sends each update's new weights.
using OwnedStages = std::vector<char>;

// The tile options of a stage another rank owns: no gradient, no moments, and with a compute copy no
// masters either, split or not: the owner sends the copy, which split masters' high halves are (throws
// std::invalid_argument for fp32 compute with the masters in a store: a replica would stream nothing).
HostTileOptions replica_tile_options(const HostTileOptions& options);

// Host bytes a model's tiles need with these options, before allocating anything (reports, checks);
// a MomentStore outside the tiles reports its own (MomentStore::ram_bytes).
std::size_t host_model_bytes(const ModelConfig& cfg, const HostTileOptions& options = {},
                             const OwnedStages& owned = {});

class HostModel {
 public:
  // Allocates every tile (and pins each one through `pinning` when given; the hook must outlive the
  // model). Throws std::invalid_argument for an invalid config, std::runtime_error when memory is short.
  // The moments live in the tiles (options.moments_in_tile, `moments` null) or in `moments` (then
  // options.moments_in_tile must be false). `owned`: the stages whose state this process holds (empty:
  // all; else one entry per stage, and a store must hold exactly those: MomentStore::holds).
  explicit HostModel(const ModelConfig& cfg, const HostTileOptions& options = {}, HostPinningHook* pinning = nullptr,
                     std::unique_ptr<MomentStore> moments = nullptr, OwnedStages owned = {});
  ~HostModel();
  HostModel(const HostModel&) = delete;
  HostModel& operator=(const HostModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  std::int64_t num_stages() const { return static_cast<std::int64_t>(tiles_.size()); }
  HostTile& tile(std::int64_t stage);  // throws std::out_of_range
  const HostTile& tile(std::int64_t stage) const;
  const ParamLayout& layout(std::int64_t stage) const;  // names and offsets inside each region
  // This process holds stage s's optimizer state (false: a replica, owned by another rank).
  bool owns(std::int64_t stage) const { return owned_.empty() || owned_.at(static_cast<std::size_t>(stage)) != 0; }
  bool sharded() const { return !owned_.empty(); }
  // This process holds stage s's fp32 masters: an owned stage, or a replica without a compute copy
  // (fp32 compute streams the masters). A bf16 replica holds the compute copy alone.
  bool holds_masters(std::int64_t stage) const { return owns(stage) || tile(stage).has_params(); }

  // Every stage's AdamW moments: the tiles' regions, or a store outside them (compressed, NVMe).
  // With train.offload_params the store holds the fp32 masters too (moments().holds_masters()).
  MomentStore& moments() const { return *moments_; }
  // The tiles hold the fp32 masters as a params region (false: in the store, or split into halves).
  bool masters_in_tiles() const { return !moments_->holds_masters() && !split_masters_; }
  // The masters are split into the compute copy and low halves (HostTileOptions::split_master).
  bool split_masters() const { return split_masters_; }

  // Sets stage s's fp32 masters through fill(masters) and zeroes its grad and moments: a fresh run, a
  // params-only import. Wherever the masters live (tile, or the store: then written back).
  void set_masters(std::int64_t stage, const std::function<void(float* masters)>& fill);
  // Calls read(masters) with stage s's fp32 masters (valid during the call only).
  void read_masters(std::int64_t stage, const std::function<void(const float* masters)>& read) const;

  std::size_t host_bytes() const;            // sum of every tile's allocation and the moment store's RAM
  std::size_t largest_stage_floats() const;  // what a device weight slot must hold
  std::int64_t largest_stage() const;

 private:
  ModelConfig cfg_;
  std::vector<ParamLayout> layouts_;
  std::vector<std::unique_ptr<HostTile>> tiles_;  // HostTile holds a mutex: not movable
  HostPinningHook* pinning_;
  std::unique_ptr<MomentStore> moments_;
  bool split_masters_;
  int convert_threads_;  // HostTileOptions::convert_threads
  OwnedStages owned_;    // empty: every stage

  // Rounds `masters` (the stage's floats) into its bf16 compute copy, as the fused update rounds them.
  void set_compute_copy(std::int64_t stage, const float* masters);
};

// A stage's optimizer state under one lease, as plain fp32 arrays: the masters (the tile's params, or the
// store's copy under train.offload_params) and the moments. mark_modified() writes them back.
// With split masters (HostTileOptions::split_master) the lease assembles the fp32 masters and the plain v
// (tie bits cleared) into arrays of its own (Use::update: joined from the tile; Use::overwrite: left for
// the caller to fill), and mark_modified() splits them back into the tile at once (it throws, leaving the
// tile as it was, on a v that no update produces: kernels/master_halves.hpp). The optimizer updates split
// tiles in place (adamw_stage_split_master) and takes no lease.
class StateLease {
 public:
  StateLease(HostModel& host, std::int64_t stage, MomentLease::Use use = MomentLease::Use::update);
  float* master() const { return master_; }
  float* m() const { return moments_.m(); }
  float* v() const { return v_; }
  void mark_modified();

 private:
  HostTile& tile_;
  MomentLease moments_;
  std::vector<float> split_master_, split_v_;  // split masters only
  float* master_;
  float* v_;
};

// The moments in the tiles themselves: a lease is the tile's own regions (no copy, no I/O).
class TileMomentStore final : public MomentStore {
 public:
  explicit TileMomentStore(HostModel& host) : host_(host) {}
  MomentView acquire(std::int64_t stage) override;
  void release(std::int64_t, bool) noexcept override {}
  void flush() override {}
  void reset(std::int64_t stage) override;
  std::size_t ram_bytes() const override { return 0; }
  std::string describe() const override { return "in the host tiles"; }
  bool holds(std::int64_t stage) const override { return host_.owns(stage); }

 private:
  HostModel& host_;
};

}  // namespace mt
