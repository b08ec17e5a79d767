// tools/bench/run state-modes [--steps N (16)] [--rounds R (3)]: the demo model's engine step in each exact
// way of holding the optimizer state (train.master_weights x train.gradient_buffer), with clipping (stage
// gradients then run two passes) and without (one pass), side by side against today's layout (fp32
// masters beside the bf16 copy, gradient accumulators; in fp32 runs the accumulators). Each
// configuration runs in a child process of its own, the rounds interleaved so drift hits all alike; the
// figure is the median step over the rounds, divided by the baseline's of the same round set. Every mode
// must give the same losses bit for bit (a line says so, and the bench fails otherwise). bf16 runs also
// at two micro-batches per step (stage gradients then run layer-major with two stage accumulators).
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tools/bench/bench_report.hpp"
#include "tools/bench/bf16_choice.hpp"
#include "tools/bench/demo_model.hpp"
#include "tools/bench/engine_step.hpp"
#include "tools/bench/gemm_ceiling.hpp"

using namespace mt;
using namespace mt::bench;

namespace {

struct Mode {
  std::string name, master_weights, gradient_buffer;
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 16, rounds = 3;
  if (!parse_steps_rounds(argc, argv, "state-modes", &steps, &rounds)) return 2;
  std::printf("state modes: the demo model's engine step per way of holding the state, 2 threads\n");
  std::printf("  CPU: %s\n  ISA: %s\n", cpu_model().c_str(), cpu_isa_flags().c_str());
  {
    // The bf16 runs take the products' path a run of the demo would measure here (fixed for every child).
    const TrainConfig demo = demo_train_config(1);
    const std::int64_t rows = demo.train.per_device_train_batch_size * demo.data.seq_length;
    const std::int64_t d = demo.model.hidden_size, ff = demo.model.intermediate_size;
    std::printf("  bf16 products: %s\n",
                choose_bf16_path({{rows, d, 3 * d}, {rows, d, d}, {rows, d, ff}, {rows, ff, d}}, 2).c_str());
  }
  Report report("state_modes");
  bool same_bits = true;
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    const bool bf16 = precision == Precision::bf16;
    std::vector<Mode> modes;
    if (bf16) {
      modes = {{"fp32 masters, accumulators (18 B/param)", "fp32", "model"},
               {"split masters, accumulators (16 B/param)", "split", "model"},
               {"split masters, stage gradients (12 B/param)", "split", "stage"}};
    } else {
      modes = {{"accumulators (16 B/param)", "auto", "model"}, {"stage gradients (12 B/param)", "auto", "stage"}};
    }
    // bf16 also at two micro-batches per step: stage gradients then run layer-major, summed in two
    // stage accumulators (the baseline runs the default interleaved order with accumulators).
    for (std::int64_t micro_batches : bf16 ? std::vector<std::int64_t>{1, 2} : std::vector<std::int64_t>{1})
      for (double clip : {1.0, 0.0}) {
        std::map<std::string, std::vector<double>> step;
        std::map<std::string, std::uint64_t> bits;
        for (int r = 0; r < rounds; ++r)
          for (const Mode& m : modes) {
            const EngineStep e = measure_engine_step(precision, 2, steps, [&](TrainConfig& c) {
              c.train.master_weights = m.master_weights;
              c.train.gradient_buffer = m.gradient_buffer;
              c.train.max_grad_norm = clip;
              c.train.gradient_accumulation_steps = micro_batches;
            });
            step[m.name].push_back(e.step_s);
            bits[m.name] = e.loss_bits;
          }
        const double base = median(step[modes[0].name]);
        for (const Mode& m : modes) {
          const double s = median(step[m.name]);
          const bool same = bits[m.name] == bits[modes[0].name];
          same_bits = same_bits && same;
          std::printf("  %s, %lld micro-batch(es), max_grad_norm %.0f: %-46s step %.4f s  %.2fx of %s  losses %s\n",
                      bf16 ? "bf16" : "fp32", static_cast<long long>(micro_batches), clip, m.name.c_str(), s, s / base,
                      modes[0].name.c_str(), same ? "bit-identical" : "DIFFER");
          if (&m == &modes[0]) continue;
          const std::string metric =
              std::string("demo_") + (bf16 ? "bf16_" : "fp32_") + (m.master_weights == "split" ? "split_" : "") +
              m.gradient_buffer + (clip > 0 ? "_clip" : "_noclip") + (micro_batches > 1 ? "_ga2" : "") + "_step_ratio";
          report.add({metric, s, "s", base, 0.0, "lower"});
        }
      }
  }
  std::printf("  every mode's losses bit-identical to the baseline's: %s\n", same_bits ? "yes" : "NO");
  report.print();
  return same_bits ? 0 : 1;
}
