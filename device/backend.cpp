#include "device/backend.hpp"

#include "device/cpu/cpu_backend.hpp"
#if MEGATRAIN_HAVE_CUDA
#include "device/cuda/cuda_backend.hpp"
#include "device/cuda/device_probe.hpp"
#endif

namespace mt {

void check_backend_available(const BackendOptions& options) {
  if (options.devices < 1)
    throw BackendUnavailable("must be >= 1, got " + std::to_string(options.devices), "device.gpus");
  if (options.kind == "cpu") return;
  if (options.kind != "cuda") throw BackendUnavailable("'" + options.kind + "' is not one of: cpu, cuda");
#if MEGATRAIN_HAVE_CUDA
  const cuda::DeviceProbe probe = cuda::probe_devices();
  if (probe.count == 0)
    throw BackendUnavailable("cuda needs a usable GPU and this machine has none (" + probe.reason +
                             "); use device.backend=cpu");
  if (options.device_index < 0 || options.device_index >= probe.count)
    throw BackendUnavailable("cuda: GPU " + std::to_string(options.device_index) + " does not exist (" +
                             std::to_string(probe.count) + " found)");
#if !MEGATRAIN_HAVE_NCCL
  if (options.devices > 1)
    throw BackendUnavailable(std::to_string(options.devices) +
                                 " GPUs need NCCL for the gradient reduction, and this build has none (configured "
                                 "without it); use device.gpus = 1",
                             "device.gpus");
#endif
  if (options.devices > probe.count)
    throw BackendUnavailable(std::to_string(options.devices) + " GPUs asked for, and this machine has " +
                                 std::to_string(probe.count) + " (" + probe.reason + ")",
                             "device.gpus");
#else
  throw BackendUnavailable(
      "cuda: this build has no CUDA backend (nvcc was not found when it was configured, or "
      "-DMEGATRAIN_CUDA=OFF); rebuild with the CUDA toolkit or use device.backend=cpu");
#endif
}

void Backend::accumulate_to_host(const float*, float*, std::size_t, bool, int) {
  throw std::logic_error(std::string("the ") + name() +
                         " backend does not share host memory: gradients reach the host over its link");
}

void Backend::reduce_gradients(const std::vector<Backend*>&, const std::vector<float*>&, std::size_t) {
  throw std::logic_error(std::string("the ") + name() +
                         " backend has no cross-device gradient reduction: device.gpus must be 1 with it");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  check_backend_available(options);
#if MEGATRAIN_HAVE_CUDA
  if (options.kind == "cuda") return cuda::make_cuda_backend(options);
#endif
  return std::make_unique<CpuBackend>(options);
}

}  // namespace mt
