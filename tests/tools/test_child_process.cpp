// tools/bench/child_process.hpp: a measurement in a forked child, its result back through a pipe.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <unistd.h>

#include "kernels/cpu/ops.hpp"
#include "tools/bench/child_process.hpp"

namespace {

struct Answer {
  int pid = 0;
  float first = 0, last = 0;
};

// A 2-thread product: its first and last outputs.
Answer product() {
  const std::int64_t N = 256, in = 128, out = 256;
  std::vector<float> x(N * in), W(out * in), y(N * out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
  for (std::size_t i = 0; i < W.size(); ++i) W[i] = static_cast<float>(i % 5) * 0.125f - 0.25f;
  mt::cpu::linear_forward(x.data(), W.data(), nullptr, y.data(), N, in, out, 2);
  return {getpid(), y.front(), y.back()};
}

}  // namespace

TEST_CASE("a child process computes the result and hands it back", "[bench][child_process]") {
  const Answer here = product();  // this process has run a 2-thread region: the child must still run one
  const std::optional<Answer> there = mt::bench::in_child_process<Answer>(product);
  REQUIRE(there.has_value());
  CHECK(there->pid != here.pid);
  CHECK(there->first == here.first);
  CHECK(there->last == here.last);
  CHECK(product().first == here.first);  // and this process still runs parallel work afterwards
}

TEST_CASE("a failing child gives no result", "[bench][child_process]") {
  CHECK_FALSE(mt::bench::in_child_process<Answer>([]() -> Answer { throw std::runtime_error("expected failure"); }));
  CHECK_FALSE(mt::bench::in_child_process<Answer>([]() -> Answer { _exit(3); }));
}
