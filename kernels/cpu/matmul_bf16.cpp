// bf16 linear products (see ops_bf16.hpp for the contract): oneDNN's bf16 matmul, or the operands
// widened to fp32 and our fp32 GEMM (matmul.cpp), whichever the run's probe measured faster.
//
// Why measure instead of a rule: the ratio of the two is a property of the core, not of its ISA flags.
// On a Xeon with AVX512-BF16 and no AMX (family 6 model 207, this project's first VMs) vdpbf16ps issues
// at half the rate of vfmadd231ps, so counting a bf16 multiply-add as 2 FLOP its peak is half the fp32
// FMA peak (measured ~90 vs ~185 GFLOP/s a core) and oneDNN's brgemm, which reaches that bf16 peak, runs
// at half of dnnl_sgemm: widening (exact, as is the product of two bf16 values in fp32) wins ~2x for one
// pass over the operands. On AMX, and on cores whose vdpbf16ps issues at the FMA's rate (Zen 4 class:
// twice the fp32 peak, measured 230 vs 115 GFLOP/s a core), oneDNN's bf16 kernels win ~2x instead. Debian's OpenBLAS
// 0.3.21 is built without its bf16 GEMM (cblas_sbgemm is declared but not exported). The path is fixed once per process
// (set_bf16_gemm_path, or the first product), and a checkpoint records it, so a resumed run keeps its bits.
//
// Why tiles of a shape-only size instead of one block per thread (as matmul.cpp does with OpenBLAS):
// oneDNN's brgemm picks kernels and blockings from the problem shape, so a per-thread block shape that
// changes with the thread count could change an element's summation order. With fixed tiles every
// element is computed by the same primitive on the same operands whatever the thread count.
#include <dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
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

using Path = Bf16Gemm;

// -1 until fixed (set_bf16_gemm_path or the first product), then the Path; products read it lock-free.
std::atomic<int> g_path{-1};
std::mutex g_path_mu;

// What a request becomes here: the forced path wins, and onednn needs oneDNN's bf16 kernels.
Path effective(Path want) {
  if (const auto forced = bf16_gemm_forced()) want = *forced;
  return want == Path::onednn && !dnnl_has_bf16() ? Path::widened : want;
}

Path fix(Path want) {
  std::lock_guard<std::mutex> lock(g_path_mu);
  if (g_path.load() < 0) g_path.store(static_cast<int>(effective(want)));
  return static_cast<Path>(g_path.load());
}

Path path() {
  const int p = g_path.load(std::memory_order_acquire);
  return p >= 0 ? static_cast<Path>(p) : fix(bf16_gemm_default());
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

// Each product on a given path: on the widened path the widening counts as matmul time, and the fp32
// product (which times itself) runs on the copies.
void forward(Path path, const bf16_t* x, const bf16_t* W, const bf16_t* bias, float* y, std::int64_t N, std::int64_t in,
             std::int64_t out, int threads) {
  if (path == Path::widened) {
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

void backward_input(Path path, const bf16_t* dy, const bf16_t* W, float* dx, std::int64_t N, std::int64_t in,
                    std::int64_t out, bool add, int threads) {
  if (path == Path::widened) {
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

void backward_weight(Path path, const bf16_t* dy, const bf16_t* x, float* dW_acc, std::int64_t N, std::int64_t in,
                     std::int64_t out, int threads) {
  if (path == Path::widened) {
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

}  // namespace

const char* bf16_gemm_name(Bf16Gemm p) { return p == Bf16Gemm::onednn ? "onednn" : "widened"; }

std::optional<Bf16Gemm> parse_bf16_gemm(const std::string& name) {
  if (name == "onednn") return Bf16Gemm::onednn;
  if (name == "widened") return Bf16Gemm::widened;
  return std::nullopt;
}

bool bf16_gemm_onednn_available() { return dnnl_has_bf16(); }

std::optional<Bf16Gemm> bf16_gemm_forced() {
  static const std::optional<Bf16Gemm> forced = [] {
    const char* e = std::getenv("MEGATRAIN_BF16_GEMM");
    if (e == nullptr || *e == 0) return std::optional<Bf16Gemm>();
    const auto p = parse_bf16_gemm(e);
    if (!p)
      throw std::invalid_argument(std::string("MEGATRAIN_BF16_GEMM=") + e + ": expected onednn or widened (or unset)");
    return p;
  }();
  return forced;
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    default:
      return "isa 0x" + [] {
        char b[16];
        std::snprintf(b, sizeof b, "%x", static_cast<unsigned>(dnnl_get_effective_cpu_isa()));
        return std::string(b);
      }();
  }
}

// The effective ISA honours DNNL_MAX_CPU_ISA, so a held-back oneDNN widens too.
Bf16Gemm bf16_gemm_default() {
  const unsigned isa = dnnl_get_effective_cpu_isa(), amx = dnnl_cpu_isa_avx512_core_amx;
  return (isa & amx) == amx && dnnl_has_bf16() ? Bf16Gemm::onednn : Bf16Gemm::widened;
}

Bf16Gemm bf16_gemm_path() {
  const int p = g_path.load(std::memory_order_acquire);
  return p >= 0 ? static_cast<Bf16Gemm>(p) : effective(bf16_gemm_default());
}

bool bf16_gemm_fixed() { return g_path.load(std::memory_order_acquire) >= 0; }

Bf16Gemm set_bf16_gemm_path(Bf16Gemm p) {
  const Bf16Gemm want = effective(p);
  const Bf16Gemm have = fix(want);
  if (have != want)
    throw std::logic_error(std::string("set_bf16_gemm_path: this process's bf16 products already run on the ") +
                           bf16_gemm_name(have) + " path; they cannot switch to " + bf16_gemm_name(want) +
                           " (the path is fixed once per process)");
  return have;
}

Bf16Probe probe_bf16_gemm(const std::vector<Bf16ProbeShape>& shapes, int threads, double budget_s) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Bf16Probe r;
  r.threads = std::max(1, threads);
  r.onednn_available = dnnl_has_bf16();
  // Bounded products (see the header): rows to 0.25 GFLOP, out to 8M weight elements.
  constexpr double kMaxFlops = 2.5e8;
  constexpr std::int64_t kMaxWeight = std::int64_t{1} << 23;
  std::size_t max_x = 0, max_w = 0, max_y = 0;
  for (Bf16ProbeShape s : shapes) {
    if (s.rows <= 0 || s.in <= 0 || s.out <= 0) continue;
    if (s.in * s.out > kMaxWeight) s.out = std::max<std::int64_t>(64, kMaxWeight / s.in / 64 * 64);
    const auto fit = static_cast<std::int64_t>(kMaxFlops / (2.0 * static_cast<double>(s.in * s.out)));
    if (s.rows > fit) s.rows = std::max<std::int64_t>(64, fit / 64 * 64);
    r.shapes.push_back(s);
    max_x = std::max(max_x, static_cast<std::size_t>(s.rows * s.in));
    max_w = std::max(max_w, static_cast<std::size_t>(s.in * s.out));
    max_y = std::max(max_y, static_cast<std::size_t>(s.rows * s.out));
  }
  // Operands: small values of a fixed pattern (timing only; never checked).
  std::vector<bf16_t> x(max_x), w(max_w), dy(max_y);
  auto fill = [](std::vector<bf16_t>& v, std::uint32_t seed) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      v[i] = bf16_round_reference(static_cast<float>(seed >> 9) * (1.0f / 8388608.0f) - 0.5f);
    }
  };
  fill(x, 1);
  fill(w, 2);
  fill(dy, 3);
  std::vector<float> y(max_y), dx(max_x), dw(max_w, 0.0f);
  const int n = static_cast<int>(r.shapes.size());
  r.products = 3 * n;
  auto run = [&](Path p, int product) {
    const Bf16ProbeShape& s = r.shapes[static_cast<std::size_t>(product / 3)];
    switch (product % 3) {
      case 0:
        forward(p, x.data(), w.data(), nullptr, y.data(), s.rows, s.in, s.out, r.threads);
        break;
      case 1:
        backward_input(p, dy.data(), w.data(), dx.data(), s.rows, s.in, s.out, false, r.threads);
        break;
      default:
        backward_weight(p, dy.data(), x.data(), dw.data(), s.rows, s.in, s.out, r.threads);
        break;
    }
  };
  auto seconds = [&](Path p, int product) {
    const auto a = Clock::now();
    run(p, product);
    return std::chrono::duration<double>(Clock::now() - a).count();
  };
  std::vector<Path> paths{Path::widened};
  if (r.onednn_available) paths.push_back(Path::onednn);
  for (int i = 0; i < r.products; ++i)
    for (Path p : paths) run(p, i);  // warm-up: oneDNN's primitives, the widened scratch
  r.warmup_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> best_w(static_cast<std::size_t>(r.products), 1e300), best_o = best_w;
  constexpr int kMaxRounds = 5;
  while (r.rounds < kMaxRounds &&
         (r.rounds == 0 || std::chrono::duration<double>(Clock::now() - t0).count() < budget_s)) {
    for (int i = 0; i < r.products; ++i) {
      // Alternate which path goes first, so a drifting machine favours neither.
      const bool onednn_first = r.onednn_available && (r.rounds + i) % 2 == 1;
      if (onednn_first) best_o[i] = std::min(best_o[i], seconds(Path::onednn, i));
      best_w[i] = std::min(best_w[i], seconds(Path::widened, i));
      if (r.onednn_available && !onednn_first) best_o[i] = std::min(best_o[i], seconds(Path::onednn, i));
    }
    ++r.rounds;
  }
  for (int i = 0; i < r.products; ++i) {
    r.widened_s += best_w[static_cast<std::size_t>(i)];
    if (r.onednn_available) r.onednn_s += best_o[static_cast<std::size_t>(i)];
  }
  r.choice = r.onednn_available && r.products > 0 && r.widened_s >= kBf16OnednnMargin * r.onednn_s ? Path::onednn
                                                                                                   : Path::widened;
  scratch() = Scratch{};  // the widened copies would stay with this (the caller's) thread
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

void linear_forward_bf16(const bf16_t* x, const bf16_t* W, const bf16_t* bias, float* y, std::int64_t N,
                         std::int64_t in, std::int64_t out, int threads) {
  forward(path(), x, W, bias, y, N, in, out, threads);
}

void linear_backward_input_bf16(const bf16_t* dy, const bf16_t* W, float* dx, std::int64_t N, std::int64_t in,
                                std::int64_t out, bool add, int threads) {
  backward_input(path(), dy, W, dx, N, in, out, add, threads);
}

void linear_backward_weight_bf16(const bf16_t* dy, const bf16_t* x, float* dW_acc, std::int64_t N, std::int64_t in,
                                 std::int64_t out, int threads) {
  backward_weight(path(), dy, x, dW_acc, N, in, out, threads);
}

const char* linear_bf16_impl_name(std::int64_t N, std::int64_t in, std::int64_t out) {
  static const std::string widened_name = std::string("bf16 widened to fp32, ") + gemm_backend_name();
  if (path() == Path::widened) return widened_name.c_str();
  SingleThreaded one;
  return prepared(Problem{N, out, in, in, 1, 1, in, out, false}).impl.c_str();
}

}  // namespace mt::cpu
