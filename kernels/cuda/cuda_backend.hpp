// The CUDA backend behind kernels/backend.hpp (device.backend = cuda). Plain C++: make_backend
// (kernels/backend.cpp) calls this in builds with MEGATRAIN_HAVE_CUDA. See cuda_backend_impl.hpp.
#pragma once
#include <memory>

#include "kernels/backend.hpp"

namespace mt::cuda {

// Throws BackendUnavailable when the GPU options.device_index is not usable.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace mt::cuda
