// AdamW parameters/s against the memory bandwidth of this machine, both measured in this run.
// Each probe has its kernel's access pattern (fp32: read p, g, m, v; write p, m, v in place; bf16 copy:
// the same plus a 2-byte store per parameter; split masters: read and write the two 2-byte halves, m and
// v, read g) and no arithmetic to speak of, so probe params/s is the ceiling a memory-bound AdamW can reach.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <omp.h>

#include "kernels/adamw.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/master_halves.hpp"
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

// The fused kernel's pattern: also stores the upper half of the new p (a 2-byte write per parameter).
void probe_copy(float* p, const float* g, float* m, float* v, mt::bf16_t* c, std::size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    const float x = g[i];
    const float y = p[i] + x;
    p[i] = y;
    m[i] += x;
    v[i] += x;
    unsigned u;
    __builtin_memcpy(&u, &y, 4);
    c[i] = static_cast<mt::bf16_t>(u >> 16);
  }
}

// The split-master kernel's pattern: both halves, m and v read and written in place, g read (28 B/param).
void probe_split(mt::bf16_t* high, std::uint16_t* low, const float* g, float* m, float* v, std::size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    const float x = g[i];
    high[i] = static_cast<mt::bf16_t>(high[i] + 1);
    low[i] = static_cast<std::uint16_t>(low[i] ^ 0x55);
    m[i] += x;
    v[i] += x;
  }
}

// What the prefetcher streams of a split-master stage, two ways: the tile's high halves as they are
// (one contiguous region: the compute copy), or gathered from masters interleaved as 32-bit words
// (high and low together, the strided layout the tile avoids). Both write the 2-byte copy a slot holds.
void stream_contiguous(const mt::bf16_t* high, mt::bf16_t* slot, std::size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) slot[i] = high[i];
}
void stream_strided(const std::uint32_t* interleaved, mt::bf16_t* slot, std::size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) slot[i] = static_cast<mt::bf16_t>(interleaved[i] >> 16);
}

// /proc/cpuinfo: the model line and the SIMD flags that decide the kernels (the other benches' format).
std::string cpu_line() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown CPU", family, number, flags;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name") model = value;
    if (key == "cpu family") family = value;
    if (key == "model") number = value;
    if (key == "flags") flags = value;
    if (key == "flags") break;  // the first processor's block is enough
  }
  std::string isa;
  for (const char* w :
       {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"}) {
    std::istringstream in(flags);
    for (std::string x; in >> x;)
      if (x == w) isa += (isa.empty() ? "" : " ") + x;
  }
  return "  CPU: " + model + " (family " + family + " model " + number + ")\n  ISA: " + isa;
}

}  // namespace

// NOLINTNEXTLINE(bugprone-exception-escape): a benchmark; an error ends it via std::terminate, which names it
int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::size_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (std::size_t(32) << 20);
  const int reps = 7;
  std::printf("adamw: %zu params (%.1f MiB of state), %d threads, best of %d\n%s\n", n, n * 16.0 / (1 << 20), threads,
              reps, cpu_line().c_str());
  std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  std::vector<mt::bf16_t> copy(n, 0);
  mt::AdamWHyper h;
  h.weight_decay = 0.1f;
  const auto s = mt::make_adamw_step(h, 10);
  const double t_probe =
      mt::bench::best_seconds([&] { probe(p.data(), g.data(), m.data(), v.data(), n, threads); }, reps);
  const double t_adam =
      mt::bench::best_seconds([&] { mt::cpu::adamw(p.data(), g.data(), m.data(), v.data(), n, s, threads); }, reps);
  const double t_probe_copy = mt::bench::best_seconds(
      [&] { probe_copy(p.data(), g.data(), m.data(), v.data(), copy.data(), n, threads); }, reps);
  const double t_copy = mt::bench::best_seconds(
      [&] { mt::cpu::adamw_bf16copy(p.data(), g.data(), m.data(), v.data(), copy.data(), n, s, threads); }, reps);
  // The split kernel and its probe alternate (best_seconds_alternating) over the same arrays, as the
  // other pairs run one after the other over theirs: the probe's increments leave finite values whose
  // update costs what a real state's does (no subnormals, infinities or NaNs appear in 16 runs).
  std::vector<mt::bf16_t> high(n);
  std::vector<std::uint16_t> low(n);
  std::vector<float> v_split(n, 0.0f);
  mt::cpu::split_masters(p.data(), high.data(), low.data(), v_split.data(), n, threads);
  const auto [t_probe_split, t_split] = mt::bench::best_seconds_alternating(
      [&] { probe_split(high.data(), low.data(), g.data(), m.data(), v_split.data(), n, threads); },
      [&] { mt::cpu::adamw_split_master(high.data(), low.data(), g.data(), m.data(), v_split.data(), n, s, threads); },
      reps);
  // The streamed copy: contiguous high halves against a gather from interleaved 32-bit masters.
  std::vector<std::uint32_t> interleaved(n);
  for (std::size_t i = 0; i < n; ++i) interleaved[i] = (std::uint32_t{high[i]} << 16) | low[i];
  std::vector<mt::bf16_t> slot(n, 0);
  const auto [t_contiguous, t_strided] =
      mt::bench::best_seconds_alternating([&] { stream_contiguous(high.data(), slot.data(), n, threads); },
                                          [&] { stream_strided(interleaved.data(), slot.data(), n, threads); }, reps);
  const double t_ref =
      mt::bench::best_seconds([&] { mt::cpu::adamw_reference(p.data(), g.data(), m.data(), v.data(), n, s); }, 3);
  const double probe_rate = n / t_probe, adam_rate = n / t_adam, ref_rate = n / t_ref;
  const double probe_copy_rate = n / t_probe_copy, copy_rate = n / t_copy;
  const double probe_split_rate = n / t_probe_split, split_rate = n / t_split;
  std::printf("  probe      %.3f Gparam/s  (%.1f GB/s at 28 B/param)\n", probe_rate / 1e9, probe_rate * 28 / 1e9);
  std::printf("  adamw      %.3f Gparam/s  (%.1f GB/s)  %.1f%% of probe\n", adam_rate / 1e9, adam_rate * 28 / 1e9,
              100 * adam_rate / probe_rate);
  std::printf("  probe+bf16 %.3f Gparam/s  (%.1f GB/s at 30 B/param)\n", probe_copy_rate / 1e9,
              probe_copy_rate * 30 / 1e9);
  std::printf("  adamw+bf16 %.3f Gparam/s  (%.1f GB/s)  %.1f%% of its probe\n", copy_rate / 1e9, copy_rate * 30 / 1e9,
              100 * copy_rate / probe_copy_rate);
  std::printf("  probe split %.3f Gparam/s  (%.1f GB/s at 28 B/param)\n", probe_split_rate / 1e9,
              probe_split_rate * 28 / 1e9);
  std::printf("  adamw split %.3f Gparam/s  (%.1f GB/s)  %.1f%% of its probe, %.2fx adamw+bf16\n", split_rate / 1e9,
              split_rate * 28 / 1e9, 100 * split_rate / probe_split_rate, split_rate / copy_rate);
  std::printf("  reference  %.3f Gparam/s  (1 thread, scalar)\n", ref_rate / 1e9);
  std::printf(
      "  streamed copy of split masters: contiguous high halves %.3f Gparam/s, gathered from interleaved "
      "32-bit masters %.3f Gparam/s (%.2fx)\n",
      n / t_contiguous / 1e9, n / t_strided / 1e9, t_strided / t_contiguous);
  mt::bench::Report report("adamw");
  report.add({"adamw_params_per_s", adam_rate, "params/s", probe_rate});
  report.add({"adamw_bytes_per_s", adam_rate * 28, "B/s", probe_rate * 28});
  report.add({"adamw_bf16copy_params_per_s", copy_rate, "params/s", probe_copy_rate});
  report.add({"adamw_split_master_params_per_s", split_rate, "params/s", probe_split_rate});
  // the same update with the masters split, beside the fp32-master kernel it replaces (same bits)
  report.add({"adamw_split_master_vs_fp32_master", split_rate, "params/s", copy_rate});
  report.add({"adamw_reference_params_per_s", ref_rate, "params/s", probe_rate});
  // the high halves as the tile keeps them (contiguous) against the strided gather it avoids
  report.add({"split_master_stream_contiguous_vs_strided", n / t_contiguous, "params/s", n / t_strided});
  report.print();
  return 0;
}
