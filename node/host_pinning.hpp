// Page-locking of the host tiles, once per run: the tiles are what the prefetcher streams from and the
// collector accumulates into, so on a GPU they must be pinned for the copies to be asynchronous DMA.
// A backend of the run's kind does it (CUDA: cudaHostRegister at each tile's exact size, never a
// caching allocator that rounds up); HostModel pins each tile as it allocates it and unpins it when it
// is destroyed, on the error paths too. The CPU backend needs nothing, so no hook is made for it.
#pragma once
#include <cstddef>
#include <memory>

#include "actors/engine.hpp"
#include "device/backend.hpp"
#include "storage/host/host_model.hpp"

namespace mt::node {

class BackendPinning final : public HostPinningHook {
 public:
  explicit BackendPinning(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}
  void pin(void* data, std::size_t bytes) override {
    backend_->register_host(data, bytes);
    pinned_bytes_ += bytes;
  }
  void unpin(void* data, std::size_t bytes) override {
    backend_->unregister_host(data, bytes);
    pinned_bytes_ -= bytes;
  }
  std::size_t pinned_bytes() const { return pinned_bytes_; }

 private:
  std::unique_ptr<Backend> backend_;
  std::size_t pinned_bytes_ = 0;
};

// The run's pinning hook: null for the CPU backend (nothing to pin), else a BackendPinning over a
// backend of device.backend on device 0 (CUDA registers the ranges as portable: every GPU sees them).
std::unique_ptr<BackendPinning> host_pinning_for(const TrainConfig& cfg, const plan::EnginePlan& plan);

}  // namespace mt::node
