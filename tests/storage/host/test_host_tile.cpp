#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/param_layout.hpp"
#include "storage/host/host_model.hpp"
#include "tiny_model.hpp"

using namespace mt;
using namespace std::chrono_literals;

namespace {

float bits_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool aligned(const void* p, std::size_t to) { return reinterpret_cast<std::uintptr_t>(p) % to == 0; }

}  // namespace

TEST_CASE("host tile regions are aligned, disjoint, zeroed and sized from the layout", "[host_tile]") {
  HostTile tile(3, 1024);
  CHECK(tile.stage() == 3);
  CHECK(tile.floats() == 1024);
  CHECK(tile.region_bytes() == 4096);
  CHECK(tile.bytes() == 4 * 4096);
  for (TileRegion r : {TileRegion::params, TileRegion::grad, TileRegion::adam_m, TileRegion::adam_v}) {
    CHECK(aligned(tile.region(r), kCacheLineBytes));
    for (std::size_t i = 0; i < tile.floats(); ++i) REQUIRE(tile.region(r)[i] == 0.0f);
  }
  CHECK(tile.grad() == tile.params() + 1024);
  CHECK(tile.adam_m() == tile.grad() + 1024);
  CHECK(tile.adam_v() == tile.adam_m() + 1024);
  CHECK_FALSE(tile.has_compute_copy());
  CHECK(tile.stream_source() == tile.params());
  CHECK(tile.stream_bytes() == tile.region_bytes());
  CHECK(std::string(tile_region_name(TileRegion::adam_v)) == "adam_v");
}

TEST_CASE("a tile without moments holds params, grad and the compute copy only", "[host_tile]") {
  HostTileOptions options;
  options.moments_in_tile = false;  // the moments live in a MomentStore (storage/offload)
  options.compute_bytes_per_param = 2;
  HostTile tile(2, 256, options);
  CHECK_FALSE(tile.has_moments());
  CHECK(tile.bytes() == 2 * 1024 + 512);
  CHECK(static_cast<std::byte*>(tile.compute_copy()) == reinterpret_cast<std::byte*>(tile.grad() + 256));
  CHECK_THROWS_WITH(tile.adam_m(), Catch::Contains("holds no adam_m region"));
  // A model whose tiles hold no moments needs a store, and a store needs tiles without them.
  const ModelConfig c = test::tiny_model(1);
  CHECK_THROWS_WITH(HostModel(c, options), Catch::Contains("no moment store"));
  HostModel in_tiles(c);
  CHECK(in_tiles.moments().describe() == "in the host tiles");
  MomentLease l(in_tiles.moments(), 1);
  CHECK(l.m() == in_tiles.tile(1).adam_m());  // a lease is the tile's own region: no copy
}

TEST_CASE("split masters: grad, m, v, the copy (the high halves) and the low halves, no params region",
          "[host_tile][master_halves]") {
  HostTileOptions options;
  options.compute_bytes_per_param = 2;
  options.split_master = true;
  HostTile tile(1, 256, options);
  CHECK(tile.has_split_master());
  CHECK_FALSE(tile.has_params());
  CHECK(tile.bytes() == 3 * 1024 + 512 + 512);  // 16 bytes per parameter where fp32 masters take 18
  CHECK(tile.master_high() == tile.compute_copy());
  CHECK(reinterpret_cast<std::byte*>(tile.master_low()) == static_cast<std::byte*>(tile.compute_copy()) + 512);
  CHECK(tile.stream_source() == tile.compute_copy());
  CHECK(tile.stream_bytes() == 512);
  CHECK_THROWS_WITH(tile.params(), Catch::Contains("holds no params region"));
  HostTileOptions fp32 = options;
  fp32.compute_bytes_per_param = 0;
  CHECK_THROWS_WITH(HostTile(1, 256, fp32), Catch::Contains("split masters need a bf16 compute copy"));

  // The model: masters set and read through the halves, exactly; leases give plain arrays and split back.
  const ModelConfig c = test::tiny_model(1);
  HostModel host(c, options);
  CHECK(host.split_masters());
  CHECK_FALSE(host.masters_in_tiles());
  const std::size_t n = host.tile(1).floats();
  std::vector<float> want(n);
  for (std::size_t i = 0; i < n; ++i)  // ties of both parities among ordinary values (1.0 .. 2.0: finite)
    want[i] = i % 7 == 0 ? bits_of(0x3f800000u + (static_cast<std::uint32_t>(i % 128) << 16) + 0x8000u)
                         : 0.001f * static_cast<float>(i) - 0.3f;
  host.set_masters(1, [&](float* m) { std::copy(want.begin(), want.end(), m); });
  std::vector<float> got(n);
  host.read_masters(1, [&](const float* m) { std::copy(m, m + n, got.begin()); });
  CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
  {
    StateLease lease(host, 1);
    CHECK(std::memcmp(lease.master(), want.data(), n * sizeof(float)) == 0);
    for (std::size_t i = 0; i < n; ++i) REQUIRE(lease.v()[i] == 0.0f);
    REQUIRE_FALSE(std::signbit(lease.v()[0]));  // plain: the tie bits are cleared
    lease.master()[3] = 2.5f;
    lease.v()[3] = 0.25f;
    lease.mark_modified();
  }
  {
    StateLease lease(host, 1);
    CHECK(lease.master()[3] == 2.5f);
    CHECK(lease.v()[3] == 0.25f);
    lease.v()[5] = -1.0f;  // no AdamW update makes a negative v: refused, the tile unchanged
    CHECK_THROWS_WITH(lease.mark_modified(), Catch::Contains("element 5") && Catch::Contains("negative"));
  }
  StateLease again(host, 1);
  CHECK(again.v()[5] == 0.0f);
}

TEST_CASE("a host tile rejects a size that is not a multiple of the tensor alignment", "[host_tile]") {
  CHECK_THROWS_WITH(HostTile(0, 1000), Catch::Contains("not a multiple of 16"));
}

TEST_CASE("large host tiles are huge-page aligned", "[host_tile]") {
  HostTile tile(0, std::size_t{1} << 20);  // 4 MiB per region
  CHECK(aligned(tile.data(), kHugePageBytes));
}

TEST_CASE("a compute-precision copy is a separate region and becomes the stream source", "[host_tile]") {
  HostTileOptions options;
  options.compute_bytes_per_param = 2;  // bf16, as a CUDA backend would ask
  HostTile tile(1, 256, options);
  REQUIRE(tile.has_compute_copy());
  CHECK(tile.compute_copy_bytes() == 512);
  CHECK(tile.stream_bytes() == 512);
  CHECK(tile.stream_source() == tile.compute_copy());
  CHECK(static_cast<std::byte*>(tile.compute_copy()) == reinterpret_cast<std::byte*>(tile.adam_v() + 256));
  CHECK(aligned(tile.compute_copy(), kCacheLineBytes));
  CHECK(tile.bytes() == 4 * 1024 + 512);
}

TEST_CASE("versions only grow, and waiters wake when one is published", "[host_tile][version]") {
  HostTile tile(0, 16);
  CHECK(tile.version() == 0);
  CHECK(tile.wait_for_version(0));
  CHECK_FALSE(tile.wait_for_version(1, 10ms));  // times out
  bool woke = false;
  std::thread waiter([&] { woke = tile.wait_for_version(2); });
  std::this_thread::sleep_for(20ms);
  CHECK(tile.bump_version() == 1);
  std::this_thread::sleep_for(20ms);
  tile.publish_version(2);
  waiter.join();
  CHECK(woke);
  CHECK(tile.version() == 2);
  CHECK_THROWS_AS(tile.publish_version(1), std::logic_error);
  tile.publish_version(2);  // the same version again is fine
}

TEST_CASE("data written before a version is published is visible to the waiter", "[host_tile][version]") {
  HostTile data(0, 4096);
  HostTile acknowledged(1, 16);  // the reader's progress, so the writer never overwrites unread data
  std::thread writer([&] {
    for (std::uint64_t v = 1; v <= 50; ++v) {
      for (std::size_t i = 0; i < data.floats(); ++i) data.params()[i] = static_cast<float>(v);
      data.publish_version(v);
      acknowledged.wait_for_version(v);
    }
  });
  bool all_seen = true;
  for (std::uint64_t v = 1; v <= 50; ++v) {
    data.wait_for_version(v);
    all_seen = all_seen && data.params()[0] == static_cast<float>(v) &&
               data.params()[data.floats() - 1] == static_cast<float>(v);
    acknowledged.publish_version(v);
  }
  writer.join();
  CHECK(all_seen);
}

TEST_CASE("abort_waits releases every waiter with false", "[host_tile][version]") {
  HostTile tile(0, 16);
  bool result_a = true, result_b = true;
  std::thread a([&] { result_a = tile.wait_for_version(5); });
  std::thread b([&] { result_b = tile.wait_for_version(5, std::chrono::seconds(30)); });
  std::this_thread::sleep_for(20ms);
  tile.abort_waits();
  a.join();
  b.join();
  CHECK_FALSE(result_a);
  CHECK_FALSE(result_b);
  CHECK_FALSE(tile.wait_for_version(1));  // stays aborted
  CHECK(tile.wait_for_version(0));        // already reached: true without waiting
}

TEST_CASE("a host model has one tile per stage, sized by its layout, and reports host bytes", "[host_model]") {
  const ModelConfig cfg = test::tiny_model(4);
  HostModel model(cfg);
  REQUIRE(model.num_stages() == 6);
  std::size_t sum = 0;
  for (std::int64_t s = 0; s < model.num_stages(); ++s) {
    CHECK(model.tile(s).stage() == s);
    CHECK(model.tile(s).floats() == stage_layout(cfg, s).total_floats);
    CHECK(model.layout(s).total_floats == model.tile(s).floats());
    sum += model.tile(s).bytes();
  }
  CHECK(model.host_bytes() == sum);
  CHECK(host_model_bytes(cfg) == sum);
  CHECK(model.largest_stage_floats() == stage_layout(cfg, model.largest_stage()).total_floats);
  CHECK_THROWS_AS(model.tile(6), std::out_of_range);
  CHECK_THROWS_AS(model.tile(-1), std::out_of_range);
}

TEST_CASE("host memory grows linearly with depth", "[host_model]") {
  const auto b12 = host_model_bytes(test::tiny_model(12));
  const auto b24 = host_model_bytes(test::tiny_model(24));
  const auto b48 = host_model_bytes(test::tiny_model(48));
  CHECK(b48 - b24 == 2 * (b24 - b12));
  CHECK(b24 - b12 == 12 * HostTile(1, stage_layout(test::tiny_model(1), 1).total_floats).bytes());
}

namespace {

struct CountingPinner : HostPinningHook {
  std::size_t pinned = 0, unpinned = 0;
  void pin(void*, std::size_t bytes) override { pinned += bytes; }
  void unpin(void*, std::size_t bytes) override { unpinned += bytes; }
};

}  // namespace

TEST_CASE("the pinning hook sees every tile once in and once out", "[host_model]") {
  CountingPinner pinner;
  std::size_t bytes = 0;
  {
    HostModel model(test::tiny_model(3), {}, &pinner);
    bytes = model.host_bytes();
    CHECK(pinner.pinned == bytes);
  }
  CHECK(pinner.unpinned == bytes);
}

TEST_CASE("a host model rejects an invalid model config", "[host_model]") {
  ModelConfig bad = test::tiny_model(2);
  bad.hidden_size = 0;
  CHECK_THROWS_WITH(HostModel(bad), Catch::Contains("hidden_size"));
}

// cluster.shard_state: a rank holds the whole state of the stages it owns and only the masters (and
// the compute copy) of the others, whose moments are refused by name rather than read.
TEST_CASE("a sharded host model holds gradients and moments of its own stages only", "[host_model]") {
  const ModelConfig cfg = test::tiny_model(4);
  const OwnedStages owned = {1, 0, 1, 0, 1, 0};
  HostTileOptions options;
  options.compute_bytes_per_param = 2;
  HostModel model(cfg, options, nullptr, nullptr, owned);
  CHECK(model.sharded());
  std::size_t sum = 0;
  for (std::int64_t s = 0; s < model.num_stages(); ++s) {
    INFO("stage " << s);
    const HostTile& t = model.tile(s);
    const bool own = owned[static_cast<std::size_t>(s)] != 0;
    CHECK(model.owns(s) == own);
    CHECK(t.has_params() == own);  // a bf16 replica holds the compute copy alone
    CHECK(model.holds_masters(s) == own);
    CHECK(t.has_compute_copy());
    CHECK(t.has_grad() == own);
    CHECK(t.has_moments() == own);
    sum += t.bytes();
  }
  CHECK(host_model_bytes(cfg, options, owned) == sum);
  CHECK(model.host_bytes() == sum);
  CHECK(sum < host_model_bytes(cfg, options));
  // A replica's masters set are rounded into its copy; they cannot be read back, its moments not leased.
  model.set_masters(1, [](float* m) { m[0] = 3.0f, m[1] = 1.0f + 1.0f / 512; });
  const auto* copy = static_cast<const bf16_t*>(model.tile(1).compute_copy());
  CHECK(cpu::bf16_to_float(copy[0]) == 3.0f);
  CHECK(cpu::bf16_to_float(copy[1]) == 1.0f);  // round to nearest even
  CHECK_THROWS_WITH(model.read_masters(1, [](const float*) {}), Catch::Contains("held by the rank that owns it"));
  CHECK_THROWS_WITH(StateLease(model, 1), Catch::Contains("held by the rank that owns it"));
  // fp32 compute: a replica holds the masters it streams.
  HostModel fp32(cfg, HostTileOptions{}, nullptr, nullptr, owned);
  CHECK(fp32.tile(1).has_params());
  CHECK(fp32.holds_masters(1));
  fp32.set_masters(1, [](float* m) { m[0] = 3.0f; });
  fp32.read_masters(1, [](const float* m) { CHECK(m[0] == 3.0f); });
  CHECK_NOTHROW(StateLease(model, 2));
  // Split masters: the owner holds the halves, a replica the bf16 copy (their high halves) alone.
  HostTileOptions split = options;
  split.split_master = true;
  HostModel halves(cfg, split, nullptr, nullptr, owned);
  CHECK(halves.tile(0).has_split_master());
  CHECK_FALSE(halves.tile(1).has_split_master());
  CHECK_FALSE(halves.holds_masters(1));
  CHECK(halves.tile(1).has_compute_copy());
  // An ownership of another shape.
  CHECK_THROWS_WITH(HostModel(cfg, options, nullptr, nullptr, OwnedStages{1, 0}), Catch::Contains("6"));
}
