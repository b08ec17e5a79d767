#include <catch2/catch.hpp>

#include "kernels/cuda/launch_config.hpp"

using mt::cuda::elementwise_launch;

TEST_CASE("elementwise launch covers every element exactly", "[cuda][launch]") {
  const std::size_t n = GENERATE(1, 3, 4, 5, 1023, 1024, 1025, 1000003, std::size_t(3) << 30);
  const int sms = GENERATE(1, 132);
  const auto c = elementwise_launch(n, sms, 4, 256, 8);
  REQUIRE(c.grid >= 1);
  CHECK(c.grid <= static_cast<unsigned>(sms) * 8);
  CHECK(c.block == 256);
  // grid-stride coverage: threads x trips x width >= n, and one trip fewer would not suffice
  const std::size_t threads = static_cast<std::size_t>(c.grid) * c.block;
  CHECK(threads * c.elements_per_thread >= n);
  const std::size_t vectors = (n + 3) / 4;
  if (c.grid < static_cast<unsigned>(sms) * 8) CHECK(static_cast<std::size_t>(c.grid) * c.block >= vectors);
}

TEST_CASE("elementwise launch of nothing launches nothing", "[cuda][launch]") {
  CHECK(elementwise_launch(0, 80).grid == 0);
}

TEST_CASE("elementwise launch rejects impossible shapes", "[cuda][launch]") {
  CHECK_THROWS_WITH(elementwise_launch(10, 0), Catch::Contains("sm_count"));
  CHECK_THROWS_WITH(elementwise_launch(10, 8, 0), Catch::Contains("vector_width"));
  CHECK_THROWS_WITH(elementwise_launch(10, 8, 4, 100), Catch::Contains("multiple of 32"));
  CHECK_THROWS_WITH(elementwise_launch(10, 8, 4, 2048), Catch::Contains("multiple of 32"));
}
