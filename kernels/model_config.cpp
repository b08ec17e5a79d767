#include "kernels/model_config.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

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
    case Arch::mixtral:
      return "mixtral";
    case Arch::qwen3_moe:
      return "qwen3_moe";
    case Arch::gpt_oss:
      return "gpt_oss";
  }
  return "?";
}

Arch parse_arch(const std::string& model_type) {
  for (Arch a : {Arch::llama, Arch::qwen2, Arch::qwen3, Arch::mistral, Arch::gpt2, Arch::mixtral, Arch::qwen3_moe,
                 Arch::gpt_oss})
    if (model_type == arch_name(a)) return a;
  throw std::invalid_argument("unsupported model_type '" + model_type +
                              "' (supported: llama, qwen2, qwen3, mistral, gpt2, mixtral, qwen3_moe, gpt_oss)");
}

const char* rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::none:
      return "default";
    case RopeType::llama3:
      return "llama3";
    case RopeType::linear:
      return "linear";
    case RopeType::dynamic:
      return "dynamic";
    case RopeType::yarn:
      return "yarn";
  }
  return "?";
}

namespace {

// rope_scaling's numbers, each error naming its field (fail prefixes "model config: ").
template <class Fail>
void validate_rope_scaling(const ModelConfig& c, Fail fail) {
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeType::none) return;
  const std::string type = rope_type_name(rs.type);
  auto num = [&](double v) { return std::to_string(v); };
  if (!(rs.factor >= 1.0) || !std::isfinite(rs.factor))
    fail("rope_scaling.factor must be >= 1, got " + num(rs.factor) + " (rope_type " + type + ")");
  if (rs.original_max_position_embeddings < 0)
    fail("rope_scaling.original_max_position_embeddings must be > 0, got " +
         std::to_string(rs.original_max_position_embeddings));
  switch (rs.type) {
    case RopeType::none:
    case RopeType::linear:
      break;
    case RopeType::llama3:
      if (rs.original_max_position_embeddings <= 0)
        fail("rope_scaling.original_max_position_embeddings must be > 0 for llama3");
      if (!(rs.low_freq_factor > 0.0)) fail("rope_scaling.low_freq_factor must be > 0, got " + num(rs.low_freq_factor));
      if (!(rs.high_freq_factor > rs.low_freq_factor)) fail("rope_scaling.high_freq_factor must be > low_freq_factor");
      break;
    case RopeType::dynamic:
      // transformers' _compute_dynamic_ntk_parameters grows the base past config.max_position_embeddings,
      // whatever rope_scaling.original_max_position_embeddings says ("TODO" there): a different value
      // would make us disagree with it.
      if (rs.original_max_position_embeddings != 0 && rs.original_max_position_embeddings != c.max_position_embeddings)
        fail("rope_scaling.original_max_position_embeddings (" + std::to_string(rs.original_max_position_embeddings) +
             ") must equal max_position_embeddings (" + std::to_string(c.max_position_embeddings) +
             ") for dynamic: transformers scales from max_position_embeddings");
      if (c.head_dim <= 2) fail("dynamic rope_scaling needs head_dim > 2 (the base exponent is dim / (dim - 2))");
      break;
    case RopeType::yarn:
      if (!(rs.beta_fast > 0.0)) fail("rope_scaling.beta_fast must be > 0, got " + num(rs.beta_fast));
      if (!(rs.beta_slow > 0.0)) fail("rope_scaling.beta_slow must be > 0, got " + num(rs.beta_slow));
      if (!(rs.beta_fast >= rs.beta_slow))
        fail("rope_scaling.beta_fast (" + num(rs.beta_fast) + ") must be >= beta_slow (" + num(rs.beta_slow) + ")");
      if (!(rs.attention_factor >= 0.0))
        fail("rope_scaling.attention_factor must be > 0, got " + num(rs.attention_factor));
      if (!(rs.mscale >= 0.0)) fail("rope_scaling.mscale must be >= 0, got " + num(rs.mscale));
      if (!(rs.mscale_all_dim >= 0.0)) fail("rope_scaling.mscale_all_dim must be >= 0, got " + num(rs.mscale_all_dim));
      // Newer transformers replace factor by max_position_embeddings / original_max_position_embeddings
      // when the latter is given; 4.46 uses factor. Both agree only when the two are equal.
      if (rs.original_max_position_embeddings > 0 &&
          rs.factor !=
              static_cast<double>(c.max_position_embeddings) / static_cast<double>(rs.original_max_position_embeddings))
        fail("rope_scaling.factor (" + num(rs.factor) + ") must equal max_position_embeddings / " +
             "rope_scaling.original_max_position_embeddings (" + std::to_string(c.max_position_embeddings) + " / " +
             std::to_string(rs.original_max_position_embeddings) + ") for yarn");
      break;
  }
}

}  // namespace

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
    if (rope_scaling.type != RopeType::none) fail("gpt2 has no rotary embeddings: rope_scaling must be default");
  } else {
    if (head_dim % 2 != 0) fail("head_dim must be even for rotary embeddings, got " + std::to_string(head_dim));
    if (!(rope_theta > 0.0f)) fail("rope_theta must be > 0");
    validate_rope_scaling(*this, fail);
  }
  if (arch == Arch::mixtral && !is_moe()) fail("mixtral needs num_experts (num_local_experts) > 0");
  if (arch == Arch::qwen3_moe && !is_moe()) fail("qwen3_moe needs num_experts > 0");
  if (arch == Arch::qwen3_moe && !qk_norm) fail("qwen3_moe always has q/k norms (qk_norm)");
  if (decoder_sparse_step < 1) fail("decoder_sparse_step must be >= 1, got " + std::to_string(decoder_sparse_step));
  if ((decoder_sparse_step != 1 || !mlp_only_layers.empty()) && arch != Arch::qwen3_moe)
    fail(std::string("mlp_only_layers and decoder_sparse_step are Qwen3-MoE's (this is ") + arch_name(arch) + ")");
  for (std::size_t i = 0; i < mlp_only_layers.size(); ++i) {
    const std::int64_t l = mlp_only_layers[i];
    if (l < 0 || l >= num_hidden_layers)
      fail("mlp_only_layers holds " + std::to_string(l) + ", not a layer in [0, " + std::to_string(num_hidden_layers) +
           ")");
    if (i > 0 && l <= mlp_only_layers[i - 1]) fail("mlp_only_layers must be sorted without repeats");
  }
  if (is_gpt_oss()) {
    if (!is_moe()) fail("gpt_oss needs num_experts (num_local_experts) > 0");
    if (qk_norm) fail("gpt_oss has no q/k norms");
    if (sliding_window < 0) fail("sliding_window must be >= 0, got " + std::to_string(sliding_window));
    if (!sliding_layers.empty() && sliding_window <= 0)
      fail("layer_types has sliding_attention layers but sliding_window is " + std::to_string(sliding_window));
    if (!(swiglu_limit > 0.0f) || !std::isfinite(swiglu_limit))
      fail("swiglu_limit must be > 0 and finite, got " + std::to_string(swiglu_limit));
  } else if (arch == Arch::mistral || arch == Arch::mixtral) {
    if (sliding_window < 0) fail("sliding_window must be >= 0, got " + std::to_string(sliding_window));
    if ((sliding_window > 0) != !sliding_layers.empty() ||
        (!sliding_layers.empty() && static_cast<std::int64_t>(sliding_layers.size()) != num_hidden_layers))
      fail(std::string(arch_name(arch)) + "'s sliding window is every layer's or none's");
  } else if (sliding_window != 0 || !sliding_layers.empty()) {
    fail(std::string("a sliding window is gpt-oss's, Mistral's and Mixtral's here (this is ") + arch_name(arch) + ")");
  }
  for (std::size_t i = 0; i < sliding_layers.size(); ++i) {
    const std::int64_t l = sliding_layers[i];
    if (l < 0 || l >= num_hidden_layers)
      fail("sliding layers hold " + std::to_string(l) + ", not a layer in [0, " + std::to_string(num_hidden_layers) +
           ")");
    if (i > 0 && l <= sliding_layers[i - 1]) fail("sliding layers must be sorted without repeats");
  }
  if (is_moe()) {
    if (is_gpt2()) fail("gpt2 has no mixture-of-experts form");
    if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
      fail("num_experts_per_tok must be in [1, num_experts=" + std::to_string(num_experts) + "], got " +
           std::to_string(num_experts_per_tok));
    if (moe_intermediate_size <= 0)
      fail("moe_intermediate_size (an expert's width) must be > 0, got " + std::to_string(moe_intermediate_size));
    if (num_experts > (1 << 20)) fail("num_experts must be <= 2^20, got " + std::to_string(num_experts));
  } else if (num_experts < 0) {
    fail("num_experts must be >= 0, got " + std::to_string(num_experts));
  }
  if (output_router_logits && !is_moe()) fail("output_router_logits (the load-balancing loss) needs experts");
  if (!(router_aux_loss_coef >= 0.0) || !std::isfinite(router_aux_loss_coef))
    fail("router_aux_loss_coef must be >= 0 and finite");
  if (!(norm_eps > 0.0f)) fail("norm eps must be > 0");
  if (!(initializer_range > 0.0f)) fail("initializer_range must be > 0");
}

bool ModelConfig::layer_is_moe(std::int64_t layer) const {
  if (!is_moe()) return false;
  for (const std::int64_t l : mlp_only_layers)
    if (l == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

bool ModelConfig::layer_slides(std::int64_t layer) const {
  for (const std::int64_t l : sliding_layers)
    if (l == layer) return true;
  return false;
}

bool ModelConfig::layers_differ() const {
  if (!sliding_layers.empty() && static_cast<std::int64_t>(sliding_layers.size()) != num_hidden_layers) return true;
  if (!is_moe() || (mlp_only_layers.empty() && decoder_sparse_step == 1)) return false;
  for (std::int64_t l = 0; l < num_hidden_layers; ++l)
    if (!layer_is_moe(l)) return true;
  return false;
}

ModelConfig ModelConfig::layer_config(std::int64_t layer) const {
  ModelConfig c = *this;
  c.mlp_only_layers.clear();
  c.decoder_sparse_step = 1;
  c.sliding_layers.clear();
  if (layer_slides(layer))  // every layer of the layer's own config slides
    for (std::int64_t l = 0; l < num_hidden_layers; ++l) c.sliding_layers.push_back(l);
  if (is_moe() && !layer_is_moe(layer)) {
    c.arch = Arch::qwen3;  // validate() admits mlp_only_layers for qwen3_moe only, and a dense one is qwen3
    c.num_experts = 0, c.num_experts_per_tok = 0, c.moe_intermediate_size = 0;
    c.output_router_logits = false, c.router_aux_loss_coef = 0.0;  // no router here
  }
  return c;
}

}  // namespace mt
