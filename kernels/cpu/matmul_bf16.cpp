// bf16 linear products through oneDNN's matmul primitive (see ops_bf16.hpp for the contract).
//
// Why tiles of a shape-only size instead of one block per thread (as matmul.cpp does with OpenBLAS):
// oneDNN's brgemm picks kernels and blockings from the problem shape, so a per-thread block shape that
// changes with the thread count could change an element's summation order. With fixed tiles every
// element is computed by the same primitive on the same operands whatever the thread count.
#include <dnnl.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <omp.h>

#include "kernels/cpu/ops_bf16.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// C[M, N] (+)= A[M, K] B[K, N]; A and B described by element strides, C row-major with ldc.
struct Problem {
  std::int64_t M, N, K, sa_m, sa_k, sb_k, sb_n, ldc;
  bool accumulate;
  bool f32_operands = false;  // the fallback: A and B widened to fp32
  auto tie() const { return std::tie(M, N, K, sa_m, sa_k, sb_k, sb_n, ldc, accumulate, f32_operands); }
  bool operator<(const Problem& o) const { return tie() < o.tie(); }
};

struct Prepared {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, scratch;
  std::size_t scratch_bytes = 0;
  std::string impl;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Runs its scope with OpenMP's max threads at 1 on this thread (oneDNN reads it when it creates and
// executes a primitive), restoring the previous value after.
class SingleThreaded {
 public:
  SingleThreaded() : prev_(omp_get_max_threads()) {
    if (prev_ != 1) omp_set_num_threads(1);
  }
  ~SingleThreaded() {
    if (prev_ != 1) omp_set_num_threads(prev_);
  }
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;

 private:
  int prev_;
};

// Primitives cached per problem shape: creation JIT-compiles kernels (milliseconds), execution is
// thread-safe with a caller-provided (per-thread) scratchpad.
const Prepared& prepared(const Problem& p) {
  static std::mutex mu;
  static std::map<Problem, std::unique_ptr<Prepared>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(p);
    if (it != cache.end()) return *it->second;
  }
  auto r = std::make_unique<Prepared>();
  const dt in_type = p.f32_operands ? dt::f32 : dt::bf16;
  r->a = dnnl::memory::desc(dims{p.M, p.K}, in_type, dims{p.sa_m, p.sa_k});
  r->b = dnnl::memory::desc(dims{p.K, p.N}, in_type, dims{p.sb_k, p.sb_n});
  r->c = dnnl::memory::desc(dims{p.M, p.N}, dt::f32, dims{p.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);  // C = A B + C, in fp32
    attr.set_post_ops(po);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(r->a, r->b, r->c), attr, engine());
  r->prim = dnnl::matmul(pd);
  r->scratch = pd.scratchpad_desc();
  r->scratch_bytes = r->scratch.get_size();
  r->impl = pd.impl_info_str();
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache.emplace(p, std::move(r));  // another thread may have made it meanwhile
  return *it->second;
}

void run_tile(const Problem& p, const void* A, const void* B, float* C) {
  SingleThreaded one;
  const Prepared& pr = prepared(p);
  thread_local dnnl::stream stream(engine());
  thread_local std::vector<unsigned char> scratch;
  if (scratch.size() < pr.scratch_bytes) scratch.resize(pr.scratch_bytes);
  dnnl::memory a(pr.a, engine(), const_cast<void*>(A));
  dnnl::memory b(pr.b, engine(), const_cast<void*>(B));
  dnnl::memory c(pr.c, engine(), C);
  dnnl::memory s(pr.scratch, engine(), scratch.data());
  pr.prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, s}});
  stream.wait();
}

// Tile size along the split extent: a function of the shape only (see the file comment). Up to 8
// tiles in multiples of 16, balanced for 1, 2, 4 and 8 threads.
std::int64_t tile_size(std::int64_t extent, double flops) {
  if (flops < 2e6) return extent;
  const std::int64_t count = std::clamp<std::int64_t>(extent / 64, 1, 8);
  return std::min(extent, ((extent + count - 1) / count + 15) / 16 * 16);
}

// A and B hold bf16 (or, with f32_operands, float) elements.
void gemm(const Problem& full, const void* A, const void* B, float* C, int threads) {
  if (full.M <= 0 || full.N <= 0) return;
  const double flops = 2.0 * static_cast<double>(full.M) * static_cast<double>(full.N) * static_cast<double>(full.K);
  const bool split_m = full.M >= full.N;
  const std::int64_t extent = split_m ? full.M : full.N;
  const std::int64_t tile = tile_size(extent, flops);
  const std::int64_t tiles = (extent + tile - 1) / tile;
  const std::int64_t esize = full.f32_operands ? 4 : 2;
  auto at = [&](const void* base, std::int64_t elements) { return static_cast<const char*>(base) + elements * esize; };
  auto one = [&](std::int64_t i) {
    const std::int64_t lo = i * tile, n = std::min(tile, extent - lo);
    Problem p = full;
    if (split_m) {
      p.M = n;
      run_tile(p, at(A, lo * full.sa_m), B, C + lo * full.ldc);
    } else {
      p.N = n;
      run_tile(p, A, at(B, lo * full.sb_n), C + lo);
    }
  };
  if (threads <= 1 || tiles == 1) {
    for (std::int64_t i = 0; i < tiles; ++i) one(i);
    return;
  }
#pragma omp parallel for num_threads(std::min <std::int64_t>(threads, tiles)) schedule(static)
  for (std::int64_t i = 0; i < tiles; ++i) one(i);
}

// oneDNN 2.6 has bf16 matmul kernels from AVX-512 (native with AVX512-BF16/AMX, emulated on plain
// avx512_core) and none below (no primitive can be created on AVX2, checked with DNNL_MAX_CPU_ISA=AVX2).
bool dnnl_has_bf16() {
  static const bool ok = [] {
    try {
      SingleThreaded one;
      prepared(Problem{2, 2, 2, 2, 1, 2, 1, 2, false});
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

// Fallback without oneDNN bf16 kernels: widen the operands (exact) and run oneDNN's fp32 matmul through
// the same shape-only tiles, so the math is the same (products of the same bf16 values, fp32
// accumulation) and thread-count independent by the same construction, but the summation order is the
// fp32 kernel's, not the bf16 kernel's. Allocates per-thread buffers on first use (a slow path for CPUs
// below AVX-512, not the engine's hot path).
const float* widened(const bf16_t* x, std::int64_t n, std::vector<float>& buf, int threads) {
  const auto count = static_cast<std::size_t>(n);
  if (buf.size() < count) buf.resize(count);
  from_bf16(x, buf.data(), count, threads);
  return buf.data();
}

// Runs the problem on bf16 operands, or widened through the fallback.
void gemm_bf16(Problem p, const bf16_t* A, std::int64_t a_elems, const bf16_t* B, std::int64_t b_elems, float* C,
               int threads) {
  if (dnnl_has_bf16()) {
    gemm(p, A, B, C, threads);
    return;
  }
  thread_local std::vector<float> a, b;
  p.f32_operands = true;
  gemm(p, widened(A, a_elems, a, threads), widened(B, b_elems, b, threads), C, threads);
}

}  // namespace

void linear_forward_bf16(const bf16_t* x, const bf16_t* W, const bf16_t* bias, float* y, std::int64_t N,
                         std::int64_t in, std::int64_t out, int threads) {
  prof::Scope prof_scope(prof::matmul);
  if (bias) {  // start from the broadcast bias, then y += x W^T
    for (std::int64_t o = 0; o < out; ++o) y[o] = bf16_to_float(bias[o]);
    for (std::int64_t r = 1; r < N; ++r) std::copy(y, y + out, y + r * out);
  }
  // A = x [N, in]; B = W^T: element (k, n) at W[n * in + k]
  gemm_bf16(Problem{N, out, in, in, 1, 1, in, out, bias != nullptr}, x, N * in, W, out * in, y, threads);
}

void linear_backward_input_bf16(const bf16_t* dy, const bf16_t* W, float* dx, std::int64_t N, std::int64_t in,
                                std::int64_t out, bool add, int threads) {
  prof::Scope prof_scope(prof::matmul);
  // A = dy [N, out]; B = W [out, in]
  gemm_bf16(Problem{N, in, out, out, 1, in, 1, in, add}, dy, N * out, W, out * in, dx, threads);
}

void linear_backward_weight_bf16(const bf16_t* dy, const bf16_t* x, float* dW_acc, std::int64_t N, std::int64_t in,
                                 std::int64_t out, int threads) {
  prof::Scope prof_scope(prof::matmul);
  // A = dy^T: element (o, r) at dy[r * out + o]; B = x [N, in]
  gemm_bf16(Problem{out, in, N, 1, out, in, 1, in, true}, dy, N * out, x, N * in, dW_acc, threads);
}

const char* linear_bf16_impl_name(std::int64_t N, std::int64_t in, std::int64_t out) {
  const bool fallback = !dnnl_has_bf16();
  SingleThreaded one;
  return prepared(Problem{N, out, in, in, 1, 1, in, out, false, fallback}).impl.c_str();
}

}  // namespace mt::cpu
