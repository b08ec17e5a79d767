// checkpoint_stall: the extra step time an asynchronous checkpoint costs training, measured on the
// demo model's shapes (config/demo.ini: Llama, hidden 384, 8 layers, vocab 4096, batch 4 x 128) with
// synthetic random tokens. Each round is a pair of engine runs of `steps` steps on the same data: a
// control run without checkpoints and a run checkpointing every `every` steps (the checkpointer writes
// each stage from its tile right after the optimizer's update, behind the version gate; by default
// deferred until the step's updates are over, --stall-immediate 1 writes each stage as soon as it is
// updated). Over the same steps (after 2 warm-up steps, before the last):
//   stall = (time of the checkpointed run - time of the control run) / checkpoints
//   metric checkpoint_stall: value = stall / the control run's median step (a fraction of a step; may
//   be negative when noise exceeds the cost), the median over `rounds` rounds, target <= 0.05.
// Also printed: the optimizer's total wait at the version gate and each checkpoint's write time.
// The least stall any write schedule can reach on these cores: a checkpoint's own CPU work (the
// checkpointer thread's CPU time: checksums, system calls; plus the optimizer's copies aside) is taken
// from training's cores however it is scheduled, so with training keeping all `cores` busy it costs at
// least cpu / cores of wall time:
//   metric checkpoint_stall_cpu_floor: (writer CPU + copy time) / cores per checkpoint / the control
//   run's median step (median over the rounds); the stall's ratio to it is printed beside it.
#include "tools/bench/checkpoint_stall.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "actors/engine.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/demo_model.hpp"

namespace mt::bench {

namespace {

struct RunTimes {
  std::vector<double> step_s;  // measured steps (3 .. steps-1)
  double gate_wait_s = 0.0;
  double writer_cpu_s = 0.0;  // the checkpointer's CPU time over every checkpoint written
  double copy_s = 0.0;        // the optimizer's copies aside, for those checkpoints
  int written = 0;            // checkpoints written (the one at the last step too)
  bool ok = false;
};

// One engine run; checkpoints every `every` steps when every > 0.
RunTimes one_run(const std::filesystem::path& dir, int steps, int every, bool immediate, int snapshot_mib,
                 double host_ram_gb) {
  using namespace mt::actors;
  TrainConfig c = mt::bench::demo_train_config(steps);
  c.train.warmup_steps = 2;
  c.plan.host_ram_gb = host_ram_gb;
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
  if (every > 0) {
    job.checkpoint.root = (dir / "stall").string();
    job.checkpoint.save_steps = every;
    job.checkpoint.at_end = false;
    job.checkpoint.keep_last = 1;
    job.checkpoint.write_after_step = !immediate;
    if (snapshot_mib >= 0) job.checkpoint.snapshot_budget_bytes = static_cast<std::uint64_t>(snapshot_mib) << 20;
  }
  std::vector<CheckpointEvent> events;
  job.on_checkpoint = [&](const CheckpointEvent& e) { events.push_back(e); };
  const EngineResult r = run_engine(std::move(job));
  RunTimes t;
  if (!r.error.empty()) {
    std::fprintf(stderr, "checkpoint_stall: %s\n", r.error.c_str());
    return t;
  }
  for (const auto& e : events) {
    std::printf("checkpoint step %lld: %s, %.1f MiB in %.2fs, writer CPU %.3fs\n", static_cast<long long>(e.step),
                e.ok ? "ok" : e.error.c_str(), static_cast<double>(e.bytes) / (1 << 20), e.seconds, e.cpu_seconds);
    if (!e.ok) continue;
    t.writer_cpu_s += e.cpu_seconds;  // every checkpoint the run wrote (also one whose steps are not measured)
    ++t.written;
  }
  for (const auto& s : r.steps)
    if (s.step > 2 && s.step < steps)
      t.step_s.push_back(s.step_s);  // warm-up; the last step's checkpoint runs past the end
  t.gate_wait_s = r.checkpoint_wait_s;
  t.copy_s = r.checkpoint_copy_s;
  t.ok = !t.step_s.empty();
  return t;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// The cores this process may run on (training uses them all by default).
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// One round: a control run and a checkpointed run; returns the stall and its CPU floor (see the top) as
// fractions of a control step.
bool one_round(const std::filesystem::path& dir, int steps, int every, bool immediate, int snapshot_mib,
               double host_ram_gb, double& fraction, double& floor) {
  const RunTimes control = one_run(dir, steps, 0, immediate, snapshot_mib, host_ram_gb);
  const RunTimes ckpt = one_run(dir, steps, every, immediate, snapshot_mib, host_ram_gb);
  int checkpoints = 0;
  for (int v = every; v < steps; v += every) ++checkpoints;
  if (!control.ok || !ckpt.ok || checkpoints == 0) return false;
  const double step = median(control.step_s);
  const double stall = (sum(ckpt.step_s) - sum(control.step_s)) / checkpoints;
  fraction = stall / step;
  const int cores = usable_cores();
  // Per checkpoint, over all the run wrote: the one at the last step is written (and may be copied
  // aside) though its steps are not measured.
  const int written = std::max(1, ckpt.written);
  const double cpu = (ckpt.writer_cpu_s + ckpt.copy_s) / written;
  floor = cpu / cores / step;
  std::printf(
      "%d steps, checkpoint every %d: control run %.3fs (median step %.3fs), checkpointed run %.3fs, stall per "
      "checkpoint %.3fs (%.1f%% of a step), optimizer gate wait %.3fs total; per checkpoint writer CPU %.3fs + "
      "copies aside %.3fs over %d cores: floor %.1f%% of a step\n",
      steps, every, sum(control.step_s), step, sum(ckpt.step_s), stall, 100.0 * fraction, ckpt.gate_wait_s,
      ckpt.writer_cpu_s / written, ckpt.copy_s / written, cores, 100.0 * floor);
  return true;
}

}  // namespace

int measure_checkpoint_stall(Report& report, const std::filesystem::path& dir, int steps, int every, int rounds,
                             bool immediate, int snapshot_mib, double host_ram_gb) {
  std::vector<double> fractions, floors;
  for (int i = 0; i < std::max(1, rounds); ++i) {
    double x = 0, f = 0;
    if (!one_round(dir, steps, every, immediate, snapshot_mib, host_ram_gb, x, f)) return 1;
    fractions.push_back(x);
    floors.push_back(f);
  }
  const double m = median(fractions);
  const double floor = median(floors);
  std::printf(
      "checkpoint_stall: median of %zu rounds %.1f%% of a step (target <= 5%%, lower is better); the checkpoint's "
      "own CPU work floors it at %.1f%% (median), the stall is %.2f x that floor\n",
      fractions.size(), 100.0 * m, 100.0 * floor, floor > 0 ? m / floor : 0.0);
  report.add({"checkpoint_stall", m, "step", 0, 0.05, "lower"});
  report.add({"checkpoint_stall_cpu_floor", floor, "step", 0, 0, "lower"});
  return 0;
}

}  // namespace mt::bench
