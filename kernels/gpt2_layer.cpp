// The GPT-2 decoder layer: LayerNorm with bias, fused q/k/v projection (c_attn) with bias, causal
// multi-head attention, tanh-GELU MLP, biases everywhere:
//   x1 = x + c_proj(attn(split(c_attn(ln_1(x)))));   y = x1 + mlp.c_proj(gelu(c_fc(ln_2(x1))))
// Written once over the ops (ops.hpp): every backend runs this code.
#include <algorithm>

#include "kernels/layer_impl.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/workspace.hpp"

namespace mt::detail {

namespace {

enum Tensor { ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b, kTensors };
const char* const kNames[kTensors] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

template <class P>
using Bound = BoundTensors<P, kTensors>;

template <class P>
Bound<P> bind(const ModelConfig& c, P base, Precision prec) {  // offsets looked up once per model shape
  return bind_tensors(
      per_shape<TensorOffsets<kTensors>>(c, [&] { return find_offsets(cached_layer_layout(c), kNames); }), base, prec);
}

// What the forward keeps for the backward. As in the Llama layer (llama_layer.cpp), not the layer input
// (the caller's x_in), the norms' outputs or the MLP's activation: the backward makes them again, one
// elementwise pass each with the same ops, the same bits.
struct Saved {
  float *mean1, *rstd1, *qkv, *att, *lse, *x1, *mean2, *rstd2, *fc;
};

Saved carve_saved(const ModelConfig& c, std::int64_t N, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  Saved s{};
  s.mean1 = cv.take(N);
  s.rstd1 = cv.take(N);
  s.qkv = cv.take(N * 3 * d);
  s.att = cv.take(N * d);
  s.lse = cv.take(N * c.num_attention_heads);
  s.x1 = cv.take(N * d);
  s.mean2 = cv.take(N);
  s.rstd2 = cv.take(N);
  s.fc = cv.take(N * ff);
  if (used) *used = cv.used();
  return s;
}

// dx1, the row statistics a norm made again writes (unused), and one region the MLP and attention phases
// share (the forward's attention, then its MLP; the backward's MLP, then its attention).
struct Scratch {
  float *dx1, *mean, *rstd;
  float *act, *xn2, *dact, *dxn2;   // MLP phase (act: then dfc, the same buffer)
  float *xn1, *datt, *dqkv, *dxn1;  // attention phase
};

Scratch carve_scratch(const ModelConfig& c, std::int64_t N, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  Scratch s{};
  s.dx1 = cv.take(N * d);
  s.mean = cv.take(N);
  s.rstd = cv.take(N);
  float* region = base ? base + cv.used() : nullptr;
  Carver mlp(region);
  s.act = mlp.take(N * ff);
  s.xn2 = mlp.take(N * d);
  s.dact = mlp.take(N * ff);
  s.dxn2 = mlp.take(N * d);
  Carver attn(region);
  s.xn1 = attn.take(N * d);
  s.datt = attn.take(N * d);
  s.dqkv = attn.take(N * 3 * d);
  s.dxn1 = attn.take(N * d);
  if (used) *used = cv.used() + std::max(mlp.used(), attn.used());
  return s;
}

AttnShape attn_shape(const ModelConfig& c, std::int64_t B, std::int64_t T, const std::int32_t* positions) {
  AttnShape a;
  a.positions = positions;
  a.batch = B, a.seq = T, a.q_heads = a.kv_heads = c.num_attention_heads, a.head_dim = c.head_dim;
  a.q_stride = a.kv_stride = 3 * c.hidden_size;  // q, k, v are column blocks of c_attn's output
  a.o_stride = c.hidden_size;
  return a;
}

std::size_t saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_saved(c, B * T, nullptr, &n);
  return n;
}

std::size_t scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_scratch(c, B * T, nullptr, &n);
  return n;
}

OperandRoom operand_room(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  const std::int64_t widest = std::max({c.hidden_size, c.intermediate_size, 3 * c.hidden_size});
  return {B * T * widest, B * T * widest, std::max(c.hidden_size, c.head_dim)};
}

// Up to c_fc's output; the activation, mlp.c_proj and the residual when x_out is non-null.
void forward_into(Ops& ops, const ModelConfig& c, const Bound<const void*>& w, const float* x, float* x_out,
                  const BatchRows& rows, const Saved& s, const Scratch& sc) {
  const std::int64_t B = rows.batch, T = rows.seq, N = B * T, d = c.hidden_size, ff = c.intermediate_size;
  ops.layernorm_forward(x, w[ln1_w], w[ln1_b], sc.xn1, s.mean1, s.rstd1, N, d, c.norm_eps);
  ops.linear_forward(sc.xn1, w[attn_w], w[attn_b], s.qkv, N, d, 3 * d);
  // Attention stays fp32 in bf16 mode too (on the fp32 q/k/v the bf16 product produced).
  ops.attention_forward(s.qkv, s.qkv + d, s.qkv + 2 * d, nullptr, s.att, s.lse, attn_shape(c, B, T, rows.positions));
  ops.linear_forward(s.att, w[proj_w], w[proj_b], s.x1, N, d, d);
  ops.add_into(s.x1, x, static_cast<std::size_t>(N * d));
  ops.layernorm_forward(s.x1, w[ln2_w], w[ln2_b], sc.xn2, s.mean2, s.rstd2, N, d, c.norm_eps);  // over xn1
  ops.linear_forward(sc.xn2, w[fc_w], w[fc_b], s.fc, N, d, ff);
  if (x_out) {
    ops.gelu_forward(s.fc, sc.act, static_cast<std::size_t>(N * ff));
    ops.linear_forward(sc.act, w[fc2_w], w[fc2_b], x_out, N, ff, d);
    ops.add_into(x_out, s.x1, static_cast<std::size_t>(N * d));
  }
}

// b.balance: no experts.
void forward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b) {
  const std::int64_t N = rows.batch * rows.seq;
  forward_into(ops, c, bind(c, params, ops.precision()), b.x_in, b.x_out, rows, carve_saved(c, N, b.saved),
               carve_scratch(c, N, b.workspace));
}

void backward(Ops& ops, const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
              bool recompute) {
  const float *x_in = b.x_in, *dy = b.dy;
  float *dx = b.dx, *grads = b.grads;
  const std::int64_t B = rows.batch, T = rows.seq, N = B * T, d = c.hidden_size, ff = c.intermediate_size;
  const Bound<const void*> w = bind(c, params, ops.precision());
  const Bound<float*> g = bind(c, grads, Precision::fp32);
  const Saved s = carve_saved(c, N, b.saved);
  const Scratch sc = carve_scratch(c, N, b.workspace);
  if (recompute) forward_into(ops, c, w, x_in, nullptr, rows, s, sc);  // no activation, no last product
  // MLP
  ops.copy(sc.dx1, dy, static_cast<std::size_t>(N * d));
  if (!recompute)  // else just made
    ops.layernorm_forward(s.x1, w[ln2_w], w[ln2_b], sc.xn2, sc.mean, sc.rstd, N, d, c.norm_eps);
  ops.gelu_forward(s.fc, sc.act, static_cast<std::size_t>(N * ff));
  ops.linear_backward(dy, sc.act, w[fc2_w], sc.dact, false, g[fc2_w], g[fc2_b], N, ff, d);
  float* dfc = sc.act;  // the activation is done with
  ops.gelu_backward(s.fc, sc.dact, dfc, static_cast<std::size_t>(N * ff));
  ops.linear_backward(dfc, sc.xn2, w[fc_w], sc.dxn2, false, g[fc_w], g[fc_b], N, d, ff);
  ops.layernorm_backward(s.x1, w[ln2_w], s.mean2, s.rstd2, sc.dxn2, sc.dx1, g[ln2_w], g[ln2_b], N, d, true);
  // Attention
  ops.linear_backward(sc.dx1, s.att, w[proj_w], sc.datt, false, g[proj_w], g[proj_b], N, d, d);
  ops.attention_backward(s.qkv, s.qkv + d, s.qkv + 2 * d, nullptr, s.att, s.lse, sc.datt, sc.dqkv, sc.dqkv + d,
                         sc.dqkv + 2 * d, nullptr, attn_shape(c, B, T, rows.positions));
  ops.layernorm_forward(x_in, w[ln1_w], w[ln1_b], sc.xn1, sc.mean, sc.rstd, N, d,
                        c.norm_eps);  // the MLP's wrote over it
  ops.linear_backward(sc.dqkv, sc.xn1, w[attn_w], sc.dxn1, false, g[attn_w], g[attn_b], N, d, 3 * d);
  ops.copy(dx, sc.dx1, static_cast<std::size_t>(N * d));
  ops.layernorm_backward(x_in, w[ln1_w], s.mean1, s.rstd1, sc.dxn1, dx, g[ln1_w], g[ln1_b], N, d, true);
}

}  // namespace

// No tiled form: GPT-2's learned position table bounds its context (n_positions, 1024 on the hub).
const LayerFamily kGpt2Layer{"gpt2",  saved_floats, scratch_floats, operand_room, forward, backward,
                             nullptr, nullptr,      nullptr,        nullptr,      nullptr};

}  // namespace mt::detail
