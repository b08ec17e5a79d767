// Equivalence: the pipelined engine and the sequential reference trainer give bit-identical weights,
// moments and losses after 20 steps, for K = 2 and 3 weight slots, 1 and 4 micro-batches, clipping on
// and off, Llama- and GPT-2-style models (tiny shapes); and for both micro-batch orders (interleaved,
// the default, and sequential) with layer boundaries kept on the device or offloaded to the host; and
// through a modelled link (weights and gradients copied, as on a GPU) as well as mapped (the CPU).
#include <catch2/catch.hpp>

#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/ops.hpp"
#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;

namespace {

// documents: the batches packed as documents (with_documents: positions, document-ending targets).
void check_equivalence(const Tiny& t, const RopeScaling& rope = {}, std::int64_t max_positions = 0,
                       bool documents = false) {
  const TrainConfig cfg = tiny_config(t);
  ModelConfig model = cfg.model_config_from_keys();
  model.rope_scaling = rope;  // as a config.json would give it (storage/hf)
  if (max_positions > 0) model.max_position_embeddings = max_positions;
  const auto batches = documents ? with_documents(tiny_batches(t, 16)) : tiny_batches(t, 16);
  RefRun ref = run_reference(cfg, model, batches, t.steps);
  EngineRun eng = run_pipeline(cfg, model, batches);
  INFO("arch " << arch_name(t.arch) << " rope " << rope_type_name(rope.type) << (t.bf16 ? " bf16" : " fp32")
               << " K=" << t.weight_slots << " M=" << t.micro_batches << " clip=" << t.max_grad_norm
               << " keep=" << t.keep << " schedule=" << t.schedule);
  INFO("engine error: " << eng.result.error);
  REQUIRE(eng.result.error.empty());
  REQUIRE(eng.result.steps_done == t.steps);
  REQUIRE(eng.result.steps.size() == static_cast<std::size_t>(t.steps));
  for (std::int64_t s = 0; s < t.steps; ++s) {
    INFO("step " << s + 1);
    CHECK(eng.result.steps[static_cast<std::size_t>(s)].loss == ref.losses[static_cast<std::size_t>(s)]);
  }
  CHECK(equals_reference(*eng.host, *ref.trainer));
  // Without a modelled link the CPU backend maps the tiles (no weight copies); with one every load that
  // is not a hit on a resident slot is a copy, as on a GPU.
  const std::uint64_t weight_copies = eng.result.link.of(LinkDirection::host_to_device).copies;
  if (t.bandwidth_gbps == 0.0 && t.keep != "boundary_host")
    CHECK(weight_copies == 0);
  else
    CHECK(weight_copies > 0);
  // The loss moved: the run really trained.
  CHECK(ref.losses.back() < ref.losses.front());
}

}  // namespace

TEST_CASE("pipelined engine equals the reference trainer bit for bit", "[actors][equivalence]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (std::int64_t k : {2, 3})
      for (std::int64_t m : {1, 4})
        for (double clip : {1.0, 0.0}) {
          Tiny t;
          t.arch = arch;
          t.weight_slots = k;
          t.micro_batches = m;
          t.max_grad_norm = clip;
          check_equivalence(t);
        }
}

// data.packing = documents: positions restart at each document, attention stays inside it; both
// families, both micro-batch orders, weights resident or streamed.
TEST_CASE("documents: the engine equals the reference trainer bit for bit, interleaved and layer-major",
          "[actors][equivalence][documents]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (const char* schedule : {"interleaved", "layer_major"})
      for (std::int64_t k : {2, 3}) {
        Tiny t;
        t.arch = arch;
        t.layers = 3;
        t.micro_batches = 3;
        t.weight_slots = k;
        t.schedule = schedule;
        if (std::string(schedule) == "layer_major") t.gradient_buffer = "model";
        t.steps = 6;
        INFO(arch_name(arch) << " " << schedule << " K=" << k);
        check_equivalence(t, {}, 0, true);
      }
}

// rope_scaling through the engine: yarn (gpt-oss's shape) and dynamic with sequences of 8 past
// max_position_embeddings 4 (the grown base: the engine accepts those lengths for dynamic only).
TEST_CASE("rope_scaling yarn and dynamic (past max_position_embeddings): engine equals the reference",
          "[actors][equivalence][rope]") {
  Tiny t;
  t.steps = 6;
  RopeScaling yarn;
  yarn.type = RopeType::yarn;
  yarn.factor = 32.0;
  yarn.original_max_position_embeddings = 2;  // 64 / 2 = 32: newer transformers' factor equals it
  yarn.truncate = false;
  check_equivalence(t, yarn);
  RopeScaling dynamic;
  dynamic.type = RopeType::dynamic;
  dynamic.factor = 2.0;
  check_equivalence(t, dynamic, 4);
}

// The path of a backend with a link (a GPU): weights copied into the slots, gradients copied out and
// then added on the host. On the CPU backend a link bandwidth selects it; the bits must not change.
TEST_CASE("through a modelled link the engine equals the reference trainer bit for bit", "[actors][equivalence]") {
  for (bool bf16 : {false, true})
    for (std::int64_t k : {2, 3})
      for (std::int64_t m : {1, 4}) {
        Tiny t;
        t.bf16 = bf16;
        t.weight_slots = k;
        t.micro_batches = m;
        t.bandwidth_gbps = 1000;
        check_equivalence(t);
      }
}

// bf16 compute with fp32 masters: the engine streams the bf16 copies the optimizer writes; the reference
// trainer keeps its own copies. Both must agree bit for bit (masters, moments, copies, losses).
TEST_CASE("bf16: pipelined engine equals the reference trainer bit for bit", "[actors][equivalence][bf16]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (std::int64_t k : {2, 3})
      for (std::int64_t m : {1, 4})
        for (double clip : {1.0, 0.0}) {
          Tiny t;
          t.bf16 = true;
          t.arch = arch;
          t.weight_slots = k;
          t.micro_batches = m;
          t.max_grad_norm = clip;
          check_equivalence(t);
        }
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (const char* keep : {"boundary_host", "all"})
      for (const char* schedule : {"interleaved", "sequential"}) {
        Tiny t;
        t.bf16 = true;
        t.arch = arch;
        t.layers = 3;
        t.keep = keep;
        t.schedule = schedule;
        t.micro_batches = 3;
        t.steps = 8;
        check_equivalence(t);
      }
}

// The attention's two block products (fp32, bf16 pairs where the CPU has AVX512-BF16): each keeps the
// engine and the reference trainer bit-identical, and the two give different runs (the setting is used).
TEST_CASE("bf16: the engine equals the reference trainer on either attention product", "[actors][equivalence][bf16]") {
  const cpu::AttnProducts before = cpu::bf16_attention_products();
  // MEGATRAIN_BF16_ATTENTION wins over a setting: then only the forced products run.
  std::vector<cpu::AttnProducts> products{cpu::bf16_attention_forced() ? cpu::bf16_attention_products()
                                                                       : cpu::AttnProducts::fp32};
  if (cpu::bf16_pairs_available() && !cpu::bf16_attention_forced()) products.push_back(cpu::AttnProducts::bf16_pairs);
  std::vector<double> first_losses;
  for (const cpu::AttnProducts p : products)
    for (Arch arch : {Arch::llama, Arch::gpt2}) {
      INFO("attention products " << cpu::attn_products_name(p));
      REQUIRE(cpu::set_bf16_attention_products(p) == p);
      Tiny t;
      t.bf16 = true;
      t.arch = arch;
      t.micro_batches = 2;
      check_equivalence(t);
      if (arch != Arch::llama) continue;
      const TrainConfig cfg = tiny_config(t);
      const RefRun ref = run_reference(cfg, cfg.model_config_from_keys(), tiny_batches(t, 16), t.steps);
      if (first_losses.empty())
        first_losses = ref.losses;
      else
        CHECK(ref.losses != first_losses);
    }
  cpu::set_bf16_attention_products(before);
}

TEST_CASE("bf16: split and fp32 masters both equal the reference trainer, the split tiles 2 bytes/param smaller",
          "[actors][equivalence][bf16][master_halves]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (double clip : {1.0, 0.0})
      for (const char* masters : {"fp32", "split"}) {
        Tiny t;
        t.bf16 = true;
        t.arch = arch;
        t.micro_batches = 2;
        t.max_grad_norm = clip;
        t.master_weights = masters;
        check_equivalence(t);
        const TrainConfig cfg = tiny_config(t);
        const ModelConfig model = cfg.model_config_from_keys();
        CHECK(host_tile_options(cfg).split_master == (std::string(masters) == "split"));
        HostModel host(model, host_tile_options(cfg));
        std::size_t floats = 0;
        for (std::int64_t s = 0; s < host.num_stages(); ++s) floats += host.tile(s).floats();
        // grad, m, v (12) + the copy (2) + the master: 4 bytes fp32, 2 bytes of low halves split
        const double per_param = static_cast<double>(host.host_bytes()) / static_cast<double>(floats);
        INFO(masters << ": " << per_param << " bytes per element");
        CHECK(per_param == Approx(std::string(masters) == "split" ? 16.0 : 18.0).epsilon(0.02));
      }
}

// train.gradient_buffer=stage: no accumulator in the tiles; with clipping two passes per step (the first
// sums the squares), without one pass. Both equal the reference trainer (one pass, accumulators).
TEST_CASE("stage gradients, one pass and two, equal the reference trainer, the tiles hold no gradient",
          "[actors][equivalence][stage_gradients]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (double clip : {1.0, 0.0})
      for (bool bf16 : {false, true})
        for (double link : {0.0, 1000.0}) {
          Tiny t;
          t.arch = arch;
          t.bf16 = bf16;
          t.max_grad_norm = clip;
          t.bandwidth_gbps = link;
          t.gradient_buffer = "stage";
          t.steps = 8;
          check_equivalence(t);
        }
  for (const char* keep : {"boundary_host", "all"})
    for (const char* schedule : {"interleaved", "sequential"}) {
      Tiny t;
      t.layers = 3;
      t.keep = keep;
      t.schedule = schedule;
      t.gradient_buffer = "stage";
      t.steps = 6;
      check_equivalence(t);
    }
  Tiny t;
  t.bf16 = true;
  t.gradient_buffer = "stage";
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  CHECK_FALSE(host_tile_options(cfg).grad_in_tile);
  HostModel host(model, host_tile_options(cfg));
  std::size_t floats = 0;
  for (std::int64_t s = 0; s < host.num_stages(); ++s) {
    floats += host.tile(s).floats();
    CHECK_FALSE(host.tile(s).has_grad());
  }
  // m, v (8) + the split master (4): twelve bytes per parameter
  CHECK(static_cast<double>(host.host_bytes()) / static_cast<double>(floats) == Approx(12.0).epsilon(0.02));
}

// Stage gradients of several micro-batches run layer-major: a stage's micro-batches are summed into a
// stage accumulator with the tile accumulator's bits, so one pass and two equal the reference trainer
// (accumulators, micro-batch-major) bit for bit; tied embeddings stage every micro-batch's head
// gradient of the embedding until its embed backward.
TEST_CASE("stage gradients of several micro-batches, layer-major, equal the reference trainer",
          "[actors][equivalence][stage_gradients]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (double clip : {1.0, 0.0})
      for (std::int64_t m : {2, 3}) {
        Tiny t;
        t.arch = arch;
        t.max_grad_norm = clip;
        t.micro_batches = m;
        t.bf16 = m == 3;
        t.gradient_buffer = "stage";
        t.steps = 6;
        INFO("arch " << arch_name(arch) << " clip " << clip << " M " << m);
        const TrainConfig cfg = tiny_config(t);
        const EnginePlan plan = plan_engine(cfg, cfg.model_config_from_keys());
        CHECK(plan.order == MicroBatchOrder::layer_major);
        CHECK(plan.activation_sets == m);
        check_equivalence(t);
      }
  for (const char* keep : {"boundary_host", "all", "boundary_mapped", "all_mapped"})
    for (double link : {0.0, 1000.0}) {
      Tiny t;
      t.arch = std::string(keep) == "all" ? Arch::gpt2 : Arch::llama;
      t.layers = 3;
      t.keep = keep;
      t.micro_batches = 2;
      t.bandwidth_gbps = link;
      t.gradient_buffer = "stage";
      t.steps = 5;
      INFO(keep << " link " << link);
      check_equivalence(t);
    }
}

// The layer-major order with the accumulators kept (device.schedule=layer_major): the same bits too.
TEST_CASE("the layer-major order with gradient accumulators equals the reference trainer", "[actors][equivalence]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (const char* keep : {"boundary", "boundary_host"}) {
      Tiny t;
      t.arch = arch;
      t.keep = keep;
      t.micro_batches = 3;
      t.schedule = "layer_major";
      t.gradient_buffer = "model";
      t.steps = 5;
      INFO(arch_name(arch) << " " << keep);
      check_equivalence(t);
    }
}

TEST_CASE("both micro-batch orders, with boundaries on the device or the host, equal the reference trainer",
          "[actors][equivalence]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (const char* keep : {"boundary", "boundary_host"})
      for (const char* schedule : {"interleaved", "sequential"})
        for (std::int64_t k : {2, 3})
          for (std::int64_t m : {1, 3}) {
            if (m == 1 && std::string(schedule) == "sequential") continue;  // one micro-batch: one order
            Tiny t;
            t.arch = arch;
            t.layers = 3;
            t.keep = keep;
            t.schedule = schedule;
            t.weight_slots = k;
            t.micro_batches = m;
            t.steps = 8;
            check_equivalence(t);
          }
}

TEST_CASE("keep-intermediates mode equals the reference trainer", "[actors][equivalence]") {
  for (Arch arch : {Arch::llama, Arch::gpt2}) {
    Tiny t;
    t.arch = arch;
    t.keep = "all";
    t.micro_batches = 2;
    t.steps = 8;
    check_equivalence(t);
    t.schedule = "sequential";
    check_equivalence(t);
  }
}

TEST_CASE("clipping actually clips in the equivalence runs", "[actors][equivalence]") {
  Tiny t;
  t.max_grad_norm = 0.05;
  t.steps = 5;
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = tiny_batches(t, 8);
  EngineRun eng = run_pipeline(cfg, model, batches);
  REQUIRE(eng.result.error.empty());
  REQUIRE(eng.result.steps.size() == 5);
  CHECK(eng.result.steps[0].clip < 1.0);
  RefRun ref = run_reference(cfg, model, batches, t.steps);
  CHECK(equals_reference(*eng.host, *ref.trainer));
}

// keep_intermediates = auto in recompute mode spends the budget left over on the last layers'
// intermediates (EnginePlan::kept_layers): their backward skips the recomputation, same bits.
TEST_CASE("auto keeps the last layers' intermediates with the budget left over, same bits", "[actors][equivalence]") {
  for (Arch arch : {Arch::llama, Arch::gpt2}) {
    Tiny t;
    t.arch = arch;
    t.layers = 4;
    t.micro_batches = 2;
    t.steps = 8;
    t = with_kept_layers(t, 2);
    const ModelConfig model = tiny_config(t).model_config_from_keys();
    const EnginePlan plan = plan_engine(tiny_config(t), model);
    INFO("arch " << arch_name(arch) << ": " << plan.arena.describe());
    CHECK(plan.mode == ActivationMode::recompute);
    CHECK_FALSE(plan.boundaries == BoundaryPlacement::host_ring);
    CHECK(plan.kept_layers == 2);
    check_equivalence(t);
    // Chosen explicitly, the boundary mode keeps nothing more.
    t.keep = "boundary";
    CHECK(plan_engine(tiny_config(t), model).kept_layers == 0);
  }
}

// With host RAM to spare on a device sharing it, auto keeps every intermediate mapped there
// (all_mapped) instead of the last layers in the budget: nothing recomputed, same bits.
TEST_CASE("auto keeps every intermediate in host RAM on a device sharing it, same bits", "[actors][equivalence]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (bool bf16 : {false, true}) {
      Tiny t;
      t.arch = arch;
      t.layers = 4;
      t.bf16 = bf16;
      t.micro_batches = bf16 ? 1 : 2;
      t.steps = 6;
      t = with_kept_layers(t, 1);  // the budget keeps one layer; host RAM (below) keeps them all
      t.host_ram_gb = 64;
      const ModelConfig model = tiny_config(t).model_config_from_keys();
      const EnginePlan plan = plan_engine(tiny_config(t), model);
      INFO("arch " << arch_name(arch) << " bf16 " << bf16 << ": " << plan.arena.describe());
      CHECK(planned_keep(plan) == KeepIntermediates::all_mapped);
      check_equivalence(t);
    }
}

// Mixtral's experts through the engine (8 experts, top-2, from the [model] keys): fp32 and bf16, kept
// intermediates and recomputed, mapped and through a modelled link.
TEST_CASE("mixtral: pipelined engine equals the reference trainer bit for bit", "[actors][equivalence][moe]") {
  for (bool bf16 : {false, true})
    for (const char* keep : {"boundary", "all"})
      for (double link : {0.0, 1000.0}) {
        Tiny t;
        t.arch = Arch::mixtral;
        t.steps = 6;
        t.bf16 = bf16;
        t.keep = keep;
        t.micro_batches = 2;
        t.bandwidth_gbps = link;
        check_equivalence(t);
      }
}

// Qwen3-MoE through the engine: 4 layers with 8 experts (top-2, not renormalised) where dense layers
// sit among them (decoder_sparse_step 2 and mlp_only_layers {3}: only layer 1 routes), so stages of two
// shapes stream through the same slots; fp32 and bf16, kept intermediates and recomputed.
TEST_CASE("gpt_oss (sinks, sliding and full layers): pipelined engine equals the reference trainer bit for bit",
          "[actors][equivalence][moe]") {
  for (bool bf16 : {false, true})
    for (const char* keep : {"boundary", "all"}) {
      Tiny t;
      t.arch = Arch::gpt_oss;
      t.layers = 2;
      t.sliding_window = 3;  // of 8 tokens
      t.steps = 4;
      t.bf16 = bf16;
      t.keep = keep;
      t.micro_batches = 2;
      t.bandwidth_gbps = bf16 ? 1000.0 : 0.0;
      check_equivalence(t);
    }
}

TEST_CASE("the load-balancing loss: pipelined engine equals the reference trainer bit for bit",
          "[actors][equivalence][moe]") {
  for (const Arch arch : {Arch::mixtral, Arch::qwen3_moe, Arch::gpt_oss})
    for (const char* keep : {"boundary", "all"}) {
      Tiny t;
      t.arch = arch;
      t.layers = 4;
      t.steps = 4;
      t.micro_batches = 2;
      t.keep = keep;
      t.bf16 = arch == Arch::gpt_oss;
      t.output_router_logits = true;
      t.router_aux_loss_coef = 0.3;
      if (arch == Arch::qwen3_moe) t.decoder_sparse_step = 2;
      if (arch == Arch::gpt_oss) t.sliding_window = 3;
      check_equivalence(t);
    }
  // Two passes (stage gradients with clipping): the replay's head and backward use the first pass's
  // statistics.
  Tiny s;
  s.arch = Arch::mixtral;
  s.layers = 3;
  s.steps = 4;
  s.micro_batches = 1;
  s.gradient_buffer = "stage";
  s.output_router_logits = true;
  s.router_aux_loss_coef = 0.3;
  check_equivalence(s);
}

TEST_CASE("qwen3_moe with dense layers: pipelined engine equals the reference trainer bit for bit",
          "[actors][equivalence][moe]") {
  for (bool bf16 : {false, true})
    for (const char* keep : {"boundary", "all"}) {
      Tiny t;
      t.arch = Arch::qwen3_moe;
      t.layers = 4;
      t.decoder_sparse_step = 2;
      t.mlp_only_layers = "3";
      t.steps = 6;
      t.bf16 = bf16;
      t.keep = keep;
      t.micro_batches = 2;
      t.bandwidth_gbps = bf16 ? 1000.0 : 0.0;
      check_equivalence(t);
    }
}
