// The GPT-2 decoder layer: LayerNorm with bias, fused q/k/v projection (c_attn) with bias, causal
// multi-head attention, tanh-GELU MLP, biases everywhere:
//   x1 = x + c_proj(attn(split(c_attn(ln_1(x)))));   y = x1 + mlp.c_proj(gelu(c_fc(ln_2(x1))))
#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/profile.hpp"
#include "kernels/step_math.hpp"
#include "kernels/workspace.hpp"

namespace mt::detail {

namespace {

template <class P>
struct Bound {  // params of the run's precision, or fp32 grads
  P ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
};
using Weights = Bound<const void*>;
using Grads = Bound<float*>;

struct Offsets {
  std::size_t o[12];
};

template <class P>
Bound<P> bind(const ModelConfig& c, P base, Precision prec) {
  static const char* const names[12] = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  const Offsets& off = per_shape<Offsets>(c, [&] {  // looked up once per model shape
    const ParamLayout& l = cached_layer_layout(c);
    Offsets r{};
    for (int i = 0; i < 12; ++i) r.o[i] = l.at(names[i]).offset;
    return r;
  });
  auto at = [&](int i) -> P { return elem_offset(base, off.o[i], prec); };
  return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11)};
}

struct Saved {
  float *x, *xn1, *mean1, *rstd1, *qkv, *att, *lse, *x1, *xn2, *mean2, *rstd2, *fc, *act;
};

Saved carve_saved(const ModelConfig& c, std::int64_t N, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  Saved s{};
  s.x = cv.take(N * d);
  s.xn1 = cv.take(N * d);
  s.mean1 = cv.take(N);
  s.rstd1 = cv.take(N);
  s.qkv = cv.take(N * 3 * d);
  s.att = cv.take(N * d);
  s.lse = cv.take(N * c.num_attention_heads);
  s.x1 = cv.take(N * d);
  s.xn2 = cv.take(N * d);
  s.mean2 = cv.take(N);
  s.rstd2 = cv.take(N);
  s.fc = cv.take(N * ff);
  s.act = cv.take(N * ff);
  if (used) *used = cv.used();
  return s;
}

struct Scratch {
  float* dx1;
  float *dact, *dfc, *dxn2;   // MLP phase
  float *datt, *dqkv, *dxn1;  // attention phase
};

Scratch carve_scratch(const ModelConfig& c, std::int64_t N, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  Scratch s{};
  s.dx1 = cv.take(N * d);
  float* region = base ? base + cv.used() : nullptr;
  Carver mlp(region);
  s.dact = mlp.take(N * ff);
  s.dfc = mlp.take(N * ff);
  s.dxn2 = mlp.take(N * d);
  Carver attn(region);
  s.datt = attn.take(N * d);
  s.dqkv = attn.take(N * 3 * d);
  s.dxn1 = attn.take(N * d);
  if (used) *used = cv.used() + std::max(mlp.used(), attn.used());
  return s;
}

cpu::AttnShape attn_shape(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  cpu::AttnShape a;
  a.batch = B, a.seq = T, a.q_heads = a.kv_heads = c.num_attention_heads, a.head_dim = c.head_dim;
  a.q_stride = a.kv_stride = 3 * c.hidden_size;  // q, k, v are column blocks of c_attn's output
  a.o_stride = c.hidden_size;
  return a;
}

void add_into(float* y, const float* x, std::int64_t n, int threads) {  // the residual connection
  cpu::accumulate(y, x, static_cast<std::size_t>(n), threads);
}

void forward(const ModelConfig& c, const Weights& w, const float* x, float* x_out, std::int64_t B, std::int64_t T,
             const Saved& s, const Mixed& mx) {
  const std::int64_t N = B * T, d = c.hidden_size, ff = c.intermediate_size;
  const int th = mx.threads;
  cpu::layernorm_forward(x, mx.vec(w.ln1_w, d, 0), mx.vec(w.ln1_b, d, 1), s.xn1, s.mean1, s.rstd1, N, d, c.norm_eps,
                         th);
  mx.fwd(s.xn1, w.attn_w, w.attn_b, s.qkv, N, d, 3 * d);
  // Attention stays fp32 in bf16 mode too (on the fp32 q/k/v the bf16 product produced).
  cpu::attention_forward(s.qkv, s.qkv + d, s.qkv + 2 * d, s.att, s.lse, attn_shape(c, B, T), th);
  mx.fwd(s.att, w.proj_w, w.proj_b, s.x1, N, d, d);
  add_into(s.x1, x, N * d, th);
  cpu::layernorm_forward(s.x1, mx.vec(w.ln2_w, d, 2), mx.vec(w.ln2_b, d, 3), s.xn2, s.mean2, s.rstd2, N, d, c.norm_eps,
                         th);
  mx.fwd(s.xn2, w.fc_w, w.fc_b, s.fc, N, d, ff);
  cpu::gelu_forward(s.fc, s.act, static_cast<std::size_t>(N * ff), th);
  if (x_out) {
    mx.fwd(s.act, w.fc2_w, w.fc2_b, x_out, N, ff, d);
    add_into(x_out, s.x1, N * d, th);
  }
}

}  // namespace

std::size_t gpt2_saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_saved(c, B * T, nullptr, &n);
  return n;
}

std::size_t gpt2_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_scratch(c, B * T, nullptr, &n);
  return n;
}

void gpt2_forward(const ModelConfig& c, const void* params, const float* x_in, float* x_out, std::int64_t B,
                  std::int64_t T, float* saved, float* /*scratch*/, const Mixed& mx) {
  const Saved s = carve_saved(c, B * T, saved);
  forward(c, bind(c, params, mx.precision), x_in, x_out, B, T, s, mx);
  std::memcpy(s.x, x_in, static_cast<std::size_t>(B * T * c.hidden_size) * sizeof(float));
}

void gpt2_backward(const ModelConfig& c, const void* params, const float* x_in, float* saved, bool recompute,
                   const float* dy, float* dx, float* grads, std::int64_t B, std::int64_t T, float* scratch,
                   const Mixed& mx) {
  const std::int64_t N = B * T, d = c.hidden_size, ff = c.intermediate_size;
  const int th = mx.threads;
  const Weights w = bind(c, params, mx.precision);
  const Grads g = bind(c, grads, Precision::fp32);
  const Saved s = carve_saved(c, N, saved);
  const Scratch sc = carve_scratch(c, N, scratch);
  const float* x = x_in;
  if (recompute)
    forward(c, w, x_in, nullptr, B, T, s, mx);
  else
    x = s.x;
  // MLP
  std::memcpy(sc.dx1, dy, static_cast<std::size_t>(N * d) * sizeof(float));
  mx.bwd(dy, s.act, w.fc2_w, sc.dact, false, g.fc2_w, g.fc2_b, N, ff, d);
  cpu::gelu_backward(s.fc, sc.dact, sc.dfc, static_cast<std::size_t>(N * ff), th);
  mx.bwd(sc.dfc, s.xn2, w.fc_w, sc.dxn2, false, g.fc_w, g.fc_b, N, d, ff);
  cpu::layernorm_backward(s.x1, mx.vec(w.ln2_w, d, 2), s.mean2, s.rstd2, sc.dxn2, sc.dx1, g.ln2_w, g.ln2_b, N, d, true,
                          th);
  // Attention
  mx.bwd(sc.dx1, s.att, w.proj_w, sc.datt, false, g.proj_w, g.proj_b, N, d, d);
  cpu::attention_backward(s.qkv, s.qkv + d, s.qkv + 2 * d, s.att, s.lse, sc.datt, sc.dqkv, sc.dqkv + d, sc.dqkv + 2 * d,
                          attn_shape(c, B, T), th);
  mx.bwd(sc.dqkv, s.xn1, w.attn_w, sc.dxn1, false, g.attn_w, g.attn_b, N, d, 3 * d);
  std::memcpy(dx, sc.dx1, static_cast<std::size_t>(N * d) * sizeof(float));
  cpu::layernorm_backward(x, mx.vec(w.ln1_w, d, 0), s.mean1, s.rstd1, sc.dxn1, dx, g.ln1_w, g.ln1_b, N, d, true, th);
}

}  // namespace mt::detail
