// The version gate between the optimizer and the checkpointer (actors/checkpoint_gate.hpp): the
// optimizer copies a stage aside within the budget instead of waiting, waits when the stage is being
// written or the budget is spent, and the checkpointer writes from the copy.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "actors/checkpoint_gate.hpp"

using namespace mt::actors;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kFloats = 1000;
constexpr std::uint64_t kStageBytes = kFloats * sizeof(float) * 3;

// A copy function that writes `value` into every float of the snapshot and counts its calls.
struct Copier {
  std::atomic<int> calls{0};
  float value = 0;
  std::chrono::milliseconds delay{0};
  std::function<void(StageSnapshot&)> fn() {
    return [this](StageSnapshot& s) {
      ++calls;
      std::this_thread::sleep_for(delay);
      for (std::size_t i = 0; i < s.floats; ++i) s.master[i] = s.m[i] = s.v[i] = value;
    };
  }
};

}  // namespace

TEST_CASE("gate: no checkpoint open, or the stage written: the update goes on at once") {
  CheckpointGate g;
  Copier c;
  CHECK(g.before_update(4, 0, kFloats, 3, c.fn()) == 0.0);
  REQUIRE(g.open(4, 2));
  CHECK_FALSE(g.open(4, 2));
  g.mark_written(4, 0);
  CHECK(g.before_update(4, 0, kFloats, 3, c.fn()) == 0.0);
  CHECK(c.calls == 0);
}

TEST_CASE("gate: without a budget the optimizer waits until the stage is written") {
  CheckpointGate g;
  REQUIRE(g.open(4, 2));
  Copier c;
  std::thread writer([&] {
    CHECK(g.begin_write(4, 1) == nullptr);  // from the tile
    std::this_thread::sleep_for(100ms);
    g.mark_written(4, 1);
  });
  const double waited = g.before_update(4, 1, kFloats, 3, c.fn());
  writer.join();
  CHECK(waited > 0.05);
  CHECK(c.calls == 0);
  CHECK(g.copied_bytes() == 0);
  CHECK(g.waited_s() == Approx(waited));
}

TEST_CASE("gate: within the budget the optimizer copies the stage and the checkpointer writes the copy") {
  CheckpointGate g;
  g.set_snapshot_budget(kStageBytes);
  REQUIRE(g.open(8, 3));
  Copier c;
  c.value = 2.5f;
  CHECK(g.before_update(8, 2, kFloats, 3, c.fn()) == 0.0);
  CHECK(c.calls == 1);
  CHECK(g.has_snapshot(8, 2));
  CHECK_FALSE(g.has_snapshot(8, 1));
  const StageSnapshot* s = g.begin_write(8, 2);
  REQUIRE(s != nullptr);
  CHECK(s->floats == kFloats);
  CHECK(s->master[kFloats - 1] == 2.5f);
  CHECK(s->v[0] == 2.5f);
  // Page-aligned, so the writer writes the copy straight to disk (O_DIRECT), not through the page cache.
  for (const float* state : {s->master.get(), s->m.get(), s->v.get()})
    CHECK(reinterpret_cast<std::uintptr_t>(state) % 4096 == 0);
  // A second update of the same stage (a re-issued one) neither copies nor waits again.
  CHECK(g.before_update(8, 2, kFloats, 3, c.fn()) == 0.0);
  CHECK(c.calls == 1);
  g.mark_written(8, 2);
  CHECK_FALSE(g.has_snapshot(8, 2));
  CHECK(g.copied_bytes() == kStageBytes);
  CHECK(g.copy_seconds() > 0.0);

  SECTION("the budget holds one stage: the next copy waits until the first is written") {
    g.close(8);
    REQUIRE(g.open(12, 3));
    CHECK(g.before_update(12, 0, kFloats, 3, c.fn()) == 0.0);
    std::thread writer([&] {
      std::this_thread::sleep_for(100ms);
      REQUIRE(g.begin_write(12, 0) != nullptr);
      g.mark_written(12, 0);  // frees the first copy's budget
    });
    const double waited = g.before_update(12, 1, kFloats, 3, c.fn());
    writer.join();
    CHECK(waited > 0.05);
    CHECK(c.calls == 3);  // 8/2, 12/0, then 12/1 once the budget was back
    CHECK(g.has_snapshot(12, 1));
  }
  SECTION("closing a checkpoint frees its copies") {
    CHECK(g.before_update(8, 1, kFloats, 3, c.fn()) == 0.0);
    g.close(8);
    CHECK_FALSE(g.has_snapshot(8, 1));
    REQUIRE(g.open(16, 2));
    CHECK(g.before_update(16, 0, kFloats, 3, c.fn()) == 0.0);  // the budget is free again
    CHECK(g.has_snapshot(16, 0));
  }
}

TEST_CASE("gate: a stage being written is waited for even with a budget") {
  CheckpointGate g;
  g.set_snapshot_budget(10 * kStageBytes);
  REQUIRE(g.open(4, 1));
  REQUIRE(g.begin_write(4, 0) == nullptr);
  Copier c;
  std::thread writer([&] {
    std::this_thread::sleep_for(100ms);
    g.mark_written(4, 0);
  });
  CHECK(g.before_update(4, 0, kFloats, 3, c.fn()) > 0.05);
  writer.join();
  CHECK(c.calls == 0);
}

// While the optimizer waits for the stage being written, the writer is on the critical path: the gate
// says so (the checkpointer then runs at training's priority), and says when the wait is over. No wait,
// no call.
TEST_CASE("gate: the writer is told it is urgent while the optimizer waits for it, and when it is not") {
  CheckpointGate g;
  std::vector<bool> calls;
  std::atomic<int> urgent{0};
  g.set_writer_urgency([&](bool u) {
    calls.push_back(u);
    urgent += u ? 1 : -1;
  });
  REQUIRE(g.open(4, 2));
  Copier c;
  g.mark_written(4, 0);
  CHECK(g.before_update(4, 0, kFloats, 3, c.fn()) == 0.0);
  CHECK(calls.empty());
  REQUIRE(g.begin_write(4, 1) == nullptr);
  std::atomic<bool> seen_urgent{false};
  std::thread writer([&] {
    const auto deadline = std::chrono::steady_clock::now() + 5s;  // never called: fail, do not hang
    while (urgent.load() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);  // the optimizer waits for this write
    seen_urgent = urgent.load() != 0;
    g.mark_written(4, 1);
  });
  CHECK(g.before_update(4, 1, kFloats, 3, c.fn()) > 0.0);
  writer.join();
  CHECK(seen_urgent);
  CHECK(calls == std::vector<bool>{true, false});
  CHECK(urgent == 0);
  // Cleared (the writer's thread is gone): a wait calls nothing.
  g.set_writer_urgency({});
  REQUIRE(g.open(8, 1));
  std::thread late([&] {
    std::this_thread::sleep_for(50ms);
    g.mark_written(8, 0);
  });
  REQUIRE(g.begin_write(8, 0) == nullptr);
  CHECK(g.before_update(8, 0, kFloats, 3, c.fn()) > 0.0);
  late.join();
  CHECK(calls.size() == 2);
}

TEST_CASE("gate: the checkpointer waits for a copy in progress and writes it") {
  CheckpointGate g;
  g.set_snapshot_budget(kStageBytes);
  REQUIRE(g.open(4, 1));
  Copier c;
  c.value = -1.0f;
  c.delay = 150ms;
  std::thread optimizer([&] { CHECK(g.before_update(4, 0, kFloats, 3, c.fn()) == 0.0); });
  while (!g.has_snapshot(4, 0)) std::this_thread::sleep_for(1ms);
  const auto t0 = std::chrono::steady_clock::now();
  const StageSnapshot* s = g.begin_write(4, 0);
  CHECK(std::chrono::steady_clock::now() - t0 > 50ms);
  optimizer.join();
  REQUIRE(s != nullptr);
  CHECK(s->m[10] == -1.0f);
}

TEST_CASE("gate: release_all frees a waiting optimizer") {
  CheckpointGate g;
  REQUIRE(g.open(4, 1));
  REQUIRE(g.begin_write(4, 0) == nullptr);
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    g.release_all();
  });
  Copier c;
  CHECK(g.before_update(4, 0, kFloats, 3, c.fn()) > 0.02);
  stopper.join();
}
