// bench_documents: the attention op with document masks (data.packing = documents) computes only its
// pairs. At T tokens (8192 by default) cut into documents of D tokens (512), the CPU kernel's forward +
// backward on the demo's heads against the same op unmasked (plain causal) on the same operands: the time
// ratio must be within 1.2x of the ratio of pairs, T / D documents of D (D + 1) / 2 pairs each against
// T (T + 1) / 2. On the fp32 products, and on the bf16 pair products where the CPU has AVX512-BF16.
//
//   bench_documents [--seq 8192] [--doc 512] [--threads N] [--reps 3] [--only documents|causal]
//                   [--products fp32|pairs]
// --only runs one side's forward + backward, reps times, and prints its time (to profile one side);
// --products keeps it to one kind of block products.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/tile.hpp"
#include "tools/bench/bench_report.hpp"

namespace {

using namespace mt;

AlignedFloats filled(std::int64_t n, float scale) {
  AlignedFloats b = make_aligned_floats(static_cast<std::size_t>(n));
  std::uint64_t x = static_cast<std::uint64_t>(n) * 2654435761u + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b[static_cast<std::size_t>(i)] = scale * (static_cast<float>((x >> 40) & 0xffff) / 32768.0f - 1.0f);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t T = 8192, D = 512;
  int reps = 3;
  std::string only, only_products;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--seq")
      T = std::stoll(v);
    else if (a == "--doc")
      D = std::stoll(v);
    else if (a == "--threads")
      threads = std::stoi(v);
    else if (a == "--reps")
      reps = std::max(1, std::stoi(v));
    else if (a == "--only" && (v == "documents" || v == "causal"))
      only = v;
    else if (a == "--products" && (v == "fp32" || v == "pairs"))
      only_products = v;
    else {
      std::fprintf(stderr,
                   "usage: bench_documents [--seq 8192] [--doc 512] [--threads N] [--reps 3] [--only "
                   "documents|causal] [--products fp32|pairs]\n");
      return 2;
    }
  }
  if (T < 1 || D < 1 || D > T) {
    std::fprintf(stderr, "bench_documents: need 1 <= --doc <= --seq\n");
    return 2;
  }
  // The demo's heads (config/demo.ini): 6 query heads, 2 key/value heads of 64.
  const std::int64_t Hq = 6, Hkv = 2, hd = 64, qd = Hq * hd, kd = Hkv * hd;
  AttnShape causal;
  causal.batch = 1, causal.seq = T, causal.q_heads = Hq, causal.kv_heads = Hkv, causal.head_dim = hd;
  causal.q_stride = qd, causal.kv_stride = kd, causal.o_stride = qd;
  std::vector<std::int32_t> positions(static_cast<std::size_t>(T));
  double doc_pairs = 0;
  for (std::int64_t t = 0; t < T; ++t) positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t % D);
  for (std::int64_t s = 0; s < T; s += D) {
    const double n = static_cast<double>(std::min(D, T - s));
    doc_pairs += n * (n + 1) / 2;
  }
  AttnShape documents = causal;
  documents.positions = positions.data();
  const double causal_pairs = static_cast<double>(T) * static_cast<double>(T + 1) / 2;
  const double pairs_ratio = doc_pairs / causal_pairs;

  AlignedFloats q = filled(T * qd, 1.0f), k = filled(T * kd, 1.0f), v = filled(T * kd, 1.0f),
                dout = filled(T * qd, 0.1f);
  AlignedFloats out = make_aligned_floats(static_cast<std::size_t>(T * qd)),
                lse = make_aligned_floats(static_cast<std::size_t>(T * Hq)),
                dq = make_aligned_floats(static_cast<std::size_t>(T * qd)),
                dk = make_aligned_floats(static_cast<std::size_t>(T * kd)),
                dv = make_aligned_floats(static_cast<std::size_t>(T * kd));
  auto step = [&](const AttnShape& a, cpu::AttnProducts products) {
    cpu::attention_forward(q.get(), k.get(), v.get(), nullptr, false, out.get(), lse.get(), a, threads, products);
    cpu::attention_backward(q.get(), k.get(), v.get(), nullptr, false, out.get(), lse.get(), dout.get(), dq.get(),
                            dk.get(), dv.get(), nullptr, a, threads, products);
  };
  if (!only.empty()) {
    const AttnShape& a = only == "documents" ? documents : causal;
    for (const auto products : {cpu::AttnProducts::fp32, cpu::AttnProducts::bf16_pairs}) {
      if (products == cpu::AttnProducts::bf16_pairs && !cpu::bf16_pairs_available()) continue;
      if (!only_products.empty() && only_products != cpu::attn_products_name(products)) continue;
      step(a, products);  // warm-up: the threads' rooms, the library's kernels
      const auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();
      for (int r = 0; r < reps; ++r) step(a, products);
      // The process's CPU time too: on a shared machine it varies less than the wall time.
      std::printf("%s %s: %.4f s a step, %.4f s of CPU\n", only.c_str(), cpu::attn_products_name(products),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps,
                  static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC / reps);
    }
    return 0;
  }
  std::printf(
      "bench_documents: attention forward + backward, T=%lld, documents of %lld, %lld query heads, %lld kv "
      "heads of %lld, %d threads\n",
      static_cast<long long>(T), static_cast<long long>(D), static_cast<long long>(Hq), static_cast<long long>(Hkv),
      static_cast<long long>(hd), threads);
  std::printf("  pairs: documents %.4g, causal %.4g, ratio %.4f\n", doc_pairs, causal_pairs, pairs_ratio);
  mt::bench::Report report("documents");
  std::vector<std::pair<cpu::AttnProducts, std::string>> paths = {{cpu::AttnProducts::fp32, ""}};
  if (cpu::bf16_pairs_available()) paths.push_back({cpu::AttnProducts::bf16_pairs, "_bf16"});
  const std::string at = "_" + std::to_string(T / 1024) + "k";
  // Each timing runs the documents' op `repeat` times (about the causal op's duration: one over the ratio of
  // pairs), so that both sides of a pair of timings last alike and a scheduling hiccup weighs the same.
  const int repeat = std::max(1, static_cast<int>(1.0 / pairs_ratio + 0.5));
  for (const auto& [products, tag] : paths) {
    auto repeated = [&](const std::function<void()>& f) {
      return [&, f] {
        for (int r = 0; r < repeat; ++r) f();
      };
    };
    // Alternating, so that a drifting machine affects both alike.
    const auto [doc_n, causal_s] = mt::bench::best_seconds_alternating(
        repeated([&] { step(documents, products); }), [&] { step(causal, products); }, reps);
    const double doc_s = doc_n / repeat, time_ratio = doc_s / causal_s;
    std::printf(
        "  %-5s documents %.4f s (best of %d x %d runs), causal %.4f s: time ratio %.4f = %.3f x the pairs' "
        "ratio (target <= 1.2)\n",
        cpu::attn_products_name(products), doc_s, reps, repeat, causal_s, time_ratio, time_ratio / pairs_ratio);
    // The forward alone, the same way (the backward is the rest).
    auto forward = [&](const AttnShape& a) {
      cpu::attention_forward(q.get(), k.get(), v.get(), nullptr, false, out.get(), lse.get(), a, threads, products);
    };
    const auto [doc_fn, causal_f] = mt::bench::best_seconds_alternating(
        repeated([&] { forward(documents); }), [&] { forward(causal); }, reps);
    std::printf("        forward alone: documents %.4f s, causal %.4f s: %.3f x the pairs' ratio\n", doc_fn / repeat,
                causal_f, doc_fn / repeat / causal_f / pairs_ratio);
    report.add({"documents_attention_time_ratio" + at + tag, time_ratio, "x", pairs_ratio, 1.2, "lower"});
    report.add({"documents_attention_seconds" + at + tag, doc_s, "s", 0.0, 0.0, "lower"});
    report.add({"causal_attention_seconds" + at + tag, causal_s, "s", 0.0, 0.0, "lower"});
  }
  report.print();
  return 0;
}
