#include "storage/host/host_tile.hpp"

#include <stdexcept>
#include <string>

#include "kernels/param_layout.hpp"

namespace mt {

const char* tile_region_name(TileRegion r) {
  switch (r) {
    case TileRegion::params:
      return "params";
    case TileRegion::grad:
      return "grad";
    case TileRegion::adam_m:
      return "adam_m";
    case TileRegion::adam_v:
      return "adam_v";
  }
  return "?";
}

namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

bool holds(const HostTileOptions& o, TileRegion r) {
  switch (r) {
    case TileRegion::params:
      return o.params_in_tile && !o.split_master;
    case TileRegion::grad:
      return o.grad_in_tile;
    case TileRegion::adam_m:
    case TileRegion::adam_v:
      return o.moments_in_tile;
  }
  return false;
}
int fp32_regions_of(const HostTileOptions& o) {
  int n = 0;
  for (int r = 0; r < kTileRegionCount; ++r) n += holds(o, static_cast<TileRegion>(r)) ? 1 : 0;
  return n;
}
std::size_t low_halves_bytes(std::size_t floats, const HostTileOptions& o) {
  return o.split_master ? round_up(floats * sizeof(std::uint16_t), kCacheLineBytes) : 0;
}

}  // namespace

std::size_t HostTile::allocation_bytes(std::size_t floats, const HostTileOptions& o) {
  return static_cast<std::size_t>(fp32_regions_of(o)) * floats * sizeof(float) +
         round_up(floats * o.compute_bytes_per_param, kCacheLineBytes) + low_halves_bytes(floats, o);
}

HostTile::HostTile(std::int64_t stage, std::size_t floats_per_region, const HostTileOptions& options)
    : stage_(stage),
      floats_(floats_per_region),
      compute_bytes_(floats_per_region * options.compute_bytes_per_param),
      fp32_regions_(fp32_regions_of(options)),
      split_master_(options.split_master) {
  for (int r = 0, held = 0; r < kTileRegionCount; ++r)
    region_index_[r] = holds(options, static_cast<TileRegion>(r)) ? held++ : -1;
  if (!options.params_in_tile && (options.moments_in_tile || options.compute_bytes_per_param == 0))
    throw std::invalid_argument(
        "HostTile: a tile without params needs a compute copy and its moments outside (the masters live with them)");
  if (options.split_master &&
      (options.compute_bytes_per_param != sizeof(bf16_t) || !options.moments_in_tile || !options.params_in_tile))
    throw std::invalid_argument(
        "HostTile: split masters need a bf16 compute copy, the moments in the tile and the masters in the tile");
  if (floats_ % kAlignFloats != 0)
    throw std::invalid_argument("HostTile: floats_per_region " + std::to_string(floats_) + " is not a multiple of " +
                                std::to_string(kAlignFloats));
  const std::string what = "host tile of stage " + std::to_string(stage);
  buffer_ = AlignedBuffer(allocation_bytes(floats_, options), what.c_str(), options.zero_fill);
}

float* HostTile::region(TileRegion r) {
  const int i = region_index_[static_cast<int>(r)];
  if (i < 0)
    throw std::logic_error(std::string("HostTile: stage ") + std::to_string(stage_) + " holds no " +
                           tile_region_name(r) + " region" +
                           (r == TileRegion::grad ? " (gradients live in staging slots)" : " (it lives elsewhere)"));
  return reinterpret_cast<float*>(buffer_.data()) + static_cast<std::size_t>(i) * floats_;
}

const float* HostTile::region(TileRegion r) const { return const_cast<HostTile*>(this)->region(r); }

void* HostTile::compute_copy() {
  return compute_bytes_ == 0 ? nullptr : buffer_.data() + static_cast<std::size_t>(fp32_regions_) * region_bytes();
}

std::uint16_t* HostTile::master_low() {
  if (!split_master_) return nullptr;
  return reinterpret_cast<std::uint16_t*>(static_cast<std::byte*>(compute_copy()) +
                                          round_up(compute_bytes_, kCacheLineBytes));
}

const void* HostTile::stream_source() const {
  return compute_bytes_ == 0 ? static_cast<const void*>(params())
                             : buffer_.data() + static_cast<std::size_t>(fp32_regions_) * region_bytes();
}

std::size_t HostTile::stream_bytes() const { return compute_bytes_ == 0 ? region_bytes() : compute_bytes_; }

void HostTile::publish_version(std::uint64_t v) {
  {
    std::lock_guard<std::mutex> lock(version_mutex_);
    const auto current = version_.load(std::memory_order_relaxed);
    if (v < current)
      throw std::logic_error("stage " + std::to_string(stage_) + ": version " + std::to_string(v) +
                             " is older than the current " + std::to_string(current));
    // Stored under the mutex so a waiter cannot check, miss the store and then sleep forever.
    version_.store(v, std::memory_order_release);
  }
  version_changed_.notify_all();
}

std::uint64_t HostTile::bump_version() {
  std::uint64_t next;
  {
    std::lock_guard<std::mutex> lock(version_mutex_);
    next = version_.load(std::memory_order_relaxed) + 1;
    version_.store(next, std::memory_order_release);
  }
  version_changed_.notify_all();
  return next;
}

bool HostTile::wait_for_version(std::uint64_t v) const {
  if (version() >= v) return true;  // fast path without the lock
  std::unique_lock<std::mutex> lock(version_mutex_);
  version_changed_.wait(lock, [&] { return aborted_ || version_.load(std::memory_order_acquire) >= v; });
  return version_.load(std::memory_order_acquire) >= v && !aborted_;
}

bool HostTile::wait_for_version(std::uint64_t v, std::chrono::nanoseconds timeout) const {
  if (version() >= v) return true;
  std::unique_lock<std::mutex> lock(version_mutex_);
  version_changed_.wait_for(lock, timeout, [&] { return aborted_ || version_.load(std::memory_order_acquire) >= v; });
  return version_.load(std::memory_order_acquire) >= v && !aborted_;
}

void HostTile::abort_waits() {
  {
    std::lock_guard<std::mutex> lock(version_mutex_);
    aborted_ = true;
  }
  version_changed_.notify_all();
}

}  // namespace mt
