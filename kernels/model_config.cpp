#include "kernels/model_config.hpp"

#include <stdexcept>

namespace mt {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::llama:
      return "llama";
    case Arch::qwen2:
      return "qwen2";
    case Arch::qwen3:
      return "qwen3";
    case Arch::mistral:
      return "mistral";
    case Arch::gpt2:
      return "gpt2";
  }
  return "?";
}

Arch parse_arch(const std::string& model_type) {
  for (Arch a : {Arch::llama, Arch::qwen2, Arch::qwen3, Arch::mistral, Arch::gpt2})
    if (model_type == arch_name(a)) return a;
  throw std::invalid_argument("unsupported model_type '" + model_type +
                              "' (supported: llama, qwen2, qwen3, mistral, gpt2)");
}

void ModelConfig::validate() const {
  auto positive = [](std::int64_t v, const char* name) {
    if (v <= 0)
      throw std::invalid_argument(std::string("model config: ") + name + " must be > 0, got " + std::to_string(v));
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(intermediate_size, "intermediate_size");
  positive(max_position_embeddings, "max_position_embeddings");
  auto fail = [](const std::string& what) { throw std::invalid_argument("model config: " + what); };
  if (num_attention_heads % num_key_value_heads != 0)
    fail("num_attention_heads (" + std::to_string(num_attention_heads) +
         ") is not a multiple of num_key_value_heads (" + std::to_string(num_key_value_heads) + ")");
  if (is_gpt2()) {
    if (num_key_value_heads != num_attention_heads)
      fail("gpt2 has no grouped-query attention: num_key_value_heads must equal num_attention_heads");
    if (q_dim() != hidden_size) fail("gpt2 needs num_attention_heads x head_dim == hidden_size");
    if (attention_bias || qk_norm) fail("gpt2 takes neither attention_bias nor qk_norm");
  } else {
    if (head_dim % 2 != 0) fail("head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
    if (!(rope_theta > 0.0f)) fail("rope_theta must be > 0");
    if (rope_scaling.factor != 0.0f && !(rope_scaling.factor >= 1.0f)) fail("rope_scaling.factor must be >= 1");
    if (rope_scaling.factor != 0.0f && !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))
      fail("rope_scaling.high_freq_factor must be > low_freq_factor");
  }
  if (!(norm_eps > 0.0f)) fail("norm eps must be > 0");
  if (!(initializer_range > 0.0f)) fail("initializer_range must be > 0");
}

}  // namespace mt
