// The GEMM ceiling of this machine: for transformer-shaped products (1024 tokens; hidden/MLP sizes
// 768/3072 and 256/1024; the three orientations of a linear layer), on one thread and on all threads,
// the rate of each library path beside our own kernels/cpu linear products (which split each product on
// OpenMP's pool and run the library single-threaded per block):
//   openblas            Debian's OpenBLAS as loaded (its core is picked from a CPU-model table when
//                       the library loads; OPENBLAS_CORETYPE in the environment overrides it)
//   onednn_sgemm        oneDNN's dnnl_sgemm (JIT kernels picked from CPU features)
//   onednn_matmul_f32   oneDNN's matmul primitive, fp32
//   onednn_matmul_bf16  oneDNN's matmul primitive, bf16 inputs, fp32 output
//   ours                kernels/cpu linear_forward / linear_backward_input / linear_backward_weight
// Figures: gemm_fp32_best and gemm_bf16_best (FLOP/s per thread count), and ours against the best fp32
// rate on the same shape.
//
// usage: bench_gemm [threads=all] [tokens=1024] [reps=3]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/gemm_ceiling.hpp"

namespace {

using mt::bench::GemmLib;
using mt::bench::GemmShape;

// Our linear products on the shape's orientation: NT = forward, NN = backward input, TN = backward weight.
double ours_rate(const GemmShape& s, int threads, int reps) {
  std::vector<float> a(static_cast<std::size_t>(s.m * s.k), 0.01f), b(static_cast<std::size_t>(s.k * s.n), 0.02f),
      c(static_cast<std::size_t>(s.m * s.n), 0.0f);
  std::function<void()> fn;
  if (!s.ta && s.tb)  // y[m, n] = x[m, k] W[n, k]^T
    fn = [&] { mt::cpu::linear_forward(a.data(), b.data(), nullptr, c.data(), s.m, s.k, s.n, threads); };
  else if (!s.ta && !s.tb)  // dx[m, n] = dy[m, k] W[k, n]
    fn = [&] { mt::cpu::linear_backward_input(a.data(), b.data(), c.data(), s.m, s.n, s.k, false, threads); };
  else if (s.ta && !s.tb)  // dW[m, n] += dy[k, m]^T x[k, n]
    fn = [&] { mt::cpu::linear_backward_weight(a.data(), b.data(), c.data(), nullptr, s.k, s.n, s.m, threads); };
  else
    return 0;
  return s.flops() / mt::bench::best_seconds(fn, reps);
}

}  // namespace

static int run(int argc, char** argv) {
  const int all = omp_get_num_procs();
  const int threads = argc > 1 ? std::atoi(argv[1]) : all;
  const std::int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;

  std::printf("gemm: %s\n  ISA: %s\n  OpenBLAS core: %s (%s)\n  our GEMM: %s\n", mt::bench::cpu_model().c_str(),
              mt::bench::cpu_isa_flags().c_str(), mt::bench::openblas_core().c_str(),
              std::getenv("OPENBLAS_CORETYPE") ? "OPENBLAS_CORETYPE set" : "as detected", mt::cpu::gemm_backend_name());

  std::vector<GemmShape> shapes;
  for (const auto& s : mt::bench::transformer_shapes(tokens, 768, 3072)) shapes.push_back(s);
  for (const auto& s : mt::bench::transformer_shapes(tokens, 256, 1024)) shapes.push_back(s);
  // The QKV projection is the same product shape as two others at these sizes; keep the distinct ones.
  std::vector<GemmShape> uniq;
  for (const auto& s : shapes)
    if (std::none_of(uniq.begin(), uniq.end(), [&](const GemmShape& u) {
          return u.m == s.m && u.n == s.n && u.k == s.k && u.ta == s.ta && u.tb == s.tb;
        }))
      uniq.push_back(s);

  mt::bench::Report report("gemm");
  std::vector<int> counts = {1};
  if (threads > 1) counts.push_back(threads);
  constexpr int kLibs = static_cast<int>(GemmLib::kNum);
  for (const int t : counts) {
    std::printf("\n  %d thread%s, GFLOP/s\n  %-18s", t, t > 1 ? "s" : "", "shape (m n k op)");
    for (int l = 0; l < kLibs; ++l) std::printf(" %18s", mt::bench::lib_name(static_cast<GemmLib>(l)));
    std::printf(" %10s %10s\n", "ours", "ours/best");
    const std::string tag = "_t" + std::to_string(t);
    double best32 = 0, best16 = 0, lib_best[kLibs] = {}, ours_sum_t = 0, best_sum_t = 0;
    for (const auto& s : uniq) {
      double r[kLibs];
      for (int l = 0; l < kLibs; ++l) r[l] = mt::bench::gemm_rate(static_cast<GemmLib>(l), s, t, reps);
      const double ours = ours_rate(s, t, reps);
      const double fp32 = std::max({r[0], r[1], r[2]});
      std::printf("  %-18s", s.name().c_str());
      for (int l = 0; l < kLibs; ++l) std::printf(" %18.1f", r[l] / 1e9);
      std::printf(" %10.1f %10.2f\n", ours / 1e9, ours / fp32);
      for (int l = 0; l < kLibs; ++l) lib_best[l] = std::max(lib_best[l], r[l]);
      best32 = std::max(best32, fp32);
      best16 = std::max(best16, r[3]);
      // Time-weighted: the same FLOPs at our rate and at the best rate, summed over the shapes.
      ours_sum_t += s.flops() / ours;
      best_sum_t += s.flops() / fp32;
      std::string id = s.name();
      id[id.find(' ')] = '_';
      report.add({"gemm_ours_" + id + tag, ours, "FLOP/s", fp32});
    }
    for (int l = 0; l < kLibs; ++l)
      report.add(
          {std::string("gemm_") + mt::bench::lib_name(static_cast<GemmLib>(l)) + tag, lib_best[l], "FLOP/s", best32});
    report.add({"gemm_fp32_best" + tag, best32, "FLOP/s", 0});
    report.add({"gemm_bf16_best" + tag, best16, "FLOP/s", best32});
    // ours over the per-shape best, time-weighted over the shapes (value and ceiling in FLOP/s)
    double total = 0;
    for (const auto& s : uniq) total += s.flops();
    report.add({"gemm_ours_vs_best" + tag, total / ours_sum_t, "FLOP/s", total / best_sum_t});
    std::printf("  best fp32 %.1f GFLOP/s, best bf16 %.1f GFLOP/s; ours at %.0f%% of the per-shape best fp32\n",
                best32 / 1e9, best16 / 1e9, 100 * best_sum_t / ours_sum_t);
    if (t == counts.back()) {
      report.add({"gemm_fp32_best", best32, "FLOP/s", 0});
      report.add({"gemm_bf16_best", best16, "FLOP/s", best32});
      report.add({"gemm_ours_vs_best", total / ours_sum_t, "FLOP/s", total / best_sum_t});
    }
  }
  report.print();
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
}
