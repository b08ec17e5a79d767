// CUDA AdamW over device-resident fp32 tensors (same math and constants as kernels/adamw.hpp).
#pragma once
#include <cstddef>

#include "kernels/adamw.hpp"

namespace mt::cuda {

// Enqueues the update on `stream` (a cudaStream_t passed as void* so this header needs no CUDA headers).
// Returns the cudaError_t value as int (0 = success).
int adamw(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s, void* stream);

// Number of multiprocessors of the current device, or 0 without a usable GPU.
int device_sm_count();

}  // namespace mt::cuda
