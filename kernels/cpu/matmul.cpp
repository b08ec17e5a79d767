// Linear layers as row-major GEMMs, weights [out, in] as torch.nn.Linear stores them.
//
// Library: oneDNN's dnnl_sgemm by default. It picks JIT kernels from the CPU's features at run time
// (AVX2, AVX-512, ...), whereas Debian's OpenBLAS 0.3.21 picks from a table of CPU models and falls
// back to SSE3 (Prescott) kernels on CPUs newer than the table. Measured on a Xeon family 6 model 207
// with AVX-512 (tools/bench/gemm_bench.cpp, transformer shapes, one thread): OpenBLAS as detected
// 25-38 GFLOP/s, oneDNN sgemm 140-195, OpenBLAS forced to its Cooperlake kernels 120-195. OpenBLAS
// reads OPENBLAS_CORETYPE only when the library loads (before main), so the kernels cannot correct
// its choice; oneDNN needs no help. MEGATRAIN_GEMM=openblas in the environment selects OpenBLAS
// instead (for comparisons). oneDNN's matmul primitive measured about the same as its sgemm here
// and would need primitives cached per shape, so the plain sgemm call it is.
//
// Threading: the library runs single-threaded and we split each product into shape-only tiles shared
// out on OpenMP's pool (see gemm() below). The reason is the 2-core machine: a library's own workers spin for a long
// time after each call, and so do OpenMP's after each elementwise kernel; two pools on two cores steal
// each other's time slices and both run at half speed. One pool for everything avoids it. Each output
// element is still one dot product over the whole K in the library's K order, so the split does not
// change results (the kernels tests check 1 vs 2 threads bit for bit, on the model's shapes too).
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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

enum class Lib { onednn, openblas };

Lib gemm_lib() {
  static const Lib lib = [] {
    const char* e = std::getenv("MEGATRAIN_GEMM");
    return e && std::strcmp(e, "openblas") == 0 ? Lib::openblas : Lib::onednn;
  }();
  return lib;
}

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

}  // namespace

const char* gemm_backend_name() {
  static const std::string name = [] {
    if (gemm_lib() == Lib::openblas) return std::string("OpenBLAS (core ") + openblas_get_corename() + ")";
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
           " sgemm (" + isa_name(dnnl_get_effective_cpu_isa()) + ")";
  }();
  return name.c_str();
}

void sgemm_serial(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
                  const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (gemm_lib() == Lib::openblas) {
    set_blas_threads(1);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
                static_cast<int>(N), static_cast<int>(K), 1.0f, A, static_cast<int>(lda), B, static_cast<int>(ldb),
                beta, C, static_cast<int>(ldc));
    return;
  }
  // oneDNN runs single-threaded inside an active parallel region; outside one it would open a team of
  // omp_get_max_threads() and might split K, which changes the bits. This thread's team size is set
  // to 1 for the call (an ICV of the calling thread only) and restored.
  const int prev = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (prev != 1) omp_set_num_threads(1);
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  if (prev != 1) omp_set_num_threads(prev);
  if (st != dnnl_success) {  // only for invalid arguments (a bug here), and we may be on a pool thread
    std::fprintf(stderr, "megatrain: dnnl_sgemm failed (status %d, M %lld N %lld K %lld)\n", static_cast<int>(st),
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K));
    std::abort();
  }
}

namespace {

// C[M, N] = op(A) op(B) + beta C, row-major, cut into tiles along the larger of M and N.
//
// The tiles depend only on the shape, never on the thread count: the threads share out whole tiles,
// so every output element comes from the same library call on the same operands whatever `threads`
// is. Splitting by thread count instead (one block per thread) is not enough: oneDNN's AVX2 sgemm
// picks its K blocking from the block's M and N, so a 1-thread and a 2-thread run summed in different
// orders (seen with DNNL_MAX_CPU_ISA=AVX2, the Zen 1 case). Tiles of >= kMinTile rows or columns keep
// the operand the tiles share (re-packed by each call) cheap next to the product; at most kMaxTiles of
// them keep up to that many threads busy.
constexpr std::int64_t kMinTile = 128, kMaxTiles = 16, kTileAlign = 16;

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc, int threads) {
  auto call = [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    if (m1 <= m0 || n1 <= n0) return;
    const float* a = ta ? A + m0 : A + m0 * lda;  // row m of op(A)
    const float* b = tb ? B + n0 * ldb : B + n0;  // column n of op(B)
    sgemm_serial(ta, tb, m1 - m0, n1 - n0, K, a, lda, b, ldb, beta, C + m0 * ldc + n0, ldc);
  };
  const bool split_m = M >= N;
  const std::int64_t extent = split_m ? M : N;
  const std::int64_t per = std::max(kMinTile, (extent + kMaxTiles - 1) / kMaxTiles);
  const std::int64_t tile = (per + kTileAlign - 1) / kTileAlign * kTileAlign;
  const std::int64_t tiles = (extent + tile - 1) / tile;
  auto run_tile = [&](std::int64_t t) {
    const std::int64_t lo = t * tile, hi = std::min(extent, lo + tile);
    if (split_m)
      call(lo, hi, 0, N);
    else
      call(0, M, lo, hi);
  };
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  if (threads <= 1 || tiles <= 1 || flops < 4e6) {
    for (std::int64_t t = 0; t < tiles; ++t) run_tile(t);
    return;
  }
#pragma omp parallel for num_threads(static_cast <int>(std::min <std::int64_t>(threads, tiles))) schedule(dynamic, 1)
  for (std::int64_t t = 0; t < tiles; ++t) run_tile(t);
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
