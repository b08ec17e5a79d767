// Linear layers through OpenBLAS sgemm, row-major, weights [out, in] as torch.nn.Linear stores them.
//
// Threading: OpenBLAS runs single-threaded and we split each product into `threads` column or row
// blocks on OpenMP's pool. The reason is the 2-core machine: OpenBLAS's own (pthread) workers spin
// for a long time after each call, and so do OpenMP's after each elementwise kernel; two pools on two
// cores steal each other's time slices and both run at half speed. One pool for everything avoids it.
// Each output element is still one sgemm dot product over the whole K, in OpenBLAS's K order, so the
// split does not change results (the kernels tests check 1 vs 2 threads bit for bit).
#include <cblas.h>

#include <algorithm>
#include <atomic>

#include <omp.h>

#include "kernels/cpu/ops.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

void set_blas_threads(int threads) {
  static std::atomic<int> current{0};
  if (threads < 1) threads = 1;
  if (current.exchange(threads) != threads) openblas_set_num_threads(threads);
}

namespace {

// C[M, N] = alpha op(A) op(B) + beta C, row-major, split over the larger of M and N.
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc, int threads) {
  set_blas_threads(1);
  const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  auto call = [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    if (m1 <= m0 || n1 <= n0) return;
    const float* a = ta ? A + m0 : A + m0 * lda;  // row m of op(A)
    const float* b = tb ? B + n0 * ldb : B + n0;  // column n of op(B)
    cblas_sgemm(CblasRowMajor, TA, TB, static_cast<int>(m1 - m0), static_cast<int>(n1 - n0), static_cast<int>(K), 1.0f,
                a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, C + m0 * ldc + n0, static_cast<int>(ldc));
  };
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if (threads <= 1 || flops < 4e6) {
    call(0, M, 0, N);
    return;
  }
  const bool split_m = M >= N;
  const std::int64_t extent = split_m ? M : N;
  constexpr std::int64_t kAlign = 16;
#pragma omp parallel num_threads(threads)
  {
    const std::int64_t t = omp_get_num_threads(), id = omp_get_thread_num();
    const std::int64_t per = ((extent + t - 1) / t + kAlign - 1) / kAlign * kAlign;
    const std::int64_t lo = std::min(extent, id * per), hi = std::min(extent, (id + 1) * per);
    if (split_m)
      call(lo, hi, 0, N);
    else
      call(0, M, lo, hi);
  }
}

}  // namespace

void linear_forward(const float* x, const float* W, const float* bias, float* y, std::int64_t N, std::int64_t in,
                    std::int64_t out, int threads) {
  prof::Scope prof_scope(prof::matmul);
  float beta = 0.0f;
  if (bias) {
    // Start from the broadcast bias so sgemm adds the product in one pass (beta = 1).
    for (std::int64_t r = 0; r < N; ++r) std::copy(bias, bias + out, y + r * out);
    beta = 1.0f;
  }
  gemm(false, true, N, out, in, x, in, W, in, beta, y, out, threads);
}

void linear_backward_input(const float* dy, const float* W, float* dx, std::int64_t N, std::int64_t in,
                           std::int64_t out, bool add, int threads) {
  prof::Scope prof_scope(prof::matmul);
  gemm(false, false, N, in, out, dy, out, W, in, add ? 1.0f : 0.0f, dx, in, threads);
}

void linear_backward_weight(const float* dy, const float* x, float* dW_acc, float* dbias_acc, std::int64_t N,
                            std::int64_t in, std::int64_t out, int threads) {
  prof::Scope prof_scope(prof::matmul);
  gemm(true, false, out, in, N, dy, out, x, in, 1.0f, dW_acc, in, threads);
  if (dbias_acc) colsum_add(dy, dbias_acc, N, out, threads);
}

void colsum_add(const float* dy, float* db_acc, std::int64_t N, std::int64_t D, int threads) {
  // Columns split over threads in blocks of 64; each column sums rows 0..N-1 in order.
  const std::int64_t blocks = (D + 63) / 64;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * D > 32768)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t j0 = blk * 64, j1 = std::min<std::int64_t>(D, j0 + 64);
    float acc[64];
    for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] = db_acc[j];
    for (std::int64_t r = 0; r < N; ++r) {
      const float* row = dy + r * D;
      for (std::int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
    }
    for (std::int64_t j = j0; j < j1; ++j) db_acc[j] = acc[j - j0];
  }
}

}  // namespace mt::cpu
