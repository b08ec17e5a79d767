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
  c.arch = mt::Arch::mistral, c.num_experts = 0;          // the same shape without experts
  c.validate();
  CHECK(mt::active_param_count(c) == mt::total_param_count(c));
}

TEST_CASE("gpt-oss-120b: 116.8B parameters, 5.7B active per token (top-4 of 128, embeddings counted)", "[layout]") {
  mt::ModelConfig c;  // the hub's config.json of openai/gpt-oss-120b
  c.arch = mt::Arch::gpt_oss;
  c.vocab_size = 201088, c.hidden_size = 2880, c.num_hidden_layers = 36, c.num_attention_heads = 64;
  c.num_key_value_heads = 8, c.head_dim = 64, c.intermediate_size = 2880, c.max_position_embeddings = 131072;
  c.attention_bias = true, c.num_experts = 128, c.num_experts_per_tok = 4, c.moe_intermediate_size = 2880;
  c.norm_topk_prob = false, c.sliding_window = 128;
  for (std::int64_t l = 0; l < 36; l += 2) c.sliding_layers.push_back(l);
  c.validate();
  // By hand: q 4096 x 2880 + 4096, k and v 512 x 2880 + 512, o 2880 x 4096 + 2880, 64 sinks, two norms;
  // router 128 x 2880 + 128; each expert gate and up 2880 x 2880 + 2880, down 2880 x 2880 + 2880.
  const std::int64_t d = 2880, attention = 2 * (4096 * d) + 4096 + 2 * (512 * d + 512) + d + 64 + 2 * d;
  const std::int64_t router = 128 * d + 128, expert = 3 * (d * d + d), outside = 2 * 201088 * d + d;
  CHECK(mt::total_param_count(c) == outside + 36 * (attention + router + 128 * expert));
  CHECK(mt::total_param_count(c) == 116829156672);  // "116.8B", as OpenAI's model card says
  CHECK(mt::active_param_count(c) == outside + 36 * (attention + router + 4 * expert));
  // Sliding and full layers have the same tensors.
  CHECK(mt::layer_layout(c, 0).param_count() == mt::layer_layout(c, 1).param_count());
  CHECK(mt::layer_layout(c, 0).find("self_attn.sinks") != nullptr);
  CHECK(mt::layer_layout(c, 1).find("mlp.experts.127.down_proj.bias") != nullptr);
}

TEST_CASE("Qwen3-30B-A3B: 30.5B parameters, 3.3B active per token (top-8 of 128)", "[layout]") {
  mt::ModelConfig c;  // the hub's config.json of Qwen/Qwen3-30B-A3B
  c.arch = mt::Arch::qwen3_moe;
  c.vocab_size = 151936, c.hidden_size = 2048, c.num_hidden_layers = 48, c.num_attention_heads = 32;
  c.num_key_value_heads = 4, c.head_dim = 128, c.intermediate_size = 6144, c.max_position_embeddings = 40960;
  c.qk_norm = true, c.num_experts = 128, c.num_experts_per_tok = 8, c.moe_intermediate_size = 768;
  c.norm_topk_prob = true;
  c.validate();
  // By hand: q 4096 x 2048, k and v 512 x 2048, o 2048 x 4096, q/k norms 128 each, two norms; router
  // 128 x 2048; each expert gate, up 768 x 2048 and down 2048 x 768.
  const std::int64_t d = 2048, attention = 2 * 4096 * d + 2 * 512 * d + 2 * 128 + 2 * d, router = 128 * d;
  const std::int64_t expert = 3 * 768 * d, outside = 2 * 151936 * d + d;
  CHECK(mt::total_param_count(c) == outside + 48 * (attention + router + 128 * expert));
  CHECK(mt::active_param_count(c) == outside + 48 * (attention + router + 8 * expert));
  CHECK(mt::total_param_count(c) / 100'000'000 == 305);  // the published 30.5B
  CHECK(mt::active_param_count(c) / 100'000'000 == 33);  // and 3.3B
  const auto l = mt::layer_layout(c, 7);
  CHECK(l.at("mlp.gate.weight").shape == std::vector<std::int64_t>{128, 2048});
  CHECK(l.at("mlp.experts.127.down_proj.weight").shape == std::vector<std::int64_t>{2048, 768});
  CHECK(l.find("mlp.gate_proj.weight") == nullptr);
}

TEST_CASE("Qwen3-MoE dense layers: mlp_only_layers and decoder_sparse_step, transformers' rule", "[layout]") {
  mt::ModelConfig c;
  c.arch = mt::Arch::qwen3_moe;
  c.vocab_size = 100, c.hidden_size = 32, c.num_hidden_layers = 8, c.num_attention_heads = 4;
  c.num_key_value_heads = 2, c.head_dim = 8, c.intermediate_size = 48, c.max_position_embeddings = 64;
  c.qk_norm = true, c.num_experts = 4, c.num_experts_per_tok = 2, c.moe_intermediate_size = 16;
  c.validate();
  CHECK_FALSE(c.layers_differ());
  c.decoder_sparse_step = 3, c.mlp_only_layers = {5};
  c.validate();
  CHECK(c.layers_differ());
  // experts where (l + 1) % 3 == 0 and l is not listed: of layers 2 and 5, 5 is listed, so layer 2 alone
  const std::vector<bool> want = {false, false, true, false, false, false, false, false};
  for (std::int64_t l = 0; l < 8; ++l) {
    INFO("layer " << l);
    CHECK(c.layer_is_moe(l) == want[static_cast<std::size_t>(l)]);
    const auto layout = mt::layer_layout(c, l);
    CHECK(layout.prefix == "model.layers." + std::to_string(l) + ".");
    CHECK((layout.find("mlp.gate.weight") != nullptr) == want[static_cast<std::size_t>(l)]);
    CHECK((layout.find("mlp.gate_proj.weight") != nullptr) == !want[static_cast<std::size_t>(l)]);
    const mt::ModelConfig lc = c.layer_config(l);
    CHECK_FALSE(lc.layers_differ());
    CHECK(lc.is_moe() == want[static_cast<std::size_t>(l)]);
    CHECK(mt::layer_layout(lc, l).total_floats == layout.total_floats);
  }
  CHECK(mt::layer_layout(c, 0).at("mlp.down_proj.weight").shape == std::vector<std::int64_t>{32, 48});
  CHECK(mt::layer_layout(c, 2).at("mlp.experts.3.up_proj.weight").shape == std::vector<std::int64_t>{16, 32});
  CHECK(mt::active_param_count(c) < mt::total_param_count(c));
  c.mlp_only_layers = {8};
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("mlp_only_layers holds 8"));
  c.mlp_only_layers = {3, 1};
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("sorted"));
  c.mlp_only_layers = {}, c.decoder_sparse_step = 0;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("decoder_sparse_step"));
  c.decoder_sparse_step = 2, c.arch = mt::Arch::mixtral, c.qk_norm = false;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("Qwen3-MoE's"));
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
