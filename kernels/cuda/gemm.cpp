#include "kernels/cuda/gemm.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/cuda_check.hpp"

namespace mt::cuda {

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool gemm_ex = false;  // no cuBLASLt algorithm: cublasGemmEx
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(desc);
  }
};

int pointer_alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int align = 256;
  while (align > 1 && v % static_cast<std::uintptr_t>(align) != 0) align /= 2;
  return align;
}

Gemm::Gemm(bool allow_tf32, std::size_t workspace_bytes, std::size_t max_plans)
    : tf32_(allow_tf32), workspace_bytes_(workspace_bytes), plans_(max_plans) {
  MT_CUBLAS_CHECK(cublasLtCreate(&handle_));
  MT_CUBLAS_CHECK(cublasCreate(&fallback_));
  MT_CUBLAS_CHECK(cublasSetMathMode(fallback_, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  MT_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Gemm::~Gemm() {
  plans_.clear();  // the plans' descriptors before the handle
  cudaFree(workspace_);
  cublasDestroy(fallback_);
  cublasLtDestroy(handle_);
}

std::shared_ptr<const Gemm::Plan> Gemm::plan_for(const Key& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto* found = plans_.find(key)) return *found;
  const auto [ta, tb, m, n, k, lda, ldb, ldc, bf16, accumulate, align] = key;
  auto p = std::make_shared<Plan>();
  const cublasComputeType_t compute = bf16 || !tf32_ ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  const cudaDataType_t in_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Stored shapes (column-major): A is m x k (k x m when transposed), B is k x n (n x k when transposed).
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, in_type, ta ? k : m, ta ? m : k, lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, in_type, tb ? n : k, tb ? k : n, ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, m, n, ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = workspace_bytes_;
  const std::uint32_t al = static_cast<std::uint32_t>(align);
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    p->gemm_ex = true;  // no cuBLASLt algorithm for these types / alignments: cublasGemmEx runs it
  else
    p->algo = result.algo;
  return plans_.insert(key, std::move(p));
}

void Gemm::matmul(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const void* A, std::int64_t lda,
                  const void* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc, bool bf16, cudaStream_t st) {
  if (m == 0 || n == 0) return;
  if (k == 0) throw std::invalid_argument("Gemm::matmul: k == 0");
  const int align = std::min({pointer_alignment(A), pointer_alignment(B), pointer_alignment(C)});
  const Key key{ta, tb, m, n, k, lda, ldb, ldc, bf16, beta != 0.0f, align};
  const std::shared_ptr<const Plan> plan = plan_for(key);
  const Plan& p = *plan;
  const float alpha = 1.0f;
  note_kernel(p.gemm_ex ? "cublasGemmEx" : "cublasLtMatmul");
  if (p.gemm_ex) {
    std::lock_guard<std::mutex> lock(mu_);  // the handle's stream is per call
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = bf16 || !tf32_ ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
    MT_CUBLAS_CHECK(cublasSetStream(fallback_, st));
    MT_CUBLAS_CHECK(cublasGemmEx(fallback_, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, A, t,
                                 static_cast<int>(lda), B, t, static_cast<int>(ldb), &beta, C, CUDA_R_32F,
                                 static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  MT_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c, &p.algo, workspace_,
                                 workspace_bytes_, st));
}

std::size_t Gemm::fallback_plans() const {
  std::size_t n = 0;
  plans_.for_each([&](const Key&, const std::shared_ptr<const Plan>& p) { n += p->gemm_ex; });
  return n;
}

void Gemm::linear_forward(const void* x, const void* W, float* y, std::int64_t N, std::int64_t in, std::int64_t out,
                          bool bf16, cudaStream_t st) {
  // column-major y^T[out, N] = W^T(stored in x out, transposed) x^T(stored in x N)
  matmul(true, false, out, N, in, W, in, x, in, 0.0f, y, out, bf16, st);
}

void Gemm::linear_backward_input(const void* dy, const void* W, float* dx, std::int64_t N, std::int64_t in,
                                 std::int64_t out, bool add, bool bf16, cudaStream_t st) {
  // column-major dx^T[in, N] = W(stored in x out) dy^T(stored out x N)
  matmul(false, false, in, N, out, W, in, dy, out, add ? 1.0f : 0.0f, dx, in, bf16, st);
}

void Gemm::linear_backward_weight(const void* dy, const void* x, float* dW, std::int64_t N, std::int64_t in,
                                  std::int64_t out, bool bf16, cudaStream_t st) {
  // column-major dW^T[in, out] += x^T(stored in x N) (dy^T(stored out x N))^T
  matmul(false, true, in, out, N, x, in, dy, out, 1.0f, dW, in, bf16, st);
}

}  // namespace mt::cuda
