// The GEMM ceiling of this machine: for transformer-shaped products (1024 tokens; hidden/MLP sizes
// 768/3072 and 256/1024; the three orientations of a linear layer), on one thread and on all threads,
// the rate of each library path beside our own kernels/cpu linear products (which split each product on
// OpenMP's pool and run the library single-threaded per block):
//   openblas            Debian's OpenBLAS as loaded (its core is picked from a CPU-model table when
//                       the library loads; OPENBLAS_CORETYPE in the environment overrides it)
//   onednn_sgemm        oneDNN's dnnl_sgemm (JIT kernels picked from CPU features)
//   onednn_matmul_f32   oneDNN's matmul primitive, fp32
//   onednn_matmul_bf16  oneDNN's matmul primitive, bf16 inputs, fp32 output
//   onednn_gemm_bf16    oneDNN's dnnl_gemm_bf16bf16f32 (bf16 inputs, fp32 output)
//   openblas_sbgemm     OpenBLAS's cblas_sbgemm, when the loaded library exports it (Debian's does not)
//   bf16_widened_sgemm  bf16 inputs widened to fp32 (exact), then dnnl_sgemm; widening included
//   openblas_<core>     OpenBLAS with the core that fits the CPU's features forced (OPENBLAS_CORETYPE,
//                       in a child process: the library reads it only when it loads)
//   ours                kernels/cpu linear_forward / linear_backward_input / linear_backward_weight, on
//                       the library per product a run would measure here (MEGATRAIN_FP32_GEMM forces one)
//   ours_bf16           their bf16 versions (ops_bf16.hpp), on the operands rounded to bf16, on the path a
//                       run would measure here (bf16_choice.hpp; MEGATRAIN_BF16_GEMM forces one)
// Figures: gemm_fp32_best (the in-process fp32 libraries, the ceiling bench_train_step uses) and
// gemm_bf16_best (the best of the bf16 candidates; FLOP/s, per thread count and for all threads), each
// library's best, ours against the best fp32 rate on the same shape (time-weighted over the shapes:
// gemm_ours_vs_best), ours in bf16 against the best bf16 rate (gemm_ours_bf16_vs_best), and one core's
// fp32 FMA and vdpbf16ps peaks (isa_peak.hpp: why bf16 cannot beat fp32 without AMX on some CPUs).
//
// usage: bench_gemm [threads=all] [tokens=1024] [rounds=3]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/bf16_choice.hpp"
#include "tools/bench/gemm_ceiling.hpp"
#include "tools/bench/isa_peak.hpp"

namespace {

using mt::bench::GemmLib;
using mt::bench::GemmShape;

// Our linear products on the shape's orientation: NT = forward, NN = backward input, TN = backward weight.
double ours_rate(const GemmShape& s, int threads, int reps) {
  mt::bench::AlignedVector<float> a(static_cast<std::size_t>(s.m * s.k), 0.01f),
      b(static_cast<std::size_t>(s.k * s.n), 0.02f), c(static_cast<std::size_t>(s.m * s.n), 0.0f);
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

// The same with bf16 operands (ops_bf16.hpp).
double ours_bf16_rate(const GemmShape& s, int threads, int reps) {
  using mt::bf16_t;
  mt::bench::AlignedVector<bf16_t> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n));
  std::vector<float> af(a.size(), 0.01f), bf(b.size(), 0.02f), c(static_cast<std::size_t>(s.m * s.n), 0.0f);
  mt::cpu::to_bf16(af.data(), a.data(), a.size(), 1);
  mt::cpu::to_bf16(bf.data(), b.data(), b.size(), 1);
  std::function<void()> fn;
  if (!s.ta && s.tb)
    fn = [&] { mt::cpu::linear_forward_bf16(a.data(), b.data(), nullptr, c.data(), s.m, s.k, s.n, threads); };
  else if (!s.ta && !s.tb)
    fn = [&] { mt::cpu::linear_backward_input_bf16(a.data(), b.data(), c.data(), s.m, s.n, s.k, false, threads); };
  else if (s.ta && !s.tb)
    fn = [&] { mt::cpu::linear_backward_weight_bf16(a.data(), b.data(), c.data(), s.k, s.n, s.m, threads); };
  else
    return 0;
  return s.flops() / mt::bench::best_seconds(fn, reps);
}

// The OpenBLAS core that fits this CPU's features (what Debian's 0.3.21 would pick if it knew the model).
const char* fitting_openblas_core(const std::string& isa) {
  if (isa.find("avx512_bf16") != std::string::npos) return "Cooperlake";
  if (isa.find("avx512f") != std::string::npos) return "SkylakeX";
  if (isa.find("avx2") != std::string::npos) return "Haswell";
  return nullptr;
}

// OpenBLAS reads OPENBLAS_CORETYPE once, when the library loads, so a forced core needs a fresh process:
// this binary again in --openblas-only mode. Returns rate[thread count index][shape] (empty on failure).
std::vector<std::vector<double>> forced_openblas(const char* self, const char* core, const std::vector<int>& counts,
                                                 std::size_t shapes, std::int64_t tokens, int reps) {
  const std::string cmd = std::string("OPENBLAS_CORETYPE=") + core + " '" + self + "' --openblas-only " +
                          std::to_string(counts.back()) + " " + std::to_string(tokens) + " " + std::to_string(reps);
  std::vector<std::vector<double>> rate(counts.size(), std::vector<double>(shapes, 0.0));
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  char line[256];
  int ti = 0, si = 0;
  double r = 0;
  while (std::fgets(line, sizeof line, p))
    if (std::sscanf(line, "openblas %d %d %lf", &ti, &si, &r) == 3 && ti >= 0 && ti < static_cast<int>(counts.size()) &&
        si >= 0 && si < static_cast<int>(shapes))
      rate[static_cast<std::size_t>(ti)][static_cast<std::size_t>(si)] = r;
  return pclose(p) == 0 ? rate : std::vector<std::vector<double>>{};
}

}  // namespace

static int run(int argc, char** argv) {
  const bool openblas_only = argc > 1 && std::strcmp(argv[1], "--openblas-only") == 0;
  if (openblas_only) {
    --argc;
    ++argv;
  }
  const int all = omp_get_num_procs();
  const int threads = argc > 1 ? std::atoi(argv[1]) : all;
  const std::int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;

  std::vector<GemmShape> uniq;  // the two models' shapes; some repeat at tokens = 1024
  for (const std::int64_t d : {768, 256})
    for (const auto& s : mt::bench::transformer_shapes(tokens, d, 4 * d))
      if (std::none_of(uniq.begin(), uniq.end(), [&](const GemmShape& u) {
            return u.m == s.m && u.n == s.n && u.k == s.k && u.ta == s.ta && u.tb == s.tb;
          }))
        uniq.push_back(s);
  std::vector<int> counts = {1};
  if (threads > 1) counts.push_back(threads);

  if (openblas_only) {
    for (std::size_t ti = 0; ti < counts.size(); ++ti)
      for (std::size_t si = 0; si < uniq.size(); ++si)
        std::printf("openblas %zu %zu %.17g\n", ti, si,
                    mt::bench::gemm_rate(GemmLib::openblas, uniq[si], counts[ti], reps));
    return 0;
  }

  const std::string isa = mt::bench::cpu_isa_flags();
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  // ours_bf16 runs the path a run would measure here (both models' layers at `threads` threads).
  std::vector<mt::cpu::Bf16ProbeShape> layers;
  for (const std::int64_t d : {768, 256})
    for (const auto& io : {std::pair{d, d}, std::pair{d, 3 * d}, std::pair{d, 4 * d}, std::pair{4 * d, d}})
      layers.push_back({tokens, io.first, io.second});
  // ours runs the fp32 libraries a run would measure here, on the same layers (first: the bf16 probe's
  // widened path runs on them).
  const std::string fp32_choice = mt::bench::choose_fp32_gemm(layers, threads);
  const std::string bf16_path = mt::bench::choose_bf16_path(layers, threads);
  std::printf(
      "gemm: %s\n  ISA: %s\n  OpenBLAS core: %s (%s)\n  our fp32 libraries: %s\n  our GEMM: %s\n  our bf16 GEMM: "
      "%s\n  our bf16 path: %s\n",
      mt::bench::cpu_model().c_str(), isa.c_str(), mt::bench::openblas_core().c_str(),
      env_core && *env_core ? "OPENBLAS_CORETYPE set" : "as detected", fp32_choice.c_str(),
      mt::cpu::gemm_backend_name(), mt::cpu::linear_bf16_impl_name(tokens, 768, 768), bf16_path.c_str());
  const char* core = fitting_openblas_core(isa);
  std::vector<std::vector<double>> forced;
  if (core) {
    forced = forced_openblas(argv[0], core, counts, uniq.size(), tokens, reps);
    std::printf("  OpenBLAS forced: OPENBLAS_CORETYPE=%s in a child process%s\n", core,
                forced.empty() ? " failed" : "");
  }
  const std::string forced_name = std::string("openblas_") + (core ? core : "forced");

  mt::bench::Report report("gemm");
  // What the units can do at all: a bf16 GEMM without AMX runs on one of these two instructions.
  const mt::bench::IsaPeaks peak = mt::bench::isa_peaks(5);
  std::printf("  one core's peak: fp32 FMA %.1f GFLOP/s (%s; zmm %.1f, ymm %.1f), vdpbf16ps %.1f GFLOP/s (%.2fx FMA)\n",
              peak.fma_fp32 / 1e9, *peak.fma_isa ? peak.fma_isa : "no FMA measured", peak.fma_avx512 / 1e9,
              peak.fma_avx2 / 1e9, peak.dpbf16 / 1e9, peak.fma_fp32 > 0 ? peak.dpbf16 / peak.fma_fp32 : 0.0);
  report.add({"gemm_core_peak_fp32_fma", peak.fma_fp32, "FLOP/s", 0});
  report.add({"gemm_core_peak_fp32_fma_ymm", peak.fma_avx2, "FLOP/s", peak.fma_fp32});
  report.add({"gemm_core_peak_bf16_dpbf16", peak.dpbf16, "FLOP/s", peak.fma_fp32});
  constexpr int kLibs = static_cast<int>(GemmLib::kNum);
  for (std::size_t ti = 0; ti < counts.size(); ++ti) {
    const int t = counts[ti];
    std::printf("\n  %d thread%s, GFLOP/s\n  %-18s", t, t > 1 ? "s" : "", "shape (m n k op)");
    for (int l = 0; l < kLibs; ++l) std::printf(" %18s", mt::bench::lib_name(static_cast<GemmLib>(l)));
    std::printf(" %18s %8s %9s %9s %9s\n", forced_name.c_str(), "ours", "ours/best", "ours_bf16", "/best16");
    const std::string tag = "_t" + std::to_string(t);
    double best32 = 0, best16 = 0, lib_best[kLibs] = {}, forced_best = 0, ours_sum_t = 0, best_sum_t = 0, total = 0;
    double ours16_sum_t = 0, best16_sum_t = 0;
    for (std::size_t si = 0; si < uniq.size(); ++si) {
      const GemmShape& s = uniq[si];
      double r[kLibs] = {}, ours = 0, ours16 = 0;
      // Rounds that time every candidate once each (after its warm-up), each keeping its best: a busy
      // moment of a shared machine then hits them alike, not one candidate's whole series.
      for (int round = 0; round < reps; ++round) {
        for (int l = 0; l < kLibs; ++l) r[l] = std::max(r[l], mt::bench::gemm_rate(static_cast<GemmLib>(l), s, t, 1));
        ours = std::max(ours, ours_rate(s, t, 1));
        ours16 = std::max(ours16, ours_bf16_rate(s, t, 1));
      }
      const double f = forced.empty() ? 0 : forced[ti][si];
      // The in-process fp32 libraries (the ceiling the train-step bench uses too), and the bf16 candidates.
      double fp32 = 0, bf16 = 0;
      for (int l = 0; l < kLibs; ++l) {
        double& best = mt::bench::is_bf16(static_cast<GemmLib>(l)) ? bf16 : fp32;
        best = std::max(best, r[l]);
      }
      std::printf("  %-18s", s.name().c_str());
      for (int l = 0; l < kLibs; ++l) std::printf(" %18.1f", r[l] / 1e9);
      std::printf(" %18.1f %8.1f %9.2f %9.1f %9.2f\n", f / 1e9, ours / 1e9, ours / fp32, ours16 / 1e9, ours16 / bf16);
      for (int l = 0; l < kLibs; ++l) lib_best[l] = std::max(lib_best[l], r[l]);
      forced_best = std::max(forced_best, f);
      best32 = std::max(best32, fp32);
      best16 = std::max(best16, bf16);
      ours16_sum_t += s.flops() / ours16;
      best16_sum_t += s.flops() / bf16;
      // Time-weighted over the shapes: the same FLOPs at our rate and at the per-shape best rate.
      ours_sum_t += s.flops() / ours;
      best_sum_t += s.flops() / fp32;
      total += s.flops();
      std::string id = s.name();
      id[id.find(' ')] = '_';
      report.add({"gemm_ours_" + id + tag, ours, "FLOP/s", fp32});
      report.add({"gemm_ours_bf16_" + id + tag, ours16, "FLOP/s", bf16});
    }
    for (int l = 0; l < kLibs; ++l)
      report.add(
          {std::string("gemm_") + mt::bench::lib_name(static_cast<GemmLib>(l)) + tag, lib_best[l], "FLOP/s", best32});
    if (!forced.empty()) report.add({"gemm_" + forced_name + tag, forced_best, "FLOP/s", best32});
    report.add({"gemm_fp32_best" + tag, best32, "FLOP/s", 0});
    report.add({"gemm_bf16_best" + tag, best16, "FLOP/s", best32});
    report.add({"gemm_ours_vs_best" + tag, total / ours_sum_t, "FLOP/s", total / best_sum_t});
    report.add({"gemm_ours_bf16_vs_best" + tag, total / ours16_sum_t, "FLOP/s", total / best16_sum_t});
    std::printf(
        "  best fp32 %.1f GFLOP/s, best bf16 %.1f GFLOP/s; ours at %.0f%% of the per-shape best fp32, ours in bf16 at "
        "%.0f%% of the per-shape best bf16\n",
        best32 / 1e9, best16 / 1e9, 100 * best_sum_t / ours_sum_t, 100 * best16_sum_t / ours16_sum_t);
    if (t == counts.back()) {  // the headline figures: all threads
      report.add({"gemm_fp32_best", best32, "FLOP/s", 0});
      report.add({"gemm_bf16_best", best16, "FLOP/s", best32});
      report.add({"gemm_ours_vs_best", total / ours_sum_t, "FLOP/s", total / best_sum_t});
      report.add({"gemm_ours_bf16_vs_best", total / ours16_sum_t, "FLOP/s", total / best16_sum_t});
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
