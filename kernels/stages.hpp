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

// The layer stages over the buffers of LayerBuffers (stage_api.hpp); seq_tile as ComputeCtx::seq_tile
// (0: whole sequences).
void layer_forward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                   std::int64_t seq_tile = 0);
void layer_backward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                    std::int64_t seq_tile = 0);

// head_chunk as ComputeCtx::head_chunk (0: head_chunk_tokens()), seq_tile as ComputeCtx::seq_tile.
LossSum head_forward_backward(Ops& ops, const ModelConfig& c, const void* head_params, const void* embed_params,
                              const BatchRows& rows, const HeadBuffers& b, std::int64_t head_chunk,
                              std::int64_t seq_tile = 0);
void head_logits(Ops& ops, const ModelConfig& c, const void* head_params, const void* embed_params, const float* x_in,
                 std::int64_t batch, std::int64_t seq, float* logits, float* workspace, std::int64_t head_chunk);

}  // namespace mt
