// config.json parsing for the five architectures, its strictness, and the way back.
#include <catch2/catch.hpp>

#include <cmath>

#include <nlohmann/json.hpp>

#include "kernels/ops.hpp"  // rope_params_of
#include "storage/hf/hf_config.hpp"

using namespace mt;
using nlohmann::json;

namespace {

json llama_json() {
  return json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "hidden_act": "silu", "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false,
    "attention_dropout": 0.0, "pretraining_tp": 1, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3", "use_cache": true, "initializer_range": 0.02,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}})");
}

std::string parse_error(const json& j) {
  try {
    hf::parse_config(j, "dir/config.json");
  } catch (const hf::HfError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config.json of each supported architecture parses into ModelConfig") {
  const ModelConfig l = hf::parse_config(llama_json());
  CHECK(l.arch == Arch::llama);
  CHECK(l.head_dim == 16);
  CHECK(l.num_key_value_heads == 2);
  CHECK(l.rope_theta == 500000.0f);
  CHECK(l.norm_eps == 1e-5f);
  CHECK(l.rope_scaling.type == RopeType::llama3);
  CHECK(l.rope_scaling.factor == 8.0);
  CHECK(l.rope_scaling.original_max_position_embeddings == 8192);

  json q2 = llama_json();
  q2["architectures"] = {"Qwen2ForCausalLM"};
  q2["model_type"] = "qwen2";
  q2.erase("attention_bias");
  q2.erase("mlp_bias");
  q2.erase("pretraining_tp");
  q2["use_sliding_window"] = false;
  q2["sliding_window"] = 4096;
  q2["max_window_layers"] = 28;
  q2["tie_word_embeddings"] = true;
  const ModelConfig c2 = hf::parse_config(q2);
  CHECK(c2.arch == Arch::qwen2);
  CHECK(c2.attention_bias);
  CHECK(c2.tie_word_embeddings);

  json q3 = q2;
  q3["architectures"] = {"Qwen3ForCausalLM"};
  q3["model_type"] = "qwen3";
  q3["head_dim"] = 32;
  q3["attention_bias"] = false;
  const ModelConfig c3 = hf::parse_config(q3);
  CHECK(c3.qk_norm);
  CHECK(c3.head_dim == 32);
  CHECK_FALSE(c3.attention_bias);

  json m = llama_json();
  m["architectures"] = {"MistralForCausalLM"};
  m["model_type"] = "mistral";
  for (auto k : {"attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling"}) m.erase(k);
  m["sliding_window"] = nullptr;
  CHECK(hf::parse_config(m).arch == Arch::mistral);

  const json g = json::parse(R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
    "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_ctx": 1024, "n_inner": null,
    "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-05, "initializer_range": 0.02, "summary_type": "cls_index", "summary_use_proj": true,
    "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
    "scale_attn_weights": true, "use_cache": true, "scale_attn_by_inverse_layer_idx": false,
    "reorder_and_upcast_attn": false, "bos_token_id": 50256, "eos_token_id": 50256,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}})");
  const ModelConfig cg = hf::parse_config(g);
  CHECK(cg.arch == Arch::gpt2);
  CHECK(cg.intermediate_size == 3072);
  CHECK(cg.head_dim == 64);
  CHECK(cg.tie_word_embeddings);
}

TEST_CASE("unsupported config fields and values are errors naming the field and the file") {
  auto with = [](const char* key, json value) {
    json j = llama_json();
    j[key] = std::move(value);
    return j;
  };
  CHECK_THAT(parse_error(with("rope_scaling", {{"rope_type", "longrope"}, {"factor", 4.0}})),
             Catch::Contains("dir/config.json") && Catch::Contains("rope_scaling type 'longrope'") &&
                 Catch::Contains("supported: default, linear, dynamic, yarn, llama3"));
  CHECK_THAT(parse_error(with("mlp_bias", true)), Catch::Contains("mlp_bias"));
  CHECK_THAT(parse_error(with("hidden_act", "gelu")), Catch::Contains("hidden_act 'gelu'"));
  CHECK_THAT(parse_error(with("fancy_new_feature", 3)),
             Catch::Contains("unsupported config field 'fancy_new_feature'"));
  CHECK_THAT(parse_error(with("hidden_size", "64")), Catch::Contains("'hidden_size' must be an integer"));
  CHECK_THAT(parse_error(with("architectures", {"LlamaForSequenceClassification"})), Catch::Contains("architectures"));
  CHECK_THAT(parse_error(with("model_type", "falcon")), Catch::Contains("unsupported model_type 'falcon'"));
  CHECK_THAT(parse_error(with("num_key_value_heads", 3)), Catch::Contains("num_key_value_heads"));
  CHECK_THAT(parse_error(with("quantization_config", json::object())), Catch::Contains("quantization_config"));
  json no_hidden = llama_json();
  no_hidden.erase("hidden_size");
  CHECK_THAT(parse_error(no_hidden), Catch::Contains("missing required field 'hidden_size'"));

  json mistral = llama_json();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  for (auto k : {"attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling"}) mistral.erase(k);
  mistral["sliding_window"] = 64;  // every layer slides (transformers 4.46's Mistral mask)
  const ModelConfig slides = hf::parse_config(mistral);
  CHECK(slides.sliding_window == 64);
  CHECK(slides.sliding_layers.size() == static_cast<std::size_t>(slides.num_hidden_layers));
  CHECK_FALSE(slides.layers_differ());
  CHECK(slides.attention_window() == 64);
  CHECK(hf::config_to_json(slides, nullptr)["sliding_window"] == 64);
  mistral["sliding_window"] = 0;
  CHECK_THAT(parse_error(mistral), Catch::Contains("sliding_window must be > 0"));
  mistral["sliding_window"] = 4096;  // >= max_position_embeddings: never slides
  CHECK(parse_error(mistral).empty());
  CHECK(hf::parse_config(mistral).attention_window() == 0);
  CHECK(hf::config_to_json(hf::parse_config(mistral), nullptr)["sliding_window"].is_null());
  mistral.erase("sliding_window");  // absent: MistralConfig's 4096 (null is none)
  mistral["max_position_embeddings"] = 32768;
  CHECK(hf::parse_config(mistral).attention_window() == 4096);
  mistral["sliding_window"] = nullptr;
  CHECK(hf::parse_config(mistral).attention_window() == 0);

  json qwen = llama_json();
  qwen["architectures"] = {"Qwen2ForCausalLM"};
  qwen["model_type"] = "qwen2";
  for (auto k : {"attention_bias", "mlp_bias", "pretraining_tp"}) qwen.erase(k);
  qwen["use_sliding_window"] = true;
  CHECK_THAT(parse_error(qwen), Catch::Contains("use_sliding_window"));

  json gpt2 = json::parse(R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4})");
  gpt2["activation_function"] = "relu";
  CHECK_THAT(parse_error(gpt2), Catch::Contains("activation_function 'relu'"));
  gpt2["activation_function"] = "gelu_new";
  gpt2["scale_attn_by_inverse_layer_idx"] = true;
  CHECK_THAT(parse_error(gpt2), Catch::Contains("scale_attn_by_inverse_layer_idx"));
}

TEST_CASE("config_to_json writes what parse_config reads back and keeps the base config's other fields") {
  for (const char* type : {"llama", "qwen2", "qwen3", "mistral", "gpt2"}) {
    ModelConfig c;
    c.arch = parse_arch(type);
    c.vocab_size = 100;
    c.hidden_size = 48;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 6;
    c.num_key_value_heads = c.is_gpt2() ? 6 : 2;
    c.head_dim = c.arch == Arch::qwen3 ? 16 : 8;
    c.intermediate_size = 80;
    c.max_position_embeddings = 128;
    c.norm_eps = 1e-6f;
    c.attention_bias = c.arch == Arch::qwen2;
    c.qk_norm = c.arch == Arch::qwen3;
    c.tie_word_embeddings = c.is_gpt2();
    const json base = {{"bos_token_id", 7}, {"eos_token_id", 8}};
    const json j = hf::config_to_json(c, &base);
    INFO(j.dump());
    CHECK(j["bos_token_id"] == 7);
    if (!c.is_gpt2()) CHECK(j["rms_norm_eps"].dump() == "1e-06");
    const ModelConfig back = hf::parse_config(j);
    CHECK(back.arch == c.arch);
    CHECK(back.hidden_size == c.hidden_size);
    CHECK(back.num_key_value_heads == c.num_key_value_heads);
    CHECK(back.head_dim == c.head_dim);
    CHECK(back.intermediate_size == c.intermediate_size);
    CHECK(back.norm_eps == c.norm_eps);
    CHECK(back.attention_bias == c.attention_bias);
    CHECK(back.qk_norm == c.qk_norm);
    CHECK(back.tie_word_embeddings == c.tie_word_embeddings);
  }
  // GPT-2's LM head is always wte, whatever the flag says (a model made from keys, where it defaults to
  // false): the config written says tied, so transformers and megatrain-ckpt read it back (a checkpoint
  // manifest that said false could not be read, and transformers would add an untied lm_head).
  ModelConfig g;
  g.arch = Arch::gpt2;
  g.vocab_size = 64;
  g.hidden_size = 32;
  g.num_hidden_layers = 2;
  g.num_attention_heads = 4;
  g.num_key_value_heads = 4;
  g.head_dim = 8;
  g.intermediate_size = 128;
  g.max_position_embeddings = 64;
  g.tie_word_embeddings = false;
  const json j = hf::config_to_json(g, nullptr);
  CHECK(j["tie_word_embeddings"] == true);
  CHECK(hf::parse_config(j).tie_word_embeddings);
}

namespace {

json llama_rope(json rope_scaling) {
  json j = llama_json();
  j["rope_scaling"] = std::move(rope_scaling);
  return j;
}

}  // namespace

TEST_CASE("each rope_scaling type parses its own fields, and export writes them back exactly", "[rope]") {
  const ModelConfig lin = hf::parse_config(llama_rope({{"rope_type", "linear"}, {"factor", 4.0}}));
  CHECK(lin.rope_scaling.type == RopeType::linear);
  CHECK(lin.rope_scaling.factor == 4.0);
  const ModelConfig bc = hf::parse_config(llama_rope({{"type", "linear"}, {"factor", 2.0}}));  // the old key
  CHECK(bc.rope_scaling.type == RopeType::linear);

  const ModelConfig dyn = hf::parse_config(llama_rope({{"rope_type", "dynamic"}, {"factor", 2.0}}));
  CHECK(dyn.rope_scaling.type == RopeType::dynamic);
  CHECK(dyn.rope_scaling.original_max_position_embeddings == 0);
  // equal to max_position_embeddings: what transformers uses anyway
  CHECK(hf::parse_config(
            llama_rope({{"rope_type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 256}}))
            .rope_scaling.original_max_position_embeddings == 256);

  json oss = llama_rope({{"rope_type", "yarn"},
                         {"factor", 32.0},
                         {"beta_fast", 32.0},
                         {"beta_slow", 1.0},
                         {"truncate", false},
                         {"original_max_position_embeddings", 4096}});
  oss["max_position_embeddings"] = 131072;
  oss["rope_theta"] = 150000.0;
  const ModelConfig yarn = hf::parse_config(oss);
  CHECK(yarn.rope_scaling.type == RopeType::yarn);
  CHECK(yarn.rope_scaling.factor == 32.0);
  CHECK(yarn.rope_scaling.beta_fast == 32.0);
  CHECK(yarn.rope_scaling.beta_slow == 1.0);
  CHECK(!yarn.rope_scaling.truncate);
  CHECK(yarn.rope_scaling.original_max_position_embeddings == 4096);
  CHECK(yarn.rope_scaling.attention_factor == 0.0);
  const RopeParams p = rope_params_of(yarn);
  CHECK(p.kind == RopeKind::yarn);
  CHECK(p.original_max_position == 4096);
  CHECK(p.attention_scaling == 0.1 * std::log(32.0) + 1.0);

  // null optional fields are transformers' defaults (it reads them with .get(...) or default)
  const ModelConfig nulls = hf::parse_config(
      llama_rope({{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_fast", nullptr}, {"mscale", nullptr}}));
  CHECK(nulls.rope_scaling.beta_fast == 32.0);
  CHECK(nulls.rope_scaling.mscale == 0.0);
  const ModelConfig ms =
      hf::parse_config(llama_rope({{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5}}));
  CHECK(rope_params_of(ms).attention_scaling == (0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0));
  const ModelConfig af =
      hf::parse_config(llama_rope({{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}}));
  CHECK(rope_params_of(af).attention_scaling == 1.5);

  // Export writes exactly the type's fields (yarn's betas always; its newer keys only when set) and
  // import reads back the same params.
  const json oss_rs = {{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
                       {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
  CHECK(hf::config_to_json(yarn)["rope_scaling"] == oss_rs);
  CHECK(hf::config_to_json(lin)["rope_scaling"] == json({{"rope_type", "linear"}, {"factor", 4.0}}));
  CHECK(hf::config_to_json(bc)["rope_scaling"] == json({{"rope_type", "linear"}, {"factor", 2.0}}));
  CHECK(hf::config_to_json(dyn)["rope_scaling"] == json({{"rope_type", "dynamic"}, {"factor", 2.0}}));
  CHECK(hf::config_to_json(nulls)["rope_scaling"] ==
        json({{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0}}));
  CHECK(hf::config_to_json(hf::parse_config(llama_json()))["rope_scaling"] == llama_json()["rope_scaling"]);
  json llama3_float_len = llama_json();
  llama3_float_len["rope_scaling"]["original_max_position_embeddings"] = 8192.0;  // accepted, as before
  CHECK(hf::parse_config(llama3_float_len).rope_scaling.original_max_position_embeddings == 8192);
  CHECK(hf::config_to_json(hf::parse_config(llama_rope(nullptr)))["rope_scaling"].is_null());
  for (const ModelConfig& c : {lin, bc, dyn, yarn, nulls, ms, af, hf::parse_config(llama_json())}) {
    const ModelConfig back = hf::parse_config(hf::config_to_json(c));
    CHECK(back.rope_scaling == c.rope_scaling);
    CHECK(rope_params_of(back) == rope_params_of(c));
  }
}

TEST_CASE("rope_scaling refusals name the field, the type and the file", "[rope]") {
  auto err = [](json rs, std::int64_t max_positions = 256) {
    json j = llama_rope(std::move(rs));
    j["max_position_embeddings"] = max_positions;
    return parse_error(j);
  };
  CHECK_THAT(err({{"rope_type", "su"}, {"factor", 2.0}}),
             Catch::Contains("dir/config.json") && Catch::Contains("unsupported rope_scaling type 'su'") &&
                 Catch::Contains("(supported: default, linear, dynamic, yarn, llama3)"));
  CHECK_THAT(err({{"rope_type", "linear"}}), Catch::Contains("rope_scaling lacks 'factor'"));
  CHECK_THAT(err({{"rope_type", "linear"}, {"factor", 0.5}}), Catch::Contains("rope_scaling.factor must be >= 1"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 0.9}}), Catch::Contains("rope_scaling.factor must be >= 1"));
  CHECK_THAT(err({{"rope_type", "linear"}, {"factor", "2"}}), Catch::Contains("rope_scaling.factor must be a number"));
  CHECK_THAT(err({{"rope_type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}}),
             Catch::Contains("unsupported rope_scaling field 'low_freq_factor' for rope_type 'linear'"));
  CHECK_THAT(err({{"rope_type", "dynamic"}, {"factor", 2.0}, {"beta_fast", 32.0}}),
             Catch::Contains("unsupported rope_scaling field 'beta_fast' for rope_type 'dynamic'"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 2.0}, {"extrapolation_factor", 1.0}}),
             Catch::Contains("unsupported rope_scaling field 'extrapolation_factor' for rope_type 'yarn'"));
  CHECK_THAT(err({{"rope_type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 128}}),
             Catch::Contains("rope_scaling.original_max_position_embeddings (128) must equal max_position_embeddings"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", "no"}}),
             Catch::Contains("rope_scaling.truncate must be true or false"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_fast", 1.0}, {"beta_slow", 4.0}}),
             Catch::Contains("rope_scaling.beta_fast (1.000000) must be >= beta_slow (4.000000)"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_slow", -1.0}}),
             Catch::Contains("rope_scaling.beta_slow must be > 0"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 2.0}, {"attention_factor", 0.0}}),
             Catch::Contains("rope_scaling.attention_factor must be > 0"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 2.0}, {"mscale", -1.0}}),
             Catch::Contains("rope_scaling.mscale must be >= 0"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 64}}),
             Catch::Contains("rope_scaling.factor (8.000000) must equal max_position_embeddings / "
                             "rope_scaling.original_max_position_embeddings (256 / 64)"));
  CHECK_THAT(err({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64.5}}),
             Catch::Contains("rope_scaling.original_max_position_embeddings must be an integer > 0"));
  CHECK_THAT(err({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}}),
             Catch::Contains("rope_scaling lacks 'original_max_position_embeddings'"));
  CHECK_THAT(err({{"rope_type", "llama3"},
                  {"factor", 8.0},
                  {"low_freq_factor", 4.0},
                  {"high_freq_factor", 1.0},
                  {"original_max_position_embeddings", 64}}),
             Catch::Contains("rope_scaling.high_freq_factor must be > low_freq_factor"));
  CHECK_THAT(err({{"rope_type", 3}, {"factor", 2.0}}), Catch::Contains("rope_scaling.rope_type must be a string"));
  CHECK_THAT(err({{"rope_type", "linear"}, {"type", "dynamic"}, {"factor", 2.0}}),
             Catch::Contains("differs from rope_type"));
  // default with no other field is plain RoPE
  CHECK(hf::parse_config(llama_rope({{"rope_type", "default"}})).rope_scaling.type == RopeType::none);

  // Mistral: transformers 4.46's MistralRotaryEmbedding ignores rope_scaling, so every type is refused.
  json mistral = llama_json();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  for (auto k : {"attention_bias", "mlp_bias", "pretraining_tp"}) mistral.erase(k);
  for (const char* type : {"linear", "dynamic", "yarn"}) {
    mistral["rope_scaling"] = {{"rope_type", type}, {"factor", 2.0}};
    CHECK_THAT(parse_error(mistral), Catch::Contains(std::string("rope_scaling '") + type +
                                                     "' is not supported for mistral (transformers ignores it)"));
  }
}

namespace {

// Qwen/Qwen3-30B-A3B's config.json as the hub has it.
json qwen3_moe_json() {
  return json::parse(R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

}  // namespace

TEST_CASE("qwen3_moe: the hub's config.json parses, the experts' fields round-trip, bad values are refused", "[moe]") {
  const ModelConfig c = hf::parse_config(qwen3_moe_json());
  CHECK(c.arch == Arch::qwen3_moe);
  CHECK(c.qk_norm);
  CHECK_FALSE(c.attention_bias);
  CHECK(c.head_dim == 128);
  CHECK(c.num_experts == 128);
  CHECK(c.num_experts_per_tok == 8);
  CHECK(c.moe_intermediate_size == 768);
  CHECK(c.intermediate_size == 6144);
  CHECK(c.norm_topk_prob);
  CHECK(c.decoder_sparse_step == 1);
  CHECK(c.mlp_only_layers.empty());
  CHECK_FALSE(c.layers_differ());

  json defaults = qwen3_moe_json();  // transformers' defaults: norm_topk_prob false, mlp_only_layers null
  for (auto k : {"norm_topk_prob", "decoder_sparse_step"}) defaults.erase(k);
  defaults["mlp_only_layers"] = nullptr;
  const ModelConfig d = hf::parse_config(defaults);
  CHECK_FALSE(d.norm_topk_prob);
  CHECK(d.decoder_sparse_step == 1);

  json mixed = qwen3_moe_json();
  mixed["num_hidden_layers"] = 6;
  mixed["decoder_sparse_step"] = 2;
  mixed["mlp_only_layers"] = {3, 1, 3};  // transformers tests membership: order and repeats do not matter
  mixed["norm_topk_prob"] = false;
  const ModelConfig m = hf::parse_config(mixed);
  CHECK(m.mlp_only_layers == std::vector<std::int64_t>{1, 3});
  CHECK(m.layers_differ());
  const json out = hf::config_to_json(m, nullptr);
  CHECK(out["architectures"] == json::array({"Qwen3MoeForCausalLM"}));
  CHECK(out["mlp_only_layers"] == json::array({1, 3}));
  CHECK(out["decoder_sparse_step"] == 2);
  CHECK(out["norm_topk_prob"] == false);
  CHECK(out["moe_intermediate_size"] == 768);
  const ModelConfig back = hf::parse_config(out);
  CHECK(back.mlp_only_layers == m.mlp_only_layers);
  CHECK(back.decoder_sparse_step == 2);
  CHECK(back.num_experts == 128);
  CHECK(back.moe_intermediate_size == 768);
  CHECK_FALSE(back.norm_topk_prob);
  CHECK(back.head_dim == 128);

  auto with = [](const char* key, json value) {
    json j = qwen3_moe_json();
    j[key] = std::move(value);
    return j;
  };
  CHECK(hf::parse_config(with("output_router_logits", true)).output_router_logits);  // the load-balancing loss
  CHECK_THAT(parse_error(with("mlp_only_layers", {48})), Catch::Contains("mlp_only_layers holds 48"));
  CHECK_THAT(parse_error(with("mlp_only_layers", "0,1")), Catch::Contains("list of integers"));
  CHECK_THAT(parse_error(with("decoder_sparse_step", 0)), Catch::Contains("decoder_sparse_step"));
  CHECK_THAT(parse_error(with("num_experts_per_tok", 129)), Catch::Contains("exceeds num_experts"));
  CHECK_THAT(parse_error(with("use_sliding_window", true)), Catch::Contains("use_sliding_window"));
  CHECK_THAT(parse_error(with("attention_bias", true)), Catch::Contains("o_proj"));
  CHECK_THAT(parse_error(with("shared_expert_intermediate_size", 1024)),
             Catch::Contains("unsupported config field 'shared_expert_intermediate_size'"));
  CHECK_THAT(parse_error(with("architectures", {"Qwen3ForCausalLM"})), Catch::Contains("Qwen3MoeForCausalLM"));
}

namespace {
// openai/gpt-oss-120b's config.json as the hub has it (layer_types filled in below).
json gpt_oss_json() {
  json j = json::parse(R"({"architectures": ["GptOssForCausalLM"], "attention_bias": true,
    "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "num_local_experts": 128, "output_router_logits": false, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
      "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
      "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0", "use_cache": true,
    "vocab_size": 201088})");
  json types = json::array();
  for (int l = 0; l < 36; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  return j;
}
}  // namespace

TEST_CASE("gpt_oss: the hub's config.json parses, its fields round-trip, what transformers would not run is refused",
          "[moe]") {
  const ModelConfig c = hf::parse_config(gpt_oss_json());
  CHECK(c.arch == Arch::gpt_oss);
  CHECK(c.attention_bias);
  CHECK(c.o_proj_bias());
  CHECK(c.attention_sinks());
  CHECK(c.head_dim == 64);
  CHECK(c.num_experts == 128);
  CHECK(c.num_experts_per_tok == 4);
  CHECK(c.moe_intermediate_size == 2880);
  CHECK(c.sliding_window == 128);
  CHECK(c.sliding_layers.size() == 18);
  CHECK(c.layer_slides(0));
  CHECK_FALSE(c.layer_slides(1));
  CHECK(c.layers_differ());
  CHECK(c.layer_config(0).attention_window() == 128);
  CHECK(c.layer_config(1).attention_window() == 0);
  CHECK(c.swiglu_limit == 7.0f);
  CHECK(c.rope_scaling.type == RopeType::yarn);
  CHECK_FALSE(c.rope_scaling.truncate);
  CHECK(c.rope_scaling.original_max_position_embeddings == 4096);
  CHECK(c.norm_eps == 1e-5f);
  CHECK(c.rope_theta == 150000.0f);

  // GptOssConfig's defaults: layer 0 sliding then alternating, window 128, YaRN factor 32 (truncate false)
  json defaults = gpt_oss_json();
  for (auto k : {"layer_types", "sliding_window", "rope_scaling", "swiglu_limit", "head_dim", "rope_theta",
                 "rms_norm_eps", "max_position_embeddings"})
    defaults.erase(k);
  const ModelConfig d = hf::parse_config(defaults);
  CHECK(d.sliding_layers == c.sliding_layers);
  CHECK(d.sliding_window == 128);
  CHECK(d.rope_scaling.type == RopeType::yarn);
  CHECK(d.rope_scaling.factor == 32.0);
  CHECK_FALSE(d.rope_scaling.truncate);
  CHECK(d.head_dim == 64);
  CHECK(d.rope_theta == 150000.0f);
  CHECK(d.norm_eps == 1e-5f);
  CHECK(d.max_position_embeddings == 131072);
  json plain = gpt_oss_json();
  plain["rope_scaling"] = nullptr;  // None: plain RoPE
  CHECK(hf::parse_config(plain).rope_scaling.type == RopeType::none);

  // Export: the engine's config back in transformers' spelling, quantization dropped (the weights are not).
  json custom = gpt_oss_json();
  custom["layer_types"] = json::array();
  for (int l = 0; l < 36; ++l) custom["layer_types"].push_back(l < 3 ? "full_attention" : "sliding_attention");
  custom["sliding_window"] = 64;
  const ModelConfig m = hf::parse_config(custom);
  const json out = hf::config_to_json(m, &custom);
  CHECK(out["architectures"] == json::array({"GptOssForCausalLM"}));
  CHECK_FALSE(out.contains("quantization_config"));
  CHECK_FALSE(out.contains("experts_per_token"));
  CHECK(out["layer_types"] == custom["layer_types"]);
  CHECK(out["sliding_window"] == 64);
  CHECK(out["num_local_experts"] == 128);
  CHECK(out["swiglu_limit"] == 7.0);
  const ModelConfig back = hf::parse_config(out);
  CHECK(back.sliding_layers == m.sliding_layers);
  CHECK(back.sliding_window == 64);
  CHECK(back.rope_scaling == m.rope_scaling);
  CHECK(back.num_experts_per_tok == 4);

  auto with = [](const char* key, json value) {
    json j = gpt_oss_json();
    j[key] = std::move(value);
    return j;
  };
  CHECK_THAT(parse_error(with("swiglu_limit", 5.0)), Catch::Contains("swiglu_limit") && Catch::Contains("7.0"));
  CHECK_THAT(parse_error(with("attention_bias", false)), Catch::Contains("attention_bias=false"));
  CHECK_THAT(parse_error(with("experts_per_token", 2)), Catch::Contains("experts_per_token"));
  CHECK(hf::parse_config(with("output_router_logits", true)).output_router_logits);  // the load-balancing loss
  CHECK_THAT(parse_error(with("layer_types", json::array({"full_attention"}))),
             Catch::Contains("layer_types has 1 entries for 36 layers"));
  json odd = gpt_oss_json();
  odd["layer_types"][5] = "chunked_attention";
  CHECK_THAT(parse_error(odd), Catch::Contains("layer_types[5] is 'chunked_attention'"));
  CHECK_THAT(parse_error(with("sliding_window", 0)), Catch::Contains("sliding_window must be > 0"));
  CHECK_THAT(parse_error(with("sliding_window", nullptr)), Catch::Contains("sliding_window is null"));
  CHECK_THAT(parse_error(with("quantization_config", {{"quant_method", "gptq"}, {"bits", 4}})),
             Catch::Contains("unsupported quantization 'gptq'"));
  json extra = gpt_oss_json();
  extra["quantization_config"]["group_size"] = 64;
  CHECK_THAT(parse_error(extra), Catch::Contains("quantization_config field 'group_size'"));
  json q = qwen3_moe_json();
  q["quantization_config"] = {{"quant_method", "mxfp4"}};
  CHECK_THAT(parse_error(q), Catch::Contains("unsupported quantization 'mxfp4'") && Catch::Contains("qwen3_moe"));
  CHECK_THAT(parse_error(with("architectures", {"Qwen3ForCausalLM"})), Catch::Contains("GptOssForCausalLM"));
  ModelConfig lim = c;
  lim.swiglu_limit = 1.0f;
  CHECK_THROWS_WITH(hf::config_to_json(lim, nullptr), Catch::Contains("swiglu_limit"));
}

TEST_CASE("attention_bias=true is refused where transformers would bias o_proj too (llama, qwen3)") {
  json l = llama_json();
  l["attention_bias"] = true;
  CHECK_THAT(parse_error(l), Catch::Contains("attention_bias=true for llama") && Catch::Contains("o_proj"));
  ModelConfig c = hf::parse_config(llama_json());
  c.attention_bias = true;
  CHECK_THROWS_WITH(hf::config_to_json(c, nullptr), Catch::Contains("o_proj"));
}
