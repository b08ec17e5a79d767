// Where every parameter of a model lives. A model is a sequence of stages that stream through the
// compute device one at a time: stage 0 the embedding, stages 1..L the decoder layers, stage L+1 the
// head (final norm and, when untied, the LM head). Each stage's parameters are one flat fp32 buffer;
// a ParamLayout names the tensors in it with their shapes and offsets (each offset a multiple of
// kAlignFloats, so every tensor starts on a 64-byte boundary).
//
// Tensor names are the Hugging Face names relative to the stage ("self_attn.q_proj.weight"); the
// full name adds the stage prefix ("model.layers.3."). Matrices are stored [out, in] row-major as
// torch.nn.Linear does (y = x W^T) — GPT-2 included, whose Hugging Face Conv1D files hold [in, out]
// (the interop code transposes at the boundary).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/model_config.hpp"

namespace mt {

inline constexpr std::size_t kAlignFloats = 16;  // 64 bytes
inline constexpr std::size_t align_floats(std::size_t n) {
  return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

struct TensorSpec {
  std::string name;                 // relative to the stage, Hugging Face spelling
  std::vector<std::int64_t> shape;  // [out, in] for matrices
  std::size_t offset = 0;           // in floats from the stage buffer's start
  std::size_t numel = 0;
  bool weight_decay = false;  // matrices decay; norms and biases do not
};

enum class StageKind { embedding, layer, head };

struct ParamLayout {
  StageKind kind = StageKind::layer;
  std::string prefix;  // full name = prefix + tensor name ("model.layers.3." + "mlp.up_proj.weight")
  std::vector<TensorSpec> tensors;
  std::size_t total_floats = 0;  // buffer size, padded to kAlignFloats

  // Throws std::out_of_range naming the tensor when absent.
  const TensorSpec& at(const std::string& name) const;
  const TensorSpec* find(const std::string& name) const;
  std::size_t param_count() const;  // sum of numel (excludes padding)
};

// Stage indices: 0 = embedding, 1..L = layers 0..L-1, L+1 = head.
inline std::int64_t num_stages(const ModelConfig& c) { return c.num_hidden_layers + 2; }
ParamLayout embedding_layout(const ModelConfig& c);
ParamLayout layer_layout(const ModelConfig& c, std::int64_t layer);
ParamLayout head_layout(const ModelConfig& c);
ParamLayout stage_layout(const ModelConfig& c, std::int64_t stage);

// A mixture-of-experts layer's tensors by the family's Hugging Face (transformers v4) names, relative to
// the layer. Mixtral: the router "block_sparse_moe.gate.weight", expert e's matrices
// "block_sparse_moe.experts.<e>.{w1,w3,w2}.weight" (gate, up, down). Qwen3-MoE: "mlp.gate.weight" and
// "mlp.experts.<e>.{gate_proj,up_proj,down_proj}.weight". transformers v5 fuses each kind over experts
// (storage/hf reads both). gpt-oss: "mlp.router.weight" and Qwen3-MoE's per-expert names, with biases;
// its files hold them fused and gate/up interleaved (storage/hf converts both ways).
enum class ExpertMatrix { gate, up, down };
std::string moe_router_tensor(const ModelConfig& c);
std::string moe_experts_prefix(const ModelConfig& c);  // "block_sparse_moe.experts." / "mlp.experts."
std::string moe_expert_tensor(const ModelConfig& c, std::int64_t expert, ExpertMatrix m);
// gpt-oss's biases (ModelConfig::moe_biases): the router's ("mlp.router.bias") and each expert matrix's
// ("mlp.experts.N.gate_proj.bias", ...), kept per expert like the matrices.
std::string moe_router_bias_tensor(const ModelConfig& c);
std::string moe_expert_bias_tensor(const ModelConfig& c, std::int64_t expert, ExpertMatrix m);

std::int64_t total_param_count(const ModelConfig& c);
// Parameters one token computes with: all of them for a dense model; with experts, a layer's router,
// attention and norms plus num_experts_per_tok of its num_experts experts (what FLOPs scale with, while
// memory and the link carry total_param_count).
std::int64_t layer_active_param_count(const ModelConfig& c, std::int64_t layer);
std::int64_t active_param_count(const ModelConfig& c);

}  // namespace mt
