// The shape of a decoder-only model: everything the kernels and the memory layout need to know.
// Field names follow Hugging Face config.json where one exists (config/ parses those files into this).
#pragma once
#include <cstdint>
#include <string>

namespace mt {

enum class Arch { llama, qwen2, qwen3, mistral, gpt2 };

// "llama", "qwen2", ... (the Hugging Face model_type) and back; parse throws std::invalid_argument.
const char* arch_name(Arch a);
Arch parse_arch(const std::string& model_type);

// Llama-3 style frequency-dependent RoPE scaling (rope_scaling.rope_type == "llama3"); factor 0 = none.
struct RopeScaling {
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  std::int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Arch arch = Arch::llama;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;  // d_model
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;      // == num_attention_heads without GQA
  std::int64_t head_dim = 0;                 // usually hidden_size / num_attention_heads
  std::int64_t intermediate_size = 0;        // MLP width (GPT-2: 4 x hidden_size)
  std::int64_t max_position_embeddings = 0;  // rotary table length / GPT-2 position table rows
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  float norm_eps = 1e-5f;            // rms_norm_eps, or layer_norm_epsilon for GPT-2
  bool tie_word_embeddings = false;  // LM head shares the embedding matrix
  bool attention_bias = false;       // q/k/v biases (Qwen2 sets this)
  bool qk_norm = false;              // RMSNorm over each head of q and k (Qwen3)
  float initializer_range = 0.02f;   // std of the normal init, as Hugging Face uses

  bool is_gpt2() const { return arch == Arch::gpt2; }
  std::int64_t q_dim() const { return num_attention_heads * head_dim; }
  std::int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  // Throws std::invalid_argument naming the first field that is missing, non-positive or inconsistent
  // (heads that do not divide, kv heads that do not divide heads, ...).
  void validate() const;
};

}  // namespace mt
