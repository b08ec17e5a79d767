// checkpoint_stall: the extra step time an asynchronous checkpoint costs training, measured on the
// demo model's shapes (config/demo.ini: Llama, hidden 384, 8 layers, vocab 4096, batch 4 x 128) with
// synthetic random tokens. One engine run of `steps` steps checkpointing every `every` steps (the
// checkpointer writes each stage from its tile right after the optimizer's update, behind the
// version gate; by default deferred until the step's updates are over, --stall-immediate 1 writes each
// stage as soon as it is updated); the steps a checkpoint overlaps (its step and the next) are compared with the median
// of the steps without one:
//   stall = (sum of step time of the affected steps - their count x median clean step) / checkpoints
//   metric checkpoint_stall: value = stall / median clean step (a fraction of a step), ceiling 1.
// Also printed: the optimizer's total wait at the version gate and each checkpoint's write time.
// The development machine is shared and noisy: `rounds` runs, the best (lowest) figure is reported.
#include "tools/bench/checkpoint_stall.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

#include "actors/engine.hpp"
#include "tools/bench/demo_model.hpp"

namespace mt::bench {

namespace {

// One run; returns the stall as a fraction of a clean step (< 0 on failure).
double one_round(const std::filesystem::path& dir, int steps, int every, bool immediate) {
  using namespace mt::actors;
  TrainConfig c = mt::bench::demo_train_config(steps);
  c.train.warmup_steps = 2;
  const ModelConfig model = c.model_config_from_keys();
  const std::vector<data::Batch> batches = mt::bench::random_batches(c, 8, 0x1234567);
  HostModel host(model);
  init_host_model(host, 7);
  VectorBatchSource source(batches);
  EngineJob job;
  job.cfg = c;
  job.model = model;
  job.data = &source;
  job.host = &host;
  job.checkpoint.root = (dir / "stall").string();
  job.checkpoint.save_steps = every;
  job.checkpoint.at_end = false;
  job.checkpoint.keep_last = 1;
  job.checkpoint.write_after_step = !immediate;
  std::vector<CheckpointEvent> events;
  job.on_checkpoint = [&](const CheckpointEvent& e) { events.push_back(e); };
  const EngineResult r = run_engine(std::move(job));
  if (!r.error.empty()) {
    std::fprintf(stderr, "checkpoint_stall: %s\n", r.error.c_str());
    return -1;
  }
  // Checkpoint v is written from the optimizer's updates of step v (record v) into step v + 1.
  std::set<std::int64_t> affected;
  int checkpoints = 0;
  for (std::int64_t v = every; v < steps; v += every) {
    affected.insert(v);
    affected.insert(v + 1);
    ++checkpoints;
  }
  std::vector<double> clean;
  double affected_s = 0;
  int n_affected = 0;
  for (const auto& s : r.steps) {
    if (s.step <= 2 || s.step == steps) continue;  // warm-up; the last step's checkpoint runs past the end
    if (affected.count(s.step)) {
      affected_s += s.step_s;
      ++n_affected;
    } else {
      clean.push_back(s.step_s);
    }
  }
  if (clean.empty() || checkpoints == 0) return -1;
  std::sort(clean.begin(), clean.end());
  const double median = clean[clean.size() / 2];
  const double stall = std::max(0.0, (affected_s - n_affected * median) / checkpoints);
  for (const auto& e : events)
    std::printf("checkpoint step %lld: %s, %.1f MiB in %.2fs\n", static_cast<long long>(e.step),
                e.ok ? "ok" : e.error.c_str(), static_cast<double>(e.bytes) / (1 << 20), e.seconds);
  std::printf(
      "demo model (%.1fM params), %d steps, checkpoint every %d: clean step %.3fs (median of %zu), "
      "checkpointed steps %.3fs over %d, stall per checkpoint %.3fs (%.1f%% of a step), optimizer gate wait "
      "%.3fs total\n",
      static_cast<double>(total_param_count(model)) / 1e6, steps, every, median, clean.size(), affected_s, n_affected,
      stall, 100.0 * stall / median, r.checkpoint_wait_s);
  return stall / median;
}

}  // namespace

int measure_checkpoint_stall(Report& report, const std::filesystem::path& dir, int steps, int every, int rounds,
                             bool immediate) {
  double best = 1e300;
  for (int i = 0; i < std::max(1, rounds); ++i) {
    const double x = one_round(dir, steps, every, immediate);
    if (x < 0) return 1;
    best = std::min(best, x);
  }
  std::printf("checkpoint_stall: best of %d rounds %.1f%% of a step (target <= 5%%)\n", std::max(1, rounds),
              100.0 * best);
  report.add({"checkpoint_stall", best, "step", 1.0});
  return 0;
}

}  // namespace mt::bench
