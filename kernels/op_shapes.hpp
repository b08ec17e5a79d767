// The shapes the op seam passes (ops.hpp), in a header of their own so the CUDA kernels can use them
// without the model headers.
#pragma once
#include <cstdint>

namespace mt {

// Rotary embeddings as transformers computes its inv_freq and attention scaling (modeling_rope_utils.py,
// ROPE_INIT_FUNCTIONS): `kind` picks the rope_type, and only that type's fields are read (the others
// keep their defaults, so two params of the same type compare equal field by field).
enum class RopeKind : int { plain, llama3, linear, dynamic, yarn };

struct RopeParams {
  RopeKind kind = RopeKind::plain;
  float theta = 10000.0f;
  double factor = 1.0;                                   // llama3, linear, dynamic, yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  // llama3: rope_scaling.original_max_position_embeddings; dynamic: the length above which the base
  // grows; yarn: the length the correction range is computed for.
  std::int64_t original_max_position = 8192;
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  bool truncate = true;                      // yarn: floor/ceil the correction range (transformers 4.46)
  double attention_scaling = 1.0;            // multiplies cos and sin (yarn's attention factor; 1 elsewhere)

  // Every field, so that the table caches (cpu/rope.cpp, cuda/ops.cu) can never miss one: the
  // static_assert below fails when a field is added without being compared here.
  bool operator==(const RopeParams& o) const {
    return kind == o.kind && theta == o.theta && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position == o.original_max_position &&
           beta_fast == o.beta_fast && beta_slow == o.beta_slow && truncate == o.truncate &&
           attention_scaling == o.attention_scaling;
  }
  bool operator!=(const RopeParams& o) const { return !(*this == o); }
};
// kind + theta (8), factor, low, high, original (4 x 8), beta_fast, beta_slow (16), truncate (8 with
// padding), attention_scaling (8): update operator== above, then this size.
static_assert(sizeof(RopeParams) == 72, "a RopeParams field was added: compare it in operator==, then fix this");

// Causal grouped-query attention over [batch, seq] tokens; strides are floats between consecutive tokens.
// Sequence tiles (long context): with q_start > 0 the queries are only the last seq - q_start positions
// of each sequence (q_start..seq-1), against keys 0..seq-1: q, out and dout hold q_rows() rows per
// sequence, k, v (and dk, dv) seq rows, lse [(b * q_heads + h) * q_rows() + i]. add_kv_grads makes the
// backward add into dk, dv instead of overwriting them, so a sequence's query tiles accumulate them.
// Sliding window (gpt-oss, transformers' sliding_window mask): with window > 0 the query at position p sees
// only the keys p - window + 1 .. p.
// Documents (data.packing = documents): with positions non-null, positions[b * seq + p] is the query's
// position within its document, so it sees only the keys p - positions[..] .. p (its document's), combined
// with the window by the later start. Rows [batch * seq], whole sequences even when q_start > 0.
struct AttnShape {
  std::int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t q_stride = 0, kv_stride = 0, o_stride = 0;
  std::int64_t q_start = 0;                 // position of the first query row (0: every position is a query)
  bool add_kv_grads = false;                // backward: dk += , dv += (else =)
  std::int64_t window = 0;                  // 0: every earlier position (plain causal)
  const std::int32_t* positions = nullptr;  // null: one document per row (the stream)
  std::int64_t q_rows() const { return seq - q_start; }
};

// A mixture-of-experts router over `tokens` rows of [experts] logits, choosing top_k experts per token.
// softmax_topk (Mixtral, Qwen3-MoE): softmax over all experts in fp32, the k largest probabilities, divided
// by their sum when `renormalize`; topk_softmax (gpt-oss): the k largest logits, softmax over those k.
// The k choices of a token are in descending order, ties to the lower expert index.
enum class RouterKind : int { softmax_topk, topk_softmax };
struct RouteShape {
  std::int64_t tokens = 0, experts = 0, top_k = 0;
  RouterKind kind = RouterKind::softmax_topk;
  bool renormalize = true;
  std::int64_t choices() const { return tokens * top_k; }  // rows the experts compute, all of them together
};

// cos / sin [seq, head_dim / 2] for positions 0..seq-1, where the ops read them. positions (documents;
// null: row % seq) is where rope_apply reads each row's position instead, one int32 per row of its call.
struct RopeTables {
  const float* cos = nullptr;
  const float* sin = nullptr;
  const std::int32_t* positions = nullptr;
};

}  // namespace mt
