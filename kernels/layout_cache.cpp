#include "kernels/layout_cache.hpp"

namespace mt::detail {

// Everything a stage layout depends on.
bool same_layout_shape(const ModelConfig& a, const ModelConfig& b) {
  return a.arch == b.arch && a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.num_attention_heads == b.num_attention_heads && a.num_key_value_heads == b.num_key_value_heads &&
         a.head_dim == b.head_dim && a.intermediate_size == b.intermediate_size &&
         a.max_position_embeddings == b.max_position_embeddings && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.attention_bias == b.attention_bias && a.qk_norm == b.qk_norm && a.num_experts == b.num_experts &&
         a.num_experts_per_tok == b.num_experts_per_tok && a.moe_intermediate_size == b.moe_intermediate_size &&
         a.mlp_only_layers == b.mlp_only_layers && a.decoder_sparse_step == b.decoder_sparse_step;
  // sliding_layers changes no tensor: gpt-oss's alternating layers share one cached layout.
}

namespace {

struct Entry {
  bool valid = false;
  ModelConfig config;
  ParamLayout layout;
};

template <class Build>
const ParamLayout& lookup(Entry& e, const ModelConfig& c, Build build) {
  if (!e.valid || !same_layout_shape(e.config, c)) {
    e.layout = build();
    e.config = c;
    e.valid = true;
  }
  return e.layout;
}

}  // namespace

const ParamLayout& cached_embedding_layout(const ModelConfig& c) {
  thread_local Entry e;
  return lookup(e, c, [&] { return embedding_layout(c); });
}

const ParamLayout& cached_layer_layout(const ModelConfig& c) {
  thread_local Entry e;
  return lookup(e, c, [&] { return layer_layout(c, 0); });
}

const ParamLayout& cached_head_layout(const ModelConfig& c) {
  thread_local Entry e;
  return lookup(e, c, [&] { return head_layout(c); });
}

}  // namespace mt::detail
