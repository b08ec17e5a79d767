// Helpers of the GPU checks (check_cuda_*.cpp): device buffers, transfers, and a verdict per
// comparison printed as one line each, so a failing run can be debugged from its output alone.
// Exit codes: 0 all passed, 1 a comparison failed or a CUDA call threw, 77 no usable GPU (ctest: skipped).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "device/cuda/device_probe.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace mt::cuda::check {

// Exits 77 (skipped) without a GPU: never a pass.
inline void require_gpu(const char* program) {
  const DeviceProbe p = probe_devices();
  if (p.count == 0) {
    std::printf("%s: no usable GPU (%s): skipped\n", program, p.reason.c_str());
    std::exit(77);
  }
  std::printf("%s: %d GPU(s), first: %s\n", program, p.count, p.reason.c_str());
}

template <class T>
struct DevBuf {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t count) : n(count) {
    MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size()) { upload(host); }
  ~DevBuf() { cudaFree(ptr); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  // A pageable cudaMemcpy may return before its bytes land and is not ordered with the backends'
  // non-blocking streams: the device is drained before (queued readers) and after (the copy itself).
  void upload(const std::vector<T>& host) {
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemcpy(ptr, host.data(), std::min(n, host.size()) * sizeof(T), cudaMemcpyHostToDevice));
    MT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> out(n);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

struct Verdicts {
  int passed = 0, failed = 0;
  // Norm-wise relative error of got against the CPU reference, within tol.
  template <class A, class B>
  void close(const std::string& what, const std::vector<A>& got, const std::vector<B>& ref, double tol) {
    const double e = test::rel_err(got, ref);
    const bool ok = got.size() == ref.size() && e <= tol && std::isfinite(e);
    std::printf("%s %-70s rel_err %.3e (tol %.0e, %zu values)\n", ok ? "PASS" : "FAIL", what.c_str(), e, tol,
                ref.size());
    (ok ? passed : failed)++;
  }
  template <class T>
  void bit_equal(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
    std::size_t diff = a.size() == b.size() ? 0 : 1;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
    const bool ok = diff == 0;
    std::printf("%s %-70s %zu of %zu values differ in any bit\n", ok ? "PASS" : "FAIL", what.c_str(), diff, a.size());
    (ok ? passed : failed)++;
  }
  void scalar(const std::string& what, double got, double ref, double tol) {
    const double e = std::abs(got - ref) / std::max(1e-30, std::abs(ref));
    const bool ok = e <= tol && std::isfinite(got);
    std::printf("%s %-70s %.9g vs CPU %.9g (rel %.2e, tol %.0e)\n", ok ? "PASS" : "FAIL", what.c_str(), got, ref, e,
                tol);
    (ok ? passed : failed)++;
  }
  void fact(const std::string& what, bool ok) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    (ok ? passed : failed)++;
  }
  int finish(const char* program) const {
    std::printf("%s: %d passed, %d failed\n", program, passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
  }
};

}  // namespace mt::cuda::check
