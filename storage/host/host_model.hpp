// Every persistent tensor of a model in host RAM: one HostTile per stage (0 embedding, 1..L layers,
// L+1 head), sized from the ParamLayout of that stage. Host memory grows linearly with depth and is
// reported; device memory (DeviceArena) does not depend on depth at all.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/model_config.hpp"
#include "kernels/param_layout.hpp"
#include "storage/host/host_tile.hpp"

namespace mt {

// Registers host memory with the device driver so copies can use DMA (cudaHostRegister on CUDA).
// The CPU backend needs nothing: the default hook does nothing.
class HostPinningHook {
 public:
  virtual ~HostPinningHook() = default;
  virtual void pin(void* /*data*/, std::size_t /*bytes*/) {}
  virtual void unpin(void* /*data*/, std::size_t /*bytes*/) {}
};

// Host bytes a model needs with these options, before allocating anything (for reports and checks).
std::size_t host_model_bytes(const ModelConfig& cfg, const HostTileOptions& options = {});

class HostModel {
 public:
  // Allocates every tile (and pins each one through `pinning` when given; the hook must outlive the
  // model). Throws std::invalid_argument for an invalid config, std::runtime_error when memory is short.
  explicit HostModel(const ModelConfig& cfg, const HostTileOptions& options = {}, HostPinningHook* pinning = nullptr);
  ~HostModel();
  HostModel(const HostModel&) = delete;
  HostModel& operator=(const HostModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  std::int64_t num_stages() const { return static_cast<std::int64_t>(tiles_.size()); }
  HostTile& tile(std::int64_t stage);  // throws std::out_of_range
  const HostTile& tile(std::int64_t stage) const;
  const ParamLayout& layout(std::int64_t stage) const;  // names and offsets inside each region

  std::size_t host_bytes() const;            // sum of every tile's allocation
  std::size_t largest_stage_floats() const;  // what a device weight slot must hold
  std::int64_t largest_stage() const;

  // abort_waits() on every tile (engine shutdown).
  void abort_all_waits();

 private:
  ModelConfig cfg_;
  std::vector<ParamLayout> layouts_;
  std::vector<std::unique_ptr<HostTile>> tiles_;  // HostTile holds a mutex: not movable
  HostPinningHook* pinning_;
};

}  // namespace mt
