// The demo model's engine step when its cores are shared, side by side in one run (issue 29, "fair on
// shared cores"). Each engine runs in a child process of its own (child_process.hpp), on random tokens
// with the demo's shapes and keys (engine_step.hpp), fp32:
//   solo        threads.total = T (default: the machine's cores) alone;
//   solo_t1     threads.total = 1 alone: what a run can expect with one core taken from it;
//   one hog     threads.total = T beside one busy-loop process;
//   two runs    two engines with threads.total = T at once.
// The last two twice: as the engine runs by default (threads.adapt_to_load: it gives up a thread while
// another process holds a core) and with the thread count fixed (`_fixed_threads` figures, no target).
// Figures: contention_one_hog = (step beside the hog) / (solo_t1 step), target <= 1.15: losing one core
// to another process should cost what running on the other core alone costs, not a scheduling collapse;
// contention_two_runs = (slower run's step) / (2 x solo step), target <= 1.15: two runs share the machine
// fairly. Every run is a correct run: its per-step losses must equal the solo run's bit for bit (the
// step's bits do not depend on the thread count), else the benchmark fails.
// Usage: bench_contention [threads=cores] [steps=12]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "tools/bench/bench_report.hpp"
#include "tools/bench/child_process.hpp"
#include "tools/bench/engine_step.hpp"
#include "tools/bench/gemm_ceiling.hpp"

namespace {

using mt::bench::ChildRun;
using mt::bench::EngineStep;

EngineStep engine(int threads, int steps, bool adapt = true) {
  const std::optional<EngineStep> e =
      ChildRun<EngineStep>([&] {
        return mt::bench::measure_engine_step_here(mt::Precision::fp32, threads, steps, adapt);
      }).wait();
  if (!e) throw std::runtime_error("contention benchmark: an engine run failed (see above)");
  return *e;
}

// A process that only burns one core until killed.
class Hog {
 public:
  Hog() {
    pid_ = fork();
    if (pid_ == 0) {
      volatile unsigned long x = 0;
      for (;;) x = x + 1;
    }
    if (pid_ < 0) throw std::runtime_error("contention benchmark: cannot fork the busy loop");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let it take its core
  }
  ~Hog() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  Hog(const Hog&) = delete;
  Hog& operator=(const Hog&) = delete;

 private:
  pid_t pid_ = -1;
};

void line(const char* what, const EngineStep& e) {
  std::printf("  %-34s %.3f s/step (compute busy %.3f s), last loss %.6f, loss bits %016llx\n", what, e.step_s,
              e.compute_s, e.last_loss, static_cast<unsigned long long>(e.loss_bits));
}

}  // namespace

int main(int argc, char** argv) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = argc > 1 ? std::atoi(argv[1]) : std::max(1, cores);
  const int steps = argc > 2 ? std::atoi(argv[2]) : 12;
  if (threads < 1 || steps < 3) {
    std::fprintf(stderr, "usage: bench_contention [threads>=1] [steps>=3]\n");
    return 2;
  }
  std::printf("contention: the demo model's engine step (fp32, %d steps, median of steps 2..N), threads.total=%d\n",
              steps, threads);
  std::printf("  CPU: %s, %d cores\n  ISA: %s\n", mt::bench::cpu_model().c_str(), cores,
              mt::bench::cpu_isa_flags().c_str());
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf("  OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s\n", wait_policy ? wait_policy : "(unset)",
              std::getenv("GOMP_SPINCOUNT") ? std::getenv("GOMP_SPINCOUNT") : "(unset)");
  try {
    const EngineStep solo = engine(threads, steps);
    line("alone", solo);
    const EngineStep solo1 = engine(1, steps);
    line("alone, threads.total=1", solo1);
    // Each case twice: the engine as it runs by default (threads.adapt_to_load: it gives up a thread
    // while another process holds a core) and with its thread count fixed (what it did before).
    struct Shared {
      EngineStep hogged, first, second;
    };
    auto shared_runs = [&](bool adapt) {
      Shared s;
      {
        Hog hog;
        s.hogged = engine(threads, steps, adapt);
      }
      ChildRun<EngineStep> first(
          [&] { return mt::bench::measure_engine_step_here(mt::Precision::fp32, threads, steps, adapt); });
      ChildRun<EngineStep> second(
          [&] { return mt::bench::measure_engine_step_here(mt::Precision::fp32, threads, steps, adapt); });
      const std::optional<EngineStep> a = first.wait(), b = second.wait();
      if (!a || !b) throw std::runtime_error("contention benchmark: one of the two concurrent runs failed (see above)");
      s.first = *a;
      s.second = *b;
      const char* how = adapt ? "adapting threads" : "fixed threads";
      std::printf("  %s:\n", how);
      line("beside one busy loop", s.hogged);
      line("two runs at once: first", s.first);
      line("two runs at once: second", s.second);
      return s;
    };
    const Shared adaptive = shared_runs(true), fixed = shared_runs(false);
    bool same = solo1.loss_bits == solo.loss_bits;
    for (const Shared* s : {&adaptive, &fixed})
      for (const EngineStep* e : {&s->hogged, &s->first, &s->second}) same = same && e->loss_bits == solo.loss_bits;
    std::printf("  every run's losses equal the solo run's, bit for bit: %s\n", same ? "yes" : "NO");
    if (!same) {
      std::fprintf(stderr, "contention benchmark: a run under contention computed other losses than the solo run\n");
      return 1;
    }
    auto slower = [](const Shared& s) { return std::max(s.first.step_s, s.second.step_s); };
    for (const Shared* s : {&adaptive, &fixed}) {
      std::printf(
          "  %s: beside a busy loop %.2fx the threads.total=1 step (%.2fx the solo step); two runs: the slower "
          "steps at %.2fx twice the solo step\n",
          s == &adaptive ? "adapting threads" : "fixed threads", s->hogged.step_s / solo1.step_s,
          s->hogged.step_s / solo.step_s, slower(*s) / (2 * solo.step_s));
    }
    mt::bench::Report report("contention");
    report.add({"contention_solo_step_s", solo.step_s, "s", 0.0, 0.0, "lower"});
    report.add({"contention_solo_t1_step_s", solo1.step_s, "s", 0.0, 0.0, "lower"});
    report.add({"contention_one_hog", adaptive.hogged.step_s, "s", solo1.step_s, 1.15, "lower"});
    report.add({"contention_two_runs", slower(adaptive), "s", 2 * solo.step_s, 1.15, "lower"});
    report.add({"contention_one_hog_fixed_threads", fixed.hogged.step_s, "s", solo1.step_s, 0.0, "lower"});
    report.add({"contention_two_runs_fixed_threads", slower(fixed), "s", 2 * solo.step_s, 0.0, "lower"});
    report.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
