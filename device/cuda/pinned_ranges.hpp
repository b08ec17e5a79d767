// The CUDA backend's pinned-memory bookkeeping: which exact host ranges are page-locked, so each is
// unpinned once, by the same range, and whatever is still pinned is unpinned when the backend goes
// (shutdown and error paths alike). Plain C++ with the pin/unpin calls injected (cudaHostRegister /
// cudaHostUnregister in the backend, recorders in the CI tests).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace mt::cuda {

class PinnedRanges {
 public:
  using Call = std::function<void(void*, std::size_t)>;
  PinnedRanges(Call pin, Call unpin) : pin_(std::move(pin)), unpin_(std::move(unpin)) {}
  ~PinnedRanges() { release_all(); }
  PinnedRanges(const PinnedRanges&) = delete;
  PinnedRanges& operator=(const PinnedRanges&) = delete;

  // Pins [data, data + bytes) exactly. Refuses a range overlapping one already pinned (the driver would
  // too, less clearly). Nothing is recorded when `pin` throws.
  void add(void* data, std::size_t bytes) {
    if (!data || bytes == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const auto b = reinterpret_cast<std::uintptr_t>(data);
    auto next = ranges_.lower_bound(data);
    if (next != ranges_.end() && reinterpret_cast<std::uintptr_t>(next->first) < b + bytes)
      throw std::invalid_argument("pinning host memory: the range overlaps one already pinned");
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (reinterpret_cast<std::uintptr_t>(prev->first) + prev->second > b)
        throw std::invalid_argument("pinning host memory: the range overlaps one already pinned");
    }
    pin_(data, bytes);
    ranges_.emplace(data, bytes);
    bytes_ += bytes;
  }

  // Unpins a range pinned by add() with the same start and size.
  void remove(void* data, std::size_t bytes) {
    if (!data || bytes == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.find(data);
    if (it == ranges_.end() || it->second != bytes)
      throw std::invalid_argument("unpinning host memory: no range of " + std::to_string(bytes) +
                                  " bytes was pinned at that address");
    ranges_.erase(it);
    bytes_ -= bytes;
    unpin_(data, bytes);
  }

  // Unpins everything still pinned (errors of the unpin calls are swallowed: this runs in destructors).
  void release_all() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [p, n] : ranges_) {
      try {
        unpin_(p, n);
      } catch (...) {
      }
    }
    ranges_.clear();
    bytes_ = 0;
  }

  std::size_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ranges_.size();
  }
  std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  Call pin_, unpin_;
  mutable std::mutex mu_;
  std::map<void*, std::size_t> ranges_;
  std::size_t bytes_ = 0;
};

}  // namespace mt::cuda
