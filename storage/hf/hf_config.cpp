#include "storage/hf/hf_config.hpp"

#include "storage/hf/file_util.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::hf {

using nlohmann::json;

namespace {

// PretrainedConfig's generic fields (transformers 4.46) and other bookkeeping keys: accepted, ignored.
const std::set<std::string>& generic_keys() {
  static const std::set<std::string> keys = {
      "_attn_implementation_autoset", "_name_or_path", "_attn_implementation", "_commit_hash", "architectures",
      "bad_words_ids", "begin_suppress_tokens", "bos_token_id", "chunk_size_feed_forward",
      "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping",
      "encoder_no_repeat_ngram_size", "eos_token_id", "exponential_decay_length_penalty", "finetuning_task",
      "forced_bos_token_id", "forced_eos_token_id", "id2label", "is_decoder", "label2id", "length_penalty",
      "max_length", "min_length", "model_type", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
      "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores", "pad_token_id", "prefix",
      "problem_type", "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict",
      "return_dict_in_generate", "sep_token_id", "suppress_tokens", "task_specific_params", "temperature",
      "tf_legacy_loss", "tokenizer_class", "top_k", "top_p", "torch_dtype", "torchscript", "transformers_version",
      "typical_p", "use_bfloat16", "use_cache", "gradient_checkpointing", "initializer_range", "tie_word_embeddings",
      // generic fields that must hold their harmless default (checked below)
      "add_cross_attention", "is_encoder_decoder", "tie_encoder_decoder"};
  return keys;
}

class Fields {
 public:
  Fields(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& what) const { throw HfError(source_ + ": " + what); }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  bool absent(const char* key) const { return !j_.contains(key); }  // null is present (and means None)
  void use(const char* key) { used_.insert(key); }

  std::int64_t integer(const char* key, std::optional<std::int64_t> dflt = std::nullopt) {
    use(key);
    if (!has(key)) {
      if (dflt) return *dflt;
      fail("missing required field '" + std::string(key) + "'");
    }
    const json& v = j_.at(key);
    if (!v.is_number_integer()) fail("field '" + std::string(key) + "' must be an integer, got " + v.dump());
    return v.get<std::int64_t>();
  }
  double number(const char* key, double dflt) {
    use(key);
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_number()) fail("field '" + std::string(key) + "' must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const char* key, bool dflt) {
    use(key);
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) fail("field '" + std::string(key) + "' must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) {
    use(key);
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_string()) fail("field '" + std::string(key) + "' must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::vector<std::int64_t> integer_list(const char* key) {  // null or absent: empty
    use(key);
    std::vector<std::int64_t> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    if (!v.is_array()) fail("field '" + std::string(key) + "' must be a list of integers, got " + v.dump());
    for (const json& e : v) {
      if (!e.is_number_integer()) fail("field '" + std::string(key) + "' must be a list of integers, got " + v.dump());
      out.push_back(e.get<std::int64_t>());
    }
    return out;
  }
  std::vector<std::string> string_list(const char* key) {  // null or absent: empty
    use(key);
    std::vector<std::string> out;
    if (!has(key)) return out;
    const json& v = j_.at(key);
    if (!v.is_array()) fail("field '" + std::string(key) + "' must be a list of strings, got " + v.dump());
    for (const json& e : v) {
      if (!e.is_string()) fail("field '" + std::string(key) + "' must be a list of strings, got " + v.dump());
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  const json* object(const char* key) {
    use(key);
    if (!has(key)) return nullptr;
    if (!j_.at(key).is_object()) fail("field '" + std::string(key) + "' must be an object or null");
    return &j_.at(key);
  }
  // Fields this family accepts but the engine has no use for (dropout: training runs without it).
  void ignore(std::initializer_list<const char*> keys) {
    for (auto k : keys) use(k);
  }
  void require_value(const char* key, bool expected, bool dflt, const std::string& why) {
    if (boolean(key, dflt) != expected)
      fail("unsupported " + std::string(key) + "=" + (expected ? "false" : "true") + ": " + why);
  }
  // Every field must be known: an unknown one may change the math (a newer transformers feature).
  void reject_unknown() const {
    for (const auto& [key, value] : j_.items()) {
      if (used_.count(key) || generic_keys().count(key)) continue;
      fail("unsupported config field '" + key + "' (value " + value.dump() + ")");
    }
  }

 private:
  const json& j_;
  std::string source_;
  std::set<std::string> used_;
};

std::int64_t positive_or_fail(Fields& f, std::int64_t v, const char* key) {
  if (v <= 0) f.fail("field '" + std::string(key) + "' must be > 0, got " + std::to_string(v));
  return v;
}

// rope_scaling: the types transformers' ROPE_INIT_FUNCTIONS computes that the engine implements, each
// with the fields it reads; an unknown type or field is refused by name (a newer transformers field may
// change the math). A null optional field is transformers' default (it reads them with .get(...) or ...).
void parse_rope_scaling(Fields& f, Arch arch, ModelConfig& c) {
  const json* rs = f.object("rope_scaling");
  if (!rs) return;
  const char* supported = "(supported: default, linear, dynamic, yarn, llama3)";
  const json* type_field = rs->contains("rope_type") ? &rs->at("rope_type")
                           : rs->contains("type")    ? &rs->at("type")
                                                     : nullptr;
  if (type_field && !type_field->is_string())
    f.fail("rope_scaling.rope_type must be a string, got " + type_field->dump());
  const std::string type = type_field ? type_field->get<std::string>() : std::string("default");
  if (type == "default") return;
  RopeScaling& out = c.rope_scaling;
  std::set<std::string> known = {"rope_type", "type", "factor"};
  if (type == "llama3") {
    out.type = RopeType::llama3;
    known.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type == "linear") {
    out.type = RopeType::linear;
  } else if (type == "dynamic") {
    out.type = RopeType::dynamic;
    known.insert("original_max_position_embeddings");
  } else if (type == "yarn") {
    out.type = RopeType::yarn;
    known.insert({"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                  "original_max_position_embeddings", "truncate"});
  } else {
    f.fail("unsupported rope_scaling type '" + type + "' " + supported);
  }
  // transformers 4.46's MistralRotaryEmbedding has no rope_scaling: it would run plain RoPE.
  if (arch == Arch::mistral)
    f.fail("rope_scaling '" + type + "' is not supported for mistral (transformers ignores it)");
  if (rs->contains("rope_type") && rs->contains("type") && rs->at("type") != rs->at("rope_type"))
    f.fail("rope_scaling.type " + rs->at("type").dump() + " differs from rope_type " + rs->at("rope_type").dump());
  for (const auto& [key, value] : rs->items())
    if (!known.count(key))
      f.fail("unsupported rope_scaling field '" + key + "' for rope_type '" + type + "' (value " + value.dump() + ")");
  auto present = [&](const char* key) { return rs->contains(key) && !rs->at(key).is_null(); };
  auto num = [&](const char* key, bool required, double dflt) {
    if (!present(key)) {
      if (required) f.fail("rope_scaling lacks '" + std::string(key) + "' (required for rope_type '" + type + "')");
      return dflt;
    }
    if (!rs->at(key).is_number())
      f.fail("rope_scaling." + std::string(key) + " must be a number, got " + rs->at(key).dump());
    return rs->at(key).get<double>();
  };
  out.factor = num("factor", true, 1.0);
  if (known.count("original_max_position_embeddings") && present("original_max_position_embeddings")) {
    // an integer; a float with an integral value (8192.0) too, as before the other types
    const json& v = rs->at("original_max_position_embeddings");
    const double d = v.is_number() ? v.get<double>() : 0.0;
    if (!v.is_number() || !(d > 0.0) || d != std::floor(d) || d > 9.0e15)
      f.fail("rope_scaling.original_max_position_embeddings must be an integer > 0, got " + v.dump());
    out.original_max_position_embeddings = static_cast<std::int64_t>(d);
  }
  switch (out.type) {
    case RopeType::llama3:
      out.low_freq_factor = num("low_freq_factor", true, 1);
      out.high_freq_factor = num("high_freq_factor", true, 4);
      if (!present("original_max_position_embeddings"))
        f.fail("rope_scaling lacks 'original_max_position_embeddings' (required for rope_type 'llama3')");
      break;
    case RopeType::yarn:
      // transformers: beta_fast = rope_scaling.get("beta_fast") or 32 (so 0 is the default too)
      out.beta_fast = num("beta_fast", false, 32.0);
      out.beta_slow = num("beta_slow", false, 1.0);
      if (out.beta_fast == 0.0) out.beta_fast = 32.0;
      if (out.beta_slow == 0.0) out.beta_slow = 1.0;
      out.attention_factor = num("attention_factor", false, 0.0);
      if (present("attention_factor") && !(out.attention_factor > 0.0))
        f.fail("rope_scaling.attention_factor must be > 0, got " + rs->at("attention_factor").dump());
      out.mscale = num("mscale", false, 0.0);
      out.mscale_all_dim = num("mscale_all_dim", false, 0.0);
      if (present("truncate")) {
        if (!rs->at("truncate").is_boolean())
          f.fail("rope_scaling.truncate must be true or false, got " + rs->at("truncate").dump());
        out.truncate = rs->at("truncate").get<bool>();
      }
      break;
    default:
      break;
  }
}

// Mistral and Mixtral (transformers 4.46 builds their causal mask with the window, every layer): a
// window shorter than max_position_embeddings slides (key j visible from i iff i - window < j <= i);
// null or a longer one never does. Qwen2/Qwen3 slide only with use_sliding_window, refused here
// (4.46 applies their window with flash-attention alone, and only above max_window_layers).
void parse_sliding_window(Fields& f, ModelConfig& c, Arch arch) {
  if (arch == Arch::mistral || arch == Arch::mixtral) {
    // transformers 4.46's MistralConfig defaults the window to 4096 (null: none); MixtralConfig to none.
    if (f.has("sliding_window") || (arch == Arch::mistral && f.absent("sliding_window"))) {
      const auto w = f.integer("sliding_window", 4096);
      if (w <= 0) f.fail("sliding_window must be > 0 or null, got " + std::to_string(w));
      if (w < c.max_position_embeddings) {
        c.sliding_window = w;
        for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) c.sliding_layers.push_back(l);
      }
    }
    f.use("sliding_window");
    return;
  }
  f.require_value("use_sliding_window", false, false,
                  "Qwen's sliding-window attention is not implemented (transformers 4.46 applies it with "
                  "flash-attention only)");
  f.ignore({"sliding_window", "max_window_layers"});
}

// Mixtral's experts (transformers 4.46 MixtralConfig's defaults): softmax, top-k, always renormalised;
// the expert width is intermediate_size.
void parse_mixtral_experts(Fields& f, ModelConfig& c) {
  c.num_experts = positive_or_fail(f, f.integer("num_local_experts", 8), "num_local_experts");
  c.num_experts_per_tok = positive_or_fail(f, f.integer("num_experts_per_tok", 2), "num_experts_per_tok");
  if (c.num_experts_per_tok > c.num_experts)
    f.fail("num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) + ") exceeds num_local_experts (" +
           std::to_string(c.num_experts) + ")");
  c.moe_intermediate_size = c.intermediate_size;
  c.norm_topk_prob = true;
  c.router_aux_loss_coef = f.number("router_aux_loss_coef", 0.001);
  c.output_router_logits = f.boolean("output_router_logits", false);  // the load-balancing loss
  const double jitter = f.number("router_jitter_noise", 0.0);
  if (jitter != 0.0)
    f.fail("unsupported router_jitter_noise=" + std::to_string(jitter) +
           ": the router's training noise is not implemented; set it to 0");
}

// Qwen3-MoE's experts (transformers' Qwen3MoeConfig defaults, 4.51 to 5.x): softmax in fp32, top-k,
// renormalised only with norm_topk_prob; expert width moe_intermediate_size, dense layers (mlp_only_layers,
// decoder_sparse_step) intermediate_size wide.
void parse_qwen3_moe_experts(Fields& f, ModelConfig& c) {
  c.num_experts = positive_or_fail(f, f.integer("num_experts", 128), "num_experts");
  c.num_experts_per_tok = positive_or_fail(f, f.integer("num_experts_per_tok", 8), "num_experts_per_tok");
  if (c.num_experts_per_tok > c.num_experts)
    f.fail("num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) + ") exceeds num_experts (" +
           std::to_string(c.num_experts) + ")");
  c.moe_intermediate_size = positive_or_fail(f, f.integer("moe_intermediate_size", 768), "moe_intermediate_size");
  c.norm_topk_prob = f.boolean("norm_topk_prob", false);
  c.decoder_sparse_step = positive_or_fail(f, f.integer("decoder_sparse_step", 1), "decoder_sparse_step");
  std::vector<std::int64_t> dense = f.integer_list("mlp_only_layers");
  for (const std::int64_t l : dense)
    if (l < 0 || l >= c.num_hidden_layers)
      f.fail("mlp_only_layers holds " + std::to_string(l) + ", not a layer in [0, " +
             std::to_string(c.num_hidden_layers) + ")");
  std::sort(dense.begin(), dense.end());  // transformers tests membership: order and repeats mean nothing
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  c.mlp_only_layers = dense;
  c.router_aux_loss_coef = f.number("router_aux_loss_coef", 0.001);
  c.output_router_logits = f.boolean("output_router_logits", false);  // the load-balancing loss
}

// gpt-oss (transformers 4.55+ GptOssConfig's defaults): every layer a mixture of experts of width
// intermediate_size, the router top-k then softmax; layer_types (default: even layers sliding) pick
// sliding-window or full attention; attention biases always (GptOssConfig sets attention_bias itself).
// A missing rope_scaling is GptOssConfig's default YaRN (factor 32, beta 32 / 1, truncate false).
void parse_gpt_oss(Fields& f, ModelConfig& c) {
  if (f.has("attention_bias") && !f.boolean("attention_bias", true))
    f.fail("unsupported attention_bias=false for gpt_oss: transformers' GptOssConfig always biases attention");
  f.use("attention_bias");
  c.attention_bias = true;
  c.num_experts = positive_or_fail(f, f.integer("num_local_experts", 128), "num_local_experts");
  c.num_experts_per_tok = positive_or_fail(f, f.integer("num_experts_per_tok", 4), "num_experts_per_tok");
  if (f.has("experts_per_token") && f.integer("experts_per_token") != c.num_experts_per_tok)
    f.fail("experts_per_token (" + std::to_string(f.integer("experts_per_token")) +
           ") differs from num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) + ")");
  f.use("experts_per_token");  // the openai reference code's name for the same number
  if (c.num_experts_per_tok > c.num_experts)
    f.fail("num_experts_per_tok (" + std::to_string(c.num_experts_per_tok) + ") exceeds num_local_experts (" +
           std::to_string(c.num_experts) + ")");
  c.moe_intermediate_size = c.intermediate_size;
  c.norm_topk_prob = false;  // the softmax runs over the k already
  // transformers' GptOssExperts clamps at 7.0 whatever the config says (only its MXFP4 GPU kernels read
  // swiglu_limit): another value would train a model transformers does not run.
  const double limit = f.number("swiglu_limit", 7.0);
  if (limit != 7.0)
    f.fail("unsupported swiglu_limit=" + std::to_string(limit) +
           ": transformers' GptOssExperts fixes the clamp at 7.0 (set it to 7.0)");
  c.swiglu_limit = 7.0f;
  // Absent: GptOssConfig's 128; null keeps None, which transformers' sliding mask cannot take.
  if (!f.absent("sliding_window") && !f.has("sliding_window"))
    f.fail("sliding_window is null: gpt-oss's sliding_attention layers need a window (transformers fails too)");
  c.sliding_window = f.integer("sliding_window", 128);
  if (c.sliding_window <= 0) f.fail("sliding_window must be > 0, got " + std::to_string(c.sliding_window));
  const std::vector<std::string> types = f.string_list("layer_types");
  if (!types.empty() && static_cast<std::int64_t>(types.size()) != c.num_hidden_layers)
    f.fail("layer_types has " + std::to_string(types.size()) + " entries for " + std::to_string(c.num_hidden_layers) +
           " layers");
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string t =
        types.empty() ? ((l + 1) % 2 ? "sliding_attention" : "full_attention") : types[static_cast<std::size_t>(l)];
    if (t == "sliding_attention")
      c.sliding_layers.push_back(l);
    else if (t != "full_attention")
      f.fail("layer_types[" + std::to_string(l) + "] is '" + t + "' (supported: sliding_attention, full_attention)");
  }
  c.router_aux_loss_coef = f.number("router_aux_loss_coef", 0.9);
  c.output_router_logits = f.boolean("output_router_logits", false);  // the load-balancing loss
  f.ignore({"initial_context_length"});  // the openai reference code's; transformers does not read it
}

// Llama, Qwen3 and Qwen3-MoE's attention_bias also biases o_proj in transformers (Qwen2's q/k/v biases
// do not); the engine's o_proj has no bias, so the flag is refused rather than trained without it.
bool attention_bias_without_o_proj(Fields& f, Arch arch) {
  if (f.boolean("attention_bias", false))
    f.fail(std::string("unsupported attention_bias=true for ") + arch_name(arch) +
           ": transformers then biases o_proj as well, which is not implemented");
  return false;
}

ModelConfig parse_llama_family(Fields& f, Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = positive_or_fail(f, f.integer("vocab_size"), "vocab_size");
  c.hidden_size = positive_or_fail(f, f.integer("hidden_size"), "hidden_size");
  c.intermediate_size = positive_or_fail(f, f.integer("intermediate_size"), "intermediate_size");
  c.num_hidden_layers = positive_or_fail(f, f.integer("num_hidden_layers"), "num_hidden_layers");
  c.num_attention_heads = positive_or_fail(f, f.integer("num_attention_heads"), "num_attention_heads");
  c.num_key_value_heads = f.integer("num_key_value_heads", c.num_attention_heads);
  if (c.hidden_size % c.num_attention_heads != 0 && !f.has("head_dim"))
    f.fail("hidden_size is not a multiple of num_attention_heads and no head_dim is given");
  const std::int64_t default_head_dim = c.hidden_size / c.num_attention_heads;
  if (arch == Arch::qwen2) {
    // transformers' Qwen2 has no head_dim field: it is always hidden_size / num_attention_heads.
    c.head_dim = default_head_dim;
    f.ignore({"head_dim"});
  } else {
    c.head_dim = f.integer("head_dim", arch == Arch::gpt_oss ? 64 : default_head_dim);
  }
  const std::int64_t default_positions = arch == Arch::llama ? 2048
                                         : (arch == Arch::mistral || arch == Arch::mixtral || arch == Arch::gpt_oss)
                                             ? 131072
                                             : 32768;
  c.max_position_embeddings = f.integer("max_position_embeddings", default_positions);
  c.rope_theta = static_cast<float>(f.number("rope_theta", arch == Arch::gpt_oss ? 150000.0 : 10000.0));
  c.norm_eps = static_cast<float>(f.number("rms_norm_eps", arch == Arch::gpt_oss ? 1e-5 : 1e-6));
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.initializer_range = static_cast<float>(f.number("initializer_range", 0.02));
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.fail("unsupported hidden_act '" + act + "' (supported: silu)");
  if (arch == Arch::gpt_oss && f.absent("rope_scaling")) {  // GptOssConfig's default
    c.rope_scaling.type = RopeType::yarn;
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.truncate = false;
    f.use("rope_scaling");
  } else {
    parse_rope_scaling(f, arch, c);
  }
  f.ignore({"attention_dropout"});
  switch (arch) {
    case Arch::llama:
      c.attention_bias = attention_bias_without_o_proj(f, arch);
      f.require_value("mlp_bias", false, false, "MLP biases are not implemented");
      f.ignore({"pretraining_tp"});  // only splits the same matmuls in transformers
      break;
    case Arch::qwen2:
      c.attention_bias = true;  // Qwen2's q/k/v projections always carry biases
      parse_sliding_window(f, c, arch);
      break;
    case Arch::qwen3:
      c.attention_bias = attention_bias_without_o_proj(f, arch);
      c.qk_norm = true;
      parse_sliding_window(f, c, arch);
      break;
    case Arch::mistral:
      parse_sliding_window(f, c, arch);
      break;
    case Arch::mixtral:
      parse_sliding_window(f, c, arch);
      parse_mixtral_experts(f, c);
      break;
    case Arch::qwen3_moe:
      c.attention_bias = attention_bias_without_o_proj(f, arch);
      c.qk_norm = true;
      parse_sliding_window(f, c, arch);
      parse_qwen3_moe_experts(f, c);
      break;
    case Arch::gpt_oss:
      parse_gpt_oss(f, c);
      break;
    case Arch::gpt2:
      break;
  }
  return c;
}

ModelConfig parse_gpt2(Fields& f) {
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.vocab_size = positive_or_fail(f, f.integer("vocab_size", 50257), "vocab_size");
  c.hidden_size = positive_or_fail(f, f.integer("n_embd", 768), "n_embd");
  c.num_hidden_layers = positive_or_fail(f, f.integer("n_layer", 12), "n_layer");
  c.num_attention_heads = positive_or_fail(f, f.integer("n_head", 12), "n_head");
  c.num_key_value_heads = c.num_attention_heads;
  if (c.hidden_size % c.num_attention_heads != 0) f.fail("n_embd is not a multiple of n_head");
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.intermediate_size = f.integer("n_inner", 4 * c.hidden_size);
  c.max_position_embeddings = f.integer("n_positions", 1024);
  c.norm_eps = static_cast<float>(f.number("layer_norm_epsilon", 1e-5));
  c.initializer_range = static_cast<float>(f.number("initializer_range", 0.02));
  c.tie_word_embeddings = true;
  if (!f.boolean("tie_word_embeddings", true))
    f.fail("unsupported tie_word_embeddings=false for gpt2 (its LM head is wte)");
  const std::string act = f.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    f.fail("unsupported activation_function '" + act + "' (supported: gelu_new, gelu_pytorch_tanh)");
  f.require_value("scale_attn_weights", true, true, "unscaled attention is not implemented");
  f.require_value("scale_attn_by_inverse_layer_idx", false, false, "per-layer attention scaling is not implemented");
  // Dropout is not applied by the engine; the summary_* fields belong to the double-heads model; n_ctx
  // is a legacy alias of n_positions; reorder_and_upcast_attn only changes the precision, fp32 here.
  f.ignore({"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
            "summary_first_dropout", "summary_proj_to_labels", "n_ctx", "reorder_and_upcast_attn"});
  return c;
}

// quantization_config: only the hub's gpt-oss form (its experts in MXFP4, dequantized on load by
// storage/hf); any other method is refused by name.
void check_quantization(Fields& f, const json& config, Arch arch) {
  f.use("quantization_config");
  if (!config.contains("quantization_config") || config.at("quantization_config").is_null()) return;
  const json& q = config.at("quantization_config");
  const std::string method = q.is_object() && q.contains("quant_method") && q.at("quant_method").is_string()
                                 ? q.at("quant_method").get<std::string>()
                                 : std::string("(no quant_method)");
  if (method != "mxfp4" || arch != Arch::gpt_oss)
    f.fail("unsupported quantization '" + method + "' (quantization_config) for " + arch_name(arch) +
           ": the only quantized weights read are gpt_oss's MXFP4 experts, dequantized on load");
  for (const auto& [key, value] : q.items())
    if (key != "quant_method" && key != "modules_to_not_convert")
      f.fail("unsupported quantization_config field '" + key + "' (value " + value.dump() + ") for mxfp4");
}

}  // namespace

namespace {
ModelConfig parse_config_fields(const json& config, const std::string& source) {
  if (!config.is_object()) throw HfError(source + ": config must be a JSON object");
  Fields f(config, source);
  const std::string model_type = f.string("model_type", "");
  if (model_type.empty()) f.fail("missing required field 'model_type'");
  Arch arch;
  try {
    arch = parse_arch(model_type);
  } catch (const std::invalid_argument& e) {
    f.fail(e.what());
  }
  if (f.has("architectures")) {
    const json& a = config.at("architectures");
    if (!a.is_array() || a.size() != 1 || !a[0].is_string() || a[0].get<std::string>() != architecture_class(arch))
      f.fail("unsupported architectures " + a.dump() + " for model_type '" + model_type + "' (expected [\"" +
             architecture_class(arch) + "\"])");
  }
  for (const char* key : {"add_cross_attention", "is_encoder_decoder", "tie_encoder_decoder"})
    if (f.boolean(key, false)) f.fail("unsupported " + std::string(key) + "=true");
  if (config.contains("auto_map")) f.fail("unsupported config field 'auto_map'");
  check_quantization(f, config, arch);
  ModelConfig c = arch == Arch::gpt2 ? parse_gpt2(f) : parse_llama_family(f, arch);
  f.reject_unknown();
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    f.fail(e.what());
  }
  return c;
}
}  // namespace

ModelConfig parse_config(const json& config, const std::string& source) {
  try {
    return parse_config_fields(config, source);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type deep inside
    throw HfError(source + ": malformed config: " + e.what());
  }
}

ModelConfig load_config(const std::filesystem::path& dir_or_file) {
  const auto file = std::filesystem::is_directory(dir_or_file) ? dir_or_file / "config.json" : dir_or_file;
  const json j = read_json_file(file);
  return parse_config(j, file.string());
}

}  // namespace mt::hf
