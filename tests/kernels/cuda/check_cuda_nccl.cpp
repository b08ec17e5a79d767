// The NCCL gradient reduction over every GPU of this machine (kernels/cuda/nccl_reduce.hpp): the
// deterministic mode equals a host reduction in rank order bit for bit; the fast mode is within 1e-6.
// With one GPU the communicator has one rank (the sum is the buffer itself). Exit 77 without a GPU.
#include <cstdio>
#include <vector>

#include "kernels/cuda/nccl_reduce.hpp"
#include "tests/kernels/cuda/cuda_check_util.hpp"

using namespace mt;
using namespace mt::cuda::check;

int main() {
  require_gpu("check_cuda_nccl");
  Verdicts v;
  try {
    int gpus = 0;
    MT_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    cuda::NcclReducer red(gpus);
    const std::size_t count = 1000003;
    std::vector<std::vector<float>> host;
    std::vector<float*> bufs, scratch;
    std::vector<cudaStream_t> streams;
    for (int g = 0; g < gpus; ++g) {
      host.push_back(test::randn(count, 100 + g));
      MT_CUDA_CHECK(cudaSetDevice(g));
      float *b = nullptr, *s = nullptr;
      cudaStream_t st = nullptr;
      MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b), count * 4));
      MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s), count * 4 * gpus));
      MT_CUDA_CHECK(cudaStreamCreate(&st));
      MT_CUDA_CHECK(cudaMemcpy(b, host[g].data(), count * 4, cudaMemcpyHostToDevice));
      bufs.push_back(b), scratch.push_back(s), streams.push_back(st);
    }
    std::vector<float> ref = host[0];
    for (int g = 1; g < gpus; ++g)
      for (std::size_t i = 0; i < count; ++i) ref[i] += host[g][i];
    red.all_reduce_sum(bufs, count, streams, scratch);
    for (int g = 0; g < gpus; ++g) {
      MT_CUDA_CHECK(cudaSetDevice(g));
      MT_CUDA_CHECK(cudaStreamSynchronize(streams[g]));
      std::vector<float> out(count);
      MT_CUDA_CHECK(cudaMemcpy(out.data(), bufs[g], count * 4, cudaMemcpyDeviceToHost));
      v.bit_equal("deterministic all-reduce on GPU " + std::to_string(g) + " of " + std::to_string(gpus) +
                      " vs the host sum in rank order",
                  out, ref);
      MT_CUDA_CHECK(cudaMemcpy(bufs[g], host[g].data(), count * 4, cudaMemcpyHostToDevice));
    }
    red.all_reduce_sum_fast(bufs, count, streams);
    for (int g = 0; g < gpus; ++g) {
      MT_CUDA_CHECK(cudaSetDevice(g));
      MT_CUDA_CHECK(cudaStreamSynchronize(streams[g]));
      std::vector<float> out(count);
      MT_CUDA_CHECK(cudaMemcpy(out.data(), bufs[g], count * 4, cudaMemcpyDeviceToHost));
      v.close("ncclAllReduce on GPU " + std::to_string(g), out, ref, 1e-6);
      cudaFree(bufs[g]), cudaFree(scratch[g]), cudaStreamDestroy(streams[g]);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    v.failed++;
  }
  return v.finish("check_cuda_nccl");
}
