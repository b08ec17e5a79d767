// CUDA AdamW: grid-stride, float4 loads, the same fused operations as the CPU kernel's lanes.
#include <cuda_runtime.h>

#include "kernels/cuda/adamw.hpp"
#include "kernels/cuda/launch_config.hpp"

namespace mt::cuda {
namespace {

__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, const AdamWStep& s) {
  const float grad = g * s.grad_scale;
  m = __fmaf_rn(s.one_minus_beta1, grad, s.beta1 * m);
  v = __fmaf_rn(s.one_minus_beta2 * grad, grad, s.beta2 * v);
  const float denom = __fmaf_rn(__fsqrt_rn(v), s.inv_sqrt_bias2, s.eps);
  p = __fmaf_rn(-s.step_size, __fdiv_rn(m, denom), p * s.decay_factor);
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, std::size_t n, AdamWStep s) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t vectors = n / 4;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    float4 pv = reinterpret_cast<float4*>(p)[i];
    const float4 gv = reinterpret_cast<const float4*>(g)[i];
    float4 mv = reinterpret_cast<float4*>(m)[i];
    float4 vv = reinterpret_cast<float4*>(v)[i];
    adamw_one(pv.x, gv.x, mv.x, vv.x, s);
    adamw_one(pv.y, gv.y, mv.y, vv.y, s);
    adamw_one(pv.z, gv.z, mv.z, vv.z, s);
    adamw_one(pv.w, gv.w, mv.w, vv.w, s);
    reinterpret_cast<float4*>(p)[i] = pv;
    reinterpret_cast<float4*>(m)[i] = mv;
    reinterpret_cast<float4*>(v)[i] = vv;
  }
  // The tail (n % 4 elements) goes to the first threads of block 0.
  if (blockIdx.x == 0 && threadIdx.x < n % 4) {
    const std::size_t i = vectors * 4 + threadIdx.x;
    adamw_one(p[i], g[i], m[i], v[i], s);
  }
}

}  // namespace

int device_sm_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return 0;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 0;
  return sms;
}

int adamw(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s, void* stream) {
  // float4 access needs 16-byte alignment; the host tiles and device slots are 64-byte aligned.
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(p) || misaligned(g) || misaligned(m) || misaligned(v)) return cudaErrorMisalignedAddress;
  const int sms = device_sm_count();
  if (sms == 0) return cudaErrorNoDevice;
  const LaunchConfig c = elementwise_launch(n, sms, 4);
  if (c.grid == 0) return cudaSuccess;
  adamw_kernel<<<c.grid, c.block, 0, static_cast<cudaStream_t>(stream)>>>(p, g, m, v, n, s);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace mt::cuda
