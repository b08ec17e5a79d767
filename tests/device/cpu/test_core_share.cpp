// The cores other processes take (device/cpu/core_share.hpp): /proc/stat parsing, the thread rule with
// its two-window hysteresis, and a real measurement beside a busy loop on this machine's cores.
#include <catch2/catch.hpp>

#include <chrono>
#include <optional>
#include <thread>

#include "device/cpu/core_share.hpp"
#include "tests/device/cpu/busy_loop.hpp"

using namespace mt;

namespace {

// Two of four CPUs; "cpu" (the sum line) must be ignored, cpu1 and cpu3 summed.
constexpr const char* kStat =
    "cpu  900 0 300 5000 10 0 0 40 0 0\n"
    "cpu0 100 0 50 1000 0 0 0 0 0 0\n"
    "cpu1 200 10 40 1000 5 3 2 30 7 0\n"
    "cpu2 300 0 100 1500 0 0 0 0 0 0\n"
    "cpu3 300 0 110 1500 5 0 0 10 0 0\n"
    "intr 12345 0 0\n"
    "ctxt 999\n";

CoreShare share(int cores, double others) {
  CoreShare s;
  s.window_s = 0.5;
  s.cores = cores;
  s.others_cores = others;
  return s;
}

}  // namespace

TEST_CASE("core share: /proc/stat's busy and steal time of the CPUs this process may use") {
  const CpuTimes t = parse_proc_stat(kStat, {1, 3}, 100.0);
  // cpu1: user 200 + nice 10 + system 40 + irq 3 + softirq 2 = 255; cpu3: 300 + 110 = 410 (ticks)
  CHECK(t.busy_s == Approx((255.0 + 410.0) / 100.0));
  CHECK(t.steal_s == Approx((30.0 + 10.0) / 100.0));
  CHECK_THROWS_WITH(parse_proc_stat(kStat, {1, 7}, 100.0), Catch::Contains("cpu7"));
  CHECK_THROWS_WITH(parse_proc_stat("cpu0 1 2\n", {0}, 100.0), Catch::Contains("malformed"));
}

TEST_CASE("core share: threads follow the cores left, after two windows that agree") {
  ThreadsForShare t(2);
  CHECK(t.update(share(2, 0.1)) == 2);
  CHECK(t.update(share(2, 1.0)) == 2);  // one window: maybe a burst
  CHECK(t.update(share(2, 1.0)) == 1);  // two: the core is taken
  CHECK(t.update(share(2, 1.0)) == 1);
  CHECK(t.update(share(2, 0.0)) == 1);  // freed once
  CHECK(t.update(share(2, 1.0)) == 1);  // ... then taken again: no change, the pending one is forgotten
  CHECK(t.update(share(2, 0.0)) == 1);
  CHECK(t.update(share(2, 0.2)) == 2);  // freed twice in a row
  // Never below one, never above the configured count; half a core left rounds up.
  ThreadsForShare four(4);
  for (int i = 0; i < 2; ++i) four.update(share(8, 7.9));
  CHECK(four.current() == 1);
  for (int i = 0; i < 2; ++i) four.update(share(8, 0.0));
  CHECK(four.current() == 4);
  for (int i = 0; i < 2; ++i) four.update(share(4, 1.5));
  CHECK(four.current() == 3);  // 2.5 cores left
  ThreadsForShare one(1);
  for (int i = 0; i < 3; ++i) CHECK(one.update(share(2, 2.0)) == 1);
}

TEST_CASE("core share: a busy loop on one of two cores is measured as about one core taken") {
  const std::vector<int> cpus = test::first_two_cpus();
  if (cpus.size() < 2) {
    WARN("one CPU only: nothing to share");
    return;
  }
  const test::PinnedTo pinned(cpus);  // this test on two CPUs, the busy loop on the second
  REQUIRE(pinned.ok());
  CoreShareMeter meter;
  CHECK(meter.cores() == 2);
  std::optional<CoreShare> s;
  {
    const test::BusyLoop loop(cpus[1]);
    REQUIRE(loop.ok());
    (void)meter.sample(0.0);  // from here on
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    s = meter.sample(0.2);
  }
  REQUIRE(s.has_value());
  CHECK(s->window_s >= 0.5);
  CHECK(s->cores == 2);
  // The loop holds its core (this process sleeps); other tenants of a shared machine may add some.
  CHECK(s->others_cores > 0.7);
  CHECK(s->others_cores <= 2.0);
}
