// The NCCL rank transport's host-side logic (device/cuda/rank_transfer.hpp), tested without a GPU: the
// owner's and the senders' steps run against fakes standing in for NCCL (per pair of ranks, the k-th
// receive meets the k-th send, as NCCL matches point-to-point operations) and for device memory. Every
// rank's gradient lands whole in the owner's host buffer for it, each part through a scratch slot inside
// the bounded scratch, slots of one group apart; a stage larger than a chunk is cut; the plan names a
// bad owner or rank count.
#include <catch2/catch.hpp>
#include <cmath>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "device/cuda/rank_transfer.hpp"

using namespace mt::cuda;

namespace {

struct Part {
  int from = 0;
  std::size_t offset = 0, floats = 0;
};

// What each sender issued, in order, per (sender, owner): the parts NCCL would deliver.
struct FakeSends {
  int from = 0;
  std::map<std::pair<int, int>, std::deque<Part>>& wire;
  void send(int to, std::size_t offset, std::size_t floats) { wire[{from, to}].push_back({from, offset, floats}); }
};

// The owner's device scratch and host buffers, and the checks of what its steps do with them.
struct FakeOwner {
  int owner = 0;
  const std::vector<std::vector<float>>& data;  // every rank's gradient
  std::map<std::pair<int, int>, std::deque<Part>>& wire;
  std::vector<float> scratch = {};
  std::vector<std::vector<float>> host = {};
  bool in_group = false;
  std::vector<std::pair<std::size_t, std::size_t>> group_slots = {};  // [begin, end) written in this group
  int groups = 0;
  std::size_t max_scratch_used = 0;

  void group_begin() {
    REQUIRE(!in_group);
    in_group = true;
    group_slots.clear();
    ++groups;
  }
  void recv(int from, std::size_t scratch_offset, std::size_t floats) {
    REQUIRE(in_group);
    REQUIRE(from != owner);
    auto& q = wire[{from, owner}];
    REQUIRE(!q.empty());  // the sender issued this part
    const Part p = q.front();
    q.pop_front();
    REQUIRE(p.floats == floats);  // the k-th send and the k-th receive agree on the size
    REQUIRE(scratch_offset + floats <= scratch.size());
    for (const auto& [b, e] : group_slots) REQUIRE((scratch_offset + floats <= b || scratch_offset >= e));
    group_slots.emplace_back(scratch_offset, scratch_offset + floats);
    max_scratch_used = std::max(max_scratch_used, scratch_offset + floats);
    for (std::size_t i = 0; i < floats; ++i) scratch[scratch_offset + i] = data[from][p.offset + i];
  }
  void group_end() {
    REQUIRE(in_group);
    in_group = false;
  }
  void copy_out(int from, std::size_t host_offset, std::size_t scratch_offset, std::size_t floats) {
    REQUIRE(!in_group);  // after the group's receives landed
    REQUIRE(host_offset + floats <= host[from].size());
    for (std::size_t i = 0; i < floats; ++i) host[from][host_offset + i] = scratch[scratch_offset + i];
  }
};

// One round of `floats` per rank to `owner` through the plan and the fakes; checks the result.
void run_round(std::size_t floats, int ranks, int owner, std::size_t chunk) {
  INFO("floats " << floats << " ranks " << ranks << " owner " << owner << " chunk " << chunk);
  std::vector<std::vector<float>> data(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < floats; ++i) data[r].push_back(static_cast<float>(r * 100000 + i) + 0.25f);
  std::map<std::pair<int, int>, std::deque<Part>> wire;
  for (int r = 0; r < ranks; ++r) {
    if (r == owner) continue;
    const RankTransferPlan p = rank_transfer_plan(floats, ranks, owner, chunk);
    FakeSends s{r, wire};
    run_sender_steps(p, s);
  }
  const RankTransferPlan plan = rank_transfer_plan(floats, ranks, owner, chunk);
  FakeOwner o{owner, data, wire};
  o.scratch.assign(plan.scratch_floats, NAN);
  o.host.assign(static_cast<std::size_t>(ranks), std::vector<float>(floats, NAN));
  run_owner_steps(plan, o);
  CHECK(o.groups == static_cast<int>((floats + chunk - 1) / chunk));
  CHECK(o.max_scratch_used <= plan.scratch_floats);
  CHECK(plan.scratch_floats == std::min(floats, chunk) * static_cast<std::size_t>(ranks - 1));
  for (const auto& [pair, q] : wire) CHECK(q.empty());  // every part sent was received
  for (int r = 0; r < ranks; ++r)
    if (r != owner) CHECK(o.host[r] == data[r]);  // whole, in place
}

}  // namespace

TEST_CASE("rank transfer: every rank's gradient reaches the owner's host buffer whole, through bounded scratch",
          "[cuda][rank_transfer]") {
  for (int ranks : {2, 3, 5})
    for (int owner = 0; owner < ranks; ++owner)
      for (std::size_t floats : {std::size_t{0}, std::size_t{1}, std::size_t{6}, std::size_t{7}, std::size_t{23}})
        for (std::size_t chunk : {std::size_t{1}, std::size_t{7}, std::size_t{100}})
          run_round(floats, ranks, owner, chunk);
}

TEST_CASE("rank transfer: the peers in rank order, each part of a chunk in its own contiguous slot",
          "[cuda][rank_transfer]") {
  const RankTransferPlan p = rank_transfer_plan(10, 4, 2, 4);
  CHECK(p.peers == std::vector<int>{0, 1, 3});
  REQUIRE(p.chunks.size() == 3);
  CHECK(p.chunks[2].offset == 8);
  CHECK(p.chunks[2].floats == 2);
  CHECK(p.slot_offset(0, p.chunks[0]) == 0);
  CHECK(p.slot_offset(2, p.chunks[0]) == 8);
  CHECK(p.slot_offset(2, p.chunks[2]) == 4);  // a short last chunk's slots are packed
  CHECK(p.scratch_floats == 12);
}

TEST_CASE("rank transfer: a stage far larger than a chunk is cut, the owner's scratch within the cap",
          "[cuda][rank_transfer]") {
  for (int ranks : {2, 3, 5, 9, 64}) {
    INFO("ranks " << ranks);
    const std::size_t chunk = reduce_chunk_floats(ranks);
    const std::size_t stage = (std::size_t{3} << 30) / sizeof(float) + 17;  // a 3 GiB stage
    const RankTransferPlan p = rank_transfer_plan(stage, ranks, ranks - 1, chunk);
    CHECK(p.chunks.size() == (stage + chunk - 1) / chunk);
    CHECK(p.chunks.size() > 1);
    CHECK(p.scratch_floats * sizeof(float) <= kReduceScratchCapBytes);
    // What the arena's fit check reserves on every rank's GPU covers the largest scratch, and NCCL's own.
    CHECK(rank_transport_reserve_bytes(ranks) == p.scratch_floats * sizeof(float) + kNcclAllowanceBytes);
  }
  CHECK(rank_transport_reserve_bytes(1) == 0);
}

TEST_CASE("rank transfer: the plan names a bad owner or too few ranks", "[cuda][rank_transfer]") {
  CHECK_THROWS_WITH(rank_transfer_plan(10, 1, 0, 4), Catch::Contains("at least 2 ranks"));
  CHECK_THROWS_WITH(rank_transfer_plan(10, 3, 3, 4), Catch::Contains("owner 3 is not one of 3 ranks"));
  CHECK_THROWS_WITH(rank_transfer_plan(10, 3, -1, 4), Catch::Contains("owner -1"));
  CHECK_THROWS_WITH(rank_transfer_plan(10, 3, 0, 0), Catch::Contains("chunk_floats"));
}
