#include <catch2/catch.hpp>

#include "kernels/param_layout.hpp"

namespace {
mt::ModelConfig gpt2_small() {
  mt::ModelConfig c;
  c.arch = mt::Arch::gpt2;
  c.vocab_size = 50257, c.hidden_size = 768, c.num_hidden_layers = 12, c.num_attention_heads = 12;
  c.num_key_value_heads = 12, c.head_dim = 64, c.intermediate_size = 3072, c.max_position_embeddings = 1024;
  c.tie_word_embeddings = true;
  return c;
}
}  // namespace

TEST_CASE("GPT-2 124M has the published parameter count", "[layout]") {
  const auto c = gpt2_small();
  c.validate();
  CHECK(mt::total_param_count(c) == 124'439'808);
}

TEST_CASE("Mixtral-8x7B: 46.7B parameters, 12.9B active per token (top-2 of 8)", "[layout]") {
  mt::ModelConfig c;
  c.arch = mt::Arch::mixtral;
  c.vocab_size = 32000, c.hidden_size = 4096, c.num_hidden_layers = 32, c.num_attention_heads = 32;
  c.num_key_value_heads = 8, c.head_dim = 128, c.intermediate_size = 14336, c.max_position_embeddings = 32768;
  c.num_experts = 8, c.num_experts_per_tok = 2, c.moe_intermediate_size = 14336;
  c.validate();
  // By hand: attention q, k, v, o; two norms; router 8 x 4096; each expert w1, w3, w2.
  const std::int64_t d = 4096, attention = d * d * 2 + 2 * (1024 * d), norms = 2 * d, router = 8 * d;
  const std::int64_t expert = 3 * d * 14336, outside = 2 * 32000 * d + d;  // embedding, LM head, final norm
  CHECK(mt::total_param_count(c) == outside + 32 * (attention + norms + router + 8 * expert));
  CHECK(mt::active_param_count(c) == outside + 32 * (attention + norms + router + 2 * expert));
  CHECK(mt::layer_active_param_count(c, 5) == attention + norms + router + 2 * expert);
  CHECK(mt::total_param_count(c) / 100'000'000 == 467);   // the published 46.7B
  CHECK(mt::active_param_count(c) / 100'000'000 == 128);  // and 12.9B (12.88B)
  c.num_experts = 0;
  c.validate();
  CHECK(mt::active_param_count(c) == mt::total_param_count(c));
}

TEST_CASE("Llama layout with GQA, biases and qk-norm", "[layout]") {
  mt::ModelConfig c;
  c.arch = mt::Arch::qwen3;
  c.vocab_size = 1000, c.hidden_size = 64, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.num_key_value_heads = 2, c.head_dim = 16, c.intermediate_size = 96, c.max_position_embeddings = 128;
  c.attention_bias = true, c.qk_norm = true;
  c.validate();
  const auto l = mt::layer_layout(c, 1);
  CHECK(l.prefix == "model.layers.1.");
  CHECK(l.at("self_attn.k_proj.weight").shape == std::vector<std::int64_t>{32, 64});
  CHECK(l.at("self_attn.q_norm.weight").numel == 16);
  CHECK_FALSE(l.at("self_attn.q_proj.bias").weight_decay);
  CHECK(l.at("mlp.down_proj.weight").weight_decay);
  for (const auto& t : l.tensors) CHECK(t.offset % mt::kAlignFloats == 0);
  CHECK(mt::head_layout(c).find("lm_head.weight") != nullptr);
  c.tie_word_embeddings = true;
  CHECK(mt::head_layout(c).find("lm_head.weight") == nullptr);
  CHECK_THROWS_WITH(l.at("nope"), Catch::Contains("model.layers.1.nope"));
}

TEST_CASE("model config validation names the bad field", "[layout]") {
  auto c = gpt2_small();
  c.num_hidden_layers = 0;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("num_hidden_layers"));
  c = gpt2_small();
  c.arch = mt::Arch::llama;
  c.num_key_value_heads = 5;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("num_key_value_heads"));
  CHECK_THROWS_WITH(mt::parse_arch("bert"), Catch::Contains("bert"));
}
