// The host store of offloaded layer-boundary activations: layout, stamps, bounds.
#include <catch2/catch.hpp>

#include <cstdint>
#include <stdexcept>

#include "storage/host/host_boundaries.hpp"

using namespace mt;

TEST_CASE("host boundaries: entries are disjoint, aligned, and start unstamped", "[storage][host]") {
  HostBoundaries store(2, 5, 37);  // an odd size: entries are padded to a cache line
  CHECK(store.sets() == 2);
  CHECK(store.boundaries() == 5);
  CHECK(store.bytes() >= 2 * 5 * 37 * sizeof(float));
  for (int s = 0; s < 2; ++s)
    for (std::int64_t b = 0; b < 5; ++b) {
      CHECK(store.stamp(s, b) == 0);
      CHECK(reinterpret_cast<std::uintptr_t>(store.data(s, b)) % kCacheLineBytes == 0);
      for (int i = 0; i < 37; ++i) store.data(s, b)[i] = static_cast<float>(s * 1000 + b * 100 + i);
    }
  // Writing every entry in full left every other entry intact.
  for (int s = 0; s < 2; ++s)
    for (std::int64_t b = 0; b < 5; ++b)
      for (int i = 0; i < 37; ++i) REQUIRE(store.data(s, b)[i] == static_cast<float>(s * 1000 + b * 100 + i));
}

TEST_CASE("host boundaries: stamps name the micro-batch whose data an entry holds", "[storage][host]") {
  HostBoundaries store(2, 3, 8);
  store.mark_saved(1, 2, 7);
  CHECK(store.stamp(1, 2) == 7);
  CHECK(store.stamp(0, 2) == 0);
  store.mark_saved(1, 2, 9);
  CHECK(store.stamp(1, 2) == 9);
}

TEST_CASE("host boundaries: bad shapes and entries outside the store are errors", "[storage][host]") {
  CHECK_THROWS_AS(HostBoundaries(0, 3, 8), std::invalid_argument);
  CHECK_THROWS_AS(HostBoundaries(1, -1, 8), std::invalid_argument);
  CHECK_THROWS_AS(HostBoundaries(1, 3, 0), std::invalid_argument);
  HostBoundaries store(1, 3, 8);
  CHECK_THROWS_WITH(store.data(1, 0), Catch::Contains("set 1"));
  CHECK_THROWS_AS(store.data(0, 3), std::out_of_range);
  CHECK_THROWS_AS(store.stamp(0, -1), std::out_of_range);
}
