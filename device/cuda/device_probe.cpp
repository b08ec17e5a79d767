#include "device/cuda/device_probe.hpp"

#include <cuda_runtime_api.h>

namespace mt::cuda {

DeviceProbe probe_devices() {
  DeviceProbe p;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    p.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    return p;
  }
  if (n == 0) {
    p.reason = "cudaGetDeviceCount found no device";
    return p;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    p.reason = std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
  p.count = n;
  return p;
}

}  // namespace mt::cuda
