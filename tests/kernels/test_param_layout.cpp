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
