#include <nccl.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/nccl_reduce.hpp"

#define MT_NCCL_CHECK(call)                                                                       \
  do {                                                                                            \
    const ncclResult_t mt_nccl_r_ = (call);                                                       \
    if (mt_nccl_r_ != ncclSuccess)                                                                \
      throw std::runtime_error(std::string("NCCL: ") + #call + " failed at " + __FILE__ + ":" +   \
                               std::to_string(__LINE__) + ": " + ncclGetErrorString(mt_nccl_r_)); \
  } while (0)

namespace mt::cuda {
namespace {

__global__ void sum_ranks_kernel(const float* __restrict__ in, float* __restrict__ out, std::size_t count, int ranks) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float s = in[i];
    for (int r = 1; r < ranks; ++r) s += in[r * count + i];
    out[i] = s;
  }
}

ncclComm_t comm(void* c) { return static_cast<ncclComm_t>(c); }

}  // namespace

void sum_ranks_in_order(const float* in, float* out, std::size_t count, int ranks, cudaStream_t st) {
  if (count == 0) return;
  sum_ranks_kernel<<<grid_for(count, 256), 256, 0, st>>>(in, out, count, ranks);
  MT_CUDA_LAUNCH_CHECK("sum_ranks_kernel");
}

NcclReducer::NcclReducer(int gpus) {
  int count = 0;
  MT_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (gpus < 1 || gpus > count)
    throw std::invalid_argument("device.gpus = " + std::to_string(gpus) + " but this machine has " +
                                std::to_string(count) + " GPU(s)");
  std::vector<ncclComm_t> c(static_cast<std::size_t>(gpus));
  std::vector<int> devs(static_cast<std::size_t>(gpus));
  for (int g = 0; g < gpus; ++g) devs[g] = g;
  MT_NCCL_CHECK(ncclCommInitAll(c.data(), gpus, devs.data()));
  for (auto x : c) comms_.push_back(x);
}

NcclReducer::~NcclReducer() {
  for (void* c : comms_) ncclCommDestroy(comm(c));
}

void NcclReducer::all_reduce_sum(const std::vector<float*>& buffers, std::size_t count,
                                 const std::vector<cudaStream_t>& streams, const std::vector<float*>& scratch) {
  const int n = size();
  if (static_cast<int>(buffers.size()) != n || static_cast<int>(streams.size()) != n ||
      static_cast<int>(scratch.size()) != n)
    throw std::invalid_argument("NcclReducer: one buffer, stream and scratch per GPU");
  MT_NCCL_CHECK(ncclGroupStart());
  for (int g = 0; g < n; ++g) {
    MT_CUDA_CHECK(cudaSetDevice(g));
    MT_NCCL_CHECK(ncclAllGather(buffers[g], scratch[g], count, ncclFloat32, comm(comms_[g]), streams[g]));
  }
  MT_NCCL_CHECK(ncclGroupEnd());
  for (int g = 0; g < n; ++g) {
    MT_CUDA_CHECK(cudaSetDevice(g));
    sum_ranks_in_order(scratch[g], buffers[g], count, n, streams[g]);
  }
}

void NcclReducer::all_reduce_sum_fast(const std::vector<float*>& buffers, std::size_t count,
                                      const std::vector<cudaStream_t>& streams) {
  const int n = size();
  if (static_cast<int>(buffers.size()) != n || static_cast<int>(streams.size()) != n)
    throw std::invalid_argument("NcclReducer: one buffer and stream per GPU");
  MT_NCCL_CHECK(ncclGroupStart());
  for (int g = 0; g < n; ++g) {
    MT_CUDA_CHECK(cudaSetDevice(g));
    MT_NCCL_CHECK(ncclAllReduce(buffers[g], buffers[g], count, ncclFloat32, ncclSum, comm(comms_[g]), streams[g]));
  }
  MT_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace mt::cuda
