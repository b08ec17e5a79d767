// Device helpers shared by the CUDA kernels: warp reductions, bf16 loads, grid sizes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/precision.hpp"

namespace mt::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float bf16_bits_to_float(bf16_t h) {
  return __uint_as_float(static_cast<unsigned>(h) << 16);
}

// Element i of a weight vector of the run's precision, as fp32 (bf16 widening is exact).
__device__ __forceinline__ float load_w(const void* w, std::int64_t i, bool bf16) {
  return bf16 ? bf16_bits_to_float(static_cast<const bf16_t*>(w)[i]) : static_cast<const float*>(w)[i];
}

// Blocks for n elements at `per_block` each, capped (kernels loop grid-stride beyond the cap).
inline unsigned grid_for(std::size_t n, unsigned per_block, unsigned cap = 65535u * 8u) {
  const std::size_t g = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(g == 0 ? 1 : (g < cap ? g : cap));
}

}  // namespace mt::cuda
