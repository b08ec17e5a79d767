#include "tools/bench/engine_step.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/profile.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/child_process.hpp"
#include "tools/bench/demo_model.hpp"

namespace mt::bench {
namespace {

TrainConfig demo_config(Precision precision, int threads, int steps) {
  TrainConfig c = demo_train_config(steps);
  c.train.bf16 = precision == Precision::bf16;
  // The demo's device keys as config/demo.ini sets them: slots and keep-intermediates "auto" (at the
  // 64 MiB budget on the CPU backend with host RAM to spare: every intermediate kept in host RAM,
  // all_mapped, and 4 weight and 4 gradient slots; without it, the last 3 layers kept and the others
  // recomputed).
  c.device.weight_slots = 0;
  c.device.grad_slots = 0;
  c.device.keep_intermediates = "auto";
  c.threads.total = threads;
  return c;
}

}  // namespace

EngineStep measure_engine_step_here(Precision precision, int threads, int steps, bool adapt_to_load,
                                    const ConfigTweak& tweak) {
  TrainConfig cfg = demo_config(precision, threads, steps);
  cfg.threads.adapt_to_load = adapt_to_load;
  if (tweak) tweak(cfg);
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::EnginePlan plan = plan::plan_engine(cfg, model);
  HostModel host(model, plan::host_tile_options(cfg));
  actors::init_host_model(host, 1337);
  const std::vector<data::Batch> batches = random_batches(cfg, 8, 2024);
  actors::VectorBatchSource source(batches);
  EngineStep e;
  actors::EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = &host;
  prof::reset();
  prof::enabled() = true;
  const actors::EngineResult r = actors::run_engine(std::move(job));
  prof::enabled() = false;
  for (int k = 0; k < prof::kNumCats; ++k)
    e.split[k] = prof::seconds(static_cast<prof::Cat>(k)) / static_cast<double>(r.steps.size());
  if (!r.error.empty()) throw std::runtime_error("engine step benchmark: " + r.error);
  // The median of steps 2..N: the first pays for first touches, and this VM's speed drifts (one
  // disturbed step should not decide the figure).
  const std::size_t first = r.steps.size() > 2 ? 1 : 0;
  std::vector<double> step, compute;
  for (std::size_t s = first; s < r.steps.size(); ++s) {
    step.push_back(r.steps[s].step_s);
    compute.push_back(r.steps[s].compute_s);
  }
  e.step_s = median(step);
  e.compute_s = median(compute);
  const double tokens = static_cast<double>(cfg.train.per_device_train_batch_size * cfg.data.seq_length);
  e.tokens_per_s = tokens / e.step_s;
  // Matmul parameters: the embedding table is a lookup, not a product (counted once, as the LM head,
  // when tied); with experts, those a token computes with (its top-k).
  double embedding = 0;
  for (const auto& t : stage_layout(model, 0).tensors) embedding += static_cast<double>(t.numel);
  const bool tied = model.tie_word_embeddings || model.is_gpt2();
  const double params = static_cast<double>(active_param_count(model)) - embedding +
                        (tied ? static_cast<double>(model.vocab_size * model.hidden_size) : 0.0);
  // As train_step_bench.cpp counts them: causal attention's computed half (6 L d T per token).
  e.model_flops = 6.0 * params * tokens + 6.0 * static_cast<double>(model.num_hidden_layers * model.hidden_size) *
                                              static_cast<double>(cfg.data.seq_length) * tokens;
  e.weight_slots = static_cast<int>(plan.weight_slots);
  e.grad_slots = static_cast<int>(plan.grad_slots);
  e.kept_layers = static_cast<long long>(plan.kept_layers);
  e.keep = keep_intermediates_name(plan::planned_keep(plan));
  e.loss_bits = 1469598103934665603ull;
  for (const auto& s : r.steps) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &s.loss, sizeof bits);
    for (int k = 0; k < 8; ++k) e.loss_bits = (e.loss_bits ^ ((bits >> (8 * k)) & 0xff)) * 1099511628211ull;
  }
  e.last_loss = r.steps.empty() ? 0.0 : r.steps.back().loss;
  return e;
}

EngineStep measure_engine_step(Precision precision, int threads, int steps, const ConfigTweak& tweak) {
  const std::optional<EngineStep> e =
      in_child_process<EngineStep>([&] { return measure_engine_step_here(precision, threads, steps, true, tweak); });
  if (!e) throw std::runtime_error("engine step benchmark: the measuring process failed (see above)");
  return *e;
}

bool parse_steps_rounds(int argc, char** argv, const char* name, int* steps, int* rounds) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      *steps = std::atoi(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      *rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: tools/bench/run %s [--steps N] [--rounds R]\n", name);
      return false;
    }
  }
  return true;
}

}  // namespace mt::bench
