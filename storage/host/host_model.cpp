#include "storage/host/host_model.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace mt {

namespace {

std::size_t tile_allocation_bytes(std::size_t floats, const HostTileOptions& options) {
  const std::size_t compute = floats * options.compute_bytes_per_param;
  const std::size_t regions = (options.moments_in_tile ? kTileRegionCount : 2) - (options.params_in_tile ? 0 : 1);
  return regions * floats * sizeof(float) + (compute + kCacheLineBytes - 1) / kCacheLineBytes * kCacheLineBytes;
}

}  // namespace

std::size_t host_model_bytes(const ModelConfig& cfg, const HostTileOptions& options) {
  cfg.validate();
  std::size_t total = 0;
  for (std::int64_t s = 0; s < num_stages(cfg); ++s)
    total += tile_allocation_bytes(stage_layout(cfg, s).total_floats, options);
  return total;
}

HostModel::HostModel(const ModelConfig& cfg, const HostTileOptions& options, HostPinningHook* pinning,
                     std::unique_ptr<MomentStore> moments)
    : cfg_(cfg), pinning_(pinning), moments_(std::move(moments)) {
  cfg_.validate();
  if (options.moments_in_tile == (moments_ != nullptr))
    throw std::invalid_argument(options.moments_in_tile
                                    ? "HostModel: a moment store was given but the tiles hold the moments"
                                    : "HostModel: the tiles hold no moments and no moment store was given");
  if (!moments_) moments_ = std::make_unique<TileMomentStore>(*this);
  if (options.params_in_tile == moments_->holds_masters())
    throw std::invalid_argument(options.params_in_tile
                                    ? "HostModel: the moment store holds the masters but the tiles hold them too"
                                    : "HostModel: the tiles hold no masters and the moment store does not either");
  const auto stages = mt::num_stages(cfg_);
  layouts_.reserve(static_cast<std::size_t>(stages));
  tiles_.reserve(static_cast<std::size_t>(stages));
  for (std::int64_t s = 0; s < stages; ++s) {
    layouts_.push_back(stage_layout(cfg_, s));
    tiles_.push_back(std::make_unique<HostTile>(s, layouts_.back().total_floats, options));
    if (pinning_) pinning_->pin(tiles_.back()->data(), tiles_.back()->bytes());
  }
}

HostModel::~HostModel() {
  if (pinning_)
    for (auto& t : tiles_) pinning_->unpin(t->data(), t->bytes());
}

HostTile& HostModel::tile(std::int64_t stage) {
  if (stage < 0 || stage >= num_stages())
    throw std::out_of_range("stage " + std::to_string(stage) + " out of range [0, " + std::to_string(num_stages()) +
                            ")");
  return *tiles_[static_cast<std::size_t>(stage)];
}

const HostTile& HostModel::tile(std::int64_t stage) const { return const_cast<HostModel*>(this)->tile(stage); }

const ParamLayout& HostModel::layout(std::int64_t stage) const {
  tile(stage);  // range check
  return layouts_[static_cast<std::size_t>(stage)];
}

std::size_t HostModel::host_bytes() const {
  std::size_t total = 0;
  for (const auto& t : tiles_) total += t->bytes();
  return total + moments_->ram_bytes();
}

std::size_t HostModel::largest_stage_floats() const {
  return tiles_[static_cast<std::size_t>(largest_stage())]->floats();
}

std::int64_t HostModel::largest_stage() const {
  std::int64_t best = 0;
  for (std::int64_t s = 1; s < num_stages(); ++s)
    if (tiles_[static_cast<std::size_t>(s)]->floats() > tiles_[static_cast<std::size_t>(best)]->floats()) best = s;
  return best;
}

MomentView TileMomentStore::acquire(std::int64_t stage) {
  HostTile& t = host_.tile(stage);
  return MomentView{t.adam_m(), t.adam_v()};
}

void TileMomentStore::reset(std::int64_t stage) {
  HostTile& t = host_.tile(stage);
  std::memset(t.adam_m(), 0, t.region_bytes());
  std::memset(t.adam_v(), 0, t.region_bytes());
}

void HostModel::set_masters(std::int64_t stage, const std::function<void(float*)>& fill) {
  HostTile& t = tile(stage);
  std::memset(t.grad(), 0, t.region_bytes());
  if (masters_in_tiles()) {
    fill(t.params());
    moments_->reset(stage);
    return;
  }
  MomentLease lease(*moments_, stage, MomentLease::Use::overwrite);  // written back when it ends
  fill(lease.master());
  std::memset(lease.m(), 0, t.region_bytes());
  std::memset(lease.v(), 0, t.region_bytes());
}

void HostModel::read_masters(std::int64_t stage, const std::function<void(const float*)>& read) const {
  if (masters_in_tiles()) {
    read(tile(stage).params());
    return;
  }
  MomentLease lease(*moments_, stage);
  read(lease.master());
}

void HostModel::abort_all_waits() {
  for (auto& t : tiles_) t->abort_waits();
}

}  // namespace mt
