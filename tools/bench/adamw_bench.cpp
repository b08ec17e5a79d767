// AdamW parameters/s against the memory bandwidth of this machine, both measured in this run.
// The probe has AdamW's access pattern (read p, g, m, v; write p, m, v in place) and no arithmetic
// to speak of, so probe params/s is the ceiling a memory-bound AdamW can reach.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <omp.h>

#include "kernels/adamw.hpp"
#include "tools/bench/bench_report.hpp"

namespace {

// Same split as the kernel: one contiguous chunk per thread.
void probe(float* p, const float* g, float* m, float* v, std::size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    const float x = g[i];
    p[i] += x;
    m[i] += x;
    v[i] += x;
  }
}

}  // namespace

// NOLINTNEXTLINE(bugprone-exception-escape): a benchmark; an error ends it via std::terminate, which names it
int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::size_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (std::size_t(32) << 20);
  const int reps = 7;
  std::printf("adamw: %zu params (%.1f MiB of state), %d threads, best of %d\n", n, n * 16.0 / (1 << 20), threads,
              reps);
  std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  mt::AdamWHyper h;
  h.weight_decay = 0.1f;
  const auto s = mt::make_adamw_step(h, 10);
  const double t_probe =
      mt::bench::best_seconds([&] { probe(p.data(), g.data(), m.data(), v.data(), n, threads); }, reps);
  const double t_adam =
      mt::bench::best_seconds([&] { mt::cpu::adamw(p.data(), g.data(), m.data(), v.data(), n, s, threads); }, reps);
  const double t_ref =
      mt::bench::best_seconds([&] { mt::cpu::adamw_reference(p.data(), g.data(), m.data(), v.data(), n, s); }, 3);
  const double probe_rate = n / t_probe, adam_rate = n / t_adam, ref_rate = n / t_ref;
  std::printf("  probe      %.3f Gparam/s  (%.1f GB/s at 28 B/param)\n", probe_rate / 1e9, probe_rate * 28 / 1e9);
  std::printf("  adamw      %.3f Gparam/s  (%.1f GB/s)  %.1f%% of probe\n", adam_rate / 1e9, adam_rate * 28 / 1e9,
              100 * adam_rate / probe_rate);
  std::printf("  reference  %.3f Gparam/s  (1 thread, scalar)\n", ref_rate / 1e9);
  mt::bench::Report report("adamw");
  report.add({"adamw_params_per_s", adam_rate, "params/s", probe_rate});
  report.add({"adamw_bytes_per_s", adam_rate * 28, "B/s", probe_rate * 28});
  report.add({"adamw_reference_params_per_s", ref_rate, "params/s", probe_rate});
  report.print();
  return 0;
}
