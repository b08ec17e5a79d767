// threads.adapt_to_load through the engine: beside a busy loop that takes one of the run's two cores,
// the run drops to one host thread after two measured windows, says so once, and its results are the
// bits of a run that never adapts (the kernels' results do not depend on the thread count).
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::actors::test;

namespace {

// A process that burns one CPU until the scope ends.
class BusyLoop {
 public:
  explicit BusyLoop(int cpu) {
    pid_ = ::fork();
    if (pid_ == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      ::sched_setaffinity(0, sizeof one, &one);
      volatile unsigned long x = 0;
      for (;;) x = x + 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ~BusyLoop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  BusyLoop(const BusyLoop&) = delete;
  BusyLoop& operator=(const BusyLoop&) = delete;
  bool ok() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

}  // namespace

TEST_CASE("adapt to load: beside a busy loop the run takes one thread fewer, same bits", "[actors][threads]") {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  int cpus[2] = {-1, -1}, n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < 2; ++c)
    if (CPU_ISSET(c, &mine)) cpus[n++] = c;
  if (n < 2) {
    WARN("one CPU only: nothing to share");
    return;
  }
  Tiny t;
  t.steps = 400;
  t.hidden = 64;
  TrainConfig cfg = tiny_config(t);
  cfg.threads.blas = 2;
  cfg.threads.optimizer = 2;
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = tiny_batches(t, static_cast<std::size_t>(t.steps));

  TrainConfig fixed = cfg;
  fixed.threads.adapt_to_load = false;
  const EngineRun plain = run_pipeline(fixed, model, batches);
  REQUIRE(plain.result.error.empty());

  // The run on two CPUs (its threads inherit the mask), the loop on the second.
  cpu_set_t two;
  CPU_ZERO(&two);
  CPU_SET(cpus[0], &two);
  CPU_SET(cpus[1], &two);
  REQUIRE(::sched_setaffinity(0, sizeof two, &two) == 0);
  EngineRun shared;
  {
    const BusyLoop loop(cpus[1]);
    REQUIRE(loop.ok());
    shared = run_pipeline(cfg, model, batches);
  }
  ::sched_setaffinity(0, sizeof mine, &mine);
  REQUIRE(shared.result.error.empty());
  REQUIRE(shared.result.steps.size() == plain.result.steps.size());
  int notes = 0, one_thread_steps = 0;
  for (const auto& s : shared.result.steps) {
    notes += !s.cores_note.empty();
    one_thread_steps += s.compute_threads == 1;
  }
  INFO("steps at one thread: " << one_thread_steps << " of " << shared.result.steps.size()
                               << ", last window: others took " << shared.result.steps.back().others_cores << " cores");
  CHECK(one_thread_steps > 0);
  CHECK(notes >= 1);
  CHECK(shared.result.steps.front().compute_threads == 2);
  for (const auto& s : plain.result.steps) CHECK(s.compute_threads == 2);
  for (std::size_t i = 0; i < plain.result.steps.size(); ++i)
    CHECK(shared.result.steps[i].loss == plain.result.steps[i].loss);  // bit for bit
  CHECK(tiles_equal(*shared.host, *plain.host));
}
