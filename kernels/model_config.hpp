// The shape of a decoder-only model: everything the kernels and the memory layout need to know.
// Field names follow Hugging Face config.json where one exists (config/ parses those files into this).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

enum class Arch { llama, qwen2, qwen3, mistral, gpt2, mixtral, qwen3_moe, gpt_oss };

// "llama", "qwen2", ... (the Hugging Face model_type) and back; parse throws std::invalid_argument.
const char* arch_name(Arch a);
Arch parse_arch(const std::string& model_type);

// rope_scaling from config.json (Hugging Face's rope_type and its fields); type none = plain RoPE.
// Each type reads only its own fields (storage/hf refuses the others by name):
//   llama3:  factor, low_freq_factor, high_freq_factor, original_max_position_embeddings (all required)
//   linear:  factor (positions / factor, i.e. inv_freq / factor)
//   dynamic: factor; original_max_position_embeddings 0 = max_position_embeddings (transformers always
//            uses max_position_embeddings, so a different value is refused): NTK-aware base growth when
//            the sequence is longer than that
//   yarn:    factor, beta_fast (32), beta_slow (1), attention_factor (0 = computed), mscale and
//            mscale_all_dim (0 = absent), original_max_position_embeddings (0 = absent: the correction
//            range is for max_position_embeddings), truncate (true: floor/ceil the correction range)
enum class RopeType { none, llama3, linear, dynamic, yarn };
const char* rope_type_name(RopeType t);  // "default", "llama3", "linear", "dynamic", "yarn"

struct RopeScaling {
  RopeType type = RopeType::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 0;  // 0 = absent (llama3 requires it)
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 0.0;  // yarn; 0 = transformers' default from factor (and mscale)
  double mscale = 0.0;            // yarn; 0 = absent
  double mscale_all_dim = 0.0;    // yarn; 0 = absent
  bool truncate = true;           // yarn

  bool operator==(const RopeScaling& o) const {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor &&
           original_max_position_embeddings == o.original_max_position_embeddings && beta_fast == o.beta_fast &&
           beta_slow == o.beta_slow && attention_factor == o.attention_factor && mscale == o.mscale &&
           mscale_all_dim == o.mscale_all_dim && truncate == o.truncate;
  }
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
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

  // Mixture of experts (Mixtral, Qwen3-MoE; num_experts == 0: a dense MLP). A MoE layer's MLP is
  // num_experts SwiGLU experts of width moe_intermediate_size; a router (a [num_experts, hidden] linear)
  // scores them per token, softmax in fp32, keeps the num_experts_per_tok best and, with norm_topk_prob,
  // divides their weights by their sum (Mixtral always does). Experts that no token chose get a zero
  // gradient. Qwen3-MoE may keep some layers dense (width intermediate_size): those in mlp_only_layers
  // and those whose (index + 1) is not a multiple of decoder_sparse_step (transformers' rule).
  std::int64_t num_experts = 0;            // num_local_experts (Mixtral) / num_experts (Qwen3-MoE)
  std::int64_t num_experts_per_tok = 0;    // top-k
  std::int64_t moe_intermediate_size = 0;  // an expert's width (Mixtral: intermediate_size)
  bool norm_topk_prob = true;
  // The load-balancing loss (transformers' output_router_logits, off in every hub config): coef times
  // load_balancing_loss_func over all MoE layers' router outputs joins each micro-batch's loss
  // (kernels/step_math.hpp says how, with several micro-batches).
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.0;
  std::vector<std::int64_t> mlp_only_layers;  // Qwen3-MoE: layers with a dense MLP (sorted, no repeats)
  std::int64_t decoder_sparse_step = 1;       // Qwen3-MoE: every step-th layer has experts

  // gpt-oss (arch gpt_oss): attention with q/k/v/o biases (attention_bias) and one sink logit per head
  // (an extra softmax column without a value); the layers of sliding_layers (config.json's layer_types,
  // "sliding_attention") see only the last sliding_window positions; the router has a bias, takes the
  // top k of its logits and a softmax over those k; each expert has biases and the clamped activation
  // (ops.hpp: clamped_swiglu, alpha 1.702 as transformers fixes it, limit swiglu_limit) on its gate and up
  // projections (HF stores them interleaved in one gate_up_proj; the layout keeps them apart).
  // Mistral and Mixtral slide on every layer when their sliding_window is shorter than the context.
  std::int64_t sliding_window = 0;           // the window of the sliding layers
  std::vector<std::int64_t> sliding_layers;  // layers with sliding-window attention (sorted, no repeats)
  float swiglu_limit = 7.0f;                 // gpt-oss: the clamp of the expert activation
  static constexpr float kGptOssSwigluAlpha = 1.702f;

  bool is_gpt2() const { return arch == Arch::gpt2; }
  bool is_moe() const { return num_experts > 0; }
  bool is_gpt_oss() const { return arch == Arch::gpt_oss; }
  bool attention_sinks() const { return is_gpt_oss(); }
  bool o_proj_bias() const {
    return is_gpt_oss() && attention_bias;
  }                                                 // transformers biases o_proj with q/k/v only here
  bool moe_biases() const { return is_gpt_oss(); }  // the router's and the experts'
  // The attention window of the layers of a config whose layers are alike (layer_config's): 0 for none.
  std::int64_t attention_window() const { return sliding_layers.empty() ? 0 : sliding_window; }
  bool layer_slides(std::int64_t layer) const;
  // Whether layer `layer` (0-based) has experts; false for every layer of a dense model.
  bool layer_is_moe(std::int64_t layer) const;
  // Whether some layer lacks the experts the config has (Qwen3-MoE's dense layers) or some layers slide
  // and others do not (gpt-oss). A stage computes with the config of its own layer (layer_config); the
  // layer functions refuse such a config.
  bool layers_differ() const;
  // The config one layer computes with: every layer alike (mlp_only_layers empty, decoder_sparse_step
  // 1, sliding_layers every layer or none); a Qwen3-MoE layer without experts becomes a qwen3 layer of
  // width intermediate_size.
  ModelConfig layer_config(std::int64_t layer) const;
  // Sequences longer than max_position_embeddings are refused (validate_batch_shape, the engine) but
  // with dynamic rope_scaling, whose NTK-aware base grows for exactly those (transformers' dynamic RoPE).
  bool positions_extend_past_max() const { return rope_scaling.type == RopeType::dynamic; }
  std::int64_t q_dim() const { return num_attention_heads * head_dim; }
  std::int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  // Throws std::invalid_argument naming the first field that is missing, non-positive or inconsistent
  // (heads that do not divide, kv heads that do not divide heads, ...).
  void validate() const;
};

}  // namespace mt
