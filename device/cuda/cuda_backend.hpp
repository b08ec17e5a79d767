// The CUDA backend behind device/backend.hpp (device.backend = cuda). Plain C++: make_backend
// (device/backend.cpp) calls this in builds with MEGATRAIN_HAVE_CUDA. See cuda_backend_impl.hpp.
#pragma once
#include <memory>

#include "device/backend.hpp"

namespace mt::cuda {

// Throws BackendUnavailable when the GPU options.device_index is not usable.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace mt::cuda
