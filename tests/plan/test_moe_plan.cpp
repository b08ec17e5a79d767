// The planner with a mixture of experts: compute counts the parameters a token uses (its top-k
// experts), memory and the link count them all, and the link cover says how many tokens a micro-batch
// needs before its compute hides the streaming of a layer. Datasheet profiles; nothing runs.
#include <catch2/catch.hpp>

#include "kernels/param_layout.hpp"
#include "plan/hardware.hpp"
#include "plan/resource_plan.hpp"
#include "plan/step_model.hpp"

using namespace mt;

namespace {

// Mixtral-8x7B's shape (d 4096, 32 layers, GQA 32/8, experts of width 14336, top-2 of 8).
TrainConfig mixtral(std::int64_t batch, std::int64_t seq) {
  TrainConfig c;
  c.model.arch = "mixtral";
  c.model.hidden_size = 4096;
  c.model.layers = 32;
  c.model.heads = 32;
  c.model.kv_heads = 8;
  c.model.intermediate_size = 14336;
  c.model.vocab_size = 32000;
  c.model.num_experts = 8;
  c.model.num_experts_per_tok = 2;
  c.model.max_position_embeddings = seq;
  c.data.seq_length = seq;
  c.train.per_device_train_batch_size = batch;
  c.train.gradient_accumulation_steps = 1;
  c.train.bf16 = true;
  c.device.weight_slots = 2;
  c.device.grad_slots = 2;
  c.device.max_vram_gb = 4096;
  return c;
}

struct Planned {
  ModelConfig model;
  plan::EnginePlan engine;
  plan::OpTimes ops;
  plan::TransferCover cover;
};

Planned planned(TrainConfig cfg, const plan::HardwareProfile& hw) {
  plan::plan_as_gpu(cfg, hw);
  cfg.device.max_vram_gb = 4096;
  Planned p{cfg.model_config_from_keys(), {}, {}, {}};
  p.engine = plan::plan_engine(cfg, p.model);
  p.ops = plan::op_times_from_flops(cfg, p.model, p.engine, hw);
  p.cover = plan::transfer_cover(cfg, p.model, p.engine, hw, p.ops);
  return p;
}

}  // namespace

TEST_CASE("moe plan: FLOPs from the active parameters, the link from all of them", "[plan][moe]") {
  const plan::HardwareProfile hw = plan::load_hardware_profile("h200", "");
  const Planned p = planned(mixtral(1, 4096), hw);
  const double tokens = 4096;
  const double active = static_cast<double>(layer_active_param_count(p.model, 0));
  const double all = static_cast<double>(layer_layout(p.model, 0).param_count());
  CHECK(all / active > 3.5);  // 8 experts streamed, 2 computed with
  CHECK(plan::layer_flops(p.model, 1, 4096).gemm_forward == Approx(2.0 * active * tokens));
  const double dense_flops = 6.0 * static_cast<double>(active_param_count(p.model)) * tokens;
  CHECK(plan::model_flops_per_step(p.model, tokens, tokens) > dense_flops * 0.95);
  CHECK(plan::model_flops_per_step(p.model, tokens, tokens) <
        6.0 * static_cast<double>(total_param_count(p.model)) * tokens * 0.5);
  // The link carries every expert: a layer's bf16 copy (and its padding) at the profile's rate.
  CHECK(p.cover.layer_bytes >= 2.0 * all);
  CHECK(p.cover.layer_bytes < 2.0 * all * 1.001);
  CHECK(p.cover.layer_link_s == Approx(p.cover.layer_bytes / hw.link_h2d));
  CHECK(p.cover.forward_s_per_token == Approx(p.ops.layer_forward / tokens));
  CHECK(p.cover.tokens_needed == Approx(p.cover.layer_link_s / p.cover.forward_s_per_token));
  CHECK(p.cover.tokens_now == tokens);
}

TEST_CASE("moe plan: a micro-batch of enough tokens hides the transfer, a small one does not", "[plan][moe]") {
  const plan::HardwareProfile hw = plan::load_hardware_profile("h200", "");
  const Planned small = planned(mixtral(1, 1024), hw);
  INFO(plan::describe_transfer_cover(small.cover, small.model));
  // About all / (2 x active) x rate / link per token: thousands of tokens on an H200.
  REQUIRE(small.cover.tokens_needed > 1024);
  CHECK(plan::describe_transfer_cover(small.cover, small.model).find("the link binds the forward") !=
        std::string::npos);
  CHECK(plan::describe_transfer_cover(small.cover, small.model).find("a token computes with 2 of them") !=
        std::string::npos);
  const auto batch = static_cast<std::int64_t>(small.cover.tokens_needed / 1024) + 1;
  const Planned big = planned(mixtral(batch, 1024), hw);
  CHECK(big.cover.tokens_now >= big.cover.tokens_needed);
  CHECK(plan::describe_transfer_cover(big.cover, big.model).find("hidden") != std::string::npos);
  // A dense model with the same streamed bytes computes with all of them: it needs fewer tokens.
  TrainConfig dense = mixtral(1, 1024);
  dense.model.arch = "mistral";
  dense.model.num_experts = 0;
  dense.model.num_experts_per_tok = 0;
  dense.model.intermediate_size = 8 * 14336;
  const Planned d = planned(dense, hw);
  CHECK(d.cover.layer_bytes == Approx(small.cover.layer_bytes).epsilon(0.01));
  CHECK(small.cover.tokens_needed > 3.0 * d.cover.tokens_needed);
}

TEST_CASE("plan: attention FLOPs count the pairs inside sliding windows (gpt-oss, Mistral)", "[plan][moe]") {
  TrainConfig cfg;
  cfg.model.arch = "gpt_oss";
  cfg.model.layers = 2;  // layer 0 slides, layer 1 sees everything
  cfg.model.num_experts = 4;
  cfg.model.sliding_window = 4;
  ModelConfig m = cfg.model_config_from_keys();
  const double full = 10.0 * 11.0 / 2.0, window = 4.0 * 5.0 / 2.0 + 6.0 * 4.0;  // T = 10
  const double per_pair = 2.0 * static_cast<double>(m.q_dim()) * 3.0;           // batch 3
  CHECK(plan::layer_flops(m, 3, 10).attention_forward ==
        Approx(plan::kAttentionForwardProducts * per_pair * (full + window) / 2.0));
  m.sliding_layers.clear();  // no sliding layer: every layer's causal pairs
  CHECK(plan::layer_flops(m, 3, 10).attention_forward == Approx(plan::kAttentionForwardProducts * per_pair * full));
  CHECK(plan::layer_flops(m, 3, 3).attention_forward ==  // shorter than the window: all pairs either way
        Approx(plan::kAttentionForwardProducts * 2.0 * static_cast<double>(m.q_dim()) * 3.0 * 6.0));
}
