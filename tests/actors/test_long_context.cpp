// Long context through the engine: sequence tiles (device.seq_tile) and boundaries mapped in host RAM
// (device.keep_intermediates=boundary_mapped). The pipelined engine equals the reference trainer bit for
// bit with the same tiles, with boundaries on the device, on the host and mapped, in fp32 and bf16; a
// sequence whose whole-sequence layer does not fit the budget trains in the tiles auto picks; one that
// does not fit even in tiles is refused before start, naming the key; keys and values the budget holds at
// no tile are mapped in host RAM beside the boundaries, with the same bits.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;

namespace {

// documents: the batches packed as documents (with_documents), whose boundaries fall inside and across tiles.
void check_equivalence(const Tiny& t, std::int64_t expect_tile, bool documents = false) {
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const EnginePlan plan = plan_engine(cfg, model);
  INFO("keep=" << t.keep << " seq=" << t.seq << " seq_tile=" << t.seq_tile << (t.bf16 ? " bf16" : " fp32")
               << " M=" << t.micro_batches << " planned tile " << plan.seq_tile);
  REQUIRE(plan.seq_tile == expect_tile);
  const auto batches = documents ? with_documents(tiny_batches(t, 8)) : tiny_batches(t, 8);
  RefRun ref = run_reference(cfg, model, batches, t.steps);
  EngineRun eng = run_pipeline(cfg, model, batches);
  REQUIRE(eng.result.error.empty());
  REQUIRE(eng.result.steps.size() == static_cast<std::size_t>(t.steps));
  for (std::int64_t s = 0; s < t.steps; ++s) {
    INFO("step " << s + 1);
    CHECK(eng.result.steps[static_cast<std::size_t>(s)].loss == ref.losses[static_cast<std::size_t>(s)]);
  }
  CHECK(equals_reference(*eng.host, *ref.trainer));
  CHECK(ref.losses.back() < ref.losses.front());
}

}  // namespace

TEST_CASE("sequence tiles: the engine equals the reference trainer with the same tiles", "[actors][long_context]") {
  for (const char* keep : {"boundary", "boundary_host", "boundary_mapped"})
    for (bool bf16 : {false, true})
      for (std::int64_t m : {1, 2}) {
        Tiny t;
        t.seq = 48;
        t.seq_tile = 20;  // 20, 20, 8: not a divisor
        t.keep = keep;
        t.bf16 = bf16;
        t.micro_batches = m;
        t.steps = 6;
        check_equivalence(t, 20);
      }
}

TEST_CASE("documents in sequence tiles: the engine equals the reference trainer", "[actors][long_context][documents]") {
  for (const char* keep : {"boundary", "boundary_mapped"})
    for (bool bf16 : {false, true}) {
      Tiny t;
      t.seq = 48;
      t.seq_tile = 20;
      t.keep = keep;
      t.bf16 = bf16;
      t.micro_batches = 2;
      t.steps = 6;
      check_equivalence(t, 20, true);
    }
}

TEST_CASE("a sequence too long for the budget untiled trains in the tiles auto picks", "[actors][long_context]") {
  Tiny t;
  t.batch = 1;
  t.seq = 512;
  t.max_positions = 512;
  t.steps = 3;
  t.keep = "boundary";
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  t.seq_tile = 128;
  const std::size_t tiled = plan_engine(tiny_config(t), model).arena.total_bytes;
  t.seq_tile = 512;  // whole sequences
  const std::size_t whole = plan_engine(tiny_config(t), model).arena.total_bytes;
  REQUIRE(tiled < whole);
  t.seq_tile = 0;  // auto
  t.budget_bytes = (tiled + whole) / 2;
  const EnginePlan plan = plan_engine(tiny_config(t), model);
  CHECK(plan.seq_tile > 0);
  CHECK(plan.seq_tile < t.seq);
  CHECK(plan.arena.total_bytes <= t.budget_bytes);
  bool noted = false;
  for (const auto& n : plan.notes) noted = noted || n.find("sequence tiles of") != std::string::npos;
  CHECK(noted);
  check_equivalence(t, plan.seq_tile);
  // With the budget the whole sequence needs, auto keeps whole sequences.
  t.budget_bytes = whole;
  CHECK(plan_engine(tiny_config(t), model).seq_tile == 0);
}

TEST_CASE("in tiles with the boundaries mapped each layer's attention output is kept in host RAM, same bits",
          "[actors][long_context][memory]") {
  for (std::int64_t m : {1, 2, 3}) {
    Tiny t;
    t.seq = 48;
    t.seq_tile = 20;
    t.keep = "boundary_mapped";
    t.micro_batches = m;
    // M=2 layer-major (stage gradients: a set per micro-batch); M=3 interleaved (one micro-batch's forward
    // writes one set while another's backward reads the other).
    t.gradient_buffer = m == 2 ? "stage" : m == 3 ? "model" : "auto";
    t.steps = 5;
    t.host_ram_gb = 64;
    const ModelConfig model = tiny_config(t).model_config_from_keys();
    const EnginePlan kept = plan_engine(tiny_config(t), model);
    INFO("M=" << m << " sets " << kept.activation_sets);
    REQUIRE(kept.attention == AttentionOutputs::kept_mapped);
    CHECK(kept.attention_floats == layer_attention_floats(model, t.batch, t.seq, 20));
    CHECK(kept.attention_floats == static_cast<std::size_t>(t.batch * t.seq * (model.q_dim() + t.heads)));
    bool noted = false;
    for (const auto& n : kept.notes) noted = noted || n.find("attention output and log-sum-exp") != std::string::npos;
    CHECK(noted);
    check_equivalence(t, 20);
    // Without half the host RAM for them, the backward runs the attention forward again: the same bits.
    t.host_ram_gb = 1.0 / (1024 * 1024);
    const EnginePlan recomputed = plan_engine(tiny_config(t), model);
    CHECK_FALSE(recomputed.attention == AttentionOutputs::kept_mapped);
    CHECK(kept.host_boundary_bytes - recomputed.host_boundary_bytes ==
          static_cast<std::size_t>(kept.activation_sets * t.layers) * align_floats(kept.attention_floats) *
              sizeof(float));
    CHECK(kept.arena.total_bytes == recomputed.arena.total_bytes);
    check_equivalence(t, 20);
    // Across a link each tile would write and read them over it: not kept.
    t.host_ram_gb = 64;
    t.bandwidth_gbps = 16.0;
    CHECK_FALSE(plan_engine(tiny_config(t), model).attention == AttentionOutputs::kept_mapped);
  }
}

TEST_CASE("keys and values the budget holds at no tile are mapped in host RAM, with the same bits",
          "[actors][long_context][memory]") {
  Tiny t;
  t.batch = 1;
  t.seq = 512;
  t.max_positions = 512;
  t.steps = 3;
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const std::size_t sequence_bytes = layer_sequence_floats(model, t.batch, t.seq, 128) * sizeof(float);
  REQUIRE(sequence_bytes > 0);
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp32"));
    t.bf16 = bf16;
    t.keep = "boundary_mapped";
    t.seq_tile = 128;  // the smallest tile auto tries
    t.budget_bytes = 0;
    const EnginePlan in_arena = plan_engine(tiny_config(t), model);
    REQUIRE_FALSE(in_arena.keys_values == KeysValues::mapped);
    t.keep = "auto";
    t.seq_tile = 0;
    t.budget_bytes = in_arena.arena.total_bytes - sequence_bytes / 2;  // no tile holds them
    const EnginePlan plan = plan_engine(tiny_config(t), model);
    CHECK(plan.boundaries == BoundaryPlacement::mapped);
    CHECK(plan.keys_values == KeysValues::mapped);
    CHECK(plan.seq_tile > 0);
    CHECK(plan.arena.total_bytes <= t.budget_bytes);
    CHECK(plan.sequence_floats == layer_sequence_floats(model, t.batch, t.seq, plan.seq_tile));
    CHECK(plan.host_boundary_bytes >= plan.sequence_floats * sizeof(float));
    bool noted = false;
    for (const auto& n : plan.notes) noted = noted || n.find("mapped in host RAM too") != std::string::npos;
    CHECK(noted);
    check_equivalence(t, plan.seq_tile);
    // Not while anything else fits: with the budget of keys and values in the arena they stay there.
    t.budget_bytes = in_arena.arena.total_bytes + 4096;
    CHECK_FALSE(plan_engine(tiny_config(t), model).keys_values == KeysValues::mapped);
    // Nor with the boundaries kept elsewhere by name: that run is refused, naming the budget.
    t.budget_bytes = in_arena.arena.total_bytes - sequence_bytes / 2;
    t.keep = "boundary_host";
    CHECK_THROWS_WITH(plan_engine(tiny_config(t), model), Catch::Contains("device.max_vram_gb"));
  }
}

TEST_CASE("device.attention_kv: host maps keys and values by name, device never, and a link only by name",
          "[actors][long_context][memory]") {
  Tiny t;
  t.seq = 48;
  t.seq_tile = 20;
  t.steps = 4;
  t.keep = "auto";
  t.attention_kv = "host";
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const EnginePlan host = plan_engine(tiny_config(t), model);
  CHECK(host.keys_values == KeysValues::mapped);
  CHECK(host.boundaries == BoundaryPlacement::mapped);  // keep_intermediates=auto gives way to the mapping it needs
  CHECK(host.sequence_floats == layer_sequence_floats(model, t.batch, t.seq, 20));
  t.attention_kv = "device";
  const EnginePlan device = plan_engine(tiny_config(t), model);
  CHECK_FALSE(device.keys_values == KeysValues::mapped);
  CHECK(device.arena.total_bytes > host.arena.total_bytes);
  // Across a link (a GPU reading mapped pinned memory): only by name, and the same bits.
  t.attention_kv = "host";
  t.bandwidth_gbps = 16.0;
  REQUIRE(plan_engine(tiny_config(t), model).keys_values == KeysValues::mapped);
  check_equivalence(t, 20);
  // Auto across a link never maps them: with a budget no tile fits otherwise, the run is refused.
  t.keep = "boundary_mapped";
  t.attention_kv = "device";
  const EnginePlan linked = plan_engine(tiny_config(t), model);
  t.attention_kv = "auto";
  t.budget_bytes = linked.arena.total_bytes - layer_sequence_floats(model, t.batch, t.seq, 20) * sizeof(float) / 2;
  CHECK_THROWS_WITH(plan_engine(tiny_config(t), model), Catch::Contains("device.max_vram_gb"));
  t.attention_kv = "host";
  CHECK(plan_engine(tiny_config(t), model).keys_values == KeysValues::mapped);
  t.budget_bytes = 64 * 1024;  // not even the slots: refused, saying what was tried
  CHECK_THROWS_WITH(plan_engine(tiny_config(t), model),
                    Catch::Contains("device.max_vram_gb") && Catch::Contains("(device.attention_kv=host)"));
  // What host cannot do is refused by name.
  t.budget_bytes = 0;
  t.bandwidth_gbps = 0.0;
  t.keep = "boundary_host";
  CHECK_THROWS_WITH(plan_engine(tiny_config(t), model),
                    Catch::Contains("device.attention_kv") && Catch::Contains("boundary_mapped or auto"));
  t.keep = "auto";
  t.seq_tile = 48;  // whole sequences: nothing to map
  CHECK_THROWS_WITH(plan_engine(tiny_config(t), model),
                    Catch::Contains("device.attention_kv") && Catch::Contains("needs sequence tiles"));
  t.seq_tile = 0;
  t.seq = 96;  // auto tiles go down to 128 tokens: none below 96
  t.max_positions = 96;
  CHECK_THROWS_WITH(plan_engine(tiny_config(t), tiny_config(t).model_config_from_keys()),
                    Catch::Contains("needs sequence tiles"));
}

TEST_CASE("a sequence that does not fit even in tiles is refused before start, naming the key",
          "[actors][long_context][errors]") {
  Tiny t;
  t.batch = 1;
  t.seq = 512;
  t.max_positions = 512;
  t.keep = "auto";
  t.budget_bytes = 64 * 1024;  // not even the weight slots and keys
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  CHECK_THROWS_WITH(plan_engine(cfg, model), Catch::Contains("device.max_vram_gb") &&
                                                 Catch::Contains("sequence tiles down to device.seq_tile=128"));
}

TEST_CASE("boundaries mapped: nothing of them in the arena, with or without a link", "[actors][long_context][memory]") {
  Tiny t;
  t.seq = 48;
  t.keep = "boundary_mapped";
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const EnginePlan mapped = plan_engine(tiny_config(t), model);
  CHECK(mapped.boundaries == BoundaryPlacement::mapped);
  CHECK(mapped.arena.region(ArenaRegionKind::activations).bytes == 0);
  const std::size_t boundary = static_cast<std::size_t>(t.batch * t.seq * t.hidden) * sizeof(float);
  CHECK(mapped.host_boundary_bytes >= (static_cast<std::size_t>(t.layers) + 1 + 2) * boundary);
  t.keep = "boundary_host";
  CHECK(plan_engine(tiny_config(t), model).arena.total_bytes > mapped.arena.total_bytes);
  // Across a modelled link too (a GPU reads mapped pinned memory across it): same bits, no copies of them.
  t.keep = "boundary_mapped";
  t.bandwidth_gbps = 16.0;
  t.steps = 4;
  check_equivalence(t, 0);
  // Auto takes it only when nothing else fits (the arena then bounds no activation at all).
  t.bandwidth_gbps = 0.0;
  t.keep = "auto";
  CHECK_FALSE(plan_engine(tiny_config(t), model).boundaries == BoundaryPlacement::mapped);
}

TEST_CASE("keep_intermediates=all in sequence tiles is refused by name", "[actors][long_context][errors]") {
  Tiny t;
  t.seq = 32;
  t.seq_tile = 8;
  t.keep = "all";  // whole-sequence intermediates
  const TrainConfig cfg = tiny_config(t);
  CHECK_THROWS_WITH(plan_engine(cfg, cfg.model_config_from_keys()),
                    Catch::Contains("device.keep_intermediates") && Catch::Contains("device.seq_tile=8"));
}

TEST_CASE("device.seq_tile on GPT-2 is refused by name", "[actors][long_context][errors]") {
  Tiny t;
  t.arch = Arch::gpt2;
  t.seq = 32;
  t.seq_tile = 8;
  const TrainConfig cfg = tiny_config(t);
  CHECK_THROWS_WITH(plan_engine(cfg, cfg.model_config_from_keys()), Catch::Contains("device.seq_tile"));
}

TEST_CASE("run_engine refuses a plan built by hand whose placements no plan forms", "[actors][long_context]") {
  Tiny t;
  t.seq = 48;
  t.seq_tile = 20;
  t.steps = 1;
  t.keep = "auto";
  t.attention_kv = "host";
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const EnginePlan planned = plan_engine(cfg, model);
  REQUIRE(planned.keys_values == KeysValues::mapped);
  HostModel host(model, host_tile_options(cfg));
  init_host_model(host, static_cast<std::uint64_t>(cfg.train.seed));
  VectorBatchSource source(tiny_batches(t, 4));
  // Keys and values mapped with the boundaries on the device: nothing would carve the mapped block.
  EngineJob job = engine_job(cfg, model, source, host);
  job.plan = planned;
  job.plan->boundaries = BoundaryPlacement::device;
  CHECK_THROWS_AS(run_engine(std::move(job)), std::invalid_argument);
  CHECK(host.tile(0).version() == 0);  // nothing ran
}
