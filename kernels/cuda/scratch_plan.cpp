#include "kernels/cuda/scratch_plan.hpp"

#include "kernels/layer_impl.hpp"
#include "kernels/stage_api.hpp"

namespace mt::cuda {

const char* scratch_slot_name(int slot) {
  static const char* const names[kSlots] = {"bf16 operands",      "bf16 output gradients", "column-sum partials",
                                            "attention row dots", "expert dispatch",       "load-balancing partials"};
  return slot >= 0 && slot < kSlots ? names[slot] : "?";
}

namespace {

// Every column count a column sum (norm weights, biases) of layer config c may have.
std::int64_t widest_colsum(const ModelConfig& c) {
  return std::max({c.hidden_size, c.head_dim, c.q_dim() + 2 * c.kv_dim(), 3 * c.hidden_size, 2 * c.intermediate_size,
                   2 * c.moe_intermediate_size, c.num_experts});
}

// The most splits colsum_plan makes for any row count up to `rows`: ceil(rows / 32) below 4096 rows
// (splits of 32), at most kColsumMaxSplits above.
std::int64_t most_colsum_splits(std::int64_t rows) {
  return std::min<std::int64_t>(kColsumMaxSplits, (rows + 31) / 32);
}

// The widest bf16 operand of a layer's products over B x T tokens: the stage's own operand room, but for a
// mixture's experts, which CUDA multiplies one expert at a time (Ops' grouped default): at most every
// token's rows (a token picks an expert once), not the CPU's room for all top_k x tokens choices at once.
OperandRoom cuda_operand_room(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  if (!c.is_moe()) return detail::layer_family(c).operand_room(c, B, T);
  const std::int64_t n = B * T;
  const std::int64_t widest =
      n * std::max({c.hidden_size, c.q_dim(), c.kv_dim(), c.num_experts, c.moe_intermediate_size});
  return {widest, widest, 0};
}

}  // namespace

ScratchPlan cuda_scratch_plan(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t seq_tile,
                              std::int64_t head_chunk, Precision p) {
  ScratchPlan plan;
  const bool tiles = seq_tile > 0 && seq_tile < seq;
  const std::int64_t N = batch * seq;
  std::int64_t rows = N, cols = c.hidden_size;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const ModelConfig li = c.layer_config(i);
    if (p == Precision::bf16) {  // the stage's own operand room (a tiled layer's: one tile's)
      const bool tiled = tiles && layer_has_seq_tiles(li);
      const OperandRoom room = cuda_operand_room(li, tiled ? 1 : batch, tiled ? seq_tile : seq);
      plan.cover(bf16_operand, bf16_operand_bytes(room.activation));
      plan.cover(bf16_gradient, bf16_operand_bytes(room.gradient));
    }
    rows = std::max(rows, N * std::max<std::int64_t>(1, li.num_attention_heads));  // per-head q/k norms
    cols = std::max(cols, widest_colsum(li));
    AttnShape a;
    a.batch = batch, a.seq = seq, a.q_heads = li.num_attention_heads;
    plan.cover(attention_rowdot, rowdot_bytes(a));
    if (li.is_moe()) {
      RouteShape s;
      s.tokens = N, s.experts = li.num_experts, s.top_k = li.num_experts_per_tok;
      plan.cover(moe_offsets, dispatch_scratch_bytes(s.choices(), s.experts));
      plan.cover(moe_balance, balance_bytes(s));
    }
  }
  if (p == Precision::bf16) {  // the head: the normed rows (in tiles: one chunk's), one chunk's logits gradient
    std::int64_t chunk = head_chunk > 0 ? std::min(head_chunk, N) : head_chunk_tokens(c, batch, seq);
    if (tiles) chunk = std::min(chunk, seq_tile);
    plan.cover(bf16_operand, bf16_operand_bytes((tiles ? chunk : N) * c.hidden_size));
    plan.cover(bf16_gradient, bf16_operand_bytes(chunk * c.vocab_size));
  }
  plan.cover(colsum_partial, static_cast<std::size_t>(most_colsum_splits(rows) * cols) * sizeof(float));
  return plan;
}

}  // namespace mt::cuda
