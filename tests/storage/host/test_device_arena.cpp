#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "device/device_arena.hpp"
#include "kernels/param_layout.hpp"
#include "tiny_model.hpp"

using namespace mt;

namespace {

ArenaRequest request(std::size_t budget, int slots = 2) {
  ArenaRequest r;
  r.budget_bytes = budget;
  r.budget_name = "device.max_vram_gb=" + std::to_string(static_cast<double>(budget) / (1 << 30));
  r.weight_slots = slots;
  r.workspace_bytes = 100000;
  r.activation_bytes = 50000;
  return r;
}

}  // namespace

TEST_CASE("an arena plan lays regions out aligned, disjoint and within the budget", "[arena]") {
  const ModelConfig cfg = test::tiny_model(4);
  std::int64_t stage = -1;
  const std::size_t floats = largest_stage_floats(cfg, &stage);
  CHECK(floats == stage_layout(cfg, stage).total_floats);
  const ArenaPlan plan = plan_arena(cfg, request(64u << 20, 3));
  CHECK(plan.weight_slots == 3);
  CHECK(plan.grad_slots == 1);
  CHECK(plan.weight_slot_bytes >= floats * 4);
  CHECK(plan.regions.size() == 3 + 1 + 2);
  std::size_t end = 0;
  for (const auto& r : plan.regions) {
    CHECK(r.offset % kArenaAlignBytes == 0);
    CHECK(r.offset >= end);  // in order, no overlap
    end = r.offset + r.bytes;
  }
  CHECK(end <= plan.total_bytes);
  CHECK(plan.total_bytes <= plan.budget_bytes);
  CHECK(plan.total_bytes == arena_bytes_needed(cfg, request(0, 3)));
  CHECK(plan.region(ArenaRegionKind::workspace).bytes == 100000);
  CHECK(plan.region(ArenaRegionKind::weight_slot, 2).name() == "weight_slot[2]");
  CHECK_THROWS_AS(plan.region(ArenaRegionKind::weight_slot, 3), std::out_of_range);
  CHECK_THAT(plan.describe(), Catch::Contains("weight_slot[0]") && Catch::Contains("workspace"));
}

TEST_CASE("a budget that does not fit is rejected with the key and the need spelled out", "[arena]") {
  const ModelConfig cfg = test::tiny_model(4);
  const std::size_t need = arena_bytes_needed(cfg, request(0));
  CHECK_NOTHROW(plan_arena(cfg, request(need)));
  ArenaRequest r = request(need - 1);
  r.budget_name = "device.max_vram_gb=0.0009765625";
  try {
    plan_arena(cfg, r);
    FAIL("plan_arena accepted a budget one byte short");
  } catch (const ArenaBudgetError& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::StartsWith("device.max_vram_gb=0.0009765625 is too small"));
    CHECK_THAT(m, Catch::Contains("2 weight slots x") && Catch::Contains("1 gradient slot x") &&
                      Catch::Contains("workspace") && Catch::Contains("activations") &&
                      Catch::Contains(std::to_string(need) + " bytes"));
  }
}

TEST_CASE("fewer than two weight slots or no gradient slot is an error", "[arena]") {
  const ModelConfig cfg = test::tiny_model(2);
  CHECK_THROWS_WITH(plan_arena(cfg, request(1u << 30, 1)), Catch::Contains("at least 2 weight slots"));
  ArenaRequest r = request(1u << 30);
  r.grad_slots = 0;
  CHECK_THROWS_WITH(plan_arena(cfg, r), Catch::Contains("gradient staging slot"));
}

TEST_CASE("the arena's plan does not depend on depth", "[arena]") {
  const auto p12 = plan_arena(test::tiny_model(12), request(64u << 20));
  const auto p24 = plan_arena(test::tiny_model(24), request(64u << 20));
  const auto p48 = plan_arena(test::tiny_model(48), request(64u << 20));
  CHECK(p12.total_bytes == p24.total_bytes);
  CHECK(p24.total_bytes == p48.total_bytes);
}

TEST_CASE("bf16 slots halve the weight slot size", "[arena]") {
  const ModelConfig cfg = test::tiny_model(2);
  ArenaRequest r = request(64u << 20);
  const auto fp32 = plan_arena(cfg, r);
  r.weight_bytes_per_param = 2;
  const auto bf16 = plan_arena(cfg, r);
  CHECK(bf16.weight_slot_bytes * 2 >= fp32.weight_slot_bytes);
  CHECK(bf16.weight_slot_bytes < fp32.weight_slot_bytes);
}

TEST_CASE("boundary activation bytes count hidden states of batch x seq x hidden", "[arena]") {
  CHECK(boundary_activation_bytes(test::tiny_model(2), 4, 64, 3) == 3u * 4 * 64 * 128 * 4);
  CHECK_THROWS(boundary_activation_bytes(test::tiny_model(2), 0, 64, 1));
}

TEST_CASE("claims track bytes in use and their peak, never past a region", "[arena]") {
  DeviceArena arena(plan_arena(test::tiny_model(2), request(64u << 20)));
  CHECK(arena.usage().capacity_bytes == arena.plan().total_bytes);
  CHECK(arena.usage().in_use_bytes == 0);
  arena.claim(ArenaRegionKind::workspace, 0, 1000);
  arena.claim(ArenaRegionKind::grad_slot, 0, 500);
  CHECK(arena.usage().in_use_bytes == 1500);
  arena.claim(ArenaRegionKind::workspace, 0, 200);  // replaces the earlier claim
  CHECK(arena.usage().in_use_bytes == 700);
  CHECK(arena.peak_bytes() == 1500);
  arena.release(ArenaRegionKind::grad_slot, 0);
  CHECK(arena.usage().in_use_bytes == 200);
  arena.reset_peak();
  CHECK(arena.peak_bytes() == 200);
  CHECK_THROWS_WITH(arena.claim(ArenaRegionKind::workspace, 0, 100001), Catch::Contains("exceeds workspace"));
  CHECK_THROWS_AS(arena.claim(ArenaRegionKind::grad_slot, 1, 1), std::out_of_range);
  // Region pointers lie inside the one allocation, at the planned offsets.
  CHECK(reinterpret_cast<std::byte*>(arena.grad_slot(0)) ==
        arena.base() + arena.plan().region(ArenaRegionKind::grad_slot).offset);
}

TEST_CASE("weight slots go free -> filling -> ready -> free", "[arena][slots]") {
  DeviceArena arena(plan_arena(test::tiny_model(2), request(64u << 20, 2)));
  CHECK(arena.free_slot_count() == 2);
  const auto a = arena.begin_fill(1, 7, 4096);
  REQUIRE(a);
  CHECK(*a == 0);
  CHECK(arena.slot_state(0).phase == SlotPhase::filling);
  CHECK(arena.usage().in_use_bytes == 4096);
  CHECK_FALSE(arena.find_ready(1));
  arena.mark_ready(0);
  CHECK(arena.find_ready(1, 7) == 0);
  CHECK_FALSE(arena.find_ready(1, 8));
  CHECK_FALSE(arena.find_ready(2));
  arena.begin_fill_slot(1, 2, 0, 8192);
  CHECK_FALSE(arena.begin_fill(3, 0, 1));  // both busy
  CHECK_THROWS_AS(arena.begin_fill_slot(1, 3, 0, 1), std::logic_error);
  CHECK_THROWS_AS(arena.mark_ready(0), std::logic_error);  // already ready
  CHECK(arena.peak_bytes() == 4096 + 8192);
  arena.release_slot(0);
  CHECK(arena.slot_state(0).phase == SlotPhase::free);
  CHECK(arena.usage().in_use_bytes == 8192);
  CHECK(arena.free_slot_count() == 1);
  CHECK_THROWS_AS(arena.begin_fill(4, 0, arena.plan().weight_slot_bytes + 1), std::length_error);
  CHECK(arena.free_slot_count() == 1);  // a failed fill leaves the slot free
}

TEST_CASE("a mapped weight slot reads the host tile and accounts its bytes like a copy", "[arena][slots]") {
  DeviceArena arena(plan_arena(test::tiny_model(2), request(64u << 20, 2)));
  std::vector<float> tile(1024, 1.5f);
  CHECK(arena.weights(1) == arena.weight_slot(1));  // unmapped: the slot's own memory
  arena.map_slot(1, 3, 5, 4096, tile.data());
  CHECK(arena.slot_state(1).phase == SlotPhase::ready);
  CHECK(arena.find_ready(3, 5) == 1);
  CHECK(arena.weights(1) == tile.data());
  CHECK(arena.usage().in_use_bytes == 4096);
  CHECK_THROWS_AS(arena.map_slot(1, 4, 5, 16, tile.data()), std::logic_error);  // not free
  arena.release_slot(1);
  CHECK(arena.weights(1) == arena.weight_slot(1));  // the mapping ends with the slot
  CHECK(arena.usage().in_use_bytes == 0);
  arena.begin_fill_slot(1, 3, 6, 4096);  // a copy into the same slot reads the slot again
  arena.mark_ready(1);
  CHECK(arena.weights(1) == arena.weight_slot(1));
}
