// Host storage of one stage (embedding, one decoder layer, or the head): a single aligned allocation
// with named regions, so a stage is one contiguous tile that streams, checkpoints and pins as a unit.
//
//   [ params | grad | adam_m | adam_v | compute copy (optional) ]
//
// With split_master (bf16 runs, train.master_weights=split) the fp32 master is held as two 16-bit halves:
// the compute copy is its high half and a low-halves region follows it (kernels/master_halves.hpp; the
// tie bit of the rounding rides in adam_v's sign), so there is no params region:
//
//   [ grad | adam_m | adam_v | compute copy = master high halves | master low halves ]
//
// Without grad_in_tile (train.gradient_buffer=stage) there is no grad region: a stage's gradient lives
// only in its staging slot until the optimizer has used it, and the tile is 12 bytes per parameter
// with split masters: [ adam_m | adam_v | master high halves | master low halves ].
//
// Without moments_in_tile the moments live in a MomentStore elsewhere (compressed in RAM, or on the
// NVMe tier: storage/offload) and the tile is [ params | grad | compute copy ]. Without params_in_tile
// (train.offload_params) the fp32 masters live in that store too and the tile is [ grad | compute copy ]:
// the compute copy is then what the device streams, and the optimizer refreshes it from the store's masters.
//
// params is the fp32 master copy; on the CPU backend it is also what compute reads (streamed into a
// device slot). A backend that computes in lower precision (bf16 on CUDA) asks for a compute copy
// region (compute_bytes_per_param = 2): the optimizer writes it after each update and the copy engine
// streams it instead of params. grad is the fp32 gradient accumulator; adam_m / adam_v the moments.
// Every region holds stage_layout(cfg, stage).total_floats elements and starts on a 64-byte boundary.
//
// The version counter says which optimizer update the params hold: 0 after initialisation, bumped by
// the optimizer after each update. Readers (prefetcher, checkpointer) wait for version >= v.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "kernels/precision.hpp"
#include "storage/host/aligned_buffer.hpp"

namespace mt {

enum class TileRegion { params, grad, adam_m, adam_v };
inline constexpr int kTileRegionCount = 4;
const char* tile_region_name(TileRegion r);

struct HostTileOptions {
  // 0: compute reads the fp32 params (CPU backend); 2: a bf16 / fp16 copy; 4: a separate fp32 copy.
  std::size_t compute_bytes_per_param = 0;
  // false: no adam_m / adam_v regions (the moments live in a MomentStore outside the tile).
  bool moments_in_tile = true;
  // false: no params region (the fp32 masters live in the MomentStore with the moments); needs a
  // compute copy and moments_in_tile = false.
  bool params_in_tile = true;
  // The fp32 masters as two halves (no params region): needs compute_bytes_per_param = 2, the moments
  // in the tile (the tie bits live in adam_v) and params_in_tile (the masters are in the tile).
  bool split_master = false;
  // false: no grad region (the gradient stays in its staging slot until the optimizer used it).
  bool grad_in_tile = true;
  // Zero every region at allocation (also commits the pages now rather than during the first step).
  bool zero_fill = true;
  // Threads of HostModel's whole-stage conversions (splitting and joining split masters); 0 = every core.
  int convert_threads = 0;
};

class HostTile {
 public:
  // floats_per_region: stage_layout(cfg, stage).total_floats (a multiple of kAlignFloats).
  HostTile(std::int64_t stage, std::size_t floats_per_region, const HostTileOptions& options = {});
  // Bytes of the allocation such a tile makes (HostModel's reports use it before allocating).
  static std::size_t allocation_bytes(std::size_t floats_per_region, const HostTileOptions& options);
  HostTile(const HostTile&) = delete;
  HostTile& operator=(const HostTile&) = delete;

  std::int64_t stage() const { return stage_; }
  std::size_t floats() const { return floats_; }  // elements per fp32 region
  std::size_t region_bytes() const { return floats_ * sizeof(float); }
  std::size_t bytes() const { return buffer_.bytes(); }  // the whole allocation

  float* region(TileRegion r);
  const float* region(TileRegion r) const;
  float* params() { return region(TileRegion::params); }
  const float* params() const { return region(TileRegion::params); }
  float* grad() { return region(TileRegion::grad); }
  const float* grad() const { return region(TileRegion::grad); }
  // Throw std::logic_error when the tile holds no moments (has_moments() false).
  float* adam_m() { return region(TileRegion::adam_m); }
  float* adam_v() { return region(TileRegion::adam_v); }
  bool has_moments() const { return has(TileRegion::adam_m); }
  bool has_params() const { return has(TileRegion::params); }
  bool has_grad() const { return has(TileRegion::grad); }
  bool has(TileRegion r) const { return region_index_[static_cast<int>(r)] >= 0; }
  // Split masters: the high halves are the compute copy; the low halves follow it (nullptr without).
  bool has_split_master() const { return split_master_; }
  bf16_t* master_high() { return split_master_ ? static_cast<bf16_t*>(compute_copy()) : nullptr; }
  std::uint16_t* master_low();

  // The bytes a device slot receives: the compute copy when there is one, else params.
  bool has_compute_copy() const { return compute_bytes_ > 0; }
  void* compute_copy();  // nullptr without one
  std::size_t compute_copy_bytes() const { return compute_bytes_; }
  const void* stream_source() const;
  std::size_t stream_bytes() const;

  // Whole allocation, for pinning / registering / checkpoint writes.
  void* data() { return buffer_.data(); }
  const void* data() const { return buffer_.data(); }

  // --- version -----------------------------------------------------------------------------------
  std::uint64_t version() const { return version_.load(std::memory_order_acquire); }
  // Publishes a new version (release: everything written to the tile before is visible to a reader
  // that observes it) and wakes waiters. Versions only grow; a smaller value throws std::logic_error.
  void publish_version(std::uint64_t v);
  std::uint64_t bump_version();  // publish_version(version() + 1); returns it
  // Blocks until version() >= v. Returns false when abort_waits() was called first.
  bool wait_for_version(std::uint64_t v) const;
  // As above with a timeout: false on timeout or abort.
  bool wait_for_version(std::uint64_t v, std::chrono::nanoseconds timeout) const;
  // Wakes every waiter with false, now and in future (shutdown). Irreversible.
  void abort_waits();

 private:
  std::int64_t stage_;
  std::size_t floats_;
  std::size_t compute_bytes_;
  // Per TileRegion: its place among the fp32 regions held (they come first, in TileRegion order), or -1.
  int region_index_[kTileRegionCount];
  int fp32_regions_;  // how many are held
  bool split_master_;
  AlignedBuffer buffer_;
  std::atomic<std::uint64_t> version_{0};
  mutable std::mutex version_mutex_;
  mutable std::condition_variable version_changed_;
  bool aborted_ = false;  // guarded by version_mutex_
};

}  // namespace mt
