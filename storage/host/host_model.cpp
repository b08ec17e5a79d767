#include "storage/host/host_model.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "kernels/cpu/bf16.hpp"
#include "kernels/master_halves.hpp"

namespace mt {

namespace {

// Threads for joining and splitting split masters. set_masters / read_masters run off the step
// (initialisation, loading, export): every core. Leases serve the checkpointer and the checkpoint gate
// beside a running step: one thread.
int copy_threads(int configured) {
  return configured > 0 ? configured : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}
constexpr int kLeaseThreads = 1;

}  // namespace

HostTileOptions replica_tile_options(const HostTileOptions& options) {
  // fp32 compute streams the masters: a replica holds them whatever the owner does with its own (with
  // train.offload_params, bf16 only, the replica streams the compute copy and the masters stay away).
  if (!options.params_in_tile && options.compute_bytes_per_param == 0)
    throw std::invalid_argument("HostModel: a stage owned by another rank needs its masters in the tile (fp32)");
  HostTileOptions o = options;
  o.grad_in_tile = false;
  o.moments_in_tile = false;
  // With a compute copy (bf16) that copy is all compute streams: the fp32 masters stay with the owner,
  // also split ones (their high halves are the copy the owner sends; the low halves and the tie bits in
  // v stay with it).
  if (o.compute_bytes_per_param > 0) o.params_in_tile = false;
  o.split_master = false;
  return o;
}

std::size_t host_model_bytes(const ModelConfig& cfg, const HostTileOptions& options, const OwnedStages& owned) {
  cfg.validate();
  std::size_t total = 0;
  for (std::int64_t s = 0; s < num_stages(cfg); ++s) {
    const bool here = owned.empty() || owned.at(static_cast<std::size_t>(s)) != 0;
    total +=
        HostTile::allocation_bytes(stage_layout(cfg, s).total_floats, here ? options : replica_tile_options(options));
  }
  return total;
}

HostModel::HostModel(const ModelConfig& cfg, const HostTileOptions& options, HostPinningHook* pinning,
                     std::unique_ptr<MomentStore> moments, OwnedStages owned)
    : cfg_(cfg),
      pinning_(pinning),
      moments_(std::move(moments)),
      split_masters_(options.split_master),
      convert_threads_(options.convert_threads),
      owned_(std::move(owned)) {
  cfg_.validate();
  if (!owned_.empty()) {
    if (static_cast<std::int64_t>(owned_.size()) != mt::num_stages(cfg_))
      throw std::invalid_argument("HostModel: owned stages name " + std::to_string(owned_.size()) +
                                  " stages, the model has " + std::to_string(mt::num_stages(cfg_)));
  }
  const HostTileOptions replica = owned_.empty() ? options : replica_tile_options(options);
  if (options.moments_in_tile == (moments_ != nullptr))
    throw std::invalid_argument(options.moments_in_tile
                                    ? "HostModel: a moment store was given but the tiles hold the moments"
                                    : "HostModel: the tiles hold no moments and no moment store was given");
  if (!moments_) moments_ = std::make_unique<TileMomentStore>(*this);
  // Sharded, a store outside the tiles holds this rank's own stages and no other (moment_store_for).
  for (std::int64_t s = 0; s < mt::num_stages(cfg_); ++s)
    if (moments_->holds(s) != owns(s))
      throw std::invalid_argument("HostModel: the moment store " + std::string(owns(s) ? "lacks" : "holds") +
                                  " stage " + std::to_string(s) +
                                  (owns(s) ? ", which this rank owns" : ", which another rank owns"));
  if (options.params_in_tile == moments_->holds_masters())
    throw std::invalid_argument(options.params_in_tile
                                    ? "HostModel: the moment store holds the masters but the tiles hold them too"
                                    : "HostModel: the tiles hold no masters and the moment store does not either");
  const auto stages = mt::num_stages(cfg_);
  layouts_.reserve(static_cast<std::size_t>(stages));
  tiles_.reserve(static_cast<std::size_t>(stages));
  for (std::int64_t s = 0; s < stages; ++s) {
    layouts_.push_back(stage_layout(cfg_, s));
    tiles_.push_back(std::make_unique<HostTile>(s, layouts_.back().total_floats, owns(s) ? options : replica));
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
  if (!host_.owns(stage))
    throw std::logic_error("stage " + std::to_string(stage) +
                           "'s moments are held by the rank that owns it (cluster.shard_state), not here");
  return MomentView{t.adam_m(), t.adam_v()};
}

void TileMomentStore::reset(std::int64_t stage) {
  if (!host_.owns(stage)) return;  // a replica holds no moments
  HostTile& t = host_.tile(stage);
  std::memset(t.adam_m(), 0, t.region_bytes());
  std::memset(t.adam_v(), 0, t.region_bytes());
}

void HostModel::set_masters(std::int64_t stage, const std::function<void(float*)>& fill) {
  HostTile& t = tile(stage);
  if (!owns(stage) && !t.has_params()) {  // a replica of the compute copy alone: the masters rounded
    std::vector<float> masters(t.floats(), 0.0f);
    fill(masters.data());
    set_compute_copy(stage, masters.data());
    return;
  }
  if (t.has_grad()) std::memset(t.grad(), 0, t.region_bytes());
  if (split_masters_) {
    std::vector<float> masters(t.floats(), 0.0f);
    fill(masters.data());
    moments_->reset(stage);
    cpu::split_masters(masters.data(), t.master_high(), t.master_low(), t.adam_v(), t.floats(),
                       copy_threads(convert_threads_));
    return;
  }
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

void HostModel::set_compute_copy(std::int64_t stage, const float* masters) {
  HostTile& t = tile(stage);
  cpu::to_bf16(masters, static_cast<bf16_t*>(t.compute_copy()), t.floats(), copy_threads(convert_threads_));
}

void HostModel::read_masters(std::int64_t stage, const std::function<void(const float*)>& read) const {
  if (!holds_masters(stage))
    throw std::logic_error("stage " + std::to_string(stage) +
                           "'s fp32 masters are held by the rank that owns it (cluster.shard_state), not here");
  if (split_masters_) {
    HostTile& t = const_cast<HostModel*>(this)->tile(stage);
    std::vector<float> masters(t.floats());
    cpu::join_masters(t.master_high(), t.master_low(), t.adam_v(), masters.data(), t.floats(),
                      copy_threads(convert_threads_));
    read(masters.data());
    return;
  }
  if (masters_in_tiles()) {
    read(tile(stage).params());
    return;
  }
  MomentLease lease(*moments_, stage, MomentLease::Use::read);
  read(lease.master());
}

StateLease::StateLease(HostModel& host, std::int64_t stage, MomentLease::Use use)
    : tile_(host.tile(stage)), moments_(host.moments(), stage, use), master_(moments_.master()), v_(moments_.v()) {
  if (!tile_.has_split_master()) {
    if (master_ == nullptr) master_ = tile_.params();
    return;
  }
  split_master_.resize(tile_.floats());
  split_v_.resize(tile_.floats());
  master_ = split_master_.data();
  v_ = split_v_.data();
  if (use != MomentLease::Use::overwrite) {
    cpu::join_masters(tile_.master_high(), tile_.master_low(), tile_.adam_v(), master_, tile_.floats(), kLeaseThreads);
    cpu::plain_vs(tile_.adam_v(), v_, tile_.floats(), kLeaseThreads);
  }
}

void StateLease::mark_modified() {
  if (!tile_.has_split_master()) {
    moments_.mark_modified();
    return;
  }
  // The tie bits go into the lease's plain v first (split_masters checks everything before it writes),
  // then v joins the tile: a refused v leaves the tile untouched.
  cpu::split_masters(master_, tile_.master_high(), tile_.master_low(), v_, tile_.floats(), kLeaseThreads);
  std::memcpy(tile_.adam_v(), v_, tile_.region_bytes());
  cpu::plain_vs(v_, v_, tile_.floats(), kLeaseThreads);  // the lease keeps reading plain values
}

}  // namespace mt
