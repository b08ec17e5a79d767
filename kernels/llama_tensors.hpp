// Internal: what the Llama-family layer's two forms share (llama_layer.cpp, the whole sequence at once;
// llama_layer_tiled.cpp, in sequence tiles): its tensors by Hugging Face name, their binding, the
// attention shape and the operand room of its products.
#pragma once
#include <algorithm>

#include "kernels/ffn_block.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/layout_cache.hpp"

namespace mt::detail::llama {

// The attention half and the two norms; the feed-forward block binds its own (ffn_block.hpp).
// Absent tensors (biases, q/k norms, gpt-oss's o_proj bias and sinks) bind to null.
enum Tensor { in_norm, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, bo, sinks, post_norm, kTensors };
inline const char* const kNames[kTensors] = {
    "input_layernorm.weight",         "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",          "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",        "self_attn.o_proj.weight", "self_attn.o_proj.bias", "self_attn.sinks",
    "post_attention_layernorm.weight"};

template <class P>
using Bound = BoundTensors<P, kTensors>;

template <class P>
Bound<P> bind(const ModelConfig& c, P base, Precision prec) {  // offsets looked up once per model shape
  return bind_tensors(
      per_shape<TensorOffsets<kTensors>>(c, [&] { return find_offsets(cached_layer_layout(c), kNames); }), base, prec);
}

inline AttnShape attn_shape(const ModelConfig& c, std::int64_t B, std::int64_t T,
                            const std::int32_t* positions = nullptr) {
  AttnShape a;
  a.batch = B, a.seq = T, a.q_heads = c.num_attention_heads, a.kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim, a.q_stride = c.q_dim(), a.kv_stride = c.kv_dim(), a.o_stride = c.q_dim();
  a.window = c.attention_window();
  a.positions = positions;
  return a;
}

inline OperandRoom operand_room(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  const std::int64_t widest =
      std::max(B * T * std::max({c.hidden_size, c.q_dim(), c.kv_dim()}), ffn_operand_elements(c, B * T));
  return {widest, widest, std::max(c.hidden_size, c.head_dim)};
}

// The tiled form (llama_layer_tiled.cpp). sequence: where the sequence-sized buffers go (null: at the
// start of scratch, tiled_scratch_floats in all; else tiled_sequence_floats there, the rest in scratch).
std::size_t tiled_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T, std::int64_t tile);
std::size_t tiled_sequence_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
// attention (non-null): every tile's attention output then log-sum-exp, B x T x (q_dim + heads) floats.
std::size_t tiled_attention_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
void tiled_forward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, std::int64_t tile,
                   const LayerBuffers& bufs);
void tiled_backward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, std::int64_t tile,
                    const LayerBuffers& bufs);

}  // namespace mt::detail::llama
