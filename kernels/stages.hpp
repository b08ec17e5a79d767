// The stages over an op set (ops.hpp): what every backend runs. Same semantics, shapes, workspace sizes
// and validation as the stage API (stage_api.hpp), whose ComputeCtx overloads are these with the CPU ops;
// the one difference is that token ids and targets are not read here (they may live on a device): the
// caller validates them first (validate_tokens / validate_targets on a host copy).
#pragma once
#include <cstdint>

#include "kernels/ops.hpp"
#include "kernels/stage_api.hpp"

namespace mt {

// rows (BatchRows, stage_api.hpp): the micro-batch's shape and, with documents, its positions where the
// backend computes (validated by the caller on a host copy, as the tokens). The (batch, seq) forms are the
// stream's: no positions.
void embedding_forward(Ops& ops, const ModelConfig& c, const void* params, const token_t* tokens, const BatchRows& rows,
                       float* x_out);
void embedding_backward(Ops& ops, const ModelConfig& c, const token_t* tokens, const BatchRows& rows, const float* dx,
                        float* grads);
inline void embedding_forward(Ops& ops, const ModelConfig& c, const void* params, const token_t* tokens,
                              std::int64_t batch, std::int64_t seq, float* x_out) {
  embedding_forward(ops, c, params, tokens, BatchRows{batch, seq}, x_out);
}
inline void embedding_backward(Ops& ops, const ModelConfig& c, const token_t* tokens, std::int64_t batch,
                               std::int64_t seq, const float* dx, float* grads) {
  embedding_backward(ops, c, tokens, BatchRows{batch, seq}, dx, grads);
}

// seq_tile as ComputeCtx::seq_tile (0: whole sequences).
// balance: the load-balancing loss's statistics out of the forward and gradient into the backward.
// sequence: in sequence tiles, where the sequence-sized buffers are (layer_sequence_floats, e.g. in host
// RAM); the workspace is then sized with SequenceBuffers::apart. Null: in the workspace. Ignored when the
// layer does not run tiled. Where they are never changes the results.
// attention: in sequence tiles, layer_attention_floats that the forward fills with the layer's attention
// output and log-sum-exp and the backward of the same micro-batch reads, so it does not run the attention
// forward again (null: it does). The same bits either way. Ignored when the layer does not run tiled.
void layer_forward(Ops& ops, const ModelConfig& c, const void* params, const float* x_in, float* x_out,
                   const BatchRows& rows, float* saved, float* workspace, std::int64_t seq_tile = 0,
                   const MoeBalance* balance = nullptr, float* sequence = nullptr, float* attention = nullptr);
void layer_backward(Ops& ops, const ModelConfig& c, const void* params, const float* x_in, const float* saved,
                    const float* dy, float* dx, float* grads, const BatchRows& rows, float* workspace,
                    std::int64_t seq_tile = 0, const MoeBalance* balance = nullptr, float* sequence = nullptr,
                    const float* attention = nullptr);
inline void layer_forward(Ops& ops, const ModelConfig& c, const void* params, const float* x_in, float* x_out,
                          std::int64_t batch, std::int64_t seq, float* saved, float* workspace,
                          std::int64_t seq_tile = 0, const MoeBalance* balance = nullptr, float* sequence = nullptr,
                          float* attention = nullptr) {
  layer_forward(ops, c, params, x_in, x_out, BatchRows{batch, seq}, saved, workspace, seq_tile, balance, sequence,
                attention);
}
inline void layer_backward(Ops& ops, const ModelConfig& c, const void* params, const float* x_in, const float* saved,
                           const float* dy, float* dx, float* grads, std::int64_t batch, std::int64_t seq,
                           float* workspace, std::int64_t seq_tile = 0, const MoeBalance* balance = nullptr,
                           float* sequence = nullptr, const float* attention = nullptr) {
  layer_backward(ops, c, params, x_in, saved, dy, dx, grads, BatchRows{batch, seq}, workspace, seq_tile, balance,
                 sequence, attention);
}

// head_chunk as ComputeCtx::head_chunk (0: head_chunk_tokens()), seq_tile as ComputeCtx::seq_tile.
LossSum head_forward_backward(Ops& ops, const ModelConfig& c, const void* head_params, const void* embed_params,
                              const float* x_in, const token_t* targets, std::int64_t batch, std::int64_t seq,
                              float* dx, float* head_grads, float* embed_grads, float* workspace,
                              std::int64_t head_chunk, std::int64_t seq_tile = 0);
void head_logits(Ops& ops, const ModelConfig& c, const void* head_params, const void* embed_params, const float* x_in,
                 std::int64_t batch, std::int64_t seq, float* logits, float* workspace, std::int64_t head_chunk);

}  // namespace mt
