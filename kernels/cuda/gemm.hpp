// cuBLASLt matrix products for the stage operations, in the row-major terms of the CPU's linear
// kernels (cpu/ops.hpp): W is [out, in] as torch.nn.Linear. fp32 operands multiply in fp32 (or TF32
// when allowed); bf16 operands accumulate in fp32 into fp32 outputs. Each shape's plan (descriptors and
// the heuristic's algorithm) is chosen once and reused, so a shape always runs the same algorithm and
// its results are the same bits run after run. The plans are kept in a bounded LRU cache (a mixture
// of experts makes a new shape for nearly every expert of every step); a shape whose plan was dropped
// gets it again from the heuristic, which answers the same shape on the same GPU the same way.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/cuda/lru_cache.hpp"

namespace mt::cuda {

class Gemm {
 public:
  static constexpr std::size_t kMaxPlans = 1024;  // a plan is a few hundred host bytes
  Gemm(bool allow_tf32, std::size_t workspace_bytes = std::size_t{32} << 20, std::size_t max_plans = kMaxPlans);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Column-major C[m, n] (ldc) = op(A) op(B) + beta C; A and B fp32 or bf16 (`bf16`), C fp32.
  void matmul(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const void* A, std::int64_t lda,
              const void* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc, bool bf16, cudaStream_t st);

  // Row-major, as cpu::linear_*: y[N, out] = x[N, in] W^T
  void linear_forward(const void* x, const void* W, float* y, std::int64_t N, std::int64_t in, std::int64_t out,
                      bool bf16, cudaStream_t st);
  // dx[N, in] (= or +=) dy[N, out] W
  void linear_backward_input(const void* dy, const void* W, float* dx, std::int64_t N, std::int64_t in,
                             std::int64_t out, bool add, bool bf16, cudaStream_t st);
  // dW[out, in] += dy^T x
  void linear_backward_weight(const void* dy, const void* x, float* dW, std::int64_t N, std::int64_t in,
                              std::int64_t out, bool bf16, cudaStream_t st);

  bool tf32() const { return tf32_; }
  std::size_t plans() const { return plans_.size(); }
  std::size_t dropped_plans() const { return plans_.evictions(); }
  // Products cuBLASLt's heuristic had no algorithm for (odd leading dimensions of bf16 operands, say),
  // run by cublasGemmEx instead: same types, same accumulation.
  std::size_t fallback_plans() const;

 private:
  struct Plan;
  using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         bool, bool, int>;
  std::shared_ptr<const Plan> plan_for(const Key& key);  // shared: a dropped plan lives until its call ends

  bool tf32_;
  cublasLtHandle_t handle_ = nullptr;
  cublasHandle_t fallback_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_;
  std::mutex mu_;
  LruCache<Key, std::shared_ptr<const Plan>> plans_;
};

// The largest power of two (up to 256) dividing the address: what cuBLASLt may assume about alignment.
int pointer_alignment(const void* p);

}  // namespace mt::cuda
