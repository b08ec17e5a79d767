// bf16 linear products (see ops_bf16.hpp for the contract): oneDNN's bf16 matmul where the CPU has
// AMX, the operands widened to fp32 and our fp32 GEMM (matmul.cpp) everywhere else.
//
// Why not oneDNN's bf16 kernels without AMX: on AVX512-BF16 (Cooper Lake, and Sapphire Rapids class
// cores with AMX hidden, as in the VMs of this project: family 6 model 207) vdpbf16ps issues at half
// the rate of vfmadd231ps, so counting a bf16 multiply-add as 2 FLOP its peak is half the fp32 FMA
// peak (measured: ~90 vs ~185 GFLOP/s a core). oneDNN's brgemm reaches that bf16 peak (~80-95 GFLOP/s,
// as does its dnnl_gemm_bf16bf16f32), which is still half of dnnl_sgemm. Widening a bf16 value to fp32
// is exact and so is the product of two of them in fp32, so the widened product is the same math (bf16
// operands, fp32 accumulation) at the fp32 rate, for one pass over the operands. Debian's OpenBLAS 0.3.21
// is built without its bf16 GEMM (cblas_sbgemm is declared but not exported). The choice is a function
// of the CPU only (MEGATRAIN_BF16_GEMM=onednn|widened overrides it for comparisons), so a run and its
// restart take the same path and the same bits.
//
// Why tiles of a shape-only size instead of one block per thread (as matmul.cpp does with OpenBLAS):
// oneDNN's brgemm picks kernels and blockings from the problem shape, so a per-thread block shape that
// changes with the thread count could change an element's summation order. With fixed tiles every
// element is computed by the same primitive on the same operands whatever the thread count.
#include <dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <omp.h>

#include "kernels/cpu/ops.hpp"
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
  auto tie() const { return std::tie(M, N, K, sa_m, sa_k, sb_k, sb_n, ldc, accumulate); }
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
  r->a = dnnl::memory::desc(dims{p.M, p.K}, dt::bf16, dims{p.sa_m, p.sa_k});
  r->b = dnnl::memory::desc(dims{p.K, p.N}, dt::bf16, dims{p.sb_k, p.sb_n});
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

void gemm(const Problem& full, const bf16_t* A, const bf16_t* B, float* C, int threads) {
  if (full.M <= 0 || full.N <= 0) return;
  const double flops = 2.0 * static_cast<double>(full.M) * static_cast<double>(full.N) * static_cast<double>(full.K);
  const bool split_m = full.M >= full.N;
  const std::int64_t extent = split_m ? full.M : full.N;
  const std::int64_t tile = tile_size(extent, flops);
  const std::int64_t tiles = (extent + tile - 1) / tile;
  auto one = [&](std::int64_t i) {
    const std::int64_t lo = i * tile, n = std::min(tile, extent - lo);
    Problem p = full;
    if (split_m) {
      p.M = n;
      run_tile(p, A + lo * full.sa_m, B, C + lo * full.ldc);
    } else {
      p.N = n;
      run_tile(p, A, B + lo * full.sb_n, C + lo);
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

enum class Path { onednn, widened };

// oneDNN's bf16 matmul only where it beats fp32: on AMX tiles (measured 1-3 TFLOP/s on 2 cores against
// ~300 for fp32). The effective ISA honours DNNL_MAX_CPU_ISA, so a held-back oneDNN widens too.
Path path() {
  static const Path p = [] {
    const char* e = std::getenv("MEGATRAIN_BF16_GEMM");
    if (e && std::strcmp(e, "widened") == 0) return Path::widened;
    if (e && std::strcmp(e, "onednn") == 0) return dnnl_has_bf16() ? Path::onednn : Path::widened;
    const unsigned isa = dnnl_get_effective_cpu_isa(), amx = dnnl_cpu_isa_avx512_core_amx;
    return (isa & amx) == amx && dnnl_has_bf16() ? Path::onednn : Path::widened;
  }();
  return p;
}

// The widened path's operands: fp32 copies in the calling thread's scratch (grown on first use to the
// largest operand seen: for a product, its two operands in fp32).
const float* widened(const bf16_t* x, std::int64_t n, std::vector<float>& buf, int threads) {
  const auto count = static_cast<std::size_t>(n);
  if (buf.size() < count) buf.resize(count);
  from_bf16(x, buf.data(), count, threads);
  return buf.data();
}

struct Scratch {
  std::vector<float> a, b, bias;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

// Each function: on the widened path the widening counts as matmul time, and the fp32 product (which
// times itself) runs on the copies.
void linear_forward_bf16(const bf16_t* x, const bf16_t* W, const bf16_t* bias, float* y, std::int64_t N,
                         std::int64_t in, std::int64_t out, int threads) {
  if (path() == Path::widened) {
    Scratch& s = scratch();
    const float *xf, *wf, *bf = nullptr;
    {
      prof::Scope prof_scope(prof::matmul);
      xf = widened(x, N * in, s.a, threads);
      wf = widened(W, out * in, s.b, threads);
      if (bias) bf = widened(bias, out, s.bias, 1);
    }
    linear_forward(xf, wf, bf, y, N, in, out, threads);
    return;
  }
  prof::Scope prof_scope(prof::matmul);
  if (bias) {  // start from the broadcast bias, then y += x W^T
    for (std::int64_t o = 0; o < out; ++o) y[o] = bf16_to_float(bias[o]);
    for (std::int64_t r = 1; r < N; ++r) std::copy(y, y + out, y + r * out);
  }
  // A = x [N, in]; B = W^T: element (k, n) at W[n * in + k]
  gemm(Problem{N, out, in, in, 1, 1, in, out, bias != nullptr}, x, W, y, threads);
}

void linear_backward_input_bf16(const bf16_t* dy, const bf16_t* W, float* dx, std::int64_t N, std::int64_t in,
                                std::int64_t out, bool add, int threads) {
  if (path() == Path::widened) {
    Scratch& s = scratch();
    const float *dyf, *wf;
    {
      prof::Scope prof_scope(prof::matmul);
      dyf = widened(dy, N * out, s.a, threads);
      wf = widened(W, out * in, s.b, threads);
    }
    linear_backward_input(dyf, wf, dx, N, in, out, add, threads);
    return;
  }
  prof::Scope prof_scope(prof::matmul);
  // A = dy [N, out]; B = W [out, in]
  gemm(Problem{N, in, out, out, 1, in, 1, in, add}, dy, W, dx, threads);
}

void linear_backward_weight_bf16(const bf16_t* dy, const bf16_t* x, float* dW_acc, std::int64_t N, std::int64_t in,
                                 std::int64_t out, int threads) {
  if (path() == Path::widened) {
    Scratch& s = scratch();
    const float *dyf, *xf;
    {
      prof::Scope prof_scope(prof::matmul);
      dyf = widened(dy, N * out, s.a, threads);
      xf = widened(x, N * in, s.b, threads);
    }
    linear_backward_weight(dyf, xf, dW_acc, nullptr, N, in, out, threads);
    return;
  }
  prof::Scope prof_scope(prof::matmul);
  // A = dy^T: element (o, r) at dy[r * out + o]; B = x [N, in]
  gemm(Problem{out, in, N, 1, out, in, 1, in, true}, dy, x, dW_acc, threads);
}

const char* linear_bf16_impl_name(std::int64_t N, std::int64_t in, std::int64_t out) {
  static const std::string widened_name = std::string("bf16 widened to fp32, ") + gemm_backend_name();
  if (path() == Path::widened) return widened_name.c_str();
  SingleThreaded one;
  return prepared(Problem{N, out, in, in, 1, 1, in, out, false}).impl.c_str();
}

}  // namespace mt::cpu
