#include "kernels/param_layout.hpp"

#include <stdexcept>

namespace mt {

namespace {

class LayoutBuilder {
 public:
  LayoutBuilder(StageKind kind, std::string prefix) { layout_.kind = kind, layout_.prefix = std::move(prefix); }
  void add(const std::string& name, std::vector<std::int64_t> shape) {
    TensorSpec t;
    t.name = name;
    t.numel = 1;
    for (auto d : shape) t.numel *= static_cast<std::size_t>(d);
    t.weight_decay = shape.size() >= 2;
    t.shape = std::move(shape);
    t.offset = layout_.total_floats;
    layout_.total_floats += align_floats(t.numel);
    layout_.tensors.push_back(std::move(t));
  }
  ParamLayout take() { return std::move(layout_); }

 private:
  ParamLayout layout_;
};

}  // namespace

const TensorSpec* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorSpec& ParamLayout::at(const std::string& name) const {
  if (const auto* t = find(name)) return *t;
  throw std::out_of_range("no tensor '" + prefix + name + "' in this stage");
}

std::size_t ParamLayout::param_count() const {
  std::size_t n = 0;
  for (const auto& t : tensors) n += t.numel;
  return n;
}

ParamLayout embedding_layout(const ModelConfig& c) {
  if (c.is_gpt2()) {
    LayoutBuilder b(StageKind::embedding, "transformer.");
    b.add("wte.weight", {c.vocab_size, c.hidden_size});
    b.add("wpe.weight", {c.max_position_embeddings, c.hidden_size});
    return b.take();
  }
  LayoutBuilder b(StageKind::embedding, "model.");
  b.add("embed_tokens.weight", {c.vocab_size, c.hidden_size});
  return b.take();
}

ParamLayout layer_layout(const ModelConfig& c, std::int64_t layer) {
  if (layer < 0 || layer >= c.num_hidden_layers)
    throw std::out_of_range("layer " + std::to_string(layer) + " out of range [0, " +
                            std::to_string(c.num_hidden_layers) + ")");
  if (c.layers_differ()) {  // this layer's own shape, under this layer's name
    ParamLayout l = layer_layout(c.layer_config(layer), layer);
    return l;
  }
  const auto d = c.hidden_size, ff = c.intermediate_size;
  if (c.is_gpt2()) {
    LayoutBuilder b(StageKind::layer, "transformer.h." + std::to_string(layer) + ".");
    b.add("ln_1.weight", {d});
    b.add("ln_1.bias", {d});
    b.add("attn.c_attn.weight", {3 * d, d});
    b.add("attn.c_attn.bias", {3 * d});
    b.add("attn.c_proj.weight", {d, d});
    b.add("attn.c_proj.bias", {d});
    b.add("ln_2.weight", {d});
    b.add("ln_2.bias", {d});
    b.add("mlp.c_fc.weight", {ff, d});
    b.add("mlp.c_fc.bias", {ff});
    b.add("mlp.c_proj.weight", {d, ff});
    b.add("mlp.c_proj.bias", {d});
    return b.take();
  }
  LayoutBuilder b(StageKind::layer, "model.layers." + std::to_string(layer) + ".");
  b.add("input_layernorm.weight", {d});
  b.add("self_attn.q_proj.weight", {c.q_dim(), d});
  if (c.attention_bias) b.add("self_attn.q_proj.bias", {c.q_dim()});
  b.add("self_attn.k_proj.weight", {c.kv_dim(), d});
  if (c.attention_bias) b.add("self_attn.k_proj.bias", {c.kv_dim()});
  b.add("self_attn.v_proj.weight", {c.kv_dim(), d});
  if (c.attention_bias) b.add("self_attn.v_proj.bias", {c.kv_dim()});
  if (c.qk_norm) {
    b.add("self_attn.q_norm.weight", {c.head_dim});
    b.add("self_attn.k_norm.weight", {c.head_dim});
  }
  b.add("self_attn.o_proj.weight", {d, c.q_dim()});
  if (c.o_proj_bias()) b.add("self_attn.o_proj.bias", {d});
  if (c.attention_sinks()) b.add("self_attn.sinks", {c.num_attention_heads});
  b.add("post_attention_layernorm.weight", {d});
  if (c.is_moe()) {
    // The router, then each kind of expert matrix for every expert in turn (gate, up, down): expert e's
    // matrix of a kind is e strides after expert 0's, so one grouped product reads them all; the biases
    // (gpt-oss) likewise, after the matrices.
    const std::int64_t E = c.num_experts, eff = c.moe_intermediate_size;
    b.add(moe_router_tensor(c), {E, d});
    if (c.moe_biases()) b.add(moe_router_bias_tensor(c), {E});
    for (ExpertMatrix m : {ExpertMatrix::gate, ExpertMatrix::up})
      for (std::int64_t e = 0; e < E; ++e) b.add(moe_expert_tensor(c, e, m), {eff, d});
    for (std::int64_t e = 0; e < E; ++e) b.add(moe_expert_tensor(c, e, ExpertMatrix::down), {d, eff});
    if (c.moe_biases())
      for (ExpertMatrix m : {ExpertMatrix::gate, ExpertMatrix::up, ExpertMatrix::down})
        for (std::int64_t e = 0; e < E; ++e)
          b.add(moe_expert_bias_tensor(c, e, m), {m == ExpertMatrix::down ? d : eff});
    return b.take();
  }
  b.add("mlp.gate_proj.weight", {ff, d});
  b.add("mlp.up_proj.weight", {ff, d});
  b.add("mlp.down_proj.weight", {d, ff});
  return b.take();
}

std::string moe_router_tensor(const ModelConfig& c) {
  if (c.is_gpt_oss()) return "mlp.router.weight";
  return c.arch == Arch::mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight";
}

std::string moe_router_bias_tensor(const ModelConfig& c) {
  if (!c.moe_biases()) throw std::logic_error(std::string(arch_name(c.arch)) + " has no router bias");
  return "mlp.router.bias";
}

std::string moe_expert_bias_tensor(const ModelConfig& c, std::int64_t expert, ExpertMatrix m) {
  if (!c.moe_biases()) throw std::logic_error(std::string(arch_name(c.arch)) + " has no expert biases");
  std::string name = moe_expert_tensor(c, expert, m);
  return name.replace(name.size() - 6, 6, "bias");  // "...gate_proj.weight" -> "...gate_proj.bias"
}

std::string moe_experts_prefix(const ModelConfig& c) {
  return c.arch == Arch::mixtral ? "block_sparse_moe.experts." : "mlp.experts.";
}

std::string moe_expert_tensor(const ModelConfig& c, std::int64_t expert, ExpertMatrix m) {
  static const char* const mixtral[] = {"w1", "w3", "w2"};
  static const char* const qwen[] = {"gate_proj", "up_proj", "down_proj"};
  const int i = static_cast<int>(m);
  return moe_experts_prefix(c) + std::to_string(expert) + "." + (c.arch == Arch::mixtral ? mixtral[i] : qwen[i]) +
         ".weight";
}

ParamLayout head_layout(const ModelConfig& c) {
  if (c.is_gpt2()) {
    // GPT-2 always ties its LM head to wte; ln_f is the whole stage.
    LayoutBuilder b(StageKind::head, "transformer.");
    b.add("ln_f.weight", {c.hidden_size});
    b.add("ln_f.bias", {c.hidden_size});
    return b.take();
  }
  LayoutBuilder b(StageKind::head, "");
  b.add("model.norm.weight", {c.hidden_size});
  if (!c.tie_word_embeddings) b.add("lm_head.weight", {c.vocab_size, c.hidden_size});
  return b.take();
}

ParamLayout stage_layout(const ModelConfig& c, std::int64_t stage) {
  if (stage == 0) return embedding_layout(c);
  if (stage == c.num_hidden_layers + 1) return head_layout(c);
  return layer_layout(c, stage - 1);
}

std::int64_t total_param_count(const ModelConfig& c) {
  std::int64_t n = 0;
  for (std::int64_t s = 0; s < num_stages(c); ++s) n += static_cast<std::int64_t>(stage_layout(c, s).param_count());
  return n;
}

std::int64_t layer_active_param_count(const ModelConfig& c, std::int64_t layer) {
  const ParamLayout l = layer_layout(c, layer);
  const ModelConfig lc = c.layer_config(layer);
  if (!lc.is_moe()) return static_cast<std::int64_t>(l.param_count());
  const std::string experts_prefix = moe_experts_prefix(lc);
  std::int64_t shared = 0, experts = 0;
  for (const auto& t : l.tensors)
    (t.name.rfind(experts_prefix, 0) == 0 ? experts : shared) += static_cast<std::int64_t>(t.numel);
  return shared + experts / lc.num_experts * lc.num_experts_per_tok;  // every expert has the same shapes
}

std::int64_t active_param_count(const ModelConfig& c) {
  std::int64_t n = total_param_count(c);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    n -= static_cast<std::int64_t>(layer_layout(c, l).param_count()) - layer_active_param_count(c, l);
  return n;
}

}  // namespace mt
