// Memory: a deep model trains with a device budget that fits only 2 weight slots plus gradient
// staging, workspace and the layer-boundary activations; the measured peak arena use stays within the
// budget, for 12, 24 and 48 layers. A budget 64 bytes smaller is rejected before anything starts.
#include <catch2/catch.hpp>

#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::actors::test;

TEST_CASE("deep models train within a two-slot device budget", "[actors][memory]") {
  for (std::int64_t layers : {12, 24, 48}) {
    Tiny t;
    t.layers = layers;
    t.steps = 2;
    t.micro_batches = 2;
    TrainConfig cfg = tiny_config(t);
    cfg.device.grad_slots = 1;
    const ModelConfig model = cfg.model_config_from_keys();
    // The exact need of a 2-slot plan, from the planner at a generous budget.
    const EnginePlan generous = plan_engine(cfg, model);
    const std::size_t need = generous.arena.total_bytes;
    cfg.device.device_memory_mb = 0;
    cfg.device.max_vram_gb = static_cast<double>(need) / (1024.0 * 1024.0 * 1024.0);
    const EnginePlan tight = plan_engine(cfg, model);
    INFO(layers << " layers: " << tight.arena.describe());
    REQUIRE(tight.arena.budget_bytes >= need);
    REQUIRE(tight.arena.budget_bytes < need + 8);  // the budget is the need (rounding of GiB -> bytes)
    REQUIRE(tight.weight_slots == 2);
    // Host memory holds every layer; the device budget is far below the model's size.
    const std::size_t model_bytes = static_cast<std::size_t>(total_param_count(model)) * sizeof(float);
    CHECK(tight.arena.budget_bytes < model_bytes / 2);

    const auto batches = tiny_batches(t, 8);
    EngineRun eng = run_pipeline(cfg, model, batches);
    REQUIRE(eng.result.error.empty());
    CHECK(eng.result.steps_done == 2);
    CHECK(eng.result.arena.peak_bytes <= eng.result.arena.budget_bytes);
    CHECK(eng.result.arena.peak_bytes > 0);
    // Every layer is loaded twice per micro-batch (forward, backward), the embedding and head once:
    // each load is a copy or a hit on a slot still holding that stage (only 2 slots: few hits).
    const std::uint64_t loads_per_mb = static_cast<std::uint64_t>(2 * layers + 2);
    const std::uint64_t copies = eng.result.copy.of(CopyDirection::host_to_device).jobs;
    CHECK(copies + static_cast<std::uint64_t>(eng.result.slot_reuses) == loads_per_mb * 2 * 2);
    CHECK(copies >= loads_per_mb * 2 * 2 / 2);
    RefRun ref = run_reference(cfg, model, batches, t.steps);
    CHECK(equals_reference(*eng.host, *ref.trainer));

    // 64 bytes less does not fit: rejected at planning, naming the budget key.
    TrainConfig small = cfg;
    small.device.max_vram_gb = static_cast<double>(need - 64) / (1024.0 * 1024.0 * 1024.0);
    CHECK_THROWS_WITH(plan_engine(small, model), Catch::Contains("device.max_vram_gb"));
  }
}

TEST_CASE("plan_engine rejects bad device settings, naming the key", "[actors][memory]") {
  Tiny t;
  TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  SECTION("one weight slot") {
    cfg.device.weight_slots = 1;
    CHECK_THROWS_WITH(plan_engine(cfg, model), Catch::Contains("device.weight_slots"));
  }
  SECTION("sequence longer than the model's positions") {
    cfg.data.seq_length = 1000;
    CHECK_THROWS_WITH(plan_engine(cfg, model), Catch::Contains("data.seq_length"));
  }
  SECTION("unsupported boundary offload") {
    cfg.device.keep_intermediates = "boundary_host";
    CHECK_THROWS_WITH(plan_engine(cfg, model), Catch::Contains("device.keep_intermediates"));
  }
  SECTION("keeping every intermediate costs memory") {
    cfg.device.keep_intermediates = "all";
    const EnginePlan keep = plan_engine(cfg, model);
    cfg.device.keep_intermediates = "boundary";
    const EnginePlan recompute = plan_engine(cfg, model);
    CHECK(keep.mode == ActivationMode::keep);
    CHECK(keep.arena.total_bytes > recompute.arena.total_bytes);
  }
  SECTION("tied embeddings need two gradient staging slots") {
    Tiny g;
    g.arch = Arch::gpt2;
    TrainConfig gc = tiny_config(g);
    gc.device.grad_slots = 1;
    const EnginePlan p = plan_engine(gc, gc.model_config_from_keys());
    CHECK(p.grad_slots == 2);
    CHECK(p.notes.size() == 1);
  }
}
