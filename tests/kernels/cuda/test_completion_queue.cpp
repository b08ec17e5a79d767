// The CUDA backend's copy-completion ordering (device/cuda/completion_queue.hpp) against a fake link
// whose copies finish in any order: callbacks still run once each, in submission order (a stream
// completes in order, so an earlier copy's callback never comes after a later one's), wait_idle returns
// only after every callback ran, and the stats count every copy. No GPU needed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "device/cuda/completion_queue.hpp"

using mt::cuda::CompletionQueue;

namespace {
struct FakeCopy {  // finishes when its promise is set
  int id = 0;
  std::shared_future<void> finished;
};
}  // namespace

TEST_CASE("completions run once each, in submission order, whatever order the copies finish in", "[cuda][queue]") {
  const int n = GENERATE(1, 2, 17, 200);
  const unsigned seed = GENERATE(1u, 2u, 3u);
  std::vector<std::promise<void>> promises(static_cast<std::size_t>(n));
  std::vector<int> order;
  std::mutex order_mu;
  std::atomic<int> waited{0};
  CompletionQueue<FakeCopy> q([&](FakeCopy& c) {
    c.finished.wait();
    waited++;
    return 0.001 * (c.id + 1);
  });
  for (int i = 0; i < n; ++i)
    q.push(FakeCopy{i, promises[static_cast<std::size_t>(i)].get_future().share()}, 100 + i, [&, i] {
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(i);
    });
  // Finish the copies in a random order, from another thread, with small pauses.
  std::vector<int> finish(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) finish[static_cast<std::size_t>(i)] = i;
  std::shuffle(finish.begin(), finish.end(), std::mt19937(seed));
  std::thread link([&] {
    for (int i : finish) {
      promises[static_cast<std::size_t>(i)].set_value();
      if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  q.wait_idle();
  {
    std::lock_guard<std::mutex> lock(order_mu);
    REQUIRE(order.size() == static_cast<std::size_t>(n));  // wait_idle returned after every callback
    for (int i = 0; i < n; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
  }
  link.join();
  const auto s = q.stats();
  CHECK(s.copies == static_cast<std::uint64_t>(n));
  CHECK(s.bytes == static_cast<std::uint64_t>(100 * n + n * (n - 1) / 2));
  CHECK(s.busy_seconds == Approx(0.001 * n * (n + 1) / 2));
  CHECK(waited.load() == n);
}

TEST_CASE("stopping the queue drains it: every queued callback runs", "[cuda][queue]") {
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<int> ran{0};
  auto q = std::make_unique<CompletionQueue<FakeCopy>>([](FakeCopy& c) {
    c.finished.wait();
    return 0.0;
  });
  for (int i = 0; i < 10; ++i) q->push(FakeCopy{i, open}, 1, [&] { ran++; });
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    gate.set_value();
  });
  q->stop();  // blocks until the gate opens and all ten ran
  CHECK(ran.load() == 10);
  q.reset();  // a second stop (the destructor) is harmless
  opener.join();
}
