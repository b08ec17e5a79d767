// The Llama-family decoder layer (Llama, Mistral, Qwen2 with q/k/v bias, Qwen3 with q/k RMSNorm, gpt-oss
// with q/k/v/o biases, attention sinks and sliding windows):
//   x1 = x + o_proj(attn(rope(qk_norm?(q_proj(n1))), rope(qk_norm?(k_proj(n1))), v_proj(n1))),  n1 = rmsnorm(x)
//   y  = x1 + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                                       n2 = rmsnorm(x1)
// Written once over the ops (ops.hpp): every backend runs this code. The sequence-tiled form of the same
// layer (long context) is llama_layer_tiled.cpp. A stateless template: it reads
// weights through the pointer it is given and keeps nothing.
#include <algorithm>

#include "kernels/llama_tensors.hpp"
#include "kernels/workspace.hpp"

namespace mt::detail {

namespace {

using namespace llama;

// What the forward keeps for the backward, in one carved buffer. Not kept, because the backward gets
// them back for one elementwise pass each: the layer input x (the caller's boundary, passed again as
// x_in) and the two norms' outputs (made again from x, x1 and their rows' statistics, the same bits).
// With the MLP's activation (ffn_block.cpp) a kept layer costs about 40% less memory than with them.
struct Saved {
  float *rstd1, *q_raw, *k_raw, *rstd_q, *rstd_k, *q, *k, *v, *att, *lse, *x1, *rstd2;
  float* ffn;  // the feed-forward block's own (ffn_block.hpp)
};

Saved carve_saved(const ModelConfig& c, std::int64_t N, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim();
  Saved s{};
  s.rstd1 = cv.take(N);
  if (c.qk_norm) {
    s.q_raw = cv.take(N * qd);
    s.k_raw = cv.take(N * kd);
    s.rstd_q = cv.take(N * c.num_attention_heads);
    s.rstd_k = cv.take(N * c.num_key_value_heads);
  }
  s.q = cv.take(N * qd);
  s.k = cv.take(N * kd);
  s.v = cv.take(N * kd);
  s.att = cv.take(N * qd);
  s.lse = cv.take(N * c.num_attention_heads);
  s.x1 = cv.take(N * d);
  s.rstd2 = cv.take(N);
  s.ffn = cv.take(static_cast<std::int64_t>(ffn_saved_floats(c, N)));
  if (used) *used = cv.used();
  return s;
}

// Scratch: the rope tables, dx1, a row statistic the norms made again write (unused), and one region
// shared by the MLP and attention phases (the forward's attention, then its MLP; the backward's MLP,
// then its attention). xn1 and xn2 are the norms' outputs, made in their phase.
struct Scratch {
  float *cos_t, *sin_t, *dx1, *rstd;
  float *ffn, *xn2, *dxn2;                              // MLP phase (ffn: the block's own scratch)
  float *xn1, *datt, *dq, *dk, *dv, *dxn1, *dqn, *dkn;  // attention phase (dqn/dkn: before q/k norm)
};

Scratch carve_scratch(const ModelConfig& c, std::int64_t N, std::int64_t T, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim();
  Scratch s{};
  s.cos_t = cv.take(T * c.head_dim / 2);
  s.sin_t = cv.take(T * c.head_dim / 2);
  s.dx1 = cv.take(N * d);
  s.rstd = cv.take(N);
  float* region = base ? base + cv.used() : nullptr;
  Carver mlp(region);
  s.ffn = mlp.take(static_cast<std::int64_t>(ffn_scratch_floats(c, N)));
  s.xn2 = mlp.take(N * d);
  s.dxn2 = mlp.take(N * d);
  Carver attn(region);
  s.xn1 = attn.take(N * d);
  s.datt = attn.take(N * qd);
  s.dq = attn.take(N * qd);
  s.dk = attn.take(N * kd);
  s.dv = attn.take(N * kd);
  s.dxn1 = attn.take(N * d);
  if (c.qk_norm) {
    s.dqn = attn.take(N * qd);
    s.dkn = attn.take(N * kd);
  }
  if (used) *used = cv.used() + std::max(mlp.used(), attn.used());
  return s;
}

std::size_t saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_saved(c, B * T, nullptr, &n);
  return n;
}

std::size_t scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_scratch(c, B * T, T, nullptr, &n);
  return n;
}

// Up to the MLP activation, plus the down projection and the residual when x_out is non-null. The
// tables come back from the ops (computed into the scratch, or the backend's cached ones).
RopeTables forward_into(Ops& ops, const ModelConfig& c, const void* params, const Bound<const void*>& w, const float* x,
                        float* x_out, const BatchRows& rows, const Saved& s, const Scratch& sc,
                        const MoeBalance* balance) {
  const std::int64_t B = rows.batch, T = rows.seq, N = B * T, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim();
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  ops.rmsnorm_forward(x, w[in_norm], sc.xn1, s.rstd1, N, d, c.norm_eps);
  float* q_lin = c.qk_norm ? s.q_raw : s.q;
  float* k_lin = c.qk_norm ? s.k_raw : s.k;
  ops.linear_forward(sc.xn1, w[wq], w[bq], q_lin, N, d, qd);
  ops.linear_forward(sc.xn1, w[wk], w[bk], k_lin, N, d, kd);
  ops.linear_forward(sc.xn1, w[wv], w[bv], s.v, N, d, kd);
  if (c.qk_norm) {  // Qwen3: RMSNorm over each head's vector, before the rotation
    ops.rmsnorm_forward(s.q_raw, w[q_norm], s.q, s.rstd_q, N * Hq, hd, c.norm_eps);
    ops.rmsnorm_forward(s.k_raw, w[k_norm], s.k, s.rstd_k, N * Hkv, hd, c.norm_eps);
  }
  RopeTables rope = ops.rope_tables(rope_params_of(c), T, hd, sc.cos_t, sc.sin_t);
  rope.positions = rows.positions;
  ops.rope_apply(s.q, N, T, Hq, hd, qd, rope, false);
  ops.rope_apply(s.k, N, T, Hkv, hd, kd, rope, false);
  // Attention stays fp32 in bf16 mode too (on the fp32 q/k/v the bf16 products produced).
  ops.attention_forward(s.q, s.k, s.v, w[sinks], s.att, s.lse, attn_shape(c, B, T, rows.positions));
  ops.linear_forward(s.att, w[wo], w[bo], s.x1, N, qd, d);
  ops.add_into(s.x1, x, static_cast<std::size_t>(N * d));
  ops.rmsnorm_forward(s.x1, w[post_norm], sc.xn2, s.rstd2, N, d, c.norm_eps);  // over xn1: done with it
  ffn_forward(ops, c, params, sc.xn2, N, s.ffn, x_out, sc.ffn, balance);
  if (x_out) ops.add_into(x_out, s.x1, static_cast<std::size_t>(N * d));
  return rope;
}

void forward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b) {
  const std::int64_t N = rows.batch * rows.seq;
  const Saved s = carve_saved(c, N, b.saved);
  forward_into(ops, c, params, bind(c, params, ops.precision()), b.x_in, b.x_out, rows, s,
               carve_scratch(c, N, rows.seq, b.workspace), b.balance);
}

void backward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
              bool recompute) {
  const float *x_in = b.x_in, *dy = b.dy;
  float *dx = b.dx, *grads = b.grads;
  const std::int64_t B = rows.batch, T = rows.seq, N = B * T, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim();
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const Bound<const void*> w = bind(c, params, ops.precision());
  const Bound<float*> g = bind(c, grads, Precision::fp32);
  const Saved s = carve_saved(c, N, b.saved);
  const Scratch sc = carve_scratch(c, N, T, b.workspace);
  RopeTables rope = recompute ? forward_into(ops, c, params, w, x_in, nullptr, rows, s, sc, nullptr)  // no last product
                              : ops.rope_tables(rope_params_of(c), T, hd, sc.cos_t, sc.sin_t);
  rope.positions = rows.positions;
  // MLP: y = x1 + down(h)
  ops.copy(sc.dx1, dy, static_cast<std::size_t>(N * d));
  if (!recompute) ops.rmsnorm_forward(s.x1, w[post_norm], sc.xn2, sc.rstd, N, d, c.norm_eps);  // else just made
  ffn_backward(ops, c, params, grads, sc.xn2, N, s.ffn, dy, sc.dxn2, sc.ffn, b.balance);
  ops.rmsnorm_backward(s.x1, w[post_norm], s.rstd2, sc.dxn2, sc.dx1, g[post_norm], N, d, true);
  // Attention: x1 = x + o_proj(att)
  ops.linear_backward(sc.dx1, s.att, w[wo], sc.datt, false, g[wo], g[bo], N, qd, d);
  ops.attention_backward(s.q, s.k, s.v, w[sinks], s.att, s.lse, sc.datt, sc.dq, sc.dk, sc.dv, g[sinks],
                         attn_shape(c, B, T, rows.positions));
  ops.rope_apply(sc.dq, N, T, Hq, hd, qd, rope, true);
  ops.rope_apply(sc.dk, N, T, Hkv, hd, kd, rope, true);
  const float* dq_lin = sc.dq;
  const float* dk_lin = sc.dk;
  if (c.qk_norm) {
    ops.rmsnorm_backward(s.q_raw, w[q_norm], s.rstd_q, sc.dq, sc.dqn, g[q_norm], N * Hq, hd, false);
    ops.rmsnorm_backward(s.k_raw, w[k_norm], s.rstd_k, sc.dk, sc.dkn, g[k_norm], N * Hkv, hd, false);
    dq_lin = sc.dqn;
    dk_lin = sc.dkn;
  }
  ops.rmsnorm_forward(x_in, w[in_norm], sc.xn1, sc.rstd, N, d, c.norm_eps);  // the MLP phase wrote over it
  ops.linear_backward(dq_lin, sc.xn1, w[wq], sc.dxn1, false, g[wq], g[bq], N, d, qd);
  ops.linear_backward(dk_lin, sc.xn1, w[wk], sc.dxn1, true, g[wk], g[bk], N, d, kd);
  ops.linear_backward(sc.dv, sc.xn1, w[wv], sc.dxn1, true, g[wv], g[bv], N, d, kd);
  ops.copy(dx, sc.dx1, static_cast<std::size_t>(N * d));
  ops.rmsnorm_backward(x_in, w[in_norm], s.rstd1, sc.dxn1, dx, g[in_norm], N, d, true);
}

}  // namespace

const LayerFamily kLlamaLayer{"llama",
                              saved_floats,
                              scratch_floats,
                              llama::operand_room,
                              forward,
                              backward,
                              llama::tiled_scratch_floats,
                              llama::tiled_sequence_floats,
                              llama::tiled_attention_floats,
                              llama::tiled_forward,
                              llama::tiled_backward};

}  // namespace mt::detail
