// Tiny model shapes used across the kernel tests: one per supported family and feature.
#pragma once
#include <vector>

#include "kernels/model_config.hpp"

namespace mt::test {

inline ModelConfig tiny_llama() {  // grouped-query attention, untied head
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.intermediate_size = 24;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  return c;
}

inline ModelConfig tiny_qwen2() {  // q/k/v bias, tied head
  ModelConfig c = tiny_llama();
  c.arch = Arch::qwen2;
  c.attention_bias = true;
  c.num_key_value_heads = 1;
  c.rope_theta = 1000000.0f;
  c.norm_eps = 1e-6f;
  c.tie_word_embeddings = true;
  return c;
}

inline ModelConfig tiny_qwen3() {  // q/k RMSNorm, head_dim * heads != hidden
  ModelConfig c = tiny_llama();
  c.arch = Arch::qwen3;
  c.qk_norm = true;
  c.head_dim = 8;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  return c;
}

inline ModelConfig tiny_llama3_scaled() {  // Llama-3 rope_scaling, all three frequency regimes
  ModelConfig c = tiny_llama();
  c.head_dim = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = RopeType::llama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 16;
  return c;
}

inline ModelConfig tiny_linear_rope() {  // rope_scaling linear: positions / 4
  ModelConfig c = tiny_llama();
  c.head_dim = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.rope_scaling.type = RopeType::linear;
  c.rope_scaling.factor = 4.0;
  return c;
}

// rope_scaling dynamic over max_position_embeddings 5: sequences of 6 and more grow the base (NTK), those
// of 5 and fewer are plain RoPE.
inline ModelConfig tiny_dynamic_rope() {
  ModelConfig c = tiny_llama();
  c.head_dim = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 5;
  c.rope_scaling.type = RopeType::dynamic;
  c.rope_scaling.factor = 2.0;
  return c;
}

// rope_scaling yarn shaped like gpt-oss's (factor 32 = 8192 / 256, beta 32 / 1, truncate false, theta
// 150000): at head_dim 16 the correction range [0.16, 2.49] puts frequencies in all three regimes.
inline ModelConfig tiny_yarn_rope() {
  ModelConfig c = tiny_llama();
  c.head_dim = 16;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 8192;
  c.rope_theta = 150000.0f;
  c.rope_scaling.type = RopeType::yarn;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.original_max_position_embeddings = 256;
  c.rope_scaling.beta_fast = 32.0;
  c.rope_scaling.beta_slow = 1.0;
  c.rope_scaling.truncate = false;
  return c;
}

// Mixtral: a mixture of 4 SwiGLU experts of width 12, top-2 with the weights renormalised; Mistral's
// attention (GQA, no biases).
inline ModelConfig tiny_mixtral() {
  ModelConfig c = tiny_llama();
  c.arch = Arch::mixtral;
  c.intermediate_size = 12;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.rope_theta = 1000000.0f;
  return c;
}

// Qwen3-MoE: 4 experts of width 12, top-2 with the weights *not* renormalised (transformers' default
// norm_topk_prob=false); Qwen3's attention (GQA, q/k norms). Every layer has experts.
inline ModelConfig tiny_qwen3_moe() {
  ModelConfig c = tiny_llama();
  c.arch = Arch::qwen3_moe;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = false;
  c.rope_theta = 1000000.0f;
  return c;
}

// Qwen3-MoE with dense layers among the expert layers (a model only: the layer functions take one
// layer's config): 6 layers, decoder_sparse_step 2 (layers 1, 3, 5 have experts) and mlp_only_layers
// {3}, so layers 1 and 5 route and 0, 2, 3, 4 are dense SwiGLU layers of width 24.
inline ModelConfig tiny_qwen3_moe_mixed() {
  ModelConfig c = tiny_qwen3_moe();
  c.num_hidden_layers = 6;
  c.intermediate_size = 24;
  c.decoder_sparse_step = 2;
  c.mlp_only_layers = {3};
  return c;
}

// gpt-oss: q/k/v/o biases, sinks, every layer sliding (window 3, shorter than the tests' sequences), the
// router top-k then softmax with a bias, experts with biases and a clamp low enough to bite (0.4).
inline ModelConfig tiny_gpt_oss() {
  ModelConfig c = tiny_llama();
  c.arch = Arch::gpt_oss;
  c.attention_bias = true;
  c.head_dim = 8;  // heads * head_dim != hidden, as gpt-oss (64 x 64 on 2880)
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.intermediate_size = 12;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = false;
  c.rope_theta = 150000.0f;
  c.sliding_window = 3;
  c.sliding_layers = {0, 1};
  c.swiglu_limit = 0.4f;
  return c;
}

// gpt-oss as the hub's models are: sliding and full attention alternating by layer (a model only: the
// layer functions take one layer's config), 4 layers, YaRN positions (truncate false).
inline ModelConfig tiny_gpt_oss_alternating() {
  ModelConfig c = tiny_gpt_oss();
  c.num_hidden_layers = 4;
  c.sliding_layers = {0, 2};
  c.max_position_embeddings = 64;
  c.rope_scaling.type = RopeType::yarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 16;
  c.rope_scaling.truncate = false;
  return c;
}

// Mistral's sliding window on every layer: 3 positions, shorter than the tests' sequences.
inline ModelConfig tiny_mistral_sliding() {
  ModelConfig c = tiny_llama();
  c.arch = Arch::mistral;
  c.sliding_window = 3;
  c.sliding_layers = {0, 1};
  return c;
}

inline ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.vocab_size = 41;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 32;
  c.norm_eps = 1e-5f;
  c.tie_word_embeddings = true;
  return c;
}

// Every family and feature above, named (tests loop over them).
struct Named {
  const char* name;
  ModelConfig cfg;
};
inline std::vector<Named> all_configs() {
  return {{"llama-gqa", tiny_llama()},
          {"qwen2-bias", tiny_qwen2()},
          {"qwen3-qknorm", tiny_qwen3()},
          {"llama3-rope-scaling", tiny_llama3_scaled()},
          {"linear-rope-scaling", tiny_linear_rope()},
          {"dynamic-rope-scaling", tiny_dynamic_rope()},
          {"yarn-rope-scaling", tiny_yarn_rope()},
          {"mixtral-moe", tiny_mixtral()},
          {"qwen3-moe", tiny_qwen3_moe()},
          {"gpt-oss", tiny_gpt_oss()},
          {"mistral-sliding-window", tiny_mistral_sliding()},
          {"gpt2", tiny_gpt2()}};
}

}  // namespace mt::test
