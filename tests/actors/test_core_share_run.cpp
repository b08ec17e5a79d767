// threads.adapt_to_load through the engine: beside a busy loop that takes one of the run's two cores,
// the run drops to one host thread after two measured windows, says so once, and its results are the
// bits of a run that never adapts (the kernels' results do not depend on the thread count).
#include <catch2/catch.hpp>

#include "engine_fixture.hpp"
#include "tests/device/cpu/busy_loop.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::actors::test;

TEST_CASE("adapt to load: beside a busy loop the run takes one thread fewer, same bits", "[actors][threads]") {
  const std::vector<int> cpus = mt::test::first_two_cpus();
  if (cpus.size() < 2) {
    WARN("one CPU only: nothing to share");
    return;
  }
  Tiny t;
  t.steps = 2000;  // several 0.2 s windows even on a fast machine (a tiny step takes milliseconds)
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
  EngineRun shared;
  {
    const mt::test::PinnedTo pinned(cpus);
    REQUIRE(pinned.ok());
    const mt::test::BusyLoop loop(cpus[1]);
    REQUIRE(loop.ok());
    shared = run_pipeline(cfg, model, batches);
  }
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
