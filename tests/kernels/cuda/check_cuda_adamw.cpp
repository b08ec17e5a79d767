// The CUDA AdamW kernel against the CPU reference, on a GPU: parameters and both moments bit for bit
// after three steps, every CUDA call checked. Exit 77 tells ctest "skipped" (no GPU).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/cuda/adamw.hpp"

namespace {

// Any CUDA failure ends the check with its name and the call that failed (never a silent pass).
void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "check_cuda_adamw: %s failed: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  std::exit(1);
}

}  // namespace

int main() {
  if (mt::cuda::device_sm_count() == 0) {
    std::puts("no usable GPU: skipped");
    return 77;
  }
  const std::size_t n = 10'000'003;
  std::vector<float> p(n), g(n), m(n), v(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < n; ++i)
    p[i] = normal(rng), g[i] = normal(rng), m[i] = 0.1f * normal(rng), v[i] = 0.01f * std::abs(normal(rng));
  float* d[4];
  for (auto*& ptr : d) check(cudaMalloc(&ptr, n * sizeof(float)), "cudaMalloc");
  const std::vector<float>* host[4] = {&p, &g, &m, &v};
  for (int k = 0; k < 4; ++k)
    check(cudaMemcpy(d[k], host[k]->data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  mt::AdamWHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.1f;
  for (int step = 1; step <= 3; ++step) {
    const auto s = mt::make_adamw_step(h, step, 0.5f);
    if (mt::cuda::adamw(d[0], d[1], d[2], d[3], n, s, nullptr) != 0) {
      std::fprintf(stderr, "check_cuda_adamw: the kernel launch failed at step %d\n", step);
      return 1;
    }
    check(cudaGetLastError(), "the AdamW kernel");
    mt::cpu::adamw(p.data(), g.data(), m.data(), v.data(), n, s, 2);
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const char* names[4] = {"p", "g", "m", "v"};
  std::size_t total = 0;
  for (int k : {0, 2, 3}) {  // the updated state: parameters and both moments
    std::vector<float> out(n);
    check(cudaMemcpy(out.data(), d[k], n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) mismatches += out[i] != (*host[k])[i];
    std::printf("CUDA AdamW vs CPU fast kernel, %s: %zu of %zu elements differ in any bit\n", names[k], mismatches, n);
    total += mismatches;
  }
  for (auto* ptr : d) check(cudaFree(ptr), "cudaFree");
  return total == 0 ? 0 : 1;
}
