// layer_forward / layer_backward: validation and the workspace split (saved | scratch | operand room),
// then the family's stage over the ops (layer_impl.hpp).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/stages.hpp"

namespace mt {

namespace detail {

const LayerFamily& layer_family(const ModelConfig& c) { return c.is_gpt2() ? kGpt2Layer : kLlamaLayer; }

}  // namespace detail

namespace {

void check_pointers(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("layer: ") + what);
}

// Hands the ops the room after the saved and scratch regions.
void give_operand_room(Ops& ops, const detail::LayerFamily& f, const ModelConfig& c, std::int64_t batch,
                       std::int64_t seq, float* scratch) {
  ops.use_operand_room(scratch + f.scratch_floats(c, batch, seq), f.operand_room(c, batch, seq));
}

// The tiled form's scratch in the workspace: all of it, or without the sequence-sized part kept apart.
std::size_t tiled_workspace_scratch(const detail::LayerFamily& f, const ModelConfig& c, std::int64_t batch,
                                    std::int64_t seq, std::int64_t seq_tile, bool apart) {
  return f.tiled_scratch_floats(c, batch, seq, seq_tile) - (apart ? f.tiled_sequence_floats(c, batch, seq) : 0);
}

// The same for the tiled form: the room after its scratch, for one tile's rows.
void give_tiled_operand_room(Ops& ops, const detail::LayerFamily& f, const ModelConfig& c, std::int64_t batch,
                             std::int64_t seq, std::int64_t seq_tile, float* workspace, bool apart) {
  ops.use_operand_room(workspace + tiled_workspace_scratch(f, c, batch, seq, seq_tile, apart),
                       f.operand_room(c, 1, seq_tile));
}

// A layer computes with its own layer's config (ModelConfig::layer_config): a dense layer's offsets and
// shapes are not those of its MoE neighbours.
void refuse_mixed_layers(const ModelConfig& c) {
  if (c.layers_differ())
    throw std::invalid_argument(
        "layer: this model's layers differ (dense layers among expert layers, or sliding-window layers among "
        "full-attention ones): compute with the layer's own "
        "config (ModelConfig::layer_config)");
}

// The largest of a size over each kind of layer the model has (one kind unless its layers differ).
template <class Size>
std::size_t largest_over_layer_kinds(const ModelConfig& c, Size size) {
  if (!c.layers_differ()) return size(c);
  std::size_t most = 0;
  bool seen_moe = false, seen_dense = false;
  for (std::int64_t l = 0; l < c.num_hidden_layers && !(seen_moe && seen_dense); ++l) {
    bool& seen = c.layer_is_moe(l) ? seen_moe : seen_dense;
    if (seen) continue;
    seen = true;
    most = std::max(most, size(c.layer_config(l)));
  }
  return most;
}

}  // namespace

std::size_t layer_saved_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  return largest_over_layer_kinds(
      c, [&](const ModelConfig& lc) { return detail::layer_family(lc).saved_floats(lc, batch, seq); });
}

bool layer_has_seq_tiles(const ModelConfig& c) { return detail::layer_family(c).tiled_forward != nullptr; }

bool layer_runs_tiled(const ModelConfig& c, std::int64_t seq, std::int64_t seq_tile) {
  if (seq_tile < 0) throw std::invalid_argument("layer: seq_tile must be >= 0, got " + std::to_string(seq_tile));
  if (seq_tile == 0 || seq_tile >= seq) return false;
  if (!detail::layer_family(c).tiled_forward)
    throw std::invalid_argument(std::string("layer: the ") + detail::layer_family(c).name +
                                " family has no sequence-tiled form (seq_tile must be 0 or >= seq)");
  return true;
}

std::size_t layer_workspace_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, ActivationMode mode,
                                   Precision precision, std::int64_t seq_tile, SequenceBuffers sequence) {
  if (c.layers_differ())
    return largest_over_layer_kinds(c, [&](const ModelConfig& lc) {
      return layer_workspace_floats(lc, batch, seq, mode, precision, seq_tile, sequence);
    });
  const std::size_t saved = layer_saved_floats(c, batch, seq);
  const detail::LayerFamily& f = detail::layer_family(c);
  if (mode == ActivationMode::recompute && layer_runs_tiled(c, seq, seq_tile))
    return tiled_workspace_scratch(f, c, batch, seq, seq_tile, sequence == SequenceBuffers::apart) +
           operand_room_floats(precision, f.operand_room(c, 1, seq_tile));
  return f.scratch_floats(c, batch, seq) + (mode == ActivationMode::recompute ? saved : 0) +
         operand_room_floats(precision, f.operand_room(c, batch, seq));
}

namespace {

// A part of a tiled layer that its caller may keep apart (LayerFamily::tiled_sequence_floats,
// tiled_attention_floats): the largest over the model's layer kinds; 0 when the layer does not run tiled.
using TiledPart = std::size_t (*detail::LayerFamily::*)(const ModelConfig&, std::int64_t, std::int64_t);
std::size_t tiled_part_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t seq_tile,
                              TiledPart part) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  if (!layer_runs_tiled(c, seq, seq_tile)) return 0;
  return largest_over_layer_kinds(
      c, [&](const ModelConfig& lc) { return (detail::layer_family(lc).*part)(lc, batch, seq); });
}

}  // namespace

std::size_t layer_sequence_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t seq_tile) {
  return tiled_part_floats(c, batch, seq, seq_tile, &detail::LayerFamily::tiled_sequence_floats);
}

std::size_t layer_attention_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t seq_tile) {
  return tiled_part_floats(c, batch, seq, seq_tile, &detail::LayerFamily::tiled_attention_floats);
}

std::size_t stage_workspace_floats(const ModelConfig& c, std::int64_t stage, std::int64_t batch, std::int64_t seq,
                                   ActivationMode mode, Precision precision, std::int64_t seq_tile) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  if (stage < 0 || stage > c.num_hidden_layers + 1)
    throw std::invalid_argument("stage " + std::to_string(stage) + " out of range [0, " +
                                std::to_string(c.num_hidden_layers + 1) + "]");
  if (stage == 0) return 0;
  if (stage == c.num_hidden_layers + 1) return head_workspace_floats(c, batch, seq, 0, precision, seq_tile);
  return layer_workspace_floats(c, batch, seq, mode, precision, seq_tile);
}

void layer_forward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                   std::int64_t seq_tile) {
  const std::int64_t batch = rows.batch, seq = rows.seq;
  refuse_mixed_layers(c);
  LayerBuffers in = b;  // what the family gets: the saved and scratch carving, the balance if it applies
  if (in.balance && !c.is_moe()) in.balance = nullptr;  // a dense layer has no router
  if (in.balance && in.balance->counts) std::fill(in.balance->counts, in.balance->counts + c.num_experts, 0);
  if (in.balance && in.balance->prob_sums)
    std::fill(in.balance->prob_sums, in.balance->prob_sums + c.num_experts, 0.0f);
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);
  check_pointers(params && b.x_in && b.x_out && b.workspace, "params, x_in, x_out and workspace must be non-null");
  check_pointers(b.x_in != b.x_out, "x_out must not alias x_in");
  const detail::LayerFamily& f = detail::layer_family(c);
  if (!b.saved && layer_runs_tiled(c, seq, seq_tile)) {  // kept intermediates are whole-sequence
    give_tiled_operand_room(ops, f, c, batch, seq, seq_tile, b.workspace, b.sequence != nullptr);
    f.tiled_forward(ops, c, params, rows, seq_tile, in);
    return;
  }
  in.saved = b.saved ? b.saved : b.workspace;
  in.workspace = b.saved ? b.workspace : b.workspace + saved_n;
  give_operand_room(ops, f, c, batch, seq, in.workspace);
  f.forward(ops, c, params, rows, in);
}

void layer_backward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                    std::int64_t seq_tile) {
  const std::int64_t batch = rows.batch, seq = rows.seq;
  refuse_mixed_layers(c);
  LayerBuffers in = b;  // as in the forward
  if (in.balance && (!c.is_moe() || !in.balance->grad)) in.balance = nullptr;
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);
  check_pointers(params && b.x_in && b.dy && b.dx && b.grads && b.workspace,
                 "params, x_in, dy, dx, grads and workspace must be non-null");
  check_pointers(b.dx != b.dy, "dx must not alias dy");
  const bool recompute = b.saved == nullptr;
  const detail::LayerFamily& f = detail::layer_family(c);
  if (recompute && layer_runs_tiled(c, seq, seq_tile)) {
    give_tiled_operand_room(ops, f, c, batch, seq, seq_tile, b.workspace, b.sequence != nullptr);
    f.tiled_backward(ops, c, params, rows, seq_tile, in);
    return;
  }
  in.saved = recompute ? b.workspace : b.saved;  // read-only when not recomputing
  in.workspace = recompute ? b.workspace + saved_n : b.workspace;
  give_operand_room(ops, f, c, batch, seq, in.workspace);
  f.backward(ops, c, params, rows, in, recompute);
}

void layer_forward(const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                   const ComputeCtx& ctx) {
  validate_positions(rows);
  cpu::CpuOps ops(ctx.precision, ctx.threads);
  layer_forward(ops, c, params, rows, b, ctx.seq_tile);
}

void layer_backward(const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                    const ComputeCtx& ctx) {
  validate_positions(rows);
  cpu::CpuOps ops(ctx.precision, ctx.threads);
  layer_backward(ops, c, params, rows, b, ctx.seq_tile);
}

}  // namespace mt
