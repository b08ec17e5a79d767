// Hugging Face model directories <-> megatrain stages.
//
// Names: a tensor's Hugging Face name is ParamLayout::prefix + TensorSpec::name. GPT-2's decoder-layer
// matrices are Conv1D in transformers, stored [in, out] in files; the engine holds them [out, in], so
// they are transposed at this boundary. Ignored on load: GPT-2's attn.bias / attn.masked_bias buffers,
// rotary_emb.inv_freq buffers, and lm_head.weight when the embeddings are tied (transformers ties it).
// GPT-2 files saved from GPT2Model (names without "transformer.") load too. Experts load from
// transformers v4's per-expert names (what this engine writes: Mixtral's block_sparse_moe.experts.N.w1/w2/w3,
// Qwen3-MoE's mlp.experts.N.gate_proj/up_proj/down_proj) or from v5's fused tensors
// (experts.gate_up_proj [E, 2 ff, d], gate first; experts.down_proj [E, d, ff]; Mixtral's under
// block_sparse_moe. or mlp., whose router is then mlp.gate.weight).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/model_config.hpp"
#include "kernels/param_layout.hpp"
#include "storage/hf/dtype.hpp"
#include "storage/hf/gpt_oss_experts.hpp"

namespace mt::hf {

class SafetensorsReader;

// The tensor's name and shape in a Hugging Face file, and whether the file holds it transposed.
struct HfTensorName {
  std::string name;
  std::vector<std::int64_t> file_shape;
  bool transposed = false;
};
HfTensorName hf_tensor(const ModelConfig& c, const ParamLayout& layout, const TensorSpec& t);

// Opens DIR (config.json, then model.safetensors or model.safetensors.index.json with its shards) and
// checks every tensor of every stage before anything is read: present, F32/BF16/F16, right shape; a
// missing shard, an index entry the shard lacks, or an unexpected tensor is an HfError naming the file.
class HfModelReader {
 public:
  explicit HfModelReader(const std::filesystem::path& dir);
  ~HfModelReader();

  const ModelConfig& config() const { return config_; }
  const nlohmann::json& config_json() const { return config_json_; }  // config.json as found
  const std::filesystem::path& dir() const { return dir_; }

  // Fills dst (stage_layout(config(), stage).total_floats floats, padding zeroed) in fp32.
  void read_stage(std::int64_t stage, float* dst) const;

 private:
  struct Location {
    const SafetensorsReader* file = nullptr;
    std::string name_in_file;
    // A slice of a fused tensor (transformers v5's Mixtral experts): its shape in the file, and the
    // first element and count of ours; count 0 = the whole tensor.
    std::vector<std::int64_t> fused_shape;
    std::size_t first = 0, count = 0;
    // gpt-oss's experts: fused and interleaved, or MXFP4 (scales_file holds the scales).
    std::optional<gpt_oss::ExpertSource> expert;
    const SafetensorsReader* scales_file = nullptr;
  };
  const Location& locate(const std::string& name) const;

  std::filesystem::path dir_;
  nlohmann::json config_json_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, Location> locations_;  // full HF name -> where it is
};

struct HfExportOptions {
  DType dtype = DType::f32;
  std::uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default max_shard_size ("5GB")
  std::filesystem::path tokenizer_dir;            // tokenizer files copied from here when not empty
  const nlohmann::json* base_config = nullptr;    // config.json the model came from (keeps token ids, ...)
};

// Writes a model directory transformers loads: config.json, safetensors (sharded past the limit, with
// the index), tokenizer files. stage_source(s) returns stage s's fp32 buffer, valid until the next call,
// so only one stage needs to be in memory.
void write_hf_model(const std::filesystem::path& dir, const ModelConfig& c,
                    const std::function<const float*(std::int64_t stage)>& stage_source,
                    const HfExportOptions& options);

// Copies the tokenizer and generation files that exist in `from` (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, vocab.json, merges.txt, tokenizer.model, added_tokens.json,
// generation_config.json) into `to`; returns the names copied.
std::vector<std::string> copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace mt::hf
