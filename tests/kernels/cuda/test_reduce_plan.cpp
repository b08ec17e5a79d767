// The multi-GPU gradient reduction's host-side arithmetic (device/cuda/reduce_plan.hpp), tested
// without a GPU: chunks cover the buffer once, in order; device 0's scratch stays bounded; the call
// checks name what is wrong.
#include <catch2/catch.hpp>

#include "device/cuda/reduce_plan.hpp"

using namespace mt::cuda;

TEST_CASE("reduce chunks cover the buffer once, in order, none empty", "[cuda][reduce]") {
  for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, reduce_chunk_floats(2)})
    for (std::size_t floats : {std::size_t{0}, std::size_t{1}, std::size_t{6}, std::size_t{7}, std::size_t{8},
                               std::size_t{1000}, std::size_t{12345}, reduce_chunk_floats(2) * 3 + 5}) {
      if (floats / chunk > 100000) continue;  // the count alone, below, for the many-chunk cases
      INFO("floats " << floats << " chunk " << chunk);
      const auto chunks = reduce_chunks(floats, chunk);
      CHECK(chunks.size() == (floats + chunk - 1) / chunk);
      std::size_t next = 0;
      for (const ReduceChunk& c : chunks) {
        CHECK(c.offset == next);
        CHECK(c.floats >= 1);
        CHECK(c.floats <= chunk);
        next += c.floats;
      }
      CHECK(next == floats);
    }
  CHECK(reduce_chunks(reduce_chunk_floats(2) * 3 + 5, 7).size() == (reduce_chunk_floats(2) * 3 + 5 + 6) / 7);
  CHECK_THROWS_WITH(reduce_chunks(10, 0), Catch::Contains("chunk_floats"));
}

TEST_CASE("device 0's reduce scratch: one chunk per peer, 64 MiB each at most, 256 MiB in all", "[cuda][reduce]") {
  CHECK(reduce_chunk_floats(2) * sizeof(float) == kReduceChunkBytes);
  CHECK(reduce_chunk_floats(5) * sizeof(float) == kReduceChunkBytes);  // 4 peers x 64 MiB = the cap
  for (int devices = 2; devices <= 64; ++devices) {
    INFO("devices " << devices);
    const std::size_t chunk = reduce_chunk_floats(devices);
    const std::size_t huge = std::size_t{1} << 34;  // a stage far larger than the chunk
    CHECK(reduce_scratch_floats(huge, chunk, devices) * sizeof(float) <= kReduceScratchCapBytes);
    CHECK(reduce_scratch_floats(huge, chunk, devices) == chunk * static_cast<std::size_t>(devices - 1));
    CHECK(reduce_scratch_floats(100, chunk, devices) == 100 * static_cast<std::size_t>(devices - 1));  // small stage
  }
  CHECK(reduce_scratch_floats(100, 10, 1) == 0);
  // The fit check's extra reserve: none for one GPU; NCCL's allowance everywhere, the scratch bound on 0.
  CHECK(reduce_reserve_bytes(1, 0) == 0);
  for (int devices : {2, 3, 8, 64}) {
    INFO("devices " << devices);
    CHECK(reduce_reserve_bytes(devices, 1) == kNcclAllowanceBytes);
    CHECK(reduce_reserve_bytes(devices, 0) ==
          kNcclAllowanceBytes +
              reduce_scratch_floats(std::size_t{1} << 34, reduce_chunk_floats(devices), devices) * sizeof(float));
    CHECK(reduce_reserve_bytes(devices, 0) <= kNcclAllowanceBytes + kReduceScratchCapBytes);
  }
  CHECK_THROWS(reduce_chunk_floats(1));
}

TEST_CASE("reduce_gradients' checks name the device and the problem", "[cuda][reduce]") {
  float a = 0, b = 0, c = 0;
  CHECK_NOTHROW(check_reduce_call({0, 1, 2}, {&a, &b, &c}, 3, true));
  CHECK_NOTHROW(check_reduce_call({0}, {&a}, 3, true));
  CHECK_NOTHROW(check_reduce_call({0, 1}, {nullptr, nullptr}, 0, true));  // nothing to add
  CHECK_THROWS_WITH(check_reduce_call({0, 1}, {&a}, 3, true), Catch::Contains("one buffer per device"));
  CHECK_THROWS_WITH(check_reduce_call({}, {}, 3, true), Catch::Contains("one buffer per device"));
  CHECK_THROWS_WITH(check_reduce_call({0, 1}, {&a, &b}, 3, false), Catch::Contains("device 0's backend"));
  CHECK_THROWS_WITH(check_reduce_call({0, -1}, {&a, &b}, 3, true),
                    Catch::Contains("device 1") && Catch::Contains("not a CUDA backend"));
  CHECK_THROWS_WITH(check_reduce_call({0, 1, 1}, {&a, &b, &c}, 3, true),
                    Catch::Contains("GPU 1 appears twice") && Catch::Contains("device 2"));
  CHECK_THROWS_WITH(check_reduce_call({0, 1}, {&a, nullptr}, 3, true), Catch::Contains("device 1's buffer is null"));
}
