// Host-side arithmetic of the multi-GPU gradient reduction (nccl_reduce.hpp): how a stage's gradient
// buffer is cut into chunks, how much scratch device 0 needs, and the checks of a reduce_gradients call.
// Plain C++ (no CUDA headers), so CI tests it without a GPU.
//
// Device 0 receives each other device's chunk into its own scratch slot, then adds the slots to its
// buffer in device order; the scratch holds (devices - 1) chunks, so it is bounded by the per-peer chunk
// times the peers, however large the stage, and never more than kReduceScratchCapBytes.
#pragma once
#include <algorithm>
#include <cstddef>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::cuda {

inline constexpr std::size_t kReduceChunkBytes = std::size_t{64} << 20;        // per peer, at most
inline constexpr std::size_t kReduceScratchCapBytes = std::size_t{256} << 20;  // all peers together

struct ReduceChunk {
  std::size_t offset = 0;  // in floats
  std::size_t floats = 0;
};

// Floats per peer per chunk for `devices` devices: 64 MiB, less when the peers' slots together would
// pass the cap (5 or more devices), never below one float.
inline std::size_t reduce_chunk_floats(int devices) {
  if (devices < 2) throw std::invalid_argument("reduce_chunk_floats: needs at least 2 devices");
  const std::size_t peers = static_cast<std::size_t>(devices - 1);
  const std::size_t bytes = std::min(kReduceChunkBytes, kReduceScratchCapBytes / peers);
  return std::max<std::size_t>(1, bytes / sizeof(float));
}

// [0, floats) in consecutive chunks of chunk_floats (the last one shorter); none for an empty buffer.
inline std::vector<ReduceChunk> reduce_chunks(std::size_t floats, std::size_t chunk_floats) {
  if (chunk_floats == 0) throw std::invalid_argument("reduce_chunks: chunk_floats must be > 0");
  std::vector<ReduceChunk> out;
  for (std::size_t off = 0; off < floats; off += chunk_floats)
    out.push_back({off, std::min(chunk_floats, floats - off)});
  return out;
}

// Scratch floats device 0 needs to reduce `floats` per device: one (possibly short) chunk per peer.
inline std::size_t reduce_scratch_floats(std::size_t floats, std::size_t chunk_floats, int devices) {
  if (devices < 2) return 0;
  return std::min(floats, chunk_floats) * static_cast<std::size_t>(devices - 1);
}

// NCCL's own device memory on each GPU of the communicator (its channels' buffers to the peers): an
// allowance, not yet measured on a multi-GPU machine.
inline constexpr std::size_t kNcclAllowanceBytes = std::size_t{256} << 20;

// Device memory the reduction needs beside the arena on the GPU of rank `rank` of `devices`: NCCL's
// allowance, and on rank 0 the largest scratch it can ask for. Added to the arena fit check's reserve.
inline std::size_t reduce_reserve_bytes(int devices, int rank) {
  if (devices < 2) return 0;
  const std::size_t scratch =
      rank == 0 ? reduce_chunk_floats(devices) * sizeof(float) * static_cast<std::size_t>(devices - 1) : 0;
  return scratch + kNcclAllowanceBytes;
}

// The checks of Backend::reduce_gradients on the CUDA backend, given each device backend's GPU index
// (-1: not a CUDA backend) and its buffer: one buffer per device, called on the first, distinct GPUs,
// no null buffer when there is something to add. Throws std::invalid_argument saying which.
inline void check_reduce_call(const std::vector<int>& gpus, const std::vector<const float*>& grads, std::size_t floats,
                              bool called_on_first) {
  const std::string what = "CUDA reduce_gradients: ";
  if (gpus.empty() || gpus.size() != grads.size())
    throw std::invalid_argument(what + "needs one buffer per device (" + std::to_string(gpus.size()) + " devices, " +
                                std::to_string(grads.size()) + " buffers)");
  if (!called_on_first) throw std::invalid_argument(what + "must be called on device 0's backend (devices[0])");
  std::set<int> seen;
  for (std::size_t d = 0; d < gpus.size(); ++d) {
    if (gpus[d] < 0)
      throw std::invalid_argument(what + "device " + std::to_string(d) +
                                  " is not a CUDA backend (every device of a run has the same backend)");
    if (!seen.insert(gpus[d]).second)
      throw std::invalid_argument(what + "GPU " + std::to_string(gpus[d]) + " appears twice (device " +
                                  std::to_string(d) + ")");
    if (floats > 0 && grads[d] == nullptr)
      throw std::invalid_argument(what + "device " + std::to_string(d) + "'s buffer is null");
  }
}

}  // namespace mt::cuda
