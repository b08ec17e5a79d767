#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "device/cpu/copy_engine.hpp"

using namespace mt;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(i * 31 + seed);
  return v;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

TEST_CASE("copies land byte-exact in both directions, with callbacks and futures", "[copy_engine]") {
  for (int workers : {1, 2}) {
    CopyEngineOptions options;
    options.workers = workers;
    options.chunk_bytes = 4096;  // several chunks per job, and a partial last one
    CopyEngine engine(options);
    const std::size_t sizes[] = {0, 1, 4095, 4096, 4097, 100000};
    std::vector<std::vector<std::uint8_t>> sources, targets;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      sources.push_back(pattern(sizes[i], static_cast<std::uint8_t>(i)));
      targets.emplace_back(sizes[i], 0);
    }
    std::atomic<int> callbacks{0};
    std::vector<std::future<void>> futures;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      CopyJob job;
      job.direction = i % 2 ? CopyDirection::device_to_host : CopyDirection::host_to_device;
      job.src = sources[i].data();
      job.dst = targets[i].data();
      job.bytes = sizes[i];
      job.on_done = [&] { callbacks++; };
      futures.push_back(engine.submit_with_future(std::move(job)));
    }
    for (auto& f : futures) f.get();
    CHECK(callbacks == static_cast<int>(std::size(sizes)));
    engine.wait_idle();  // a job leaves the queue count just after its callback (and future) completed
    for (std::size_t i = 0; i < std::size(sizes); ++i) CHECK((targets[i] == sources[i]));
    const auto stats = engine.stats();
    CHECK(stats.of(CopyDirection::host_to_device).jobs + stats.of(CopyDirection::device_to_host).jobs ==
          std::size(sizes));
    CHECK(stats.of(CopyDirection::host_to_device).bytes == 0 + 4095 + 4097);
    CHECK(stats.of(CopyDirection::device_to_host).bytes == 1 + 4096 + 100000);
    CHECK(stats.queued_jobs == 0);
  }
}

TEST_CASE("jobs of one direction complete in submission order", "[copy_engine]") {
  for (int workers : {1, 2}) {
    CopyEngineOptions options;
    options.workers = workers;
    CopyEngine engine(options);
    std::vector<std::uint8_t> src(1 << 16, 1), dst_h2d(1 << 16), dst_d2h(1 << 16);  // directions may run at once
    std::mutex m;
    std::vector<int> order_h2d, order_all;
    for (int i = 0; i < 40; ++i) {
      const auto direction = i % 3 ? CopyDirection::host_to_device : CopyDirection::device_to_host;
      CopyJob job{direction,
                  src.data(),
                  direction == CopyDirection::host_to_device ? dst_h2d.data() : dst_d2h.data(),
                  static_cast<std::size_t>(1000 * (i % 7)),
                  {}};
      const bool h2d = job.direction == CopyDirection::host_to_device;
      job.on_done = [&, i, h2d] {
        std::lock_guard<std::mutex> lock(m);
        if (h2d) order_h2d.push_back(i);
        order_all.push_back(i);
      };
      engine.submit(std::move(job));
    }
    engine.wait_idle();
    CHECK(std::is_sorted(order_h2d.begin(), order_h2d.end()));
    CHECK(order_all.size() == 40);
    if (workers == 1) CHECK(std::is_sorted(order_all.begin(), order_all.end()));  // one FIFO overall
  }
}

TEST_CASE("a bandwidth limit makes a copy of N bytes take N / limit seconds", "[copy_engine][bandwidth]") {
  CopyEngineOptions options;
  options.bandwidth_bytes_per_s = 20e6;  // 20 MB/s: far below memcpy speed, even under ThreadSanitizer
  CopyEngine engine(options);
  const std::size_t n = 3'000'000;  // 0.15 s at the limit
  std::vector<std::uint8_t> src(n, 7), dst(n);
  const auto t0 = Clock::now();
  engine.submit_with_future({CopyDirection::host_to_device, src.data(), dst.data(), n, {}}).get();
  const double elapsed = seconds_since(t0);
  const double ideal = static_cast<double>(n) / options.bandwidth_bytes_per_s;
  INFO("elapsed " << elapsed << " s, ideal " << ideal << " s");
  CHECK(elapsed >= ideal * 0.99);  // never faster than the link (how close it gets is for the overlap bench)
  const bool copied_exactly = dst == src;
  CHECK(copied_exactly);
  const auto s = engine.stats().of(CopyDirection::host_to_device);
  CHECK(s.busy_seconds >= ideal * 0.99);
  CHECK(s.throttle_seconds > 0.0);
  CHECK(s.throttle_seconds <= s.busy_seconds);
}

TEST_CASE("back-to-back small jobs cannot beat the limit on average", "[copy_engine][bandwidth]") {
  CopyEngineOptions options;
  options.bandwidth_bytes_per_s = 20e6;
  CopyEngine engine(options);
  std::vector<std::uint8_t> src(40'000, 3), dst(40'000);
  const auto t0 = Clock::now();
  for (int i = 0; i < 50; ++i) engine.submit({CopyDirection::device_to_host, src.data(), dst.data(), src.size(), {}});
  engine.wait_idle();
  const double elapsed = seconds_since(t0);
  const double ideal = 50 * 40'000 / options.bandwidth_bytes_per_s;  // 0.1 s
  INFO("elapsed " << elapsed << " s, ideal " << ideal << " s");
  CHECK(elapsed >= ideal * 0.99);
}

TEST_CASE("with two workers the directions run concurrently (full duplex)", "[copy_engine][bandwidth]") {
  CopyEngineOptions options;
  options.workers = 2;
  options.bandwidth_bytes_per_s = 20e6;
  CopyEngine engine(options);
  const std::size_t n = 8'000'000;  // 0.4 s per direction: long enough that scheduling noise is small
  std::vector<std::uint8_t> a(n, 1), b(n), c(n, 2), d(n);
  const auto t0 = Clock::now();
  auto f1 = engine.submit_with_future({CopyDirection::host_to_device, a.data(), b.data(), n, {}});
  auto f2 = engine.submit_with_future({CopyDirection::device_to_host, c.data(), d.data(), n, {}});
  f1.get();
  f2.get();
  const double elapsed = seconds_since(t0);
  const CopyEngineStats s = engine.stats();
  const double busy =
      s.of(CopyDirection::host_to_device).busy_seconds + s.of(CopyDirection::device_to_host).busy_seconds;
  INFO("elapsed " << elapsed << " s for 0.4 s per direction; directions busy " << busy << " s in all");
  CHECK(elapsed >= 0.399);
  // Concurrency, not speed: both directions were busy at the same time, so their busy times add up to
  // about twice the wall time (one after the other they would add up to it). No wall-clock upper
  // bound: a loaded machine may stretch both (how fast the link gets is the overlap benchmark's job).
  CHECK(busy > 1.5 * elapsed);
}

TEST_CASE("shutdown finishes queued jobs, then refuses new ones", "[copy_engine]") {
  CopyEngineOptions options;
  options.bandwidth_bytes_per_s = 1e9;
  CopyEngine engine(options);
  std::vector<std::uint8_t> src(100'000, 9), dst(100'000);
  std::atomic<int> done{0};
  for (int i = 0; i < 100; ++i)
    engine.submit({CopyDirection::host_to_device, src.data(), dst.data(), src.size(), [&] { done++; }});
  engine.shutdown();
  CHECK(done == 100);
  CHECK_THROWS_AS(engine.submit({CopyDirection::host_to_device, src.data(), dst.data(), 1, {}}), std::logic_error);
  engine.shutdown();  // idempotent
}

TEST_CASE("the destructor drains the queue too", "[copy_engine]") {
  std::vector<std::uint8_t> src(50'000, 9), dst(50'000);
  std::atomic<int> done{0};
  {
    CopyEngine engine;
    for (int i = 0; i < 20; ++i)
      engine.submit({CopyDirection::device_to_host, src.data(), dst.data(), src.size(), [&] { done++; }});
  }
  CHECK(done == 20);
}

TEST_CASE("bad jobs and options are rejected, a throwing callback is counted, not fatal", "[copy_engine]") {
  CHECK_THROWS_AS(CopyEngine(CopyEngineOptions{3, 0.0, 1 << 20}), std::invalid_argument);
  CHECK_THROWS_AS(CopyEngine(CopyEngineOptions{1, -1.0, 1 << 20}), std::invalid_argument);
  CHECK_THROWS_AS(CopyEngine(CopyEngineOptions{1, 0.0, 0}), std::invalid_argument);
  CopyEngine engine;
  std::uint8_t byte = 1;
  CHECK_THROWS_AS(engine.submit({CopyDirection::host_to_device, nullptr, &byte, 1, {}}), std::invalid_argument);
  auto f = engine.submit_with_future(
      {CopyDirection::host_to_device, &byte, &byte, 1, [] { throw std::runtime_error("boom"); }});
  CHECK_THROWS_WITH(f.get(), "boom");
  engine.wait_idle();
  CHECK(engine.stats().callback_errors == 1);
}

TEST_CASE("many threads submitting at once (ThreadSanitizer target)", "[copy_engine][threads]") {
  CopyEngineOptions options;
  options.workers = 2;
  options.chunk_bytes = 1024;
  CopyEngine engine(options);
  constexpr int kThreads = 4, kJobs = 200;
  std::vector<std::vector<std::uint32_t>> src(kThreads), dst(kThreads);
  std::atomic<std::uint64_t> bytes_done{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    src[t].resize(kJobs * 64);
    std::iota(src[t].begin(), src[t].end(), static_cast<std::uint32_t>(t) << 24);
    dst[t].assign(kJobs * 64, 0);
    submitters.emplace_back([&, t] {
      for (int j = 0; j < kJobs; ++j) {
        CopyJob job{j % 2 ? CopyDirection::host_to_device : CopyDirection::device_to_host,
                    src[t].data() + j * 64,
                    dst[t].data() + j * 64,
                    64 * sizeof(std::uint32_t),
                    {}};
        job.on_done = [&bytes_done] { bytes_done += 64 * sizeof(std::uint32_t); };
        engine.submit(std::move(job));
        if (j % 50 == 0) (void)engine.stats();
      }
    });
  }
  for (auto& s : submitters) s.join();
  engine.wait_idle();
  CHECK(bytes_done == std::uint64_t{kThreads} * kJobs * 64 * 4);
  for (int t = 0; t < kThreads; ++t) CHECK((dst[t] == src[t]));
  const auto stats = engine.stats();
  CHECK(stats.of(CopyDirection::host_to_device).bytes + stats.of(CopyDirection::device_to_host).bytes == bytes_done);
  CHECK(stats.max_queued_jobs >= 1);
}
