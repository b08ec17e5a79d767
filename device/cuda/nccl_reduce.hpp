// Gradient reduction across the GPUs of one node with NCCL (built under MEGATRAIN_HAVE_NCCL), for
// `device.gpus = N`: one process drives every GPU, one communicator rank per GPU. The CUDA backend's
// Backend::reduce_gradients (cuda_backend.cpp) owns one, made on its first call.
//
// One mode, deterministic: every other rank's buffer is sent to rank 0 (grouped ncclSend / ncclRecv)
// chunk by chunk into rank 0's scratch (reduce_plan.hpp: at most 64 MiB per peer, 256 MiB in all), and a
// kernel on rank 0 adds the chunks to rank 0's buffer in rank order, ((g0 + g1) + g2) + ...: the same
// fp32 additions in the same order as the CPU backend's host reduction, so the result is bit-identical
// to it and does not depend on NCCL's algorithm, protocol or topology. NCCL's own ncclReduce adds in
// its ring's order (equal only to rounding) and is not offered.
//
// Streams: the reducer has its own stream on every GPU, so the transfer overlaps the devices' compute.
// Ordering with the callers' streams is by events only (no host wait): rank r starts after the event
// `after[r]` (the end of the work that wrote buffer r), and done(r) marks the end of rank r's part
// (rank 0: the sum is in place; rank r > 0: its buffer has been read and may be rewritten), for the
// caller's streams to wait on.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace mt::cuda {

class NcclReducer {
 public:
  // Communicators over `gpus` (rank r on GPU gpus[r], ncclCommInitAll), and a stream and an event on
  // each. Throws std::runtime_error naming the NCCL or CUDA call and the GPU.
  NcclReducer(std::vector<int> gpus, std::size_t chunk_floats);
  ~NcclReducer();
  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;

  int size() const { return static_cast<int>(gpus_.size()); }
  const std::vector<int>& gpus() const { return gpus_; }

  // grads[0] (on GPU gpus[0]) := ((grads[0] + grads[1]) + ...) + grads[N-1], element-wise over `floats`;
  // grads[1..] unchanged. Enqueued after after[r] (null: no wait) on each rank; returns without waiting
  // for the devices (the current device is restored). One caller at a time: done() is the last call's.
  void reduce_to_first(const std::vector<float*>& grads, std::size_t floats, const std::vector<cudaEvent_t>& after);
  // Recorded on rank r's stream at the end of the last reduce_to_first.
  cudaEvent_t done(int rank) const { return done_.at(static_cast<std::size_t>(rank)); }

 private:
  void ensure_scratch(std::size_t floats);
  void release();                // idempotent: what the constructor made, on error paths too
  std::string all_gpus() const;  // "GPUs 0, 1, 2", for errors of calls over every rank

  std::vector<int> gpus_;
  std::size_t chunk_floats_ = 0;
  std::vector<void*> comms_;  // ncclComm_t, kept opaque so this header needs no nccl.h
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> done_;
  float* scratch_ = nullptr;  // on gpus_[0]: one chunk per peer
  std::size_t scratch_floats_ = 0;
};

// acc[i] = ((acc[i] + peers[i]) + peers[count + i]) + ... over `peer_count` peers, in that order.
void add_peers_in_order(float* acc, const float* peers, std::size_t count, int peer_count, cudaStream_t st);

}  // namespace mt::cuda
