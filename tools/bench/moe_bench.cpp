// tools/bench/run moe [--steps N (12)] [--rounds R (3)]: mixture-of-experts training on the CPU backend.
//   1. The grouped expert product (grouped_linear_forward + _backward: one product per expert over its
//      rows, the routing of top-2 of 8 over the demo's 512 tokens drawn uniformly), against one dense
//      product of the same total shape (all N x k rows through one matrix) through the same ops, and
//      against the best fp32 GEMM of the libraries on that shape (gemm_ceiling.hpp).
//   2. A Mixtral-shaped model's engine step (the demo's attention, d=384, 8 layers, 4 x 128 tokens; 8
//      experts of width 512, top-2), fp32 and bf16: tokens/s, model FLOP/s over the active parameters
//      against the best GEMM rate on the active shapes (attention's at 512 rows, the experts' at their
//      mean 128 rows), and the step against a dense model with the same active parameters (MLP 1024)
//      measured in the same run (the router, dispatch and the smaller products' cost).
//   3. A gpt-oss-shaped model's step the same way: the demo's attention with sinks, biases and a sliding
//      window of 64 on the even layers, 16 experts as wide as the model (384), top-4, router and expert
//      biases, the clamped activation; against a dense model with its active parameters (MLP 1536).
// Each engine step runs in a child process of its own, the rounds interleaved; figures are medians.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/bf16_choice.hpp"
#include "tools/bench/demo_model.hpp"
#include "tools/bench/engine_step.hpp"
#include "tools/bench/gemm_ceiling.hpp"

using namespace mt;
using namespace mt::bench;

namespace {

constexpr std::int64_t kExperts = 8, kTopK = 2, kExpertWidth = 512;
constexpr std::int64_t kOssExperts = 16, kOssTopK = 4;  // gpt-oss-shaped: experts as wide as the model

// Expert row offsets [E + 1] of `tokens` tokens each choosing k distinct experts uniformly.
std::vector<std::int64_t> uniform_routing(std::int64_t tokens, std::int64_t experts, std::int64_t k) {
  std::vector<std::int64_t> count(static_cast<std::size_t>(experts), 0);
  std::uint64_t x = 12345;
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<bool> taken(static_cast<std::size_t>(experts), false);
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t e;
      do {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        e = static_cast<std::int64_t>((x >> 33) % static_cast<std::uint64_t>(experts));
      } while (taken[static_cast<std::size_t>(e)]);
      taken[static_cast<std::size_t>(e)] = true;
      ++count[static_cast<std::size_t>(e)];
    }
  }
  std::vector<std::int64_t> offsets(1, 0);
  for (std::int64_t c : count) offsets.push_back(offsets.back() + c);
  return offsets;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (auto& f : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>(static_cast<double>(seed >> 40) / 16777216.0 - 0.5);
  }
  return v;
}

// The experts' layer is 4x the demo's: both models get a budget where the slot counts match.
constexpr std::int64_t kDeviceMb = 512;

// The Mixtral-shaped demo: the demo's attention and size, 8 experts of width 512, top-2.
void mixtral_shape(TrainConfig& c) {
  c.model.arch = "mixtral";
  c.model.num_experts = kExperts;
  c.model.num_experts_per_tok = kTopK;
  c.model.intermediate_size = kExpertWidth;
  c.device.max_vram_gb = kDeviceMb / 1024.0;
}

// The gpt-oss-shaped demo: the demo's attention (with gpt-oss's sinks and biases, a window of 64 on the
// even layers), 16 experts of the model's width, top-4.
void gpt_oss_shape(TrainConfig& c) {
  c.model.arch = "gpt_oss";
  c.model.num_experts = kOssExperts;
  c.model.num_experts_per_tok = kOssTopK;
  c.model.intermediate_size = c.model.hidden_size;
  c.model.sliding_window = 64;
  c.device.max_vram_gb = kDeviceMb / 1024.0;
}

// One family's engine step against a dense model with the same active MLP width, `rounds` interleaved.
struct ShapedStep {
  const char* name;  // metric prefix
  const char* what;  // printed
  void (*shape)(TrainConfig&);
  std::int64_t active_width;  // the dense comparator's MLP width
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 12, rounds = 3;
  if (!parse_steps_rounds(argc, argv, "moe", &steps, &rounds)) return 2;
  const int threads = 2;
  const TrainConfig demo = demo_train_config(1);
  const std::int64_t tokens = demo.train.per_device_train_batch_size * demo.data.seq_length;
  const std::int64_t d = demo.model.hidden_size, rows = tokens * kTopK, mean_rows = rows / kExperts;
  std::printf("moe: mixture-of-experts training on the CPU backend, %d threads\n", threads);
  std::printf("  CPU: %s\n  ISA: %s\n", cpu_model().c_str(), cpu_isa_flags().c_str());
  std::printf(
      "  fp32 products: %s\n",
      choose_fp32_gemm({{tokens, d, 3 * d}, {tokens, d, d}, {mean_rows, d, kExpertWidth}, {mean_rows, kExpertWidth, d}},
                       threads)
          .c_str());
  std::printf(
      "  bf16 products: %s\n",
      choose_bf16_path({{tokens, d, 3 * d}, {tokens, d, d}, {mean_rows, d, kExpertWidth}, {mean_rows, kExpertWidth, d}},
                       threads)
          .c_str());
  Report report("moe");

  // 1. The grouped product against one dense product of the same total shape.
  {
    const auto offsets = uniform_routing(tokens, kExperts, kTopK);
    const std::int64_t in = d, out = kExpertWidth;
    const auto x = random_floats(static_cast<std::size_t>(rows * in), 1);
    const auto w = random_floats(static_cast<std::size_t>(kExperts * out * in), 2);
    const auto dy = random_floats(static_cast<std::size_t>(rows * out), 3);
    std::vector<float> y(static_cast<std::size_t>(rows * out)), dx(static_cast<std::size_t>(rows * in));
    std::vector<float> dw(w.size(), 0.0f);
    cpu::CpuOps ops(Precision::fp32, threads);
    const std::vector<std::int64_t> one = {0, rows};
    auto grouped = [&] {
      ops.grouped_linear_forward(x.data(), w.data(), out * in, nullptr, 0, y.data(), offsets.data(), kExperts, in, out);
      ops.grouped_linear_backward(dy.data(), x.data(), w.data(), out * in, dx.data(), false, dw.data(), nullptr, 0,
                                  offsets.data(), kExperts, in, out);
    };
    auto dense = [&] {
      ops.linear_forward(x.data(), w.data(), nullptr, y.data(), rows, in, out);
      ops.linear_backward(dy.data(), x.data(), w.data(), dx.data(), false, dw.data(), nullptr, rows, in, out);
    };
    const auto [tg, td] = best_seconds_alternating(grouped, dense, 7);
    const double flops = 3.0 * 2.0 * static_cast<double>(rows * in * out);
    const Ceiling best =
        best_fp32_gemm({{rows, out, in, false, true}, {rows, in, out}, {out, in, rows, true, false}}, threads);
    std::printf("  grouped product, %lld experts, %lld rows (%lld..%lld each) x %lld -> %lld, forward + backward:\n",
                static_cast<long long>(kExperts), static_cast<long long>(rows),
                static_cast<long long>(offsets[1] - offsets[0]), static_cast<long long>(offsets[2] - offsets[1]),
                static_cast<long long>(in), static_cast<long long>(out));
    std::printf(
        "    grouped %.1f GFLOP/s, one dense product of the same total shape %.1f GFLOP/s (%.2fx), best "
        "fp32 GEMM there %.1f GFLOP/s (%s)\n",
        flops / tg / 1e9, flops / td / 1e9, td / tg, best.rate / 1e9, lib_name(best.lib));
    report.add({"grouped_gemm_vs_dense_same_shape", flops / tg, "FLOP/s", flops / td});
    report.add({"grouped_gemm_vs_best_gemm", flops / tg, "FLOP/s", best.rate});
  }

  // 2., 3. The Mixtral- and gpt-oss-shaped engine steps, each beside a dense model with its active parameters.
  const std::int64_t d_oss = d, oss_mean_rows = tokens * kOssTopK / kOssExperts;
  const Ceiling active_best = best_fp32_gemm({{tokens, 3 * d, d, false, true},
                                              {tokens, d, d, false, true},
                                              {mean_rows, kExpertWidth, d, false, true},
                                              {mean_rows, d, kExpertWidth, false, true}},
                                             threads);
  const Ceiling oss_best = best_fp32_gemm({{tokens, 3 * d, d, false, true},
                                           {tokens, d, d, false, true},
                                           {oss_mean_rows, d_oss, d, false, true},
                                           {oss_mean_rows, d, d_oss, false, true}},
                                          threads);
  const ShapedStep shapes[] = {
      {"mixtral", "mixtral-shaped (8 experts x 512, top-2)", mixtral_shape, kTopK * kExpertWidth},
      {"gpt_oss", "gpt-oss-shaped (16 experts x 384, top-4, sinks, window 64)", gpt_oss_shape, kOssTopK * d_oss}};
  for (const ShapedStep& shape : shapes) {
    const Ceiling& best = std::string(shape.name) == "mixtral" ? active_best : oss_best;
    std::printf("  best fp32 GEMM on the %s active shapes: %.1f GFLOP/s (%s, %s)\n", shape.name, best.rate / 1e9,
                lib_name(best.lib), best.shape.name().c_str());
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      const bool bf16 = precision == Precision::bf16;
      std::vector<double> moe_s, dense_s;
      EngineStep moe{}, dense{};
      for (int r = 0; r < rounds; ++r) {
        moe = measure_engine_step(precision, threads, steps, shape.shape);
        const std::int64_t width = shape.active_width;
        dense = measure_engine_step(precision, threads, steps, [width](TrainConfig& c) {
          c.model.intermediate_size = width;
          c.device.max_vram_gb = kDeviceMb / 1024.0;
        });
        moe_s.push_back(moe.step_s);
        dense_s.push_back(dense.step_s);
      }
      const double ms = median(moe_s), ds = median(dense_s);
      const double rate = moe.model_flops / ms;
      std::printf(
          "  %s, %s: step %.4f s, %.0f tokens/s, %.1f GFLOP/s model FLOPs (active) = %.2f of the best GEMM; "
          "dense with the same active parameters %.4f s (%.2fx)\n",
          shape.what, bf16 ? "bf16" : "fp32", ms, static_cast<double>(tokens) / ms, rate / 1e9, rate / best.rate, ds,
          ms / ds);
      const std::string p = std::string(shape.name) + (bf16 ? "_bf16" : "_fp32");
      report.add({p + "_tokens_per_s", static_cast<double>(tokens) / ms, "tokens/s", 0.0});
      report.add({p + "_model_flops_vs_gemm", rate, "FLOP/s", best.rate});
      report.add({p + "_step_vs_dense_active", ms, "s", ds, 0.0, "lower"});
    }
  }
  report.print();
  return 0;
}
