// The CUDA AdamW kernel against the CPU reference, on a GPU. Exit 77 tells ctest "skipped" (no GPU).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/cuda/adamw.hpp"

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
  for (auto*& ptr : d)
    if (cudaMalloc(&ptr, n * sizeof(float)) != cudaSuccess) return 1;
  const std::vector<float>* host[4] = {&p, &g, &m, &v};
  for (int k = 0; k < 4; ++k) cudaMemcpy(d[k], host[k]->data(), n * sizeof(float), cudaMemcpyHostToDevice);
  mt::AdamWHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.1f;
  for (int step = 1; step <= 3; ++step) {
    const auto s = mt::make_adamw_step(h, step, 0.5f);
    if (mt::cuda::adamw(d[0], d[1], d[2], d[3], n, s, nullptr) != 0) return 1;
    mt::cpu::adamw(p.data(), g.data(), m.data(), v.data(), n, s, 2);
  }
  std::vector<float> out(n);
  cudaMemcpy(out.data(), d[0], n * sizeof(float), cudaMemcpyDeviceToHost);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) mismatches += out[i] != p[i];
  std::printf("CUDA AdamW vs CPU fast kernel: %zu of %zu elements differ in any bit\n", mismatches, n);
  for (auto* ptr : d) cudaFree(ptr);
  return mismatches == 0 ? 0 : 1;
}
