// The CPU backend: device memory is a bounded, pre-faulted host allocation (the arena's stand-in for
// GPU memory), the link is the copy engine (device/cpu/copy_engine.hpp: worker threads, FIFO per
// direction, an optional bandwidth limit standing in for PCIe), and the stage operations are the
// stages of kernels/stages.hpp over the CPU ops (kernels/cpu/cpu_ops.hpp), run synchronously on the
// calling thread with `compute_threads` OpenMP threads. Compute is synchronous, so ordering rules 1-3 of backend.hpp
// hold by construction: a stage operation has finished when it returns.
#pragma once
#include <memory>
#include <vector>

#include "device/backend.hpp"
#include "device/cpu/copy_engine.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "storage/host/aligned_buffer.hpp"

namespace mt {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  const char* name() const override { return "cpu"; }
  std::string describe() const override;
  Precision precision() const override { return options_.precision; }

  std::byte* allocate_device(std::size_t bytes) override;
  std::byte* allocate_mapped_host(std::size_t bytes) override;
  void register_host(void*, std::size_t) override {}
  void unregister_host(void*, std::size_t) override {}

  // Without a modelled link (copy_bandwidth_gbps = 0) the "device" is host memory: loads map the
  // tiles and gradients are summed from the staging slot in place.
  bool shares_host_memory() const override { return options_.link_bytes_per_s <= 0; }
  void set_compute_threads(int threads) override;
  void accumulate_to_host(const float* device_src, float* host_acc, std::size_t n, bool first, int threads) override;

  void copy_async(LinkDirection dir, const void* src, void* dst, std::size_t bytes,
                  std::function<void()> on_done) override;
  void wait_link_idle() override;
  LinkStats link_stats() const override;

  void fill_zero(void* device_dst, std::size_t bytes) override;
  void copy_on_device(void* device_dst, const void* device_src, std::size_t bytes) override;
  void synchronize() override {}

  const token_t* upload_tokens(const token_t* host_tokens, std::size_t, int) override { return host_tokens; }
  const float* upload_floats(const float* host, std::size_t, int) override { return host; }
  Ops& ops() override { return ops_; }
  // Every CPU "device" is host memory: a plain host reduction, grads[0] += grads[d] for d = 1, 2, ...
  void reduce_gradients(const std::vector<Backend*>& devices, const std::vector<float*>& grads,
                        std::size_t floats) override;

 protected:
  void check_ids(const ModelConfig& c, const token_t* ids, std::int64_t n, bool targets, const char* what) override;

 private:
  BackendOptions options_;
  ComputeCtx ctx_;
  cpu::CpuOps ops_;
  CopyEngine copy_;
  std::vector<AlignedBuffer> memory_;
};

}  // namespace mt
