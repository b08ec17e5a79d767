// The CUDA backend's pinned-range bookkeeping (device/cuda/pinned_ranges.hpp), without a GPU: the pin
// and unpin calls are recorded instead of reaching cudaHostRegister.
#include <catch2/catch.hpp>

#include <vector>

#include "device/cuda/pinned_ranges.hpp"

using mt::cuda::PinnedRanges;

namespace {
struct Log {
  std::vector<std::pair<void*, std::size_t>> pinned, unpinned;
};
PinnedRanges recording(Log& log, bool fail_pin = false) {
  return PinnedRanges(
      [&log, fail_pin](void* p, std::size_t n) {
        if (fail_pin) throw std::runtime_error("cudaHostRegister failed");
        log.pinned.emplace_back(p, n);
      },
      [&log](void* p, std::size_t n) { log.unpinned.emplace_back(p, n); });
}
}  // namespace

TEST_CASE("pinned ranges: exact ranges pinned and unpinned once", "[cuda][pinned]") {
  std::vector<char> buf(10000);
  Log log;
  {
    PinnedRanges r = recording(log);
    r.add(buf.data(), 1000);
    r.add(buf.data() + 1000, 3001);  // adjacent, odd size: exact, no rounding
    CHECK(r.count() == 2);
    CHECK(r.bytes() == 4001);
    r.remove(buf.data(), 1000);
    CHECK(r.count() == 1);
    CHECK(log.unpinned.size() == 1);
    CHECK(log.unpinned[0] == std::make_pair(static_cast<void*>(buf.data()), std::size_t{1000}));
  }  // the destructor unpins what is left
  REQUIRE(log.unpinned.size() == 2);
  CHECK(log.unpinned[1] == std::make_pair(static_cast<void*>(buf.data() + 1000), std::size_t{3001}));
  CHECK(log.pinned.size() == 2);
}

TEST_CASE("pinned ranges: overlaps, unknown ranges and failed pins are refused cleanly", "[cuda][pinned]") {
  std::vector<char> buf(10000);
  Log log;
  PinnedRanges r = recording(log);
  r.add(buf.data() + 100, 100);
  CHECK_THROWS_WITH(r.add(buf.data() + 150, 10), Catch::Contains("overlaps"));
  CHECK_THROWS_WITH(r.add(buf.data() + 50, 51), Catch::Contains("overlaps"));
  CHECK_THROWS_WITH(r.add(buf.data() + 199, 5), Catch::Contains("overlaps"));
  CHECK_NOTHROW(r.add(buf.data() + 200, 5));  // touching, not overlapping
  CHECK_NOTHROW(r.add(buf.data() + 50, 50));
  CHECK_THROWS_WITH(r.remove(buf.data() + 100, 99), Catch::Contains("no range of 99 bytes"));
  CHECK_THROWS(r.remove(buf.data() + 7, 1));
  CHECK(r.count() == 3);
  CHECK(log.pinned.size() == 3);
  r.release_all();
  CHECK(r.count() == 0);
  CHECK(log.unpinned.size() == 3);

  Log failing;
  PinnedRanges f = recording(failing, true);
  CHECK_THROWS_WITH(f.add(buf.data(), 10), Catch::Contains("cudaHostRegister"));
  CHECK(f.count() == 0);  // nothing recorded, nothing to unpin later
}
