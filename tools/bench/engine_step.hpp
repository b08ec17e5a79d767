// The demo model's training step through the streaming engine, the way `megatrain train` runs it: the
// actors, the backend, the copy engine, the optimizer overlapping the next forward. Same shapes and
// device keys as config/demo.ini (Llama, d=384, 8 layers, 4 x 128 tokens, vocabulary 4096, 64 MiB
// device budget, auto slots and keep-intermediates), random tokens. Used by bench_train_step for engine_step_mfu.
#pragma once

#include <cstdint>
#include <functional>

#include "config/train_config.hpp"
#include "kernels/precision.hpp"

namespace mt::bench {

struct EngineStep {
  double step_s = 0.0;  // median wall time of steps 2..N (the first, warm-up, excluded)
  double tokens_per_s = 0.0;
  double model_flops = 0.0;  // per step: 6 x matmul params x tokens + attention (12 x layers x d x T per token)
  double compute_s = 0.0;    // of which compute was busy (median per step)
  const char* keep = "";     // the keep-intermediates mode the plan chose (a literal)
  int weight_slots = 0, grad_slots = 0;  // the slots the plan chose
  long long kept_layers = 0;             // recompute mode: the last layers whose intermediates are kept
  double split[8] = {};                  // seconds per step by kernel category (kernels/profile.hpp), all steps
  double last_loss = 0.0;                // the last step's loss
  std::uint64_t loss_bits = 0;           // FNV-1a of every step's loss bits: equal runs, equal hashes
};

// The same, in the calling process.
// adapt_to_load: threads.adapt_to_load (the engine's default: fewer threads while other processes
// take its cores); false keeps the thread count fixed.
// tweak: changes the demo's config before it runs (other state modes, clipping), or empty.
using ConfigTweak = std::function<void(TrainConfig&)>;
EngineStep measure_engine_step_here(Precision precision, int threads, int steps = 16, bool adapt_to_load = true,
                                    const ConfigTweak& tweak = {});

// In a child process of its own (child_process.hpp), so that earlier runs in this process do not slow it.
EngineStep measure_engine_step(Precision precision, int threads, int steps = 16, const ConfigTweak& tweak = {});

// `--steps N --rounds R` of an engine-step benchmark into *steps and *rounds (left as given when absent);
// false after printing "usage: tools/bench/run NAME [--steps N] [--rounds R]" for anything else.
bool parse_steps_rounds(int argc, char** argv, const char* name, int* steps, int* rounds);

}  // namespace mt::bench
