// Linear layers as row-major GEMMs, weights [out, in] as torch.nn.Linear stores them.
//
// Library: per product (forward NT, backward-input NN, backward-weight TN), oneDNN's dnnl_sgemm or
// OpenBLAS's cblas_sgemm, whichever the run's probe measured faster (probe_fp32_gemm; plan/kernel_choice
// caches it and a checkpoint records it); oneDNN without a probe. Neither wins everywhere: oneDNN picks
// JIT kernels from the CPU's features at run time, but its AVX2 sgemm is slow on the weight gradient's
// long-K TN shapes, where OpenBLAS's Haswell kernels run about twice as fast; Debian's OpenBLAS 0.3.21
// picks its kernels from a table of CPU models when the library loads (OPENBLAS_CORETYPE overrides it;
// nothing later can), and falls back to old kernels on CPUs newer than the table. So a run measures.
// The attention's block products (sgemm_serial) stay on oneDNN.
//
// Threading: the library runs single-threaded and we split each product into shape-only tiles shared
// out on OpenMP's pool (see gemm() below). The reason is the 2-core machine: a library's own workers spin for a long
// time after each call, and so do OpenMP's after each elementwise kernel; two pools on two cores steal
// each other's time slices and both run at half speed. One pool for everything avoids it. Each output
// element is still one dot product over the whole K in the library's K order, so the split does not
// change results (the kernels tests check 1 vs 2 threads bit for bit, on the model's shapes too, on
// each library).
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <omp.h>

#include "kernels/cpu/ops.hpp"
#include "kernels/profile.hpp"
#include "kernels/tile.hpp"

namespace mt::cpu {

namespace {

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

std::string library_words(Fp32Gemm g) {
  if (g == Fp32Gemm::openblas) return std::string("OpenBLAS sgemm (core ") + openblas_get_corename() + ")";
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " sgemm (" + isa_name(dnnl_get_effective_cpu_isa()) + ")";
}

// OpenBLAS on the calling thread only. Its pthread build (Debian's default) splits a product over its
// own pool unless its thread count is 1; its OpenMP build runs serially inside a parallel region but
// outside one follows omp_get_max_threads() unless its count is 1, and its setter also sets the calling
// thread's OpenMP team size, which is put back.
void openblas_one_thread() {
  if (openblas_get_num_threads() == 1) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (openblas_get_num_threads() == 1) return;
  const int omp = omp_get_max_threads();
  openblas_set_num_threads(1);
  omp_set_num_threads(omp);
}

void sgemm_on(Fp32Gemm lib, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A,
              std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (lib == Fp32Gemm::openblas) {
    openblas_one_thread();
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

// Null until fixed (set_fp32_gemm_choice or the first product), then the choice, never freed (it is
// fixed once per process); products read it lock-free.
std::atomic<const Fp32GemmChoice*> g_choice{nullptr};
std::mutex g_choice_mu;

// What a request becomes here: the forced library wins.
Fp32GemmChoice effective(const Fp32GemmChoice& want) {
  const auto forced = fp32_gemm_forced();
  return forced ? Fp32GemmChoice::all(*forced) : want;
}

const Fp32GemmChoice& fix(const Fp32GemmChoice& want) {
  std::lock_guard<std::mutex> lock(g_choice_mu);
  if (g_choice.load() == nullptr) g_choice.store(new Fp32GemmChoice(effective(want)));
  return *g_choice.load();
}

const Fp32GemmChoice& fixed_choice() {
  const Fp32GemmChoice* c = g_choice.load(std::memory_order_acquire);
  return c != nullptr ? *c : fix(Fp32GemmChoice{});
}

Fp32Gemm library(LinearProduct p, std::int64_t in, std::int64_t out) { return fixed_choice().of(p, in, out); }

}  // namespace

const char* linear_product_name(LinearProduct p) {
  switch (p) {
    case LinearProduct::forward:
      return "forward";
    case LinearProduct::backward_input:
      return "backward_input";
    default:
      return "backward_weight";
  }
}

const char* fp32_gemm_name(Fp32Gemm g) { return g == Fp32Gemm::openblas ? "openblas" : "onednn"; }

std::optional<Fp32Gemm> parse_fp32_gemm(const std::string& name) {
  if (name == "onednn") return Fp32Gemm::onednn;
  if (name == "openblas") return Fp32Gemm::openblas;
  return std::nullopt;
}

Fp32Gemm Fp32GemmChoice::of(LinearProduct p, std::int64_t in, std::int64_t out) const {
  for (const Shape& s : shapes)
    if (s.product == p && s.in == in && s.out == out) return s.lib;
  return (*this)[p];
}

bool Fp32GemmChoice::operator==(const Fp32GemmChoice& o) const {
  return std::equal(lib, lib + kLinearProducts, o.lib) && shapes == o.shapes;
}

Fp32GemmChoice Fp32GemmChoice::all(Fp32Gemm g) {
  Fp32GemmChoice c;
  std::fill(c.lib, c.lib + kLinearProducts, g);
  return c;
}

std::string Fp32GemmChoice::str() const {
  std::string s;
  if (std::count(lib, lib + kLinearProducts, lib[0]) == kLinearProducts) {
    s = fp32_gemm_name(lib[0]);
  } else {
    for (int i = 0; i < kLinearProducts; ++i)
      s += std::string(i ? ", " : "") + linear_product_name(static_cast<LinearProduct>(i)) + " " +
           fp32_gemm_name(lib[i]);
  }
  for (const Shape& sh : shapes)
    s += std::string("; ") + linear_product_name(sh.product) + " " + std::to_string(sh.out) + "x" +
         std::to_string(sh.in) + " " + fp32_gemm_name(sh.lib);
  return s;
}

std::optional<Fp32Gemm> fp32_gemm_forced() {
  static const std::optional<Fp32Gemm> forced = [] {
    const char* e = std::getenv("MEGATRAIN_FP32_GEMM");
    if (e == nullptr || *e == 0) return std::optional<Fp32Gemm>();
    const auto g = parse_fp32_gemm(e);
    if (!g)
      throw std::invalid_argument(std::string("MEGATRAIN_FP32_GEMM=") + e + ": expected onednn or openblas (or unset)");
    return g;
  }();
  return forced;
}

Fp32GemmChoice fp32_gemm_choice() {
  const Fp32GemmChoice* c = g_choice.load(std::memory_order_acquire);
  return c != nullptr ? *c : effective(Fp32GemmChoice{});
}

bool fp32_gemm_fixed() { return g_choice.load(std::memory_order_acquire) != nullptr; }

Fp32GemmChoice set_fp32_gemm_choice(const Fp32GemmChoice& c) {
  const Fp32GemmChoice want = effective(c), have = fix(want);
  if (have != want)
    throw std::logic_error("set_fp32_gemm_choice: this process's fp32 products already run on " + have.str() +
                           "; they cannot switch to " + want.str() + " (the choice is fixed once per process)");
  return have;
}

std::string openblas_version() {
  std::string config = openblas_get_config();
  while (!config.empty() && config.back() == ' ') config.pop_back();
  return config + ", core " + openblas_get_corename();
}

const char* gemm_backend_name() {
  static std::mutex mu;
  static std::map<std::string, std::string> names;  // one per choice; the strings never move
  const Fp32GemmChoice c = fp32_gemm_choice();
  std::lock_guard<std::mutex> lock(mu);
  std::string& name = names[c.str()];
  if (name.empty()) {
    if (std::count(c.lib, c.lib + kLinearProducts, c.lib[0]) == kLinearProducts) {
      name = library_words(c.lib[0]);
    } else {
      for (int i = 0; i < kLinearProducts; ++i)
        name += std::string(i ? ", " : "") + linear_product_name(static_cast<LinearProduct>(i)) + " " +
                library_words(c.lib[i]);
    }
    for (const auto& sh : c.shapes)
      name += std::string("; ") + linear_product_name(sh.product) + " " + std::to_string(sh.out) + "x" +
              std::to_string(sh.in) + " " + library_words(sh.lib);
  }
  return name.c_str();
}

void sgemm_serial(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
                  const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  sgemm_on(Fp32Gemm::onednn, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
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

// C[M, N] = op(A) op(B) + beta C, row-major: one product's operands.
struct Gemm {
  bool ta, tb;
  std::int64_t M, N, K;
  const float* A;
  std::int64_t lda;
  const float* B;
  std::int64_t ldb;
  float beta;
  float* C;
  std::int64_t ldc;
  double flops() const { return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K); }
  bool split_m() const { return M >= N; }
  std::int64_t extent() const { return split_m() ? M : N; }
  std::int64_t tile() const {
    const std::int64_t per = std::max(kMinTile, (extent() + kMaxTiles - 1) / kMaxTiles);
    return (per + kTileAlign - 1) / kTileAlign * kTileAlign;
  }
  std::int64_t tiles() const { return (extent() + tile() - 1) / tile(); }
};

// Tile t of g: one single-threaded library call.
void run_tile(Fp32Gemm lib, const Gemm& g, std::int64_t t) {
  const std::int64_t tile = g.tile(), lo = t * tile, hi = std::min(g.extent(), lo + tile);
  const std::int64_t m0 = g.split_m() ? lo : 0, m1 = g.split_m() ? hi : g.M;
  const std::int64_t n0 = g.split_m() ? 0 : lo, n1 = g.split_m() ? g.N : hi;
  if (m1 <= m0 || n1 <= n0) return;
  const float* a = g.ta ? g.A + m0 : g.A + m0 * g.lda;  // row m of op(A)
  const float* b = g.tb ? g.B + n0 * g.ldb : g.B + n0;  // column n of op(B)
  sgemm_on(lib, g.ta, g.tb, m1 - m0, n1 - n0, g.K, a, g.lda, b, g.ldb, g.beta, g.C + m0 * g.ldc + n0, g.ldc);
}

void gemm(Fp32Gemm lib, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A,
          std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc, int threads) {
  const Gemm g{ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc};
  const std::int64_t tiles = g.tiles();
  if (threads <= 1 || tiles <= 1 || g.flops() < 4e6) {
    for (std::int64_t t = 0; t < tiles; ++t) run_tile(lib, g, t);
    return;
  }
#pragma omp parallel for num_threads(static_cast <int>(std::min <std::int64_t>(threads, tiles))) schedule(dynamic, 1)
  for (std::int64_t t = 0; t < tiles; ++t) run_tile(lib, g, t);
}

// Independent products in one parallel region over all their tiles: each tile the same call as gemm()
// makes, so the same bits, with one fork-join for all of them and no thread idle while one product's
// last tiles finish (a mixture's experts: a few tiles each). The task list is the calling thread's,
// grown once.
void gemm_batch(Fp32Gemm lib, const std::vector<Gemm>& gs, int threads) {
  thread_local std::vector<std::pair<std::size_t, std::int64_t>> mine;
  auto& tasks = mine;  // the pool's threads read the caller's list, not their own thread_local
  tasks.clear();
  double flops = 0;
  for (std::size_t i = 0; i < gs.size(); ++i) {
    if (gs[i].M <= 0 || gs[i].N <= 0) continue;
    for (std::int64_t t = 0; t < gs[i].tiles(); ++t) tasks.emplace_back(i, t);
    flops += gs[i].flops();
  }
  const auto n = static_cast<std::int64_t>(tasks.size());
  auto run = [&](std::int64_t k) {
    const auto& [i, t] = tasks[static_cast<std::size_t>(k)];
    run_tile(lib, gs[i], t);
  };
  if (threads <= 1 || n <= 1 || flops < 4e6) {
    for (std::int64_t k = 0; k < n; ++k) run(k);
    return;
  }
#pragma omp parallel for num_threads(static_cast <int>(std::min <std::int64_t>(threads, n))) schedule(dynamic, 1)
  for (std::int64_t k = 0; k < n; ++k) run(k);
}

// The three products of a linear layer on one library (the probe runs them on both).
void forward_on(Fp32Gemm lib, const float* x, const float* W, float* y, std::int64_t N, std::int64_t in,
                std::int64_t out, float beta, int threads) {
  gemm(lib, false, true, N, out, in, x, in, W, in, beta, y, out, threads);
}

void backward_input_on(Fp32Gemm lib, const float* dy, const float* W, float* dx, std::int64_t N, std::int64_t in,
                       std::int64_t out, bool add, int threads) {
  gemm(lib, false, false, N, in, out, dy, out, W, in, add ? 1.0f : 0.0f, dx, in, threads);
}

void backward_weight_on(Fp32Gemm lib, const float* dy, const float* x, float* dW_acc, std::int64_t N, std::int64_t in,
                        std::int64_t out, int threads) {
  gemm(lib, true, false, out, in, N, dy, out, x, in, 1.0f, dW_acc, in, threads);
}

// A probe's shape: rows cut to 0.25 GFLOP a product, out to 8M weight elements.
LinearShape bounded(LinearShape s) {
  constexpr double kMaxFlops = 2.5e8;
  constexpr std::int64_t kMaxWeight = std::int64_t{1} << 23;
  if (s.in * s.out > kMaxWeight) s.out = std::max<std::int64_t>(64, kMaxWeight / s.in / 64 * 64);
  const auto fit = static_cast<std::int64_t>(kMaxFlops / (2.0 * static_cast<double>(s.in * s.out)));
  if (s.rows > fit) s.rows = std::max<std::int64_t>(64, fit / 64 * 64);
  return s;
}

Fp32Gemm pick(double onednn_s, double openblas_s) {
  return openblas_s > 0 && onednn_s >= kFp32OpenblasMargin * openblas_s ? Fp32Gemm::openblas : Fp32Gemm::onednn;
}

// The probe's choice from each product's best times (layers[i / 3], product i % 3): per product by the
// sums over the layers, then each layer shape (duplicates summed) listed where its own sums favour the
// other library by kFp32ShapeMargin.
Fp32GemmChoice probed_choice(const std::vector<LinearShape>& layers, const std::vector<double>& onednn,
                             const std::vector<double>& openblas) {
  Fp32GemmChoice c;
  double sum_d[kLinearProducts] = {}, sum_b[kLinearProducts] = {};
  std::map<std::tuple<int, std::int64_t, std::int64_t>, std::pair<double, double>> per_shape;
  for (std::size_t i = 0; i < onednn.size(); ++i) {
    const int p = static_cast<int>(i % 3);
    const LinearShape& l = layers[i / 3];
    sum_d[p] += onednn[i];
    sum_b[p] += openblas[i];
    auto& t = per_shape[{p, l.in, l.out}];
    t.first += onednn[i];
    t.second += openblas[i];
  }
  for (int p = 0; p < kLinearProducts; ++p) c.lib[p] = pick(sum_d[p], sum_b[p]);
  for (const auto& [key, t] : per_shape) {
    const auto [p, in, out] = key;
    // A shape leaves its product's library only for one measured clearly faster on it.
    const bool to_openblas = c.lib[p] == Fp32Gemm::onednn && t.first >= kFp32ShapeMargin * t.second;
    const bool to_onednn = c.lib[p] == Fp32Gemm::openblas && t.second >= kFp32ShapeMargin * t.first;
    if (to_openblas || to_onednn)
      c.shapes.push_back({static_cast<LinearProduct>(p), in, out, to_openblas ? Fp32Gemm::openblas : Fp32Gemm::onednn});
  }
  return c;
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
  forward_on(library(LinearProduct::forward, in, out), x, W, y, N, in, out, beta, threads);
}

void linear_backward_input(const float* dy, const float* W, float* dx, std::int64_t N, std::int64_t in,
                           std::int64_t out, bool add, int threads) {
  prof::Scope prof_scope(prof::matmul);
  backward_input_on(library(LinearProduct::backward_input, in, out), dy, W, dx, N, in, out, add, threads);
}

void linear_backward_weight(const float* dy, const float* x, float* dW_acc, float* dbias_acc, std::int64_t N,
                            std::int64_t in, std::int64_t out, int threads) {
  prof::Scope prof_scope(prof::matmul);
  backward_weight_on(library(LinearProduct::backward_weight, in, out), dy, x, dW_acc, N, in, out, threads);
  if (dbias_acc) colsum_add(dy, dbias_acc, N, out, threads);
}

void grouped_linear_forward(const float* x, const float* W, std::int64_t w_stride, const float* bias,
                            std::int64_t b_stride, float* y, const std::int64_t* offsets, std::int64_t experts,
                            std::int64_t in, std::int64_t out, int threads) {
  prof::Scope prof_scope(prof::matmul);
  thread_local std::vector<Gemm> gs;
  gs.clear();
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (rows <= 0) continue;
    float* ye = y + r0 * out;
    if (bias) {  // as linear_forward: start from the broadcast bias, beta = 1
      const float* be = bias + e * b_stride;
      for (std::int64_t r = 0; r < rows; ++r) std::copy(be, be + out, ye + r * out);
    }
    gs.push_back({false, true, rows, out, in, x + r0 * in, in, W + e * w_stride, in, bias ? 1.0f : 0.0f, ye, out});
  }
  gemm_batch(library(LinearProduct::forward, in, out), gs, threads);
}

void grouped_linear_backward(const float* dy, const float* x, const float* W, std::int64_t w_stride, float* dx,
                             bool add, float* dW_acc, float* db_acc, std::int64_t b_stride, const std::int64_t* offsets,
                             std::int64_t experts, std::int64_t in, std::int64_t out, int threads) {
  prof::Scope prof_scope(prof::matmul);
  thread_local std::vector<Gemm> gs;
  if (dx) {
    gs.clear();
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
      if (rows > 0)
        gs.push_back({false, false, rows, in, out, dy + r0 * out, out, W + e * w_stride, in, add ? 1.0f : 0.0f,
                      dx + r0 * in, in});
    }
    gemm_batch(library(LinearProduct::backward_input, in, out), gs, threads);
  }
  gs.clear();
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    if (rows > 0)
      gs.push_back({true, false, out, in, rows, dy + r0 * out, out, x + r0 * in, in, 1.0f, dW_acc + e * w_stride, in});
  }
  gemm_batch(library(LinearProduct::backward_weight, in, out), gs, threads);
  if (db_acc)
    for (std::int64_t e = 0; e < experts; ++e)
      if (offsets[e + 1] > offsets[e])
        colsum_add(dy + offsets[e] * out, db_acc + e * b_stride, offsets[e + 1] - offsets[e], out, threads);
}

Fp32Probe probe_fp32_gemm(const std::vector<LinearShape>& shapes, int threads, double budget_s) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Fp32Probe r;
  r.threads = std::max(1, threads);
  std::vector<LinearShape> layers;  // as given (the choice names them), r.shapes as timed
  for (const LinearShape& s : shapes)
    if (s.rows > 0 && s.in > 0 && s.out > 0) {
      layers.push_back(s);
      r.shapes.push_back(bounded(s));
    }
  std::size_t max_x = 0, max_w = 0, max_y = 0;
  for (const LinearShape& s : r.shapes) {
    max_x = std::max(max_x, static_cast<std::size_t>(s.rows * s.in));
    max_w = std::max(max_w, static_cast<std::size_t>(s.in * s.out));
    max_y = std::max(max_y, static_cast<std::size_t>(s.rows * s.out));
  }
  // Operands: small values of a fixed pattern (timing only; never checked), 64-byte aligned as the
  // engine's tiles and arena hold them: oneDNN's AVX2 sgemm runs column tiles of an aligned W whose rows
  // are a multiple of 4 KiB at half the speed of the same call on a W 16 bytes off (malloc's alignment).
  auto filled = [](std::size_t n, std::uint32_t seed) {
    AlignedFloats v = make_aligned_floats(std::max<std::size_t>(n, 1));
    for (std::size_t i = 0; i < n; ++i) {
      seed = seed * 1664525u + 1013904223u;
      v[i] = static_cast<float>(seed >> 9) * (1.0f / 8388608.0f) - 0.5f;
    }
    return v;
  };
  const AlignedFloats x = filled(max_x, 1), w = filled(max_w, 2), dy = filled(max_y, 3);
  const AlignedFloats y = filled(max_y, 4), dx = filled(max_x, 5), dw = filled(max_w, 6);
  auto seconds = [&](Fp32Gemm lib, const LinearShape& s, int product) {
    const auto a = Clock::now();
    if (product == 0)
      forward_on(lib, x.get(), w.get(), y.get(), s.rows, s.in, s.out, 0.0f, r.threads);
    else if (product == 1)
      backward_input_on(lib, dy.get(), w.get(), dx.get(), s.rows, s.in, s.out, false, r.threads);
    else
      backward_weight_on(lib, dy.get(), x.get(), dw.get(), s.rows, s.in, s.out, r.threads);
    return std::chrono::duration<double>(Clock::now() - a).count();
  };
  const std::size_t n = r.shapes.size() * kLinearProducts;
  for (std::size_t i = 0; i < n; ++i)  // warm-up: oneDNN's JIT, the libraries' buffers
    for (Fp32Gemm lib : {Fp32Gemm::onednn, Fp32Gemm::openblas}) seconds(lib, r.shapes[i / 3], static_cast<int>(i % 3));
  r.warmup_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> best_d(n, 1e300), best_b(n, 1e300);
  // At least two rounds: each library then went first once on every product, and a best of two is
  // what keeps a moment of another process's work from deciding.
  constexpr int kMinRounds = 2, kMaxRounds = 5;
  while (r.rounds < kMaxRounds &&
         (r.rounds < kMinRounds || std::chrono::duration<double>(Clock::now() - t0).count() < budget_s)) {
    for (std::size_t i = 0; i < n; ++i) {
      // Alternate which library goes first, so a drifting machine favours neither.
      const bool openblas_first = (static_cast<std::size_t>(r.rounds) + i) % 2 == 1;
      const LinearShape& s = r.shapes[i / 3];
      const int product = static_cast<int>(i % 3);
      if (openblas_first) best_b[i] = std::min(best_b[i], seconds(Fp32Gemm::openblas, s, product));
      best_d[i] = std::min(best_d[i], seconds(Fp32Gemm::onednn, s, product));
      if (!openblas_first) best_b[i] = std::min(best_b[i], seconds(Fp32Gemm::openblas, s, product));
    }
    ++r.rounds;
  }
  for (std::size_t i = 0; i < n; ++i) {
    r.onednn_s[i % 3] += best_d[i];
    r.openblas_s[i % 3] += best_b[i];
  }
  r.choice = probed_choice(layers, best_d, best_b);
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
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
