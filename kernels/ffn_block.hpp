// Internal: the feed-forward block of a Llama-family layer, after its post-attention norm: the dense
// SwiGLU MLP (mlp.gate_proj / up_proj / down_proj) or, for a mixture-of-experts model (c.is_moe()),
// a router and num_experts SwiGLU experts (Mixtral's block_sparse_moe). Both forms of the layer (the whole
// sequence, llama_layer.cpp; sequence tiles, llama_layer_tiled.cpp) call these on n token rows, so a
// family that differs only in its MLP is this file's business, not a layer of its own.
//
// The mixture, on n rows xn (k = num_experts_per_tok, P = n k choices):
//   logits = xn router^T; (expert, weight) = route(logits); group the P choices by expert (dispatch);
//   xe = the chosen rows of xn, by expert; ye = w2_e(silu(w1_e xe) * w3_e xe), one product per expert;
//   y[t] = sum_j weight[t, j] ye[row of (t, j)].
// Its backward runs the same in reverse; an expert no token chose is skipped, so its gradient stays zero
// (and AdamW still decays its weights and moments: the optimizer sees every tensor).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/model_config.hpp"
#include "kernels/ops.hpp"

namespace mt::detail {

// Floats the forward keeps for the backward, and the backward's own scratch, for n token rows.
std::size_t ffn_saved_floats(const ModelConfig& c, std::int64_t n);
std::size_t ffn_scratch_floats(const ModelConfig& c, std::int64_t n);
// The widest operand of the block's products, in elements, for n rows (the layer's operand room).
std::int64_t ffn_operand_elements(const ModelConfig& c, std::int64_t n);

// From xn[n, d]: the activations into `saved`, and with y non-null y[n, d] = block(xn) (overwritten).
// Without y the dense block stops before its activation and last product (a recomputing backward starts
// from there); the experts compute theirs anyway (the combine's backward reads them).
// scratch (ffn_scratch_floats, free during the forward): where the dense block's activation is made for
// its last product.
// balance (experts only; may be null): the load-balancing statistics added into its host arrays.
void ffn_forward(Ops& ops, const ModelConfig& c, const void* params, const float* xn, std::int64_t n, float* saved,
                 float* y, float* scratch, const MoeBalance* balance = nullptr);
// dxn[n, d] (overwritten) from dy[n, d]; the block's weight gradients added into `grads` (the layer's
// gradient buffer). `saved` is what ffn_forward wrote for this xn.
// balance->grad (experts only; may be null): the load-balancing loss's gradient joins the router's.
void ffn_backward(Ops& ops, const ModelConfig& c, const void* params, float* grads, const float* xn, std::int64_t n,
                  const float* saved, const float* dy, float* dxn, float* scratch, const MoeBalance* balance = nullptr);

}  // namespace mt::detail
