// Memory: a deep model trains with a device budget that fits only 2 weight slots plus gradient
// staging, workspace and a fixed few boundary buffers (layer boundaries offloaded to the host); the
// measured peak arena use stays within the budget and is the same for 12, 24 and 48 layers, while host
// memory grows linearly. A budget 64 bytes smaller is rejected before anything starts.
#include <algorithm>

#include <catch2/catch.hpp>

#include "plan/tier_bytes.hpp"
#include "storage/host/host_boundaries.hpp"
#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;

TEST_CASE("deep models train within a two-slot device budget", "[actors][memory]") {
  std::vector<std::size_t> peaks, budgets, host_bytes;
  for (std::int64_t layers : {12, 24, 48}) {
    Tiny t;
    t.layers = layers;
    t.steps = 2;
    t.micro_batches = 2;
    t.keep = "boundary_host";
    t.bandwidth_gbps = 1000;  // a modelled link: every load is a copy (counted below), as on a GPU
    TrainConfig cfg = tiny_config(t);
    cfg.device.grad_slots = 1;
    const ModelConfig model = cfg.model_config_from_keys();
    // The exact need of a 2-slot plan, from the planner at a generous budget.
    const EnginePlan generous = plan_engine(cfg, model);
    const std::size_t need = generous.arena.total_bytes;
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
    peaks.push_back(eng.result.arena.peak_bytes);
    budgets.push_back(tight.arena.budget_bytes);
    // The plan's host boundary bytes are what the store allocates: 2 in-flight sets x L boundaries.
    CHECK(tight.host_boundary_bytes == HostBoundaries(2, layers, tight.hidden_floats).bytes());
    host_bytes.push_back(eng.host->host_bytes() + tight.host_boundary_bytes);
    // Every layer is loaded twice per micro-batch (forward, backward), the embedding and head once:
    // each load is a copy or a hit on a slot still holding that stage (only 2 slots: few hits). Each
    // layer's backward also streams its input boundary back from the host, which the forward copied
    // out (boundaries 0..L-1).
    const std::uint64_t loads_per_mb = static_cast<std::uint64_t>(2 * layers + 2);
    const std::uint64_t copies = eng.result.link.of(LinkDirection::host_to_device).copies;
    const std::uint64_t boundary_loads = static_cast<std::uint64_t>(layers) * 2 * 2;
    CHECK(copies + static_cast<std::uint64_t>(eng.result.slot_reuses) == loads_per_mb * 2 * 2 + boundary_loads);
    CHECK(copies >= loads_per_mb * 2 * 2 / 2 + boundary_loads);
    const std::uint64_t grads_and_boundaries_out = eng.result.link.of(LinkDirection::device_to_host).copies;
    CHECK(grads_and_boundaries_out == static_cast<std::uint64_t>(layers + 2) * 2 * 2 + boundary_loads);
    RefRun ref = run_reference(cfg, model, batches, t.steps);
    CHECK(equals_reference(*eng.host, *ref.trainer));

    // 64 bytes less does not fit: rejected at planning, naming the budget key.
    TrainConfig small = cfg;
    small.device.max_vram_gb = static_cast<double>(need - 64) / (1024.0 * 1024.0 * 1024.0);
    CHECK_THROWS_WITH(plan_engine(small, model), Catch::Contains("device.max_vram_gb"));
  }
  // Device memory does not grow with depth: the same budget and the same measured peak.
  CHECK(budgets[0] == budgets[1]);
  CHECK(budgets[1] == budgets[2]);
  CHECK(peaks[0] == peaks[1]);
  CHECK(peaks[1] == peaks[2]);
  // Host memory grows linearly: 12 -> 24 layers adds half of what 24 -> 48 adds.
  CHECK(host_bytes[2] - host_bytes[1] == 2 * (host_bytes[1] - host_bytes[0]));
}

// Layer-major: a layer's backward over every micro-batch loads its weights once; the later micro-batches
// share the slot (or find it resident), so a step copies each layer at most M + 1 times (without the
// sharing: up to 2M, as in the other orders).
TEST_CASE("the layer-major order streams each layer once per backward", "[actors][memory]") {
  Tiny t;
  t.layers = 4;
  t.micro_batches = 3;
  t.steps = 2;
  t.weight_slots = 3;
  t.bandwidth_gbps = 1000.0;  // a link: every load is a copy or a reuse
  t.gradient_buffer = "model";
  for (int major = 0; major < 2; ++major) {
    t.schedule = major ? "layer_major" : "interleaved";
    INFO(t.schedule);
    const TrainConfig cfg = tiny_config(t);
    const ModelConfig model = cfg.model_config_from_keys();
    const auto batches = tiny_batches(t, 8);
    EngineRun eng = run_pipeline(cfg, model, batches);
    REQUIRE(eng.result.error.empty());
    const std::uint64_t M = 3, L = 4, steps = 2;
    const std::uint64_t copies = eng.result.link.of(LinkDirection::host_to_device).copies;
    CHECK(copies + static_cast<std::uint64_t>(eng.result.slot_reuses) == steps * M * (2 * L + 2));
    if (major) CHECK(copies <= steps * (M * (L + 2) + L));  // forwards and heads, then one load per layer
    RefRun ref = run_reference(cfg, model, batches, t.steps);
    CHECK(equals_reference(*eng.host, *ref.trainer));
  }
}

TEST_CASE("boundaries kept on the device grow with depth, offloaded they do not", "[actors][memory]") {
  Tiny t;
  t.micro_batches = 2;
  std::vector<std::size_t> device_kept, offloaded;
  for (std::int64_t layers : {12, 24}) {
    t.layers = layers;
    TrainConfig cfg = tiny_config(t);
    const ModelConfig model = cfg.model_config_from_keys();
    device_kept.push_back(plan_engine(cfg, model).arena.total_bytes);
    cfg.device.keep_intermediates = "boundary_host";
    const EnginePlan host = plan_engine(cfg, model);
    offloaded.push_back(host.arena.total_bytes);
    // Two in-flight micro-batches (interleaved order) x L boundaries on the host.
    CHECK(host.host_boundary_bytes == HostBoundaries(2, layers, host.hidden_floats).bytes());
  }
  CHECK(device_kept[1] > device_kept[0]);
  CHECK(offloaded[1] == offloaded[0]);
  CHECK(offloaded[0] < device_kept[0]);
}

namespace {

// 8 layers (deep enough that offloading the boundaries saves device memory), 2 micro-batches: its config
// and model, and its plan with keep_intermediates set to `keep`.
struct DeepModel {
  Tiny t;
  TrainConfig cfg;
  ModelConfig model;
  DeepModel() {
    t.layers = 8;
    t.micro_batches = 2;
    cfg = tiny_config(t);
    model = cfg.model_config_from_keys();
  }
  EnginePlan plan(const char* keep) const {
    TrainConfig c = cfg;
    c.device.keep_intermediates = keep;
    return plan_engine(c, model);
  }
};

}  // namespace

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
  SECTION("an offload directory that cannot be made is an error naming train.offload_dir") {
    cfg.train.offload_dir = "/proc/megatrain-no-such-dir";
    CHECK_THROWS_WITH(moment_store_for(cfg, model), Catch::Contains("train.offload_dir"));
    cfg.train.offload_dir = "";
    cfg.train.optimizer_compression = "int8";
    CHECK(moment_store_for(cfg, model) != nullptr);  // compressed in RAM
    cfg.train.optimizer_compression = "none";
    CHECK(moment_store_for(cfg, model) == nullptr);  // in the tiles
  }
  SECTION("auto keeps as much as fits the budget") {
    const DeepModel deep;
    cfg = deep.cfg;
    const ModelConfig& deep_model = deep.model;
    auto need = [&](const char* keep) { return deep.plan(keep).arena.total_bytes; };
    const std::size_t all = need("all"), boundary = need("boundary"), host = need("boundary_host");
    const std::size_t mapped = need("boundary_mapped");
    REQUIRE(all > boundary);
    REQUIRE(boundary > host);
    REQUIRE(host > mapped);
    cfg.device.keep_intermediates = "auto";
    cfg.plan.host_ram_gb = 1.0 / (1024 * 1024);  // 1 KiB: no room for all_mapped (its own section below)
    auto plan_at = [&](std::size_t budget) {
      cfg.device.max_vram_gb = static_cast<double>(budget) / (1024.0 * 1024.0 * 1024.0);
      return plan_engine(cfg, deep_model);
    };
    EnginePlan p = plan_at(all);
    CHECK(p.mode == ActivationMode::keep);
    CHECK_FALSE(p.boundaries == BoundaryPlacement::host_ring);
    p = plan_at(all - 1024);
    CHECK(p.mode == ActivationMode::recompute);
    CHECK_FALSE(p.boundaries == BoundaryPlacement::host_ring);
    // The budget left over keeps the last layers' intermediates: here all but one layer's.
    CHECK(p.kept_layers == deep.t.layers - 1);
    CHECK(p.arena.total_bytes <= all - 1024);
    CHECK(p.arena.total_bytes > boundary);
    p = plan_at(boundary);  // no room left: every layer recomputed
    CHECK(p.mode == ActivationMode::recompute);
    CHECK(p.kept_layers == 0);
    CHECK(p.arena.total_bytes == boundary);
    p = plan_at(boundary - 1024);
    CHECK(p.boundaries == BoundaryPlacement::host_ring);
    CHECK(p.arena.total_bytes == host);
    REQUIRE_FALSE(p.notes.empty());
    CHECK_THAT(p.notes.back(), Catch::Contains("chose boundary_host"));
    // Less than that: the boundaries in host RAM, used in place (the CPU backend shares host memory).
    p = plan_at(host - 1024);
    CHECK(p.boundaries == BoundaryPlacement::mapped);
    CHECK(p.arena.total_bytes == mapped);
    CHECK_THROWS_WITH(plan_at(mapped - 1024), Catch::Contains("device.max_vram_gb"));
  }
  SECTION("auto keeps every intermediate mapped in host RAM where the device shares it and half the RAM holds it") {
    const DeepModel deep;
    cfg = deep.cfg;
    const ModelConfig& deep_model = deep.model;
    const EnginePlan all = deep.plan("all"), boundary = deep.plan("boundary"), mapped = deep.plan("boundary_mapped");
    const EnginePlan all_mapped = deep.plan("all_mapped");
    // Named: keep mode, the boundaries mapped, and the intermediates with them in host RAM, not the arena.
    CHECK(all_mapped.mode == ActivationMode::keep);
    CHECK(all_mapped.boundaries == BoundaryPlacement::mapped);
    CHECK(all_mapped.kept_layers == 0);
    CHECK(planned_keep(all_mapped) == KeepIntermediates::all_mapped);
    CHECK(all_mapped.host_boundary_bytes ==
          mapped.host_boundary_bytes + static_cast<std::size_t>(all.activation_sets * deep.t.layers) *
                                           align_floats(all.saved_floats) * sizeof(float));
    CHECK(all_mapped.arena.total_bytes < boundary.arena.total_bytes);
    CHECK(all_mapped.arena.total_bytes < all.arena.total_bytes);
    CHECK(all_mapped.workspace_floats == all.workspace_floats);

    cfg.device.keep_intermediates = "auto";
    cfg.device.max_vram_gb = static_cast<double>(all.arena.total_bytes - 1024) / (1024.0 * 1024.0 * 1024.0);
    cfg.plan.host_ram_gb = 64;  // room
    EnginePlan p = plan_engine(cfg, deep_model);
    CHECK(planned_keep(p) == KeepIntermediates::all_mapped);
    CHECK(p.host_boundary_bytes == all_mapped.host_boundary_bytes);
    CHECK(std::any_of(p.notes.begin(), p.notes.end(), [](const std::string& n) {
      return n.find("chose all_mapped (the device shares host memory") != std::string::npos;
    }));
    // Where every intermediate fits the arena, it stays there.
    cfg.device.max_vram_gb = static_cast<double>(all.arena.total_bytes) / (1024.0 * 1024.0 * 1024.0);
    CHECK(planned_keep(plan_engine(cfg, deep_model)) == KeepIntermediates::all);
    cfg.device.max_vram_gb = static_cast<double>(all.arena.total_bytes - 1024) / (1024.0 * 1024.0 * 1024.0);
    // The host state, the arena (host memory here) and the mapped block just over half the host RAM:
    // the layers are recomputed.
    const TierBytes tb = tier_bytes(cfg, deep_model);
    const double need =
        static_cast<double>(tb.tiles + tb.staging + tb.ram_encodings + p.arena.total_bytes + p.host_boundary_bytes);
    cfg.plan.host_ram_gb = 2 * need / 1073741824.0 * 0.999;
    p = plan_engine(cfg, deep_model);
    CHECK(p.mode == ActivationMode::recompute);
    CHECK(p.kept_layers > 0);
    cfg.plan.host_ram_gb = 2 * need / 1073741824.0 * 1.001;
    CHECK(planned_keep(plan_engine(cfg, deep_model)) == KeepIntermediates::all_mapped);
    // Across a link the kernels would read them over it: auto does not map them; the name still does.
    cfg.plan.host_ram_gb = 64;
    cfg.device.copy_bandwidth_gbps = 1000;
    p = plan_engine(cfg, deep_model);
    CHECK(p.mode == ActivationMode::recompute);
    CHECK_FALSE(p.boundaries == BoundaryPlacement::mapped);
    cfg.device.keep_intermediates = "all_mapped";
    CHECK(planned_keep(plan_engine(cfg, deep_model)) == KeepIntermediates::all_mapped);
    // It keeps whole-sequence intermediates: a sequence tile is refused by name.
    cfg.device.seq_tile = 4;
    CHECK_THROWS_WITH(plan_engine(cfg, deep_model), Catch::Contains("device.keep_intermediates") &&
                                                        Catch::Contains("all_mapped keeps whole-sequence"));
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

// device.*_slots = auto (0): 2 weight and 1 gradient slot, then gradient slots, then weight slots, up
// to 4 each, while the arena fits the budget; never past it.
TEST_CASE("plan_engine: auto slots grow with the budget and never exceed it", "[actors][memory]") {
  Tiny t;
  t.layers = 4;
  TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  cfg.device.keep_intermediates = "boundary";
  auto plan_with = [&](std::int64_t weight, std::int64_t grad, std::size_t budget) {
    TrainConfig c = cfg;
    c.device.weight_slots = weight;
    c.device.grad_slots = grad;
    c.device.prefetch_depth = 0;
    c.device.max_vram_gb = static_cast<double>(budget) / (1024.0 * 1024.0 * 1024.0);
    return plan_engine(c, model);
  };
  const std::size_t min_bytes = plan_with(2, 1, std::size_t{1} << 30).arena.total_bytes;
  const std::size_t max_bytes = plan_with(4, 4, std::size_t{1} << 30).arena.total_bytes;
  REQUIRE(max_bytes > min_bytes);
  // A generous budget: 4 and 4, the weight slots' prefetch depth with them.
  EnginePlan p = plan_with(0, 0, std::size_t{1} << 30);
  CHECK(p.weight_slots == 4);
  CHECK(p.grad_slots == 4);
  CHECK(p.prefetch_depth == 3);
  CHECK(p.arena.total_bytes == max_bytes);
  // The minimum budget: nothing added. Between: gradient slots first, within the budget.
  p = plan_with(0, 0, min_bytes);
  CHECK(p.weight_slots == 2);
  CHECK(p.grad_slots == 1);
  const std::size_t grad4 = plan_with(2, 4, std::size_t{1} << 30).arena.total_bytes;
  p = plan_with(0, 0, grad4 + (max_bytes - grad4) / 2);
  CHECK(p.grad_slots == 4);
  CHECK(p.weight_slots == 3);
  CHECK(p.arena.total_bytes <= grad4 + (max_bytes - grad4) / 2);
  // Only one key auto: the other is kept.
  p = plan_with(3, 0, std::size_t{1} << 30);
  CHECK(p.weight_slots == 3);
  CHECK(p.grad_slots == 4);
  // An explicit prefetch depth beyond the slots planned is refused, naming the key.
  TrainConfig deep = cfg;
  deep.device.weight_slots = 0;
  deep.device.prefetch_depth = 5;
  CHECK_THROWS_WITH(plan_engine(deep, model), Catch::Contains("device.prefetch_depth"));
}

TEST_CASE("the config's shared-memory rule is the CPU backend's", "[actors][memory]") {
  // TrainConfig::device_shares_host_memory decides the auto slot budget and the planner's mapped
  // weights; the backend built from the same config decides what the prefetcher and collector do.
  Tiny t;
  TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  for (const double gbps : {0.0, 4.0}) {
    cfg.device.copy_bandwidth_gbps = gbps;
    const auto backend = make_backend(backend_options(cfg, plan_engine(cfg, model)));
    INFO("device.copy_bandwidth_gbps=" << gbps);
    CHECK(backend->shares_host_memory() == cfg.device_shares_host_memory());
    CHECK(cfg.device_shares_host_memory() == (gbps == 0.0));
  }
}
