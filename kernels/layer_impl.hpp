// Internal: the decoder-layer families behind layer_forward / layer_backward (stage_api.hpp, stages.hpp).
// A family is one entry of this table: its Saved carving (what the forward keeps for the backward, the
// caller's keep buffer or the front of the workspace when recomputing), its scratch, the operand room
// its products need, and its forward and backward written once over the ops (ops.hpp). Adding a family
// is one new file defining a LayerFamily plus one line in layer_family() (kernels/README.md).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/model_config.hpp"
#include "kernels/ops.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/precision.hpp"
#include "kernels/stage_api.hpp"

namespace mt::detail {

struct LayerFamily {
  const char* name;
  std::size_t (*saved_floats)(const ModelConfig& c, std::int64_t B, std::int64_t T);
  std::size_t (*scratch_floats)(const ModelConfig& c, std::int64_t B, std::int64_t T);
  OperandRoom (*operand_room)(const ModelConfig& c, std::int64_t B, std::int64_t T);
  // The layer's buffers (LayerBuffers, stage_api.hpp) as layer.cpp carved them: `saved` is where the
  // Saved carving lives (the caller's keep buffer, or the workspace's front when recomputing) and
  // `workspace` the scratch after it; `balance` is null for a dense layer or when not wanted. rows: the
  // micro-batch's shape and documents' positions (BatchRows).
  // forward: x_out == nullptr stops after the last activation (what a recomputing backward needs).
  void (*forward)(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b);
  // recompute: run the forward into `saved` first (from x_in); otherwise `saved` holds it and x_in is unused.
  void (*backward)(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                   bool recompute);
  // Sequence tiles (long context; null: the family runs whole sequences only): the same layer over
  // `tile` tokens of one sequence at a time, recomputing in its backward; only what attention needs
  // over the whole sequence (keys, values and their gradients) is sequence-sized. The workspace is all
  // scratch (there is no Saved; `saved` is unused); the operand room is operand_room(c, 1, tile). The
  // sequence-sized part (tiled_sequence_floats, at the workspace's start) goes to `sequence` instead when
  // that is non-null. `attention` (non-null): the forward writes each tile's attention output and
  // log-sum-exp there (tiled_attention_floats) and the backward reads them instead of recomputing the
  // attention forward.
  std::size_t (*tiled_scratch_floats)(const ModelConfig& c, std::int64_t B, std::int64_t T, std::int64_t tile);
  std::size_t (*tiled_sequence_floats)(const ModelConfig& c, std::int64_t B, std::int64_t T);
  std::size_t (*tiled_attention_floats)(const ModelConfig& c, std::int64_t B, std::int64_t T);
  void (*tiled_forward)(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, std::int64_t tile,
                        const LayerBuffers& b);
  void (*tiled_backward)(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, std::int64_t tile,
                         const LayerBuffers& b);
};

extern const LayerFamily kLlamaLayer;  // llama_layer.cpp: Llama, Mistral, Qwen2, Qwen3
extern const LayerFamily kGpt2Layer;   // gpt2_layer.cpp
const LayerFamily& layer_family(const ModelConfig& c);

// A tensor `elements` into a parameter buffer of the run's precision (weights) or fp32 (gradients).
inline const void* elem_offset(const void* base, std::size_t elements, Precision p) {
  return static_cast<const char*>(base) + elements * bytes_per_param(p);
}
inline float* elem_offset(float* base, std::size_t elements, Precision) { return base + elements; }

// The offsets of K named tensors of a stage layout, -1 for the absent ones (optional biases, norms).
template <int K>
struct TensorOffsets {
  std::ptrdiff_t at[K];
};
template <int K>
TensorOffsets<K> find_offsets(const ParamLayout& l, const char* const (&names)[K]) {
  TensorOffsets<K> r{};
  for (int i = 0; i < K; ++i) {
    const TensorSpec* t = l.find(names[i]);
    r.at[i] = t ? static_cast<std::ptrdiff_t>(t->offset) : -1;
  }
  return r;
}
// A stage buffer's K tensors as pointers (weights of the run's precision, or fp32 gradients), indexed by
// the family's tensor enum; null for the absent ones.
template <class P, int K>
struct BoundTensors {
  P t[K];
  template <class E>
  P operator[](E i) const {
    return t[static_cast<int>(i)];
  }
};
template <class P, int K>
BoundTensors<P, K> bind_tensors(const TensorOffsets<K>& off, P base, Precision p) {
  BoundTensors<P, K> b{};
  for (int i = 0; i < K; ++i)
    b.t[i] = off.at[i] >= 0 ? elem_offset(base, static_cast<std::size_t>(off.at[i]), p) : nullptr;
  return b;
}

}  // namespace mt::detail
