#include "storage/host/host_boundaries.hpp"

#include <stdexcept>
#include <string>

#include "kernels/param_layout.hpp"

namespace mt {

HostBoundaries::HostBoundaries(int sets, std::int64_t boundaries, std::size_t floats)
    : sets_(sets), boundaries_(boundaries), floats_(floats) {
  if (sets < 1 || boundaries < 0 || floats == 0)
    throw std::invalid_argument("HostBoundaries: sets >= 1, boundaries >= 0 and floats > 0 required");
  stride_floats_ = align_floats(floats);  // 64-byte entries, as the engine's plan counts them
  const std::size_t entries = static_cast<std::size_t>(sets) * static_cast<std::size_t>(boundaries);
  buffer_ = AlignedBuffer(entries * stride_floats_ * sizeof(float), "host boundary activations", true);
  stamps_ = std::make_unique<std::atomic<std::uint64_t>[]>(entries);
  for (std::size_t i = 0; i < entries; ++i) stamps_[i].store(0, std::memory_order_relaxed);
}

std::size_t HostBoundaries::entry(int set, std::int64_t boundary) const {
  if (set < 0 || set >= sets_ || boundary < 0 || boundary >= boundaries_)
    throw std::out_of_range("HostBoundaries: no entry (set " + std::to_string(set) + ", boundary " +
                            std::to_string(boundary) + ") in a store of " + std::to_string(sets_) + " x " +
                            std::to_string(boundaries_));
  return static_cast<std::size_t>(set) * static_cast<std::size_t>(boundaries_) + static_cast<std::size_t>(boundary);
}

float* HostBoundaries::data(int set, std::int64_t boundary) {
  return reinterpret_cast<float*>(buffer_.data()) + entry(set, boundary) * stride_floats_;
}

void HostBoundaries::mark_saved(int set, std::int64_t boundary, std::uint64_t stamp) {
  stamps_[entry(set, boundary)].store(stamp, std::memory_order_release);
}

std::uint64_t HostBoundaries::stamp(int set, std::int64_t boundary) const {
  return stamps_[entry(set, boundary)].load(std::memory_order_acquire);
}

}  // namespace mt
