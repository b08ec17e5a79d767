// Gradient reduction across the GPUs of one node with NCCL (built under MEGATRAIN_HAVE_NCCL), for
// `device.gpus = N`: one process drives every GPU, one communicator rank per device. Not wired into the
// engine yet: the lead connects it where the multi-device protocol reduces a layer's gradients.
//
// Two modes, both in place (every device's buffer ends holding the sum):
//   - deterministic (the default): ncclAllGather of every rank's buffer, then each device sums the
//     gathered copies in rank order 0, 1, ..., N-1 with its own kernel: the same additions in the same
//     order as a host reduction ((g0 + g1) + g2) + ..., so results are bit-identical to it and do not
//     depend on NCCL's algorithm, protocol or topology. Moves N - 1 buffers into each device (the ring
//     all-reduce moves about 2), and needs N x count floats of scratch per device.
//   - fast: ncclAllReduce (sum). Deterministic run to run for a fixed NCCL configuration and topology,
//     but its summation order is NCCL's, not the host's.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace mt::cuda {

class NcclReducer {
 public:
  // Communicators over devices 0..gpus-1 (ncclCommInitAll). Throws std::runtime_error naming the call.
  explicit NcclReducer(int gpus);
  ~NcclReducer();
  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }

  // buffers[g] (on device g, `count` floats) := sum over all g, enqueued on streams[g]; returns once
  // enqueued (synchronise the streams to wait). `scratch[g]` (deterministic mode): gpus x count floats on
  // device g.
  void all_reduce_sum(const std::vector<float*>& buffers, std::size_t count, const std::vector<cudaStream_t>& streams,
                      const std::vector<float*>& scratch);
  void all_reduce_sum_fast(const std::vector<float*>& buffers, std::size_t count,
                           const std::vector<cudaStream_t>& streams);

 private:
  std::vector<void*> comms_;  // ncclComm_t, kept opaque so this header needs no nccl.h
};

// out[i] = sum over r = 0..ranks-1 of in[r * count + i], added in rank order (one thread per element).
void sum_ranks_in_order(const float* in, float* out, std::size_t count, int ranks, cudaStream_t st);

}  // namespace mt::cuda
