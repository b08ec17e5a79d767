// bench_long_context: training at long context inside a fixed device budget (issue 26's benchmark).
//
// For each model and sequence length: one engine run in a child process of its own (so its peak RSS is
// its own), batch 1, device.max_vram_gb fixed (512 MiB by default), every device key auto as
// `megatrain train` leaves them (the plan picks the boundary placement and the sequence tile), fp32
// (or bf16).
// It prints the plan's choice, the step time and tokens/s, the arena's planned size and measured peak,
// and the process's peak RSS; then a least-squares line of peak RSS against the sequence length per
// model (it must grow linearly: the boundaries and attention's keys are the only sequence-sized state).
// Separately, the attention kernel alone (forward + backward, the demo's heads) at each length up to
// 32k: its causal FLOP rate against the best fp32 GEMM rate measured in this run on the layer's own
// product shapes (long_context_attention_vs_gemm_32k, target >= 0.5).
//
//   bench_long_context [--lengths 4096,16384,32768] [--models demo,100m] [--budget-mb 512] [--steps N] [--bf16]
//
// --bf16 trains in bf16 (the products' path and the attention's products chosen as a run would, by probe;
// figures tagged _bf16).
//
// Two steps (the second measured) up to 4k, one beyond. One step at 32k of the demo model is minutes on 2 cores
// (attention grows with T^2: 9 T^2 q_dim FLOPs per layer with the recomputation), 128k about 16 times that: pass
// --lengths 131072 for it.
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine.hpp"
#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/tile.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/bf16_choice.hpp"
#include "tools/bench/child_process.hpp"
#include "tools/bench/demo_model.hpp"
#include "tools/bench/gemm_ceiling.hpp"

namespace {

using namespace mt;
using mt::bench::Figure;

struct ModelShape {
  const char* name;
  std::int64_t hidden, layers, heads, kv_heads, ff, vocab;
};
// The demo (config/demo.ini's model) and a Llama of about 100M parameters (96M with the demo's vocabulary).
const ModelShape kModels[] = {{"demo", 384, 8, 6, 2, 1024, 4096}, {"100m", 768, 12, 12, 4, 2560, 4096}};

// The model of that name, or null.
const ModelShape* model_named(const std::string& name) {
  for (const auto& s : kModels)
    if (name == s.name) return &s;
  return nullptr;
}

struct RunResult {
  bool ok = false;
  double step_s = 0, tokens_per_s = 0, loss = 0;
  double arena_bytes = 0, arena_peak = 0, budget = 0, rss_bytes = 0, host_boundary_bytes = 0;
  long long seq_tile = 0;
  char keep[80] = {};
  long long params = 0;
};

TrainConfig config_for(const ModelShape& m, std::int64_t T, std::int64_t budget_mb, std::int64_t steps, bool bf16) {
  TrainConfig c = mt::bench::demo_train_config(steps);
  c.train.bf16 = bf16;
  c.model.hidden_size = m.hidden;
  c.model.layers = m.layers;
  c.model.heads = m.heads;
  c.model.kv_heads = m.kv_heads;
  c.model.intermediate_size = m.ff;
  c.model.vocab_size = m.vocab;
  c.model.max_position_embeddings = T;
  c.train.per_device_train_batch_size = 1;
  c.data.seq_length = T;
  c.device.max_vram_gb = budget_mb / 1024.0;
  c.device.weight_slots = 0;
  c.device.grad_slots = 0;
  c.device.keep_intermediates = "auto";
  c.device.seq_tile = 0;
  c.train.warmup_steps = 0;
  return c;
}

RunResult run_here(const ModelShape& m, std::int64_t T, std::int64_t budget_mb, std::int64_t steps, bool bf16) {
  const TrainConfig cfg = config_for(m, T, budget_mb, steps, bf16);
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::EnginePlan plan = plan::plan_engine(cfg, model);
  HostModel host(model, plan::host_tile_options(cfg));
  actors::init_host_model(host, 1337);
  const std::vector<data::Batch> batches = mt::bench::random_batches(cfg, 2, 2024);
  actors::VectorBatchSource source(batches);
  actors::EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = &host;
  const actors::EngineResult r = actors::run_engine(std::move(job));
  if (!r.error.empty()) throw std::runtime_error(r.error);
  RunResult out;
  out.ok = true;
  out.step_s = r.steps.back().step_s;  // the last step (the first pays for first touches)
  out.tokens_per_s = static_cast<double>(T) / out.step_s;
  out.loss = r.steps.back().loss;
  out.arena_bytes = static_cast<double>(plan.arena.total_bytes);
  out.arena_peak = static_cast<double>(r.arena.peak_bytes);
  out.budget = static_cast<double>(plan.arena.budget_bytes);
  out.host_boundary_bytes = static_cast<double>(plan.host_boundary_bytes);
  out.seq_tile = plan.seq_tile;
  std::snprintf(out.keep, sizeof out.keep, "%s%s%s", keep_intermediates_name(plan::planned_keep(plan)),
                plan.keys_values == plan::KeysValues::mapped ? " + attention_kv host" : "",
                plan.attention == plan::AttentionOutputs::kept_mapped ? " + attention kept" : "");
  out.params = static_cast<long long>(total_param_count(model));
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  out.rss_bytes = static_cast<double>(ru.ru_maxrss) * 1024.0;
  return out;
}

// Causal attention FLOPs of one layer's forward + backward (without the recomputation): products of
// T^2/2 x head_dim per head, 2 in the forward (scores, values), 5 in the backward.
double attention_flops(std::int64_t T, std::int64_t q_dim) {
  return 7.0 * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(q_dim);
}

// Seconds of the CPU attention kernel's forward + backward on the demo's heads at length T.
double attention_seconds(std::int64_t T, int threads, cpu::AttnProducts products) {
  const ModelShape& m = kModels[0];
  const std::int64_t hd = m.hidden / m.heads, qd = m.heads * hd, kd = m.kv_heads * hd;
  AttnShape a;
  a.batch = 1, a.seq = T, a.q_heads = m.heads, a.kv_heads = m.kv_heads, a.head_dim = hd;
  a.q_stride = qd, a.kv_stride = kd, a.o_stride = qd;
  auto buf = [&](std::int64_t n, float scale) {
    AlignedFloats b = make_aligned_floats(static_cast<std::size_t>(n));
    std::uint64_t x = static_cast<std::uint64_t>(n) * 2654435761u + 1;
    for (std::int64_t i = 0; i < n; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b[static_cast<std::size_t>(i)] = scale * (static_cast<float>((x >> 40) & 0xffff) / 32768.0f - 1.0f);
    }
    return b;
  };
  AlignedFloats q = buf(T * qd, 1.0f), k = buf(T * kd, 1.0f), v = buf(T * kd, 1.0f), dout = buf(T * qd, 0.1f);
  AlignedFloats out = make_aligned_floats(static_cast<std::size_t>(T * qd)),
                lse = make_aligned_floats(static_cast<std::size_t>(T * m.heads)),
                dq = make_aligned_floats(static_cast<std::size_t>(T * qd)),
                dk = make_aligned_floats(static_cast<std::size_t>(T * kd)),
                dv = make_aligned_floats(static_cast<std::size_t>(T * kd));
  const int reps = T <= 8192 ? 3 : 1;
  return mt::bench::best_seconds(
      [&] {
        cpu::attention_forward(q.get(), k.get(), v.get(), nullptr, false, out.get(), lse.get(), a, threads, products);
        cpu::attention_backward(q.get(), k.get(), v.get(), nullptr, false, out.get(), lse.get(), dout.get(), dq.get(),
                                dk.get(), dv.get(), nullptr, a, threads, products);
      },
      reps, T <= 8192 ? 1 : 0);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) r.push_back(part);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> lengths{4096, 16384, 32768};
  std::vector<std::string> models{"demo", "100m"};
  std::int64_t budget_mb = 512, steps = 0;
  bool bf16 = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--bf16") {
      bf16 = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_long_context: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    if (a == "--lengths") {
      lengths.clear();
      for (const auto& p : split(v)) lengths.push_back(std::stoll(p));
    } else if (a == "--models") {
      models = split(v);
    } else if (a == "--budget-mb") {
      budget_mb = std::stoll(v);
    } else if (a == "--steps") {
      steps = std::stoll(v);
    } else {
      std::fprintf(stderr,
                   "usage: bench_long_context [--lengths 4096,...] [--models demo,100m] [--budget-mb 512] "
                   "[--steps N] [--bf16]\n");
      return 2;
    }
  }
  for (const std::string& name : models)
    if (!model_named(name)) {
      std::fprintf(stderr, "bench_long_context: no model '%s' (demo, 100m)\n", name.c_str());
      return 2;
    }
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::printf("long context: batch 1, device budget %lld MiB, %s, %d threads, every device key auto\n",
              static_cast<long long>(budget_mb), bf16 ? "bf16" : "fp32", threads);
  std::printf("  CPU: %s, %d cores\n  ISA: %s\n", mt::bench::cpu_model().c_str(), threads,
              mt::bench::cpu_isa_flags().c_str());
  if (bf16 && !models.empty()) {  // as a run would choose them (the first model's shapes; forked children inherit)
    const ModelShape* m = model_named(models[0]);
    const std::int64_t rows = 1024, hd = m->hidden / m->heads;
    std::printf("  bf16 products: %s\n",
                mt::bench::choose_bf16_path(
                    {{rows, m->hidden, m->hidden}, {rows, m->hidden, m->ff}, {rows, m->ff, m->hidden}}, threads)
                    .c_str());
    AttnShape heads;
    heads.seq = 1024, heads.q_heads = m->heads, heads.kv_heads = m->kv_heads, heads.head_dim = hd;
    std::printf("  attention products: %s\n", mt::bench::choose_bf16_attention(heads, threads).c_str());
  }
  mt::bench::Report report("long_context");
  // Each model at each length (the 100M model at 32k is about a quarter of an hour on 2 cores).
  for (const std::string& name : models) {
    const ModelShape* m = model_named(name);
    std::vector<double> xs, ys;
    for (std::int64_t T : lengths) {
      const std::int64_t n = steps > 0 ? steps : (T <= 4096 ? 2 : 1);
      const std::optional<RunResult> r =
          mt::bench::in_child_process<RunResult>([&] { return run_here(*m, T, budget_mb, n, bf16); });
      if (!r || !r->ok) {
        std::printf("  %-5s T=%-7lld did not run (see above)\n", m->name, static_cast<long long>(T));
        continue;
      }
      std::printf(
          "  %-5s T=%-7lld %.1fM params: %s, seq_tile %lld | step %.1f s, %.0f tokens/s | arena %.0f MiB "
          "(peak %.0f of %.0f) | host activations %.0f MiB | peak RSS %.0f MiB | loss %.4f\n",
          m->name, static_cast<long long>(T), static_cast<double>(r->params) / 1e6, r->keep, r->seq_tile, r->step_s,
          r->tokens_per_s, r->arena_bytes / 1048576.0, r->arena_peak / 1048576.0, r->budget / 1048576.0,
          r->host_boundary_bytes / 1048576.0, r->rss_bytes / 1048576.0, r->loss);
      std::fflush(stdout);
      const std::string tag = std::string(m->name) + "_" + std::to_string(T / 1024) + "k" + (bf16 ? "_bf16" : "");
      report.add(Figure{"long_context_tokens_per_s_" + tag, r->tokens_per_s, "tokens/s", 0});
      report.add(Figure{"long_context_peak_rss_" + tag, r->rss_bytes / 1048576.0, "MiB", 0, 0, "lower"});
      report.add(Figure{"long_context_arena_peak_" + tag, r->arena_peak / 1048576.0, "MiB", 0, 0, "lower"});
      if (std::string(m->name) == "demo" && T == 131072 && !bf16)
        report.add(Figure{"long_context_tokens_per_s_128k", r->tokens_per_s, "tokens/s", 0});
      xs.push_back(static_cast<double>(T));
      ys.push_back(r->rss_bytes);
    }
    if (xs.size() >= 2) {  // least squares RSS = a + b T, and how far each point is from the line
      double mx = 0, my = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) mx += xs[i], my += ys[i];
      mx /= static_cast<double>(xs.size()), my /= static_cast<double>(xs.size());
      double sxy = 0, sxx = 0;
      for (std::size_t i = 0; i < xs.size(); ++i)
        sxy += (xs[i] - mx) * (ys[i] - my), sxx += (xs[i] - mx) * (xs[i] - mx);
      const double b = sxy / sxx, a = my - b * mx;
      double worst = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) worst = std::max(worst, std::abs(ys[i] - (a + b * xs[i])) / ys[i]);
      std::printf("  %-5s peak RSS = %.0f MiB + %.1f KiB x tokens (%zu points, largest residual %.1f%% of the point)\n",
                  m->name, a / 1048576.0, b / 1024.0, xs.size(), 100.0 * worst);
      report.add(Figure{std::string("long_context_rss_per_token_") + m->name + (bf16 ? "_bf16" : ""), b / 1024.0,
                        "KiB/token", 0, 0, "lower"});
      report.add(Figure{std::string("long_context_rss_fit_residual_") + m->name + (bf16 ? "_bf16" : ""), worst,
                        "fraction", 0, 0, "lower"});
    }
  }
  // The attention kernel alone against the best GEMM on the demo layer's products.
  const ModelShape& d = kModels[0];
  std::vector<mt::bench::GemmShape> shapes;
  for (std::int64_t rows : {1024, 4096})
    for (auto [n, k] : {std::pair<std::int64_t, std::int64_t>{d.hidden, d.hidden}, {d.ff, d.hidden}, {d.hidden, d.ff}})
      shapes.push_back({rows, n, k});
  const mt::bench::Ceiling gemm = mt::bench::best_fp32_gemm(shapes, threads);
  std::printf("  best fp32 GEMM on the demo layer's products: %.1f GFLOP/s (%s, %lld x %lld x %lld)\n", gemm.rate / 1e9,
              mt::bench::lib_name(gemm.lib), static_cast<long long>(gemm.shape.m), static_cast<long long>(gemm.shape.n),
              static_cast<long long>(gemm.shape.k));
  // The bf16 pair path (what a bf16 run uses where it measures faster) against the best bf16 GEMM.
  const bool pairs = cpu::bf16_pairs_available();
  mt::bench::Ceiling gemm_bf16;
  if (pairs) {
    gemm_bf16 = mt::bench::best_bf16_gemm(shapes, threads);
    std::printf("  best bf16 GEMM on the same products: %.1f GFLOP/s (%s, %lld x %lld x %lld)\n", gemm_bf16.rate / 1e9,
                mt::bench::lib_name(gemm_bf16.lib), static_cast<long long>(gemm_bf16.shape.m),
                static_cast<long long>(gemm_bf16.shape.n), static_cast<long long>(gemm_bf16.shape.k));
  } else {
    std::printf("  no AVX512-BF16 here: the attention's bf16 pair path is not measured\n");
  }
  for (std::int64_t T : lengths) {
    if (T > 32768) continue;
    const double s = attention_seconds(T, threads, cpu::AttnProducts::fp32);
    const double rate = attention_flops(T, d.hidden) / s;
    std::printf(
        "  attention forward + backward, T=%lld, %lld heads (%lld kv), head_dim %lld: fp32 %.2f s, %.1f GFLOP/s "
        "(%.2f of the fp32 GEMM)",
        static_cast<long long>(T), static_cast<long long>(d.heads), static_cast<long long>(d.kv_heads),
        static_cast<long long>(d.hidden / d.heads), s, rate / 1e9, rate / gemm.rate);
    if (T == 32768) report.add(Figure{"long_context_attention_vs_gemm_32k", rate, "FLOP/s", gemm.rate, 0.5});
    if (pairs) {
      const double sb = attention_seconds(T, threads, cpu::AttnProducts::bf16_pairs);
      const double rate_b = attention_flops(T, d.hidden) / sb;
      std::printf(" | bf16 pairs %.2f s, %.1f GFLOP/s (%.2f of the bf16 GEMM, %.2fx fp32)", sb, rate_b / 1e9,
                  rate_b / gemm_bf16.rate, s / sb);
      if (T == 32768) {
        report.add(Figure{"long_context_attention_bf16_vs_gemm_32k", rate_b, "FLOP/s", gemm_bf16.rate});
        report.add(Figure{"long_context_attention_bf16_speedup_32k", s / sb, "x", 0});
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  report.print();
  return 0;
}
