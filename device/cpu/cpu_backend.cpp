#include "device/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <future>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/ops.hpp"
#include "kernels/step_math.hpp"

namespace mt {
namespace {

CopyEngineOptions link_options(const BackendOptions& o) {
  CopyEngineOptions c;
  c.workers = std::clamp(o.link_workers, 1, 2);
  c.bandwidth_bytes_per_s = o.link_bytes_per_s;
  return c;
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : options_(options), ops_(options.precision, options.compute_threads), copy_(link_options(options)) {
  ctx_.threads = std::max(1, options.compute_threads);
  ctx_.head_chunk = options.head_chunk;
  head_chunk_ = options.head_chunk;
  ctx_.seq_tile = options.seq_tile;
  seq_tile_ = options.seq_tile;
  ctx_.precision = options.precision;
}

CpuBackend::~CpuBackend() { copy_.shutdown(); }

std::string CpuBackend::describe() const {
  return std::string("cpu backend: ") + precision_name(options_.precision) + " compute, " +
         std::to_string(ctx_.threads) + " compute thread(s), GEMM " + cpu::gemm_backend_name() + ", link " +
         (options_.link_bytes_per_s > 0 ? std::to_string(options_.link_bytes_per_s / 1e9) + " GB/s per direction"
                                        : std::string("unlimited (memcpy)"));
}

std::byte* CpuBackend::allocate_device(std::size_t bytes) {
  memory_.emplace_back(bytes, "the device arena", /*zero_fill=*/true);
  return memory_.back().data();
}

std::byte* CpuBackend::allocate_mapped_host(std::size_t bytes) {
  memory_.emplace_back(bytes, "the mapped layer boundaries", /*zero_fill=*/false);
  return memory_.back().data();
}

void CpuBackend::copy_async(LinkDirection dir, const void* src, void* dst, std::size_t bytes,
                            std::function<void()> on_done) {
  CopyJob job;
  job.direction = dir == LinkDirection::host_to_device ? CopyDirection::host_to_device : CopyDirection::device_to_host;
  job.src = src;
  job.dst = dst;
  job.bytes = bytes;
  job.on_done = std::move(on_done);
  copy_.submit(std::move(job));
}

void CpuBackend::set_compute_threads(int threads) {
  ops_.set_threads(threads);
  ctx_.threads = ops_.threads();
}

void CpuBackend::accumulate_to_host(const float* device_src, float* host_acc, std::size_t n, bool first, int threads) {
  if (!shares_host_memory()) Backend::accumulate_to_host(device_src, host_acc, n, first, threads);
  if (first)
    cpu::accumulate_first(host_acc, device_src, n, threads);
  else
    cpu::accumulate(host_acc, device_src, n, threads);
}

void CpuBackend::wait_link_idle() { copy_.wait_idle(); }

LinkStats CpuBackend::link_stats() const {
  const CopyEngineStats s = copy_.stats();
  LinkStats out;
  for (int d = 0; d < 2; ++d) {
    out.direction[d].copies = s.direction[d].jobs;
    out.direction[d].bytes = s.direction[d].bytes;
    out.direction[d].busy_seconds = s.direction[d].busy_seconds;
  }
  return out;
}

void CpuBackend::fill_zero(void* device_dst, std::size_t bytes) {
  // A gradient slot before each backward (megabytes): on compute's threads, which would wait otherwise.
  if (bytes % sizeof(float) == 0 && reinterpret_cast<std::uintptr_t>(device_dst) % alignof(float) == 0)
    cpu::zero(static_cast<float*>(device_dst), bytes / sizeof(float), ctx_.threads);
  else
    std::memset(device_dst, 0, bytes);
}

void CpuBackend::copy_on_device(void* device_dst, const void* device_src, std::size_t bytes) {
  std::memcpy(device_dst, device_src, bytes);
}

void CpuBackend::reduce_gradients(const std::vector<Backend*>& devices, const std::vector<float*>& grads,
                                  std::size_t floats) {
  if (devices.size() != grads.size() || devices.empty() || devices[0] != this)
    throw std::invalid_argument("reduce_gradients: one buffer per device, called on device 0's backend");
  for (std::size_t d = 1; d < grads.size(); ++d) cpu::accumulate(grads[0], grads[d], floats, ctx_.threads);
}

void CpuBackend::check_ids(const ModelConfig& c, const token_t* ids, std::int64_t n, bool targets, const char*) {
  if (targets)
    validate_targets(c, ids, static_cast<std::size_t>(n));  // host memory: the ids themselves
  else
    validate_tokens(c, ids, static_cast<std::size_t>(n));
}

}  // namespace mt
