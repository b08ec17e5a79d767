// A staged store of one rank's own stages (cluster.shard_state: stage s on rank s mod N): it holds
// those stages and no other (no slot, file or encoding), names its files by stage in a directory named
// with the rank, counts only them (footprint equals its accounting; the ranks' files add up to one
// unsharded store's), reads ahead exactly in the order the optimizer visits them (backward without
// clipping, forward with it, wrapping into the next step), and a reader beside the optimizer (the
// checkpointer) neither moves the read-ahead nor evicts what it holds. A HostModel takes such a store
// only for the stages it owns.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <set>

#include "kernels/param_layout.hpp"
#include "storage/host/host_model.hpp"
#include "storage/offload/staged_moment_store.hpp"
#include "tests/storage/host/tiny_model.hpp"
#include "tests/storage/offload/offload_test_util.hpp"

using namespace mt;
using namespace mt::offload;
namespace fs = std::filesystem;

namespace {

// Stage s of a job of `ranks` ranks belongs to rank s mod ranks (cluster::stage_owner).
std::vector<std::int64_t> own_stages(std::size_t stages, int ranks, int rank, bool backward) {
  std::vector<std::int64_t> order;
  for (std::size_t k = 0; k < stages; ++k) {
    const auto s = static_cast<std::int64_t>(backward ? stages - 1 - k : k);
    if (s % ranks == rank) order.push_back(s);
  }
  return order;
}

std::vector<std::int64_t> sorted(std::vector<std::int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::set<std::string> file_names(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

}  // namespace

TEST_CASE("a rank's store holds its own stages only in files of its own and counts them alone", "[offload][sharded]") {
  test::OffloadTempDir tmp;
  const std::vector<std::size_t> floats = {4096, 9000, 9000, 9000, 9000, 9000, 9000, 9000, 3000};
  std::size_t files_of_ranks = 0;
  for (const MomentCodec codec : {MomentCodec::none, MomentCodec::lossless})
    for (int rank = 0; rank < 3; ++rank) {
      StagedMomentStoreOptions o;
      o.codec = codec;
      o.dir = tmp.path();
      o.staging_stages = 3;
      o.rank = rank;
      o.visit_order = own_stages(floats.size(), 3, rank, true);
      StagedMomentStore store(floats, o);
      INFO(store.describe());
      CHECK_THAT(store.describe(), Catch::Contains("this rank's 3 of the model's 9 stages"));
      CHECK_THAT(fs::path(store.files_dir()).filename().string(),
                 Catch::StartsWith("megatrain-moments-rank" + std::to_string(rank) + "-"));
      std::set<std::string> expected;
      for (std::int64_t s = 0; s < 9; ++s) {
        CHECK(store.holds(s) == (s % 3 == rank));
        if (s % 3 == rank) {
          expected.insert("stage-0000" + std::to_string(s) + ".moments");
          continue;
        }
        CHECK_THROWS_WITH(MomentLease(store, s), Catch::Contains("not held here"));
        CHECK_NOTHROW(store.reset(s));  // a stage another rank owns: nothing to zero here
      }
      CHECK(file_names(store.files_dir()) == expected);
      // Two steps of updates in the optimizer's order: the leases show what was written, bit for bit.
      for (int step = 0; step < 2; ++step)
        for (std::int64_t s : o.visit_order) {
          MomentLease l(store, s);
          const std::size_t n = floats[static_cast<std::size_t>(s)];
          for (std::size_t i = 0; i < n; ++i) {
            const float before = step == 0 ? 0.0f : static_cast<float>(s * 1000 + static_cast<std::int64_t>(i));
            REQUIRE(l.m()[i] == before);
            l.m()[i] = static_cast<float>(s * 1000 + static_cast<std::int64_t>(i));
            l.v()[i] = static_cast<float>(i) * 1e-3f;
          }
          l.mark_modified();
        }
      store.flush();
      const auto fp = StagedMomentStore::footprint(floats, o);
      CHECK(fp.ram == store.ram_bytes());
      CHECK(fp.disk == store.disk_bytes());
      if (codec == MomentCodec::none) files_of_ranks += store.disk_bytes();
    }
  // The ranks' files together are one unsharded store's; the slots of each rank are its own.
  StagedMomentStoreOptions whole;
  whole.dir = tmp.path();
  whole.staging_stages = 3;
  CHECK(StagedMomentStore::footprint(floats, whole).disk == files_of_ranks);
  CHECK(fs::is_empty(tmp.path()));  // each store removed its own directory
}

TEST_CASE("the read-ahead follows the rank's own stages in the optimizer's order and a reader beside it moves nothing",
          "[offload][sharded]") {
  // 18 stages on 3 ranks: rank 1 owns 1, 4, ..., 16. Without clipping its optimizer visits them
  // backward, 16 13 10 7 4 1, every step. 4 slots: 2 stages read ahead. Every release is flushed so
  // each slot is free when the next acquire picks one: what is staged is then exact.
  const std::vector<std::size_t> floats(18, 2048);
  StagedMomentStoreOptions o;
  o.staging_stages = 4;
  o.visit_order = own_stages(floats.size(), 3, 1, true);
  REQUIRE(o.visit_order == std::vector<std::int64_t>{16, 13, 10, 7, 4, 1});
  StagedMomentStore store(floats, o);
  auto update = [&](std::int64_t s) {
    MomentLease l(store, s);
    l.m()[0] += 1.0f;
    l.mark_modified();
    return sorted(store.staged_stages());
  };
  // What the slots hold right after the optimizer acquired each stage (the lease ends afterwards).
  auto acquire = [&](std::int64_t s) {
    store.acquire(s).m[0] += 1.0f;
    const auto staged = sorted(store.staged_stages());
    store.release(s, true);
    store.flush();
    return staged;
  };
  CHECK(acquire(16) == std::vector<std::int64_t>{10, 13, 16});
  CHECK(acquire(13) == std::vector<std::int64_t>{7, 10, 13, 16});
  CHECK(acquire(10) == std::vector<std::int64_t>{4, 7, 10, 13});  // 16, the least recent, gave way to 4
  // The checkpointer reads stage 16 beside the optimizer: one load into a slot outside the window
  // (13's), and no read-ahead from there (it would load 13 and 10 again).
  const auto loads = store.stats().loads;
  {
    MomentLease read(store, 16, MomentLease::Use::read);
    CHECK(read.m()[0] == 1.0f);
    CHECK(sorted(store.staged_stages()) == std::vector<std::int64_t>{4, 7, 10, 16});
  }
  CHECK(store.stats().loads == loads + 1);
  CHECK(acquire(7) == std::vector<std::int64_t>{1, 4, 7, 16});   // 4 read ahead still there; 1 next
  CHECK(acquire(4) == std::vector<std::int64_t>{1, 4, 7, 16});   // 1 and, wrapping, 16 are staged
  CHECK(acquire(1) == std::vector<std::int64_t>{1, 4, 13, 16});  // the next step's first two: 16, 13
  CHECK(update(16) == std::vector<std::int64_t>{1, 10, 13, 16});
  store.flush();

  // With clipping the optimizer visits its stages forward: the read-ahead follows.
  StagedMomentStoreOptions f = o;
  f.visit_order = own_stages(floats.size(), 3, 1, false);
  StagedMomentStore forward(floats, f);
  { MomentLease l(forward, 1); }
  CHECK(sorted(forward.staged_stages()) == std::vector<std::int64_t>{1, 4, 7});
  { MomentLease l(forward, 16); }  // the last stage of a step: the next step's first two follow
  CHECK(sorted(forward.staged_stages()) == std::vector<std::int64_t>{1, 4, 7, 16});
}

TEST_CASE("a sharded host model takes a store of exactly the stages it owns", "[offload][sharded]") {
  const ModelConfig cfg = test::tiny_model(4);  // 6 stages
  const OwnedStages owned = {0, 1, 0, 1, 0, 1};
  std::vector<std::size_t> floats;
  for (std::int64_t s = 0; s < num_stages(cfg); ++s) floats.push_back(stage_layout(cfg, s).total_floats);
  HostTileOptions tiles;
  tiles.compute_bytes_per_param = 2;  // bf16
  tiles.moments_in_tile = false;
  tiles.params_in_tile = false;  // train.offload_params: the masters with the moments
  StagedMomentStoreOptions o;
  o.codec = MomentCodec::lossless;
  o.with_masters = true;
  o.visit_order = {5, 3, 1};
  HostModel host(cfg, tiles, nullptr, std::make_unique<StagedMomentStore>(floats, o), owned);
  for (std::int64_t s = 0; s < host.num_stages(); ++s) {
    INFO("stage " << s);
    host.set_masters(s, [&](float* m) {
      for (std::size_t i = 0; i < host.tile(s).floats(); ++i) m[i] = static_cast<float>(s) + 0.25f;
    });
    CHECK(host.holds_masters(s) == (s % 2 == 1));  // a replica holds the bf16 copy alone
    CHECK_FALSE(host.tile(s).has_params());
  }
  host.read_masters(3, [](const float* m) { CHECK(m[0] == 3.25f); });
  CHECK_THROWS_WITH(StateLease(host, 2), Catch::Contains("not held here"));
  // A store of every stage, or of another rank's, does not fit this rank's ownership.
  StagedMomentStoreOptions every = o;
  every.visit_order.clear();
  CHECK_THROWS_WITH(HostModel(cfg, tiles, nullptr, std::make_unique<StagedMomentStore>(floats, every), owned),
                    Catch::Contains("holds stage 0, which another rank owns"));
  StagedMomentStoreOptions other = o;
  other.visit_order = {5, 3};
  CHECK_THROWS_WITH(HostModel(cfg, tiles, nullptr, std::make_unique<StagedMomentStore>(floats, other), owned),
                    Catch::Contains("lacks stage 1, which this rank owns"));
}
