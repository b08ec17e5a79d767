// config.json parsing for the five architectures, its strictness, and the way back.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

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
  CHECK_THAT(parse_error(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}})),
             Catch::Contains("dir/config.json") && Catch::Contains("rope_scaling type 'yarn'"));
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
  mistral["sliding_window"] = 64;
  CHECK_THAT(parse_error(mistral), Catch::Contains("sliding_window=64"));
  mistral["sliding_window"] = 4096;  // >= max_position_embeddings: never slides
  CHECK(parse_error(mistral).empty());

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
}
