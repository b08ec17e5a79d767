// Error checks for every CUDA runtime and cuBLASLt call: a failure throws std::runtime_error naming the
// call as written, the file and line, the library's error name and text, and where the calling thread
// was (fault_context.hpp: stage, layer, step, op, last kernel). Never a silent failure.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/fault_context.hpp"

namespace mt::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")" + describe_fault(fault_context()));
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string("cuBLASLt: ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": status " + std::to_string(static_cast<int>(s)) + " (" + cublasLtGetStatusName(s) + ": " +
                           cublasLtGetStatusString(s) + ")" + describe_fault(fault_context()));
}

// Keeps the calling thread's current device across a call that switches devices (CAF worker threads
// are shared: a call leaves the device it found). Restoring is best effort (destructors do not throw).
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() {
    if (cudaGetDevice(&device_) != cudaSuccess) device_ = -1;
  }
  ~KeepCurrentDevice() {
    if (device_ >= 0) cudaSetDevice(device_);
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int device_ = -1;
};

}  // namespace mt::cuda

#define MT_CUDA_CHECK(call)                                                                           \
  do {                                                                                                \
    const cudaError_t mt_cuda_err_ = (call);                                                          \
    if (mt_cuda_err_ != cudaSuccess) ::mt::cuda::throw_cuda(mt_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define MT_CUBLAS_CHECK(call)                                                                                       \
  do {                                                                                                              \
    const cublasStatus_t mt_cublas_st_ = (call);                                                                    \
    if (mt_cublas_st_ != CUBLAS_STATUS_SUCCESS) ::mt::cuda::throw_cublas(mt_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration, too much shared memory); then the
// kernel is the thread's last (a later asynchronous fault names it).
#define MT_CUDA_LAUNCH_CHECK(name)                                                                                \
  do {                                                                                                            \
    const cudaError_t mt_cuda_err_ = cudaGetLastError();                                                          \
    if (mt_cuda_err_ != cudaSuccess) ::mt::cuda::throw_cuda(mt_cuda_err_, "launching " name, __FILE__, __LINE__); \
    ::mt::cuda::note_kernel(name);                                                                                \
  } while (0)
