// The Llama-family layer in sequence tiles (long context): the layer of llama_layer.cpp computed `tile`
// tokens of one sequence at a time, so that nothing per token is sequence-sized except what attention
// needs over the whole sequence: the keys and values (and, in the backward, their gradients). The norms,
// the projections, RoPE and the MLP run on one tile; attention runs the tile's queries against the keys
// so far (AttnShape::q_start), flash-style, so no T x T scores exist either.
//
// Forward, per sequence, tiles in order: n1 = rmsnorm(x), q, k, v (k and v into the sequence's K, V),
// q/k norms, RoPE at the tile's positions, attention against K, V up to the tile's end, o_proj and the
// residual, then the MLP and its residual into x_out.
// Backward (recomputing, no Saved; the attention output read from `attention` when given):
//   1. per sequence, tiles in order: K and V again (n1, the k and v products, k norm, RoPE);
//   2. per sequence, tiles from the last to the first: recompute the tile's n1, q, attention (unless
//      kept: below), x1, n2 and MLP activations; MLP backward; o_proj backward; attention backward,
//      adding into the sequence's dK, dV (the last tile, run first, overwrites them); then the tile's
//      keys have seen every query that reads them (all are at or after it), so its dK, dV rows are
//      final: RoPE and k-norm backward, the q/k/v products' backward and the input norm's, into the
//      tile's rows of dx.
// Weight gradients add tile by tile in that fixed order: the bits depend on the tile size (the
// engine and the reference trainer use the same), never on threads.
// With `attention` the forward also writes each tile's attention output and log-sum-exp there, and
// step 2 reads them instead of running the attention forward again (at long context 2 of the 9 block
// products a layer's attention costs a step on the CPU kernel, 2 of 11 on the CUDA one); the same ops on
// the same inputs, so the same bits.
#include <algorithm>

#include "kernels/llama_tensors.hpp"
#include "kernels/workspace.hpp"

namespace mt::detail::llama {

namespace {

// Sequence-sized: what attention reads or accumulates across tiles, and the RoPE tables.
struct Whole {
  float *K, *V, *dK, *dV;
  float *K_raw, *rstd_k;  // Qwen3's per-head k norm: its input and statistics, for its backward
  float *cos_t, *sin_t;
};
// One tile's activations and gradients (n = tile rows).
struct TileBufs {
  float *xn1, *rstd1, *q_raw, *rstd_q, *q, *att, *lse, *x1, *xn2, *rstd2, *ffn, *dx1;  // ffn: ffn_block.hpp's
  float *dffn, *dxn2;                   // MLP phase (dffn: the block's backward scratch)
  float *datt, *dq, *dqn, *dkn, *dxn1;  // attention phase (dqn/dkn: before q/k norm)
};

struct Carved {
  Whole w;
  TileBufs t;
  std::size_t used = 0;
};

// The sequence-sized buffers, from `cv`.
Whole carve_whole(const ModelConfig& c, std::int64_t B, std::int64_t T, Carver& cv) {
  const std::int64_t N = B * T, kd = c.kv_dim(), Hkv = c.num_key_value_heads;
  Whole w{};
  w.K = cv.take(N * kd);
  w.V = cv.take(N * kd);
  w.dK = cv.take(N * kd);
  w.dV = cv.take(N * kd);
  if (c.qk_norm) {
    w.K_raw = cv.take(N * kd);
    w.rstd_k = cv.take(N * Hkv);
  }
  w.cos_t = cv.take(T * c.head_dim / 2);
  w.sin_t = cv.take(T * c.head_dim / 2);
  return w;
}

// The sequence-sized buffers from `sequence` when non-null (kept apart, e.g. in host RAM), else from the
// start of `base`; then one tile's buffers from `base`. `used`: the floats taken from base.
Carved carve(const ModelConfig& c, std::int64_t B, std::int64_t T, std::int64_t n, float* base, float* sequence) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), Hq = c.num_attention_heads;
  Carved r{};
  if (sequence) {
    Carver apart(sequence);
    r.w = carve_whole(c, B, T, apart);
  } else {
    r.w = carve_whole(c, B, T, cv);
  }
  TileBufs& t = r.t;
  t.xn1 = cv.take(n * d);
  t.rstd1 = cv.take(n);
  if (c.qk_norm) {
    t.q_raw = cv.take(n * qd);
    t.rstd_q = cv.take(n * Hq);
  }
  t.q = cv.take(n * qd);
  t.att = cv.take(n * qd);
  t.lse = cv.take(n * Hq);
  t.x1 = cv.take(n * d);
  t.xn2 = cv.take(n * d);
  t.rstd2 = cv.take(n);
  t.ffn = cv.take(static_cast<std::int64_t>(ffn_saved_floats(c, n)));
  t.dx1 = cv.take(n * d);
  float* region = base ? base + cv.used() : nullptr;
  Carver mlp(region);
  t.dffn = mlp.take(static_cast<std::int64_t>(ffn_scratch_floats(c, n)));
  t.dxn2 = mlp.take(n * d);
  Carver attn(region);
  t.datt = attn.take(n * qd);
  t.dq = attn.take(n * qd);
  if (c.qk_norm) {
    t.dqn = attn.take(n * qd);
    t.dkn = attn.take(n * kd);
  }
  t.dxn1 = attn.take(n * d);
  r.used = cv.used() + std::max(mlp.used(), attn.used());
  return r;
}

// One tile: sequence b, positions [t0, t0 + n); r0 = its first row in the [B * T] buffers. positions:
// documents' positions of the sequence's rows (BatchRows::positions + b * T; null in the stream).
struct Tile {
  std::int64_t b, t0, n, r0;
  const std::int32_t* positions = nullptr;
};

// The tables as the tile's rows read them: from row t0 on, or at the rows' documents' positions.
RopeTables at_positions(const RopeTables& all, const Tile& t, std::int64_t head_dim) {
  if (t.positions) return {all.cos, all.sin, t.positions + t.t0};
  return {all.cos + t.t0 * (head_dim / 2), all.sin + t.t0 * (head_dim / 2)};
}

// n1 = rmsnorm(x) of the tile into tb.xn1.
void input_norm(Ops& ops, const ModelConfig& c, const Bound<const void*>& w, const float* x_in, const Tile& t,
                const TileBufs& tb) {
  ops.rmsnorm_forward(x_in + t.r0 * c.hidden_size, w[in_norm], tb.xn1, tb.rstd1, t.n, c.hidden_size, c.norm_eps);
}

// The tile's keys and values into the sequence's K, V rows (k normed and rotated), from tb.xn1.
void keys_values(Ops& ops, const ModelConfig& c, const Bound<const void*>& w, const Whole& wh, const RopeTables& rope,
                 const Tile& t, const TileBufs& tb) {
  const std::int64_t d = c.hidden_size, kd = c.kv_dim(), hd = c.head_dim, Hkv = c.num_key_value_heads;
  float* k = wh.K + t.r0 * kd;
  float* k_lin = c.qk_norm ? wh.K_raw + t.r0 * kd : k;
  ops.linear_forward(tb.xn1, w[wk], w[bk], k_lin, t.n, d, kd);
  ops.linear_forward(tb.xn1, w[wv], w[bv], wh.V + t.r0 * kd, t.n, d, kd);
  if (c.qk_norm) ops.rmsnorm_forward(k_lin, w[k_norm], k, wh.rstd_k + t.r0 * Hkv, t.n * Hkv, hd, c.norm_eps);
  ops.rope_apply(k, t.n, t.n, Hkv, hd, kd, at_positions(rope, t, hd), false);
}

AttnShape tile_attention(const ModelConfig& c, const Tile& t) {
  AttnShape a = attn_shape(c, 1, t.t0 + t.n, t.positions);  // the tile's queries against the keys up to its end
  a.q_start = t.t0;
  return a;
}

// From tb.xn1 (and K, V complete up to the tile's end): q, attention (unless attention_done: tb.att and
// tb.lse hold it), x1, n2 and the feed-forward block, its output into y when non-null.
void attention_and_mlp(Ops& ops, const ModelConfig& c, const void* params, const Bound<const void*>& w, const Whole& wh,
                       const RopeTables& rope, const float* x_in, const Tile& t, const TileBufs& tb, float* y,
                       const MoeBalance* balance, bool attention_done) {
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim();
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads;
  float* q_lin = c.qk_norm ? tb.q_raw : tb.q;
  ops.linear_forward(tb.xn1, w[wq], w[bq], q_lin, t.n, d, qd);
  if (c.qk_norm) ops.rmsnorm_forward(tb.q_raw, w[q_norm], tb.q, tb.rstd_q, t.n * Hq, hd, c.norm_eps);
  ops.rope_apply(tb.q, t.n, t.n, Hq, hd, qd, at_positions(rope, t, hd), false);
  const std::int64_t seq0 = t.r0 - t.t0;  // the sequence's first row
  if (!attention_done)
    ops.attention_forward(tb.q, wh.K + seq0 * kd, wh.V + seq0 * kd, w[sinks], tb.att, tb.lse, tile_attention(c, t));
  ops.linear_forward(tb.att, w[wo], w[bo], tb.x1, t.n, qd, d);
  ops.add_into(tb.x1, x_in + t.r0 * d, static_cast<std::size_t>(t.n * d));
  ops.rmsnorm_forward(tb.x1, w[post_norm], tb.xn2, tb.rstd2, t.n, d, c.norm_eps);
  ffn_forward(ops, c, params, tb.xn2, t.n, tb.ffn, y, tb.dffn, balance);  // the MLP phase's scratch: free here
}

// The tile's buffers with its attention output and log-sum-exp in `attention` (the whole micro-batch's:
// [B * T, q_dim] outputs, then each tile's [heads, n] log-sum-exp at row r0) when that is non-null.
TileBufs with_attention(const ModelConfig& c, std::int64_t B, std::int64_t T, const TileBufs& tb, const Tile& t,
                        const float* attention) {
  if (!attention) return tb;
  TileBufs r = tb;
  float* a = const_cast<float*>(attention);  // the forward writes it; the backward only reads (attention_done)
  r.att = a + t.r0 * c.q_dim();
  r.lse = a + B * T * c.q_dim() + t.r0 * c.num_attention_heads;
  return r;
}

template <class F>
void for_tiles(const BatchRows& rows, std::int64_t tile, std::int64_t b, bool reverse, F&& f) {
  const std::int64_t T = rows.seq, count = (T + tile - 1) / tile;
  const std::int32_t* positions = rows.positions ? rows.positions + b * T : nullptr;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t j = reverse ? count - 1 - i : i;
    const std::int64_t t0 = j * tile;
    f(Tile{b, t0, std::min(tile, T - t0), b * T + t0, positions}, i == 0);
  }
}

}  // namespace

std::size_t tiled_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T, std::int64_t tile) {
  return carve(c, B, T, std::min(tile, T), nullptr, nullptr).used;
}

std::size_t tiled_sequence_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  Carver cv(nullptr);
  carve_whole(c, B, T, cv);
  return cv.used();
}

std::size_t tiled_attention_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  return static_cast<std::size_t>(B * T * (c.q_dim() + c.num_attention_heads));
}

void tiled_forward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, std::int64_t tile,
                   const LayerBuffers& bufs) {
  const float* x_in = bufs.x_in;
  const std::int64_t B = rows.batch, T = rows.seq, d = c.hidden_size;
  const Bound<const void*> w = bind(c, params, ops.precision());
  const Carved cv = carve(c, B, T, std::min(tile, T), bufs.workspace, bufs.sequence);
  const RopeTables rope = ops.rope_tables(rope_params_of(c), T, c.head_dim, cv.w.cos_t, cv.w.sin_t);
  for (std::int64_t b = 0; b < B; ++b)
    for_tiles(rows, tile, b, false, [&](const Tile& t, bool) {
      const TileBufs tb = with_attention(c, B, T, cv.t, t, bufs.attention);
      input_norm(ops, c, w, x_in, t, tb);
      keys_values(ops, c, w, cv.w, rope, t, tb);
      float* y = bufs.x_out + t.r0 * d;
      // The MoE statistics add tile by tile.
      attention_and_mlp(ops, c, params, w, cv.w, rope, x_in, t, tb, y, bufs.balance, false);
      ops.add_into(y, tb.x1, static_cast<std::size_t>(t.n * d));
    });
}

void tiled_backward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, std::int64_t tile,
                    const LayerBuffers& bufs) {
  const float *x_in = bufs.x_in, *dy = bufs.dy, *attention = bufs.attention;
  float *dx = bufs.dx, *grads = bufs.grads;
  const std::int64_t B = rows.batch, T = rows.seq, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim();
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const Bound<const void*> w = bind(c, params, ops.precision());
  const Bound<float*> g = bind(c, grads, Precision::fp32);
  const Carved cv = carve(c, B, T, std::min(tile, T), bufs.workspace, bufs.sequence);
  const Whole& wh = cv.w;
  const RopeTables rope = ops.rope_tables(rope_params_of(c), T, hd, wh.cos_t, wh.sin_t);
  for (std::int64_t b = 0; b < B; ++b) {
    for_tiles(rows, tile, b, false, [&](const Tile& t, bool) {  // 1. the sequence's keys and values
      input_norm(ops, c, w, x_in, t, cv.t);
      keys_values(ops, c, w, wh, rope, t, cv.t);
    });
    const std::int64_t seq0 = b * T;
    for_tiles(rows, tile, b, true, [&](const Tile& t, bool first) {  // 2. tiles from the last
      const TileBufs tb = with_attention(c, B, T, cv.t, t, attention);
      const std::size_t nd = static_cast<std::size_t>(t.n * d);
      const RopeTables rope_t = at_positions(rope, t, hd);
      input_norm(ops, c, w, x_in, t, tb);
      attention_and_mlp(ops, c, params, w, wh, rope, x_in, t, tb, nullptr, nullptr, attention != nullptr);
      // MLP: y = x1 + ffn(n2)
      const float* dyt = dy + t.r0 * d;
      ops.copy(tb.dx1, dyt, nd);
      ffn_backward(ops, c, params, grads, tb.xn2, t.n, tb.ffn, dyt, tb.dxn2, tb.dffn, bufs.balance);
      ops.rmsnorm_backward(tb.x1, w[post_norm], tb.rstd2, tb.dxn2, tb.dx1, g[post_norm], t.n, d, true);
      // Attention: x1 = x + o_proj(att)
      ops.linear_backward(tb.dx1, tb.att, w[wo], tb.datt, false, g[wo], g[bo], t.n, qd, d);
      AttnShape a = tile_attention(c, t);
      a.add_kv_grads = !first;
      ops.attention_backward(tb.q, wh.K + seq0 * kd, wh.V + seq0 * kd, w[sinks], tb.att, tb.lse, tb.datt, tb.dq,
                             wh.dK + seq0 * kd, wh.dV + seq0 * kd, g[sinks], a);
      // Every query that reads this tile's keys is at or after it, and those tiles are done.
      float* dk = wh.dK + t.r0 * kd;
      ops.rope_apply(tb.dq, t.n, t.n, Hq, hd, qd, rope_t, true);
      ops.rope_apply(dk, t.n, t.n, Hkv, hd, kd, rope_t, true);
      const float* dq_lin = tb.dq;
      const float* dk_lin = dk;
      if (c.qk_norm) {
        ops.rmsnorm_backward(tb.q_raw, w[q_norm], tb.rstd_q, tb.dq, tb.dqn, g[q_norm], t.n * Hq, hd, false);
        ops.rmsnorm_backward(wh.K_raw + t.r0 * kd, w[k_norm], wh.rstd_k + t.r0 * Hkv, dk, tb.dkn, g[k_norm], t.n * Hkv,
                             hd, false);
        dq_lin = tb.dqn;
        dk_lin = tb.dkn;
      }
      ops.linear_backward(dq_lin, tb.xn1, w[wq], tb.dxn1, false, g[wq], g[bq], t.n, d, qd);
      ops.linear_backward(dk_lin, tb.xn1, w[wk], tb.dxn1, true, g[wk], g[bk], t.n, d, kd);
      ops.linear_backward(wh.dV + t.r0 * kd, tb.xn1, w[wv], tb.dxn1, true, g[wv], g[bv], t.n, d, kd);
      float* dxt = dx + t.r0 * d;
      ops.copy(dxt, tb.dx1, nd);
      ops.rmsnorm_backward(x_in + t.r0 * d, w[in_norm], tb.rstd1, tb.dxn1, dxt, g[in_norm], t.n, d, true);
    });
  }
}

}  // namespace mt::detail::llama
