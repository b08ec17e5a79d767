// Layer-boundary activations offloaded to host RAM (device.keep_intermediates=boundary_host): the
// device then keeps only a small ring of forward boundaries and a few activation slots, so device
// memory does not grow with depth; host memory grows by one boundary per layer.
//
// Layout: one aligned buffer of `sets` x `boundaries` entries of `floats` each, entry (set, b) at
// offset (set * boundaries + b) * stride. A set is one in-flight micro-batch (the interleaved schedule
// has two alive at once); boundary b is the input of layer b + 1 (b = 0 is the embedding's output).
//
// Each entry carries a stamp naming the micro-batch whose data it holds (its global index + 1; 0 =
// nothing yet), published with release order once the device-to-host copy has landed, so a reader
// that sees the stamp it expects sees the bytes too. No CAF.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "storage/host/aligned_buffer.hpp"

namespace mt {

class HostBoundaries {
 public:
  HostBoundaries() = default;
  // Throws std::invalid_argument for sets < 1, boundaries < 0 or floats == 0.
  HostBoundaries(int sets, std::int64_t boundaries, std::size_t floats);

  int sets() const { return sets_; }
  std::int64_t boundaries() const { return boundaries_; }
  std::size_t floats() const { return floats_; }
  std::size_t bytes() const { return buffer_.bytes(); }
  void* base() { return buffer_.data(); }  // the whole store, `bytes()` long (to pin it for the link)

  // Throws std::out_of_range naming the entry when (set, boundary) is outside the store.
  float* data(int set, std::int64_t boundary);
  void mark_saved(int set, std::int64_t boundary, std::uint64_t stamp);
  // The stamp of the data the entry holds now (0 = none yet); stamps of one entry only grow.
  std::uint64_t stamp(int set, std::int64_t boundary) const;

 private:
  std::size_t entry(int set, std::int64_t boundary) const;

  int sets_ = 0;
  std::int64_t boundaries_ = 0;
  std::size_t floats_ = 0;
  std::size_t stride_floats_ = 0;
  AlignedBuffer buffer_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> stamps_;
};

}  // namespace mt
