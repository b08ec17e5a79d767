// Hugging Face config.json <-> mt::ModelConfig, for the five supported architectures:
// LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, GPT2LMHeadModel.
//
// Parsing is strict: a field the engine does not implement (sliding windows, rope types other than
// default/llama3, MLP biases, activations other than SiLU / GPT-2's tanh GELU, quantization, ...) or a
// field this parser does not know is an error naming that field and the file. Generic PretrainedConfig
// fields (token ids, generation defaults, torch_dtype, ...) and dropout probabilities are accepted and
// ignored: the engine trains without dropout.
#pragma once
#include <filesystem>
#include <stdexcept>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "kernels/model_config.hpp"

namespace mt::hf {

// Every error this library throws: bad input files, unsupported configs, I/O failures. The message
// names the file and, where there is one, the tensor or field.
class HfError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses a config.json object; `source` (usually the file's path) appears in error messages.
ModelConfig parse_config(const nlohmann::json& config, const std::string& source = "config.json");

// Reads DIR/config.json (or the file itself when given a file).
ModelConfig load_config(const std::filesystem::path& dir_or_file);

// config.json's rope_scaling for these params (null for plain RoPE): rope_type, factor and the type's
// own fields, as parse_config reads them back (yarn's beta_fast / beta_slow always written; the other
// optional fields only when set).
nlohmann::json rope_scaling_json(const RopeScaling& rs);

// The config.json content transformers 4.46 loads for `c` ("architectures", "model_type" and the
// family's own field names). `base`, when an object (the config.json a model was imported from), is
// the starting point: its other fields (token ids, ...) are kept, the architecture fields overwritten.
nlohmann::json config_to_json(const ModelConfig& c, const nlohmann::json* base = nullptr);

// "LlamaForCausalLM", ... for the architecture.
const char* architecture_class(Arch a);

}  // namespace mt::hf
