#include <nccl.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "device/cuda/nccl_check.hpp"
#include "device/cuda/nccl_reduce.hpp"
#include "device/cuda/reduce_plan.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_util.cuh"

namespace mt::cuda {
namespace {

// A failed NCCL call: the call as written, where it ran (a GPU, or the group over every GPU), NCCL's
// error and its last message (often the actual cause: a topology or memory problem).
void nccl_check(ncclResult_t r, const char* call, const std::string& where) {
  if (r == ncclSuccess) return;
  throw std::runtime_error(std::string("NCCL: ") + call + " on " + where + " failed: " + nccl_error_text(r));
}
#define MT_NCCL_CHECK(call, where) nccl_check((call), #call, (where))

std::string gpu_name(int gpu) { return "GPU " + std::to_string(gpu); }

ncclComm_t comm(void* c) { return static_cast<ncclComm_t>(c); }

__global__ void add_peers_kernel(float* __restrict__ acc, const float* __restrict__ peers, std::size_t count,
                                 int peer_count) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float s = acc[i];
    for (int p = 0; p < peer_count; ++p) s += peers[p * count + i];  // device order: bit-equal to the host's
    acc[i] = s;
  }
}

}  // namespace

void add_peers_in_order(float* acc, const float* peers, std::size_t count, int peer_count, cudaStream_t st) {
  if (count == 0 || peer_count == 0) return;
  add_peers_kernel<<<grid_for(count, 256), 256, 0, st>>>(acc, peers, count, peer_count);
  MT_CUDA_LAUNCH_CHECK("add_peers_kernel");
}

NcclReducer::NcclReducer(std::vector<int> gpus, std::size_t chunk_floats)
    : gpus_(std::move(gpus)), chunk_floats_(chunk_floats) {
  if (gpus_.size() < 2) throw std::invalid_argument("NcclReducer: needs at least 2 GPUs");
  if (chunk_floats_ == 0) throw std::invalid_argument("NcclReducer: chunk_floats must be > 0");
  KeepCurrentDevice keep;
  const int n = size();
  std::vector<ncclComm_t> c(gpus_.size());
  MT_NCCL_CHECK(ncclCommInitAll(c.data(), n, gpus_.data()), all_gpus());
  for (ncclComm_t x : c) comms_.push_back(x);
  try {
    for (int r = 0; r < n; ++r) {
      MT_CUDA_CHECK(cudaSetDevice(gpus_[r]));
      cudaStream_t s = nullptr;
      MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
      cudaEvent_t e = nullptr;
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      done_.push_back(e);
    }
  } catch (...) {
    release();
    throw;
  }
}

NcclReducer::~NcclReducer() { release(); }

std::string NcclReducer::all_gpus() const {
  std::string s = "GPUs";
  for (std::size_t r = 0; r < gpus_.size(); ++r) s += (r ? ", " : " ") + std::to_string(gpus_[r]);
  return s;
}

void NcclReducer::release() {
  // Best effort: nothing throws from here. Finalise every rank in one group (one thread drives them
  // all: finalising one rank at a time would wait for peers not yet finalised), then free.
  KeepCurrentDevice keep;
  for (std::size_t r = 0; r < streams_.size(); ++r) cudaSetDevice(gpus_[r]), cudaStreamSynchronize(streams_[r]);
  if (!comms_.empty()) {
    ncclGroupStart();
    for (void* c : comms_) ncclCommFinalize(comm(c));
    ncclGroupEnd();
    for (void* c : comms_) ncclCommDestroy(comm(c));
    comms_.clear();
  }
  for (std::size_t r = 0; r < streams_.size(); ++r) cudaSetDevice(gpus_[r]), cudaStreamDestroy(streams_[r]);
  for (std::size_t r = 0; r < done_.size(); ++r) cudaSetDevice(gpus_[r]), cudaEventDestroy(done_[r]);
  streams_.clear(), done_.clear();
  if (scratch_) cudaSetDevice(gpus_[0]), cudaFree(scratch_);
  scratch_ = nullptr;
}

void NcclReducer::ensure_scratch(std::size_t floats) {
  const std::size_t need = reduce_scratch_floats(floats, chunk_floats_, size());
  if (need <= scratch_floats_) return;
  MT_CUDA_CHECK(cudaSetDevice(gpus_[0]));
  MT_CUDA_CHECK(cudaStreamSynchronize(streams_[0]));  // the old scratch may still be read
  MT_CUDA_CHECK(cudaFree(scratch_));
  scratch_ = nullptr;
  scratch_floats_ = 0;
  const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&scratch_), need * sizeof(float));
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA: cudaMalloc of the gradient reduction's scratch (" +
                             std::to_string(need * sizeof(float)) + " bytes) on GPU " + std::to_string(gpus_[0]) +
                             " failed: " + cudaGetErrorName(e) + "; lower device.max_vram_gb");
  scratch_floats_ = need;
}

void NcclReducer::reduce_to_first(const std::vector<float*>& grads, std::size_t floats,
                                  const std::vector<cudaEvent_t>& after) {
  const int n = size();
  if (static_cast<int>(grads.size()) != n || static_cast<int>(after.size()) != n)
    throw std::invalid_argument("NcclReducer: one buffer and event per GPU (" + std::to_string(n) + ")");
  KeepCurrentDevice keep;
  ensure_scratch(floats);
  for (int r = 0; r < n; ++r) {
    MT_CUDA_CHECK(cudaSetDevice(gpus_[r]));
    if (after[r]) MT_CUDA_CHECK(cudaStreamWaitEvent(streams_[r], after[r], 0));
  }
  for (const ReduceChunk& c : reduce_chunks(floats, chunk_floats_)) {
    // Peer p's part of this chunk lands at scratch + (p - 1) * c.floats: contiguous for the adding kernel.
    MT_NCCL_CHECK(ncclGroupStart(), all_gpus());
    try {
      for (int r = 1; r < n; ++r) {
        MT_CUDA_CHECK(cudaSetDevice(gpus_[0]));
        MT_NCCL_CHECK(ncclRecv(scratch_ + static_cast<std::size_t>(r - 1) * c.floats, c.floats, ncclFloat32, r,
                               comm(comms_[0]), streams_[0]),
                      gpu_name(gpus_[0]));
        MT_CUDA_CHECK(cudaSetDevice(gpus_[r]));
        MT_NCCL_CHECK(ncclSend(grads[r] + c.offset, c.floats, ncclFloat32, 0, comm(comms_[r]), streams_[r]),
                      gpu_name(gpus_[r]));
      }
    } catch (...) {
      ncclGroupEnd();  // leave no group open on this thread; the first error is the one reported
      throw;
    }
    MT_NCCL_CHECK(ncclGroupEnd(), all_gpus());
    MT_CUDA_CHECK(cudaSetDevice(gpus_[0]));
    // The next chunk's receives are on the same stream: they overwrite the scratch after this read it.
    add_peers_in_order(grads[0] + c.offset, scratch_, c.floats, n - 1, streams_[0]);
  }
  for (int r = 0; r < n; ++r) {
    MT_CUDA_CHECK(cudaSetDevice(gpus_[r]));
    MT_CUDA_CHECK(cudaEventRecord(done_[r], streams_[r]));
  }
}

}  // namespace mt::cuda
