// The Llama-family decoder layer (Llama, Mistral, Qwen2 with q/k/v bias, Qwen3 with q/k RMSNorm):
//   x1 = x + o_proj(attn(rope(qk_norm?(q_proj(n1))), rope(qk_norm?(k_proj(n1))), v_proj(n1))),  n1 = rmsnorm(x)
//   y  = x1 + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                                       n2 = rmsnorm(x1)
// A stateless template: it reads weights through the pointer it is given and keeps nothing.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/profile.hpp"
#include "kernels/step_math.hpp"
#include "kernels/workspace.hpp"

namespace mt::detail {

namespace {

template <class P>
struct Bound {  // pointers into one bound stage buffer (params of the run's precision, or fp32 grads)
  P in_norm, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, post_norm, wg, wu, wd;
};
using Weights = Bound<const void*>;
using Grads = Bound<float*>;

// Offsets of the named tensors (-1 when absent), looked up once per model shape.
struct Offsets {
  std::ptrdiff_t o[14];
};

template <class P>
Bound<P> bind(const ModelConfig& c, P base, Precision prec) {
  static const char* const names[14] = {"input_layernorm.weight",
                                        "self_attn.q_proj.weight",
                                        "self_attn.q_proj.bias",
                                        "self_attn.k_proj.weight",
                                        "self_attn.k_proj.bias",
                                        "self_attn.v_proj.weight",
                                        "self_attn.v_proj.bias",
                                        "self_attn.q_norm.weight",
                                        "self_attn.k_norm.weight",
                                        "self_attn.o_proj.weight",
                                        "post_attention_layernorm.weight",
                                        "mlp.gate_proj.weight",
                                        "mlp.up_proj.weight",
                                        "mlp.down_proj.weight"};
  const Offsets& off = per_shape<Offsets>(c, [&] {
    const ParamLayout& l = cached_layer_layout(c);  // offsets are the same for every layer
    Offsets r{};
    for (int i = 0; i < 14; ++i) {
      const TensorSpec* t = l.find(names[i]);
      r.o[i] = t ? static_cast<std::ptrdiff_t>(t->offset) : -1;
    }
    return r;
  });
  auto at = [&](int i) -> P {
    return off.o[i] >= 0 ? elem_offset(base, static_cast<std::size_t>(off.o[i]), prec) : nullptr;
  };
  return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11), at(12), at(13)};
}

// What the forward keeps for the backward (keep mode), in one carved buffer.
struct Saved {
  float *x, *xn1, *rstd1, *q_raw, *k_raw, *rstd_q, *rstd_k, *q, *k, *v, *att, *lse, *x1, *xn2, *rstd2, *gate, *up, *h;
};

Saved carve_saved(const ModelConfig& c, std::int64_t N, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  Saved s{};
  s.x = cv.take(N * d);
  s.xn1 = cv.take(N * d);
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
  s.xn2 = cv.take(N * d);
  s.rstd2 = cv.take(N);
  s.gate = cv.take(N * ff);
  s.up = cv.take(N * ff);
  s.h = cv.take(N * ff);
  if (used) *used = cv.used();
  return s;
}

// Backward scratch: the rope tables, dx1, and one region shared by the MLP and attention phases.
struct Scratch {
  float *cos_t, *sin_t, *dx1;
  float *dh, *dg, *du, *dxn2;                     // MLP phase
  float *datt, *dq, *dk, *dv, *dxn1, *dqn, *dkn;  // attention phase (dqn/dkn: before q/k norm)
};

Scratch carve_scratch(const ModelConfig& c, std::int64_t N, std::int64_t T, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  Scratch s{};
  s.cos_t = cv.take(T * c.head_dim / 2);
  s.sin_t = cv.take(T * c.head_dim / 2);
  s.dx1 = cv.take(N * d);
  float* region = base ? base + cv.used() : nullptr;
  Carver mlp(region);
  s.dh = mlp.take(N * ff);
  s.dg = mlp.take(N * ff);
  s.du = mlp.take(N * ff);
  s.dxn2 = mlp.take(N * d);
  Carver attn(region);
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

cpu::RopeParams rope_params(const ModelConfig& c) {
  cpu::RopeParams p;
  p.theta = c.rope_theta;
  p.scaling_factor = c.rope_scaling.factor;
  p.low_freq_factor = c.rope_scaling.low_freq_factor;
  p.high_freq_factor = c.rope_scaling.high_freq_factor;
  p.original_max_position = c.rope_scaling.original_max_position_embeddings;
  return p;
}

cpu::AttnShape attn_shape(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  cpu::AttnShape a;
  a.batch = B, a.seq = T, a.q_heads = c.num_attention_heads, a.kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim, a.q_stride = c.q_dim(), a.kv_stride = c.kv_dim(), a.o_stride = c.q_dim();
  return a;
}

void add_into(float* y, const float* x, std::int64_t n, int threads) {  // the residual connection
  cpu::accumulate(y, x, static_cast<std::size_t>(n), threads);
}

// The forward proper. x_out == nullptr stops after the MLP activation (what a recomputing backward needs).
void forward(const ModelConfig& c, const Weights& w, const float* x, float* x_out, std::int64_t B, std::int64_t T,
             const Saved& s, const Scratch& sc, const Mixed& mx) {
  const std::int64_t N = B * T, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int th = mx.threads;
  cpu::rmsnorm_forward(x, mx.vec(w.in_norm, d, 0), s.xn1, s.rstd1, N, d, c.norm_eps, th);
  float* q_lin = c.qk_norm ? s.q_raw : s.q;
  float* k_lin = c.qk_norm ? s.k_raw : s.k;
  mx.fwd(s.xn1, w.wq, w.bq, q_lin, N, d, qd);
  mx.fwd(s.xn1, w.wk, w.bk, k_lin, N, d, kd);
  mx.fwd(s.xn1, w.wv, w.bv, s.v, N, d, kd);
  if (c.qk_norm) {  // Qwen3: RMSNorm over each head's vector, before the rotation
    cpu::rmsnorm_forward(s.q_raw, mx.vec(w.q_norm, hd, 1), s.q, s.rstd_q, N * Hq, hd, c.norm_eps, th);
    cpu::rmsnorm_forward(s.k_raw, mx.vec(w.k_norm, hd, 2), s.k, s.rstd_k, N * Hkv, hd, c.norm_eps, th);
  }
  cpu::rope_table(rope_params(c), T, hd, sc.cos_t, sc.sin_t);
  cpu::rope_apply(s.q, N, T, Hq, hd, qd, sc.cos_t, sc.sin_t, false, th);
  cpu::rope_apply(s.k, N, T, Hkv, hd, kd, sc.cos_t, sc.sin_t, false, th);
  // Attention stays fp32 in bf16 mode too (on the fp32 q/k/v the bf16 products produced).
  cpu::attention_forward(s.q, s.k, s.v, s.att, s.lse, attn_shape(c, B, T), th);
  mx.fwd(s.att, w.wo, nullptr, s.x1, N, qd, d);
  add_into(s.x1, x, N * d, th);
  cpu::rmsnorm_forward(s.x1, mx.vec(w.post_norm, d, 3), s.xn2, s.rstd2, N, d, c.norm_eps, th);
  mx.fwd(s.xn2, w.wg, nullptr, s.gate, N, d, ff);
  mx.fwd(s.xn2, w.wu, nullptr, s.up, N, d, ff);
  cpu::swiglu_forward(s.gate, s.up, s.h, static_cast<std::size_t>(N * ff), th);
  if (x_out) {
    mx.fwd(s.h, w.wd, nullptr, x_out, N, ff, d);
    add_into(x_out, s.x1, N * d, th);
  }
}

}  // namespace

std::size_t llama_saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_saved(c, B * T, nullptr, &n);
  return n;
}

std::size_t llama_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  std::size_t n = 0;
  carve_scratch(c, B * T, T, nullptr, &n);
  return n;
}

void llama_forward(const ModelConfig& c, const void* params, const float* x_in, float* x_out, std::int64_t B,
                   std::int64_t T, float* saved, float* scratch, const Mixed& mx) {
  const Saved s = carve_saved(c, B * T, saved);
  const Scratch sc = carve_scratch(c, B * T, T, scratch);
  forward(c, bind(c, params, mx.precision), x_in, x_out, B, T, s, sc, mx);
  std::memcpy(s.x, x_in, static_cast<std::size_t>(B * T * c.hidden_size) * sizeof(float));
}

void llama_backward(const ModelConfig& c, const void* params, const float* x_in, float* saved_or_ws, bool recompute,
                    const float* dy, float* dx, float* grads, std::int64_t B, std::int64_t T, float* scratch,
                    const Mixed& mx) {
  const std::int64_t N = B * T, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int th = mx.threads;
  const Weights w = bind(c, params, mx.precision);
  const Grads g = bind(c, grads, Precision::fp32);
  const Saved s = carve_saved(c, N, saved_or_ws);
  const Scratch sc = carve_scratch(c, N, T, scratch);
  const float* x = x_in;
  if (recompute) {
    forward(c, w, x_in, nullptr, B, T, s, sc, mx);  // once, without the last projection
  } else {
    x = s.x;
    cpu::rope_table(rope_params(c), T, hd, sc.cos_t, sc.sin_t);
  }
  // MLP: y = x1 + down(h)
  std::memcpy(sc.dx1, dy, static_cast<std::size_t>(N * d) * sizeof(float));
  mx.bwd(dy, s.h, w.wd, sc.dh, false, g.wd, nullptr, N, ff, d);
  cpu::swiglu_backward(s.gate, s.up, sc.dh, sc.dg, sc.du, static_cast<std::size_t>(N * ff), th);
  mx.bwd(sc.dg, s.xn2, w.wg, sc.dxn2, false, g.wg, nullptr, N, d, ff);
  mx.bwd(sc.du, s.xn2, w.wu, sc.dxn2, true, g.wu, nullptr, N, d, ff);
  cpu::rmsnorm_backward(s.x1, mx.vec(w.post_norm, d, 3), s.rstd2, sc.dxn2, sc.dx1, g.post_norm, N, d, true, th);
  // Attention: x1 = x + o_proj(att)
  mx.bwd(sc.dx1, s.att, w.wo, sc.datt, false, g.wo, nullptr, N, qd, d);
  cpu::attention_backward(s.q, s.k, s.v, s.att, s.lse, sc.datt, sc.dq, sc.dk, sc.dv, attn_shape(c, B, T), th);
  cpu::rope_apply(sc.dq, N, T, Hq, hd, qd, sc.cos_t, sc.sin_t, true, th);
  cpu::rope_apply(sc.dk, N, T, Hkv, hd, kd, sc.cos_t, sc.sin_t, true, th);
  const float* dq_lin = sc.dq;
  const float* dk_lin = sc.dk;
  if (c.qk_norm) {
    cpu::rmsnorm_backward(s.q_raw, mx.vec(w.q_norm, hd, 1), s.rstd_q, sc.dq, sc.dqn, g.q_norm, N * Hq, hd, false, th);
    cpu::rmsnorm_backward(s.k_raw, mx.vec(w.k_norm, hd, 2), s.rstd_k, sc.dk, sc.dkn, g.k_norm, N * Hkv, hd, false, th);
    dq_lin = sc.dqn;
    dk_lin = sc.dkn;
  }
  mx.bwd(dq_lin, s.xn1, w.wq, sc.dxn1, false, g.wq, g.bq, N, d, qd);
  mx.bwd(dk_lin, s.xn1, w.wk, sc.dxn1, true, g.wk, g.bk, N, d, kd);
  mx.bwd(sc.dv, s.xn1, w.wv, sc.dxn1, true, g.wv, g.bv, N, d, kd);
  std::memcpy(dx, sc.dx1, static_cast<std::size_t>(N * d) * sizeof(float));
  cpu::rmsnorm_backward(x, mx.vec(w.in_norm, d, 0), s.rstd1, sc.dxn1, dx, g.in_norm, N, d, true, th);
}

}  // namespace mt::detail
