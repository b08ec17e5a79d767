// config_to_json: the config.json transformers 4.46 loads for a ModelConfig.
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "storage/hf/hf_config.hpp"

namespace mt::hf {

using nlohmann::json;

namespace {

// The shortest decimal that reads back as the same float (1e-6f is written 1e-06, not 9.99999997e-07).
double short_decimal(float f) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

}  // namespace

json rope_scaling_json(const RopeScaling& rs) {
  if (rs.type == RopeType::none) return nullptr;
  json j = {{"rope_type", rope_type_name(rs.type)}, {"factor", rs.factor}};
  switch (rs.type) {
    case RopeType::none:
    case RopeType::linear:
      break;
    case RopeType::llama3:
      j["low_freq_factor"] = rs.low_freq_factor;
      j["high_freq_factor"] = rs.high_freq_factor;
      j["original_max_position_embeddings"] = rs.original_max_position_embeddings;
      break;
    case RopeType::dynamic:
      if (rs.original_max_position_embeddings > 0)
        j["original_max_position_embeddings"] = rs.original_max_position_embeddings;
      break;
    case RopeType::yarn:
      j["beta_fast"] = rs.beta_fast;
      j["beta_slow"] = rs.beta_slow;
      if (rs.attention_factor > 0.0) j["attention_factor"] = rs.attention_factor;
      // The keys below are newer than transformers 4.46, which warns about them and ignores them:
      // written only when set, so a 4.46-shaped config stays one.
      if (rs.mscale > 0.0) j["mscale"] = rs.mscale;
      if (rs.mscale_all_dim > 0.0) j["mscale_all_dim"] = rs.mscale_all_dim;
      if (rs.original_max_position_embeddings > 0)
        j["original_max_position_embeddings"] = rs.original_max_position_embeddings;
      if (!rs.truncate) j["truncate"] = false;
      break;
  }
  return j;
}

const char* architecture_class(Arch a) {
  switch (a) {
    case Arch::llama:
      return "LlamaForCausalLM";
    case Arch::qwen2:
      return "Qwen2ForCausalLM";
    case Arch::qwen3:
      return "Qwen3ForCausalLM";
    case Arch::mistral:
      return "MistralForCausalLM";
    case Arch::gpt2:
      return "GPT2LMHeadModel";
    case Arch::mixtral:
      return "MixtralForCausalLM";
    case Arch::qwen3_moe:
      return "Qwen3MoeForCausalLM";
    case Arch::gpt_oss:
      return "GptOssForCausalLM";
  }
  return "?";
}

namespace {
// transformers' attention_bias for these families biases o_proj too, which this engine's layer lacks.
void refuse_biased_attention(const ModelConfig& c) {
  if (c.attention_bias)
    throw HfError(std::string(arch_name(c.arch)) +
                  " export: q/k/v biases without an o_proj bias have no transformers config (attention_bias "
                  "would add o_proj.bias)");
}
}  // namespace

json config_to_json(const ModelConfig& c, const json* base) {
  c.validate();
  json j = (base && base->is_object()) ? *base : json::object();
  j["architectures"] = json::array({architecture_class(c.arch)});
  j["model_type"] = arch_name(c.arch);
  j["vocab_size"] = c.vocab_size;
  j["initializer_range"] = short_decimal(c.initializer_range);
  j["tie_word_embeddings"] = c.tie_word_embeddings || c.is_gpt2();  // GPT-2's LM head is always wte
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  j.erase("quantization_config");  // the export's weights are never quantized (gpt-oss's MXFP4 is read, not written)
  if (c.is_gpt2()) {
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_hidden_layers;
    j["n_head"] = c.num_attention_heads;
    j["n_inner"] = c.intermediate_size;
    j["n_positions"] = c.max_position_embeddings;
    j["layer_norm_epsilon"] = short_decimal(c.norm_eps);
    j["activation_function"] = "gelu_new";
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    return j;
  }
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  if (c.arch == Arch::qwen2) {
    if (c.head_dim * c.num_attention_heads != c.hidden_size)
      throw HfError("qwen2 export: transformers' Qwen2 requires head_dim == hidden_size / num_attention_heads");
    j.erase("head_dim");
  } else {
    j["head_dim"] = c.head_dim;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = short_decimal(c.rope_theta);
  j["rms_norm_eps"] = short_decimal(c.norm_eps);
  j["hidden_act"] = "silu";
  j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  switch (c.arch) {
    case Arch::llama:
      refuse_biased_attention(c);
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      break;
    case Arch::qwen2:
      if (!c.attention_bias) throw HfError("qwen2 export: Qwen2 always has q/k/v biases (attention_bias must be true)");
      j["use_sliding_window"] = false;
      break;
    case Arch::qwen3:
      if (!c.qk_norm) throw HfError("qwen3 export: Qwen3 always has q/k norms");
      refuse_biased_attention(c);
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      break;
    case Arch::mistral:
      j["sliding_window"] = c.attention_window() > 0 ? json(c.sliding_window) : json(nullptr);
      break;
    case Arch::mixtral:
      if (c.attention_bias) throw HfError("mixtral export: Mixtral has no attention biases");
      if (!c.norm_topk_prob || c.moe_intermediate_size != c.intermediate_size)
        throw HfError(
            "mixtral export: Mixtral renormalises its top-k weights and its experts are intermediate_size wide");
      j["sliding_window"] = c.attention_window() > 0 ? json(c.sliding_window) : json(nullptr);
      j["num_local_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["output_router_logits"] = c.output_router_logits;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      j["router_jitter_noise"] = 0.0;
      break;
    case Arch::qwen3_moe:
      if (!c.qk_norm) throw HfError("qwen3_moe export: Qwen3-MoE always has q/k norms");
      refuse_biased_attention(c);
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      j["num_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      j["mlp_only_layers"] = c.mlp_only_layers;
      j["output_router_logits"] = c.output_router_logits;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      break;
    case Arch::gpt_oss: {
      if (!c.attention_bias) throw HfError("gpt_oss export: gpt-oss always has attention biases");
      if (c.moe_intermediate_size != c.intermediate_size)
        throw HfError("gpt_oss export: gpt-oss's experts are intermediate_size wide");
      if (c.swiglu_limit != 7.0f)
        throw HfError("gpt_oss export: swiglu_limit " + std::to_string(c.swiglu_limit) +
                      " has no transformers model (GptOssExperts fixes the clamp at 7.0)");
      j["attention_bias"] = true;
      j["num_local_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j.erase("experts_per_token");
      j["sliding_window"] =
          c.sliding_window > 0 ? c.sliding_window : 128;  // GptOssConfig's, unused without sliding layers
      json types = json::array();
      for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
        types.push_back(c.layer_slides(l) ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      j["swiglu_limit"] = short_decimal(c.swiglu_limit);
      j["output_router_logits"] = c.output_router_logits;
      j["router_aux_loss_coef"] = c.router_aux_loss_coef;
      break;
    }
    case Arch::gpt2:
      break;
  }
  if (c.arch != Arch::qwen3 && c.arch != Arch::qwen3_moe && c.qk_norm)
    throw HfError(std::string(arch_name(c.arch)) + " export: qk_norm is only part of qwen3");
  if (c.arch == Arch::mistral && c.attention_bias) throw HfError("mistral export: Mistral has no attention biases");
  return j;
}

}  // namespace mt::hf
