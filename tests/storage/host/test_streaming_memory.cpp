// The memory acceptance criterion at the storage level: streaming every stage of a model through a
// device arena that fits only 2 weight slots (plus gradient staging, workspace and activations), the
// measured peak stays within the budget and is the same for 12, 24 and 48 layers, while host memory
// grows linearly. The schedule is the engine's: forward 0..L+1, backward L+1..0, prefetching one stage
// ahead through the copy engine, gradients copied back to the host tiles.
#include <catch2/catch.hpp>

#include <future>
#include <vector>

#include "device/cpu/copy_engine.hpp"
#include "device/device_arena.hpp"
#include "storage/host/host_model.hpp"
#include "tiny_model.hpp"

using namespace mt;

namespace {

constexpr std::size_t kWorkspace = 64 * 1024, kActivations = 32 * 1024;

ArenaRequest two_slot_request(const ModelConfig& cfg) {
  ArenaRequest r;
  r.weight_slots = 2;
  r.workspace_bytes = kWorkspace;
  r.activation_bytes = kActivations;
  r.budget_bytes = arena_bytes_needed(cfg, r);  // exactly 2 slots + the rest, not a byte more
  r.budget_name = "test budget";
  return r;
}

float stage_value(std::int64_t stage) { return 1.0f + static_cast<float>(stage); }

struct StreamResult {
  bool weights_ok = true;  // every slot held its stage's params when "computed"
  std::size_t peak = 0;
};

// Starts copying `stage`'s params into a free slot; the future resolves to the slot once ready.
std::future<int> prefetch(HostModel& model, DeviceArena& arena, CopyEngine& engine, std::int64_t stage) {
  HostTile& tile = model.tile(stage);
  const auto slot = arena.begin_fill(stage, tile.version(), tile.stream_bytes());
  REQUIRE(slot);
  auto ready = std::make_shared<std::promise<int>>();
  auto future = ready->get_future();
  const int s = *slot;
  engine.submit({CopyDirection::host_to_device, tile.stream_source(), arena.weight_slot(s), tile.stream_bytes(),
                 [&arena, ready, s] {
                   arena.mark_ready(s);
                   ready->set_value(s);
                 }});
  return future;
}

// Checks the slot, claims workspace and activations as a layer's compute would, and in backward
// stages the gradient through the staging slot back into the tile's accumulator.
void compute_stage(HostModel& model, DeviceArena& arena, CopyEngine& engine, std::int64_t stage, int slot,
                   bool backward, StreamResult& result) {
  const HostTile& tile = model.tile(stage);
  const float* weights = arena.weight_slot(slot);
  const WeightSlotState state = arena.slot_state(slot);
  result.weights_ok = result.weights_ok && state.phase == SlotPhase::ready && state.stage == stage &&
                      weights[0] == stage_value(stage) && weights[tile.floats() - 1] == stage_value(stage);
  arena.claim(ArenaRegionKind::workspace, 0, kWorkspace);
  arena.claim(ArenaRegionKind::activations, 0, kActivations);
  if (backward) {
    float* staging = arena.grad_slot(0);
    arena.claim(ArenaRegionKind::grad_slot, 0, tile.region_bytes());
    for (std::size_t i = 0; i < tile.floats(); ++i) staging[i] = -stage_value(stage);
    engine
        .submit_with_future({CopyDirection::device_to_host, staging, model.tile(stage).grad(), tile.region_bytes(), {}})
        .get();
    arena.release(ArenaRegionKind::grad_slot, 0);
  }
  arena.release(ArenaRegionKind::workspace, 0);
}

StreamResult stream_one_step(HostModel& model, DeviceArena& arena, CopyEngine& engine) {
  StreamResult result;
  std::vector<std::int64_t> order;
  for (std::int64_t s = 0; s < model.num_stages(); ++s) order.push_back(s);
  for (std::int64_t s = model.num_stages() - 1; s >= 0; --s) order.push_back(s);
  const std::size_t forward_end = static_cast<std::size_t>(model.num_stages());
  std::future<int> next = prefetch(model, arena, engine, order[0]);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int slot = next.get();
    if (i + 1 < order.size()) next = prefetch(model, arena, engine, order[i + 1]);  // overlaps this compute
    compute_stage(model, arena, engine, order[i], slot, i >= forward_end, result);
    arena.release_slot(slot);
  }
  arena.release(ArenaRegionKind::activations, 0);
  result.peak = arena.peak_bytes();
  return result;
}

}  // namespace

TEST_CASE("streaming a model through 2 slots: peak within budget and flat in depth", "[arena][streaming]") {
  std::vector<std::size_t> peaks, budgets, host_bytes;
  for (std::int64_t layers : {12, 24, 48}) {
    const ModelConfig cfg = test::tiny_model(layers);
    const ArenaRequest request = two_slot_request(cfg);
    ArenaRequest three = request;
    three.weight_slots = 3;
    CHECK_THROWS_AS(plan_arena(cfg, three), ArenaBudgetError);  // the budget fits only 2 slots

    HostModel model(cfg);
    for (std::int64_t s = 0; s < model.num_stages(); ++s) {
      HostTile& tile = model.tile(s);
      for (std::size_t i = 0; i < tile.floats(); ++i) tile.params()[i] = stage_value(s);
    }
    DeviceArena arena(plan_arena(cfg, request));
    CopyEngine engine(CopyEngineOptions{2, 0.0, 256 * 1024});
    const StreamResult result = stream_one_step(model, arena, engine);
    CHECK(result.weights_ok);
    for (std::int64_t s = 0; s < model.num_stages(); ++s)
      REQUIRE(model.tile(s).grad()[model.tile(s).floats() - 1] == -stage_value(s));
    CHECK(result.peak <= request.budget_bytes);
    CHECK(arena.usage().in_use_bytes == 0);
    const auto copied = engine.stats();
    CHECK(copied.of(CopyDirection::host_to_device).jobs == 2 * static_cast<std::uint64_t>(model.num_stages()));
    CHECK(copied.of(CopyDirection::device_to_host).bytes == model.host_bytes() / 4);  // one grad region per tile
    peaks.push_back(result.peak);
    budgets.push_back(request.budget_bytes);
    host_bytes.push_back(model.host_bytes());
  }
  CHECK(peaks[0] == peaks[1]);
  CHECK(peaks[1] == peaks[2]);
  CHECK(budgets[0] == budgets[2]);
  CHECK(host_bytes[2] - host_bytes[1] == 2 * (host_bytes[1] - host_bytes[0]));
}
