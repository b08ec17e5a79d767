// Plain reference versions of the stage templates (Llama-family and GPT-2 layers, the head), built
// only from the loops in kernels/cpu/reference_ops.hpp and templated on the number type: in double they
// are what the finite-difference checks differentiate, and the fast fp32 stages must agree with them.
// Parameters use the same stage layouts as the fast code (a buffer of T instead of float).
// Backward always recomputes the forward; gradients are added (+=) into dx and grads.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/reference_ops.hpp"
#include "kernels/ops.hpp"  // rope_params_of
#include "kernels/param_layout.hpp"

namespace mt::ref {

template <class T>
using Vec = std::vector<T>;

template <class T>
Vec<T> zeros(i64 n) {
  return Vec<T>(static_cast<std::size_t>(n), T(0));
}

// cos/sin [seq, hd/2] in T precision (every rope_scaling type, yarn's attention scaling included), as
// rope_table but in T.
template <class T>
void rope_tables(const ModelConfig& c, i64 seq, Vec<T>& cs, Vec<T>& sn) {
  const i64 half = c.head_dim / 2;
  cs = zeros<T>(seq * half);
  sn = zeros<T>(seq * half);
  Vec<T> inv;
  const T scale = rope_inv_freq<T>(rope_params_of(c), seq, c.head_dim, inv);
  for (i64 i = 0; i < half; ++i)
    for (i64 t = 0; t < seq; ++t) {
      cs[t * half + i] = std::cos(T(t) * inv[i]) * scale;
      sn[t * half + i] = std::sin(T(t) * inv[i]) * scale;
    }
}

template <class T>
struct LlamaActs {
  Vec<T> xn1, q_raw, k_raw, q, k, v, att, x1, xn2, g, u, h, y;
};

template <class T>
const T* tensor(const ParamLayout& l, const T* p, const char* name) {
  const TensorSpec* t = l.find(name);
  return t ? p + t->offset : nullptr;
}
template <class T>
T* tensor(const ParamLayout& l, T* p, const char* name) {
  const TensorSpec* t = l.find(name);
  return t ? p + t->offset : nullptr;
}

// The router's shape, bias and the experts' activation by family (gpt-oss: top-k of the logits, then
// a softmax over the k; biases; the clamped SwiGLU).
inline RouteShape moe_route_shape(const ModelConfig& c, i64 N) {
  return RouteShape{N, c.num_experts, c.num_experts_per_tok,
                    c.is_gpt_oss() ? RouterKind::topk_softmax : RouterKind::softmax_topk, c.norm_topk_prob};
}
template <class P>
P router_bias(const ModelConfig& c, const ParamLayout& l, P p) {
  return c.moe_biases() ? p + l.at(moe_router_bias_tensor(c)).offset : nullptr;
}
template <class P>
P expert_bias(const ModelConfig& c, const ParamLayout& l, P p, i64 e, ExpertMatrix m) {
  return c.moe_biases() ? p + l.at(moe_expert_bias_tensor(c, e, m)).offset : nullptr;
}
template <class T>
void expert_act(const ModelConfig& c, const T* g, const T* u, T* h, i64 n) {
  if (c.is_gpt_oss())
    clamped_swiglu(g, u, h, n, T(ModelConfig::kGptOssSwigluAlpha), T(c.swiglu_limit));
  else
    swiglu(g, u, h, n);
}
template <class T>
void expert_act_backward(const ModelConfig& c, const T* g, const T* u, const T* dh, T* dg, T* du, i64 n) {
  if (c.is_gpt_oss())
    clamped_swiglu_backward(g, u, dh, dg, du, n, T(ModelConfig::kGptOssSwigluAlpha), T(c.swiglu_limit));
  else
    swiglu_backward(g, u, dh, dg, du, n);
}

// The mixture-of-experts block on xn[N, d] (ffn_block.hpp's formula), token by token and choice by
// choice: y[n] = sum_j weight[n, j] w2_e(silu(w1_e xn[n]) * w3_e xn[n]), e = expert[n, j].
template <class T>
Vec<T> moe_ffn(const ModelConfig& c, const ParamLayout& l, const T* p, const T* xn, i64 N) {
  const i64 d = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, ff = c.moe_intermediate_size;
  const RouteShape r = moe_route_shape(c, N);
  Vec<T> logits = zeros<T>(N * E), weight = zeros<T>(N * k), y = zeros<T>(N * d);
  std::vector<std::int32_t> expert(static_cast<std::size_t>(N * k));
  linear(xn, tensor(l, p, moe_router_tensor(c).c_str()), router_bias(c, l, p), logits.data(), N, d, E);
  moe_route(logits.data(), r, expert.data(), weight.data());
  Vec<T> g = zeros<T>(ff), u = zeros<T>(ff), h = zeros<T>(ff), ye = zeros<T>(d);
  for (i64 n = 0; n < N; ++n)
    for (i64 j = 0; j < k; ++j) {
      const i64 e = expert[n * k + j];
      auto W = [&](ExpertMatrix m) { return p + l.at(moe_expert_tensor(c, e, m)).offset; };
      auto Bi = [&](ExpertMatrix m) { return expert_bias(c, l, p, e, m); };
      linear(xn + n * d, W(ExpertMatrix::gate), Bi(ExpertMatrix::gate), g.data(), 1, d, ff);
      linear(xn + n * d, W(ExpertMatrix::up), Bi(ExpertMatrix::up), u.data(), 1, d, ff);
      expert_act(c, g.data(), u.data(), h.data(), ff);
      linear(h.data(), W(ExpertMatrix::down), Bi(ExpertMatrix::down), ye.data(), 1, ff, d);
      for (i64 i = 0; i < d; ++i) y[n * d + i] += weight[n * k + j] * ye[i];
    }
  return y;
}

// dxn += d/dxn, grads += d/dparams of the block above, from dy (the routing recomputed, held fixed).
template <class T>
void moe_ffn_backward(const ModelConfig& c, const ParamLayout& l, const T* p, const T* xn, const T* dy, i64 N, T* dxn,
                      T* grads) {
  const i64 d = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, ff = c.moe_intermediate_size;
  const RouteShape r = moe_route_shape(c, N);
  Vec<T> logits = zeros<T>(N * E), weight = zeros<T>(N * k), dweight = zeros<T>(N * k), dlogits = zeros<T>(N * E);
  std::vector<std::int32_t> expert(static_cast<std::size_t>(N * k));
  const T* Wr = tensor(l, p, moe_router_tensor(c).c_str());
  linear(xn, Wr, router_bias(c, l, p), logits.data(), N, d, E);
  moe_route(logits.data(), r, expert.data(), weight.data());
  for (i64 n = 0; n < N; ++n)
    for (i64 j = 0; j < k; ++j) {
      const i64 e = expert[n * k + j];
      auto W = [&](ExpertMatrix m) { return p + l.at(moe_expert_tensor(c, e, m)).offset; };
      auto G = [&](ExpertMatrix m) { return grads + l.at(moe_expert_tensor(c, e, m)).offset; };
      auto Bi = [&](ExpertMatrix m) { return expert_bias(c, l, p, e, m); };
      auto GB = [&](ExpertMatrix m) { return expert_bias(c, l, grads, e, m); };
      Vec<T> g = zeros<T>(ff), u = zeros<T>(ff), h = zeros<T>(ff), ye = zeros<T>(d);
      linear(xn + n * d, W(ExpertMatrix::gate), Bi(ExpertMatrix::gate), g.data(), 1, d, ff);
      linear(xn + n * d, W(ExpertMatrix::up), Bi(ExpertMatrix::up), u.data(), 1, d, ff);
      expert_act(c, g.data(), u.data(), h.data(), ff);
      linear(h.data(), W(ExpertMatrix::down), Bi(ExpertMatrix::down), ye.data(), 1, ff, d);
      Vec<T> dye = zeros<T>(d), dh = zeros<T>(ff), dg = zeros<T>(ff), du = zeros<T>(ff);
      for (i64 i = 0; i < d; ++i) {
        dye[i] = weight[n * k + j] * dy[n * d + i];
        dweight[n * k + j] += dy[n * d + i] * ye[i];
      }
      linear_backward(h.data(), W(ExpertMatrix::down), dye.data(), dh.data(), G(ExpertMatrix::down),
                      GB(ExpertMatrix::down), 1, ff, d);
      expert_act_backward(c, g.data(), u.data(), dh.data(), dg.data(), du.data(), ff);
      linear_backward(xn + n * d, W(ExpertMatrix::gate), dg.data(), dxn + n * d, G(ExpertMatrix::gate),
                      GB(ExpertMatrix::gate), 1, d, ff);
      linear_backward(xn + n * d, W(ExpertMatrix::up), du.data(), dxn + n * d, G(ExpertMatrix::up),
                      GB(ExpertMatrix::up), 1, d, ff);
    }
  moe_route_backward(logits.data(), expert.data(), dweight.data(), dlogits.data(), r);
  linear_backward(xn, Wr, dlogits.data(), dxn, tensor(l, grads, moe_router_tensor(c).c_str()), router_bias(c, l, grads),
                  N, d, E);
}

template <class T>
LlamaActs<T> llama_forward(const ModelConfig& c, const T* p, const T* x, i64 B, i64 S,
                           const std::int32_t* positions = nullptr) {
  const ParamLayout l = layer_layout(c, 0);
  const i64 N = B * S, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  const i64 hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const T eps = T(c.norm_eps);
  LlamaActs<T> a;
  a.xn1 = zeros<T>(N * d);
  rmsnorm(x, tensor(l, p, "input_layernorm.weight"), a.xn1.data(), N, d, eps);
  a.q_raw = zeros<T>(N * qd);
  a.k_raw = zeros<T>(N * kd);
  a.v = zeros<T>(N * kd);
  linear(a.xn1.data(), tensor(l, p, "self_attn.q_proj.weight"), tensor(l, p, "self_attn.q_proj.bias"), a.q_raw.data(),
         N, d, qd);
  linear(a.xn1.data(), tensor(l, p, "self_attn.k_proj.weight"), tensor(l, p, "self_attn.k_proj.bias"), a.k_raw.data(),
         N, d, kd);
  linear(a.xn1.data(), tensor(l, p, "self_attn.v_proj.weight"), tensor(l, p, "self_attn.v_proj.bias"), a.v.data(), N, d,
         kd);
  a.q = a.q_raw;
  a.k = a.k_raw;
  if (c.qk_norm) {
    rmsnorm(a.q_raw.data(), tensor(l, p, "self_attn.q_norm.weight"), a.q.data(), N * Hq, hd, eps);
    rmsnorm(a.k_raw.data(), tensor(l, p, "self_attn.k_norm.weight"), a.k.data(), N * Hkv, hd, eps);
  }
  Vec<T> cs, sn;
  rope_tables(c, S, cs, sn);
  rope(a.q.data(), N, S, Hq, hd, qd, cs.data(), sn.data(), false, positions);
  rope(a.k.data(), N, S, Hkv, hd, kd, cs.data(), sn.data(), false, positions);
  a.att = zeros<T>(N * qd);
  attention(a.q.data(), a.k.data(), a.v.data(), a.att.data(), B, S, Hq, Hkv, hd, qd, kd, qd, 0, c.attention_window(),
            tensor(l, p, "self_attn.sinks"), positions);
  a.x1 = zeros<T>(N * d);
  linear(a.att.data(), tensor(l, p, "self_attn.o_proj.weight"), tensor(l, p, "self_attn.o_proj.bias"), a.x1.data(), N,
         qd, d);
  for (i64 i = 0; i < N * d; ++i) a.x1[i] += x[i];
  a.xn2 = zeros<T>(N * d);
  rmsnorm(a.x1.data(), tensor(l, p, "post_attention_layernorm.weight"), a.xn2.data(), N, d, eps);
  if (c.is_moe()) {
    a.y = moe_ffn(c, l, p, a.xn2.data(), N);
  } else {
    a.g = zeros<T>(N * ff);
    a.u = zeros<T>(N * ff);
    a.h = zeros<T>(N * ff);
    linear(a.xn2.data(), tensor(l, p, "mlp.gate_proj.weight"), static_cast<const T*>(nullptr), a.g.data(), N, d, ff);
    linear(a.xn2.data(), tensor(l, p, "mlp.up_proj.weight"), static_cast<const T*>(nullptr), a.u.data(), N, d, ff);
    swiglu(a.g.data(), a.u.data(), a.h.data(), N * ff);
    a.y = zeros<T>(N * d);
    linear(a.h.data(), tensor(l, p, "mlp.down_proj.weight"), static_cast<const T*>(nullptr), a.y.data(), N, ff, d);
  }
  for (i64 i = 0; i < N * d; ++i) a.y[i] += a.x1[i];
  return a;
}

template <class T>
void llama_backward(const ModelConfig& c, const T* p, const T* x, const T* dy, T* dx, T* grads, i64 B, i64 S,
                    const std::int32_t* positions = nullptr) {
  const ParamLayout l = layer_layout(c, 0);
  const i64 N = B * S, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  const i64 hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const T eps = T(c.norm_eps);
  const LlamaActs<T> a = llama_forward(c, p, x, B, S, positions);
  auto P = [&](const char* n) { return tensor(l, p, n); };
  auto G = [&](const char* n) { return tensor(l, grads, n); };
  Vec<T> dx1(dy, dy + N * d), dxn2 = zeros<T>(N * d);
  if (c.is_moe()) {
    moe_ffn_backward(c, l, p, a.xn2.data(), dy, N, dxn2.data(), grads);
  } else {
    Vec<T> dh = zeros<T>(N * ff), dg = zeros<T>(N * ff), du = zeros<T>(N * ff);
    linear_backward(a.h.data(), P("mlp.down_proj.weight"), dy, dh.data(), G("mlp.down_proj.weight"),
                    static_cast<T*>(nullptr), N, ff, d);
    swiglu_backward(a.g.data(), a.u.data(), dh.data(), dg.data(), du.data(), N * ff);
    linear_backward(a.xn2.data(), P("mlp.gate_proj.weight"), dg.data(), dxn2.data(), G("mlp.gate_proj.weight"),
                    static_cast<T*>(nullptr), N, d, ff);
    linear_backward(a.xn2.data(), P("mlp.up_proj.weight"), du.data(), dxn2.data(), G("mlp.up_proj.weight"),
                    static_cast<T*>(nullptr), N, d, ff);
  }
  rmsnorm_backward(a.x1.data(), P("post_attention_layernorm.weight"), dxn2.data(), dx1.data(),
                   G("post_attention_layernorm.weight"), N, d, eps);
  Vec<T> datt = zeros<T>(N * qd), dq = zeros<T>(N * qd), dk = zeros<T>(N * kd), dv = zeros<T>(N * kd);
  linear_backward(a.att.data(), P("self_attn.o_proj.weight"), dx1.data(), datt.data(), G("self_attn.o_proj.weight"),
                  G("self_attn.o_proj.bias"), N, qd, d);
  attention_backward(a.q.data(), a.k.data(), a.v.data(), datt.data(), dq.data(), dk.data(), dv.data(), B, S, Hq, Hkv,
                     hd, qd, kd, qd, 0, c.attention_window(), P("self_attn.sinks"), G("self_attn.sinks"), positions);
  Vec<T> cs, sn;
  rope_tables(c, S, cs, sn);
  rope(dq.data(), N, S, Hq, hd, qd, cs.data(), sn.data(), true, positions);
  rope(dk.data(), N, S, Hkv, hd, kd, cs.data(), sn.data(), true, positions);
  if (c.qk_norm) {
    Vec<T> dqr = zeros<T>(N * qd), dkr = zeros<T>(N * kd);
    rmsnorm_backward(a.q_raw.data(), P("self_attn.q_norm.weight"), dq.data(), dqr.data(), G("self_attn.q_norm.weight"),
                     N * Hq, hd, eps);
    rmsnorm_backward(a.k_raw.data(), P("self_attn.k_norm.weight"), dk.data(), dkr.data(), G("self_attn.k_norm.weight"),
                     N * Hkv, hd, eps);
    dq = dqr;
    dk = dkr;
  }
  Vec<T> dxn1 = zeros<T>(N * d);
  linear_backward(a.xn1.data(), P("self_attn.q_proj.weight"), dq.data(), dxn1.data(), G("self_attn.q_proj.weight"),
                  G("self_attn.q_proj.bias"), N, d, qd);
  linear_backward(a.xn1.data(), P("self_attn.k_proj.weight"), dk.data(), dxn1.data(), G("self_attn.k_proj.weight"),
                  G("self_attn.k_proj.bias"), N, d, kd);
  linear_backward(a.xn1.data(), P("self_attn.v_proj.weight"), dv.data(), dxn1.data(), G("self_attn.v_proj.weight"),
                  G("self_attn.v_proj.bias"), N, d, kd);
  for (i64 i = 0; i < N * d; ++i) dx[i] += dx1[i];
  rmsnorm_backward(x, P("input_layernorm.weight"), dxn1.data(), dx, G("input_layernorm.weight"), N, d, eps);
}

template <class T>
struct Gpt2Acts {
  Vec<T> xn1, qkv, att, x1, xn2, fc, act, y;
};

template <class T>
Gpt2Acts<T> gpt2_forward(const ModelConfig& c, const T* p, const T* x, i64 B, i64 S,
                         const std::int32_t* positions = nullptr) {
  const ParamLayout l = layer_layout(c, 0);
  const i64 N = B * S, d = c.hidden_size, ff = c.intermediate_size, H = c.num_attention_heads, hd = c.head_dim;
  const T eps = T(c.norm_eps);
  auto P = [&](const char* n) { return tensor(l, p, n); };
  Gpt2Acts<T> a;
  a.xn1 = zeros<T>(N * d);
  layernorm(x, P("ln_1.weight"), P("ln_1.bias"), a.xn1.data(), N, d, eps);
  a.qkv = zeros<T>(N * 3 * d);
  linear(a.xn1.data(), P("attn.c_attn.weight"), P("attn.c_attn.bias"), a.qkv.data(), N, d, 3 * d);
  a.att = zeros<T>(N * d);
  attention(a.qkv.data(), a.qkv.data() + d, a.qkv.data() + 2 * d, a.att.data(), B, S, H, H, hd, 3 * d, 3 * d, d, 0, 0,
            static_cast<const T*>(nullptr), positions);
  a.x1 = zeros<T>(N * d);
  linear(a.att.data(), P("attn.c_proj.weight"), P("attn.c_proj.bias"), a.x1.data(), N, d, d);
  for (i64 i = 0; i < N * d; ++i) a.x1[i] += x[i];
  a.xn2 = zeros<T>(N * d);
  layernorm(a.x1.data(), P("ln_2.weight"), P("ln_2.bias"), a.xn2.data(), N, d, eps);
  a.fc = zeros<T>(N * ff);
  linear(a.xn2.data(), P("mlp.c_fc.weight"), P("mlp.c_fc.bias"), a.fc.data(), N, d, ff);
  a.act = zeros<T>(N * ff);
  for (i64 i = 0; i < N * ff; ++i) a.act[i] = gelu(a.fc[i]);
  a.y = zeros<T>(N * d);
  linear(a.act.data(), P("mlp.c_proj.weight"), P("mlp.c_proj.bias"), a.y.data(), N, ff, d);
  for (i64 i = 0; i < N * d; ++i) a.y[i] += a.x1[i];
  return a;
}

template <class T>
void gpt2_backward(const ModelConfig& c, const T* p, const T* x, const T* dy, T* dx, T* grads, i64 B, i64 S,
                   const std::int32_t* positions = nullptr) {
  const ParamLayout l = layer_layout(c, 0);
  const i64 N = B * S, d = c.hidden_size, ff = c.intermediate_size, H = c.num_attention_heads, hd = c.head_dim;
  const T eps = T(c.norm_eps);
  const Gpt2Acts<T> a = gpt2_forward(c, p, x, B, S, positions);
  auto P = [&](const char* n) { return tensor(l, p, n); };
  auto G = [&](const char* n) { return tensor(l, grads, n); };
  Vec<T> dx1(dy, dy + N * d), dact = zeros<T>(N * ff), dfc = zeros<T>(N * ff), dxn2 = zeros<T>(N * d);
  linear_backward(a.act.data(), P("mlp.c_proj.weight"), dy, dact.data(), G("mlp.c_proj.weight"), G("mlp.c_proj.bias"),
                  N, ff, d);
  gelu_backward(a.fc.data(), dact.data(), dfc.data(), N * ff);
  linear_backward(a.xn2.data(), P("mlp.c_fc.weight"), dfc.data(), dxn2.data(), G("mlp.c_fc.weight"), G("mlp.c_fc.bias"),
                  N, d, ff);
  layernorm_backward(a.x1.data(), P("ln_2.weight"), dxn2.data(), dx1.data(), G("ln_2.weight"), G("ln_2.bias"), N, d,
                     eps);
  Vec<T> datt = zeros<T>(N * d), dqkv = zeros<T>(N * 3 * d), dxn1 = zeros<T>(N * d);
  linear_backward(a.att.data(), P("attn.c_proj.weight"), dx1.data(), datt.data(), G("attn.c_proj.weight"),
                  G("attn.c_proj.bias"), N, d, d);
  attention_backward(a.qkv.data(), a.qkv.data() + d, a.qkv.data() + 2 * d, datt.data(), dqkv.data(), dqkv.data() + d,
                     dqkv.data() + 2 * d, B, S, H, H, hd, 3 * d, 3 * d, d, 0, 0, static_cast<const T*>(nullptr),
                     static_cast<T*>(nullptr), positions);
  linear_backward(a.xn1.data(), P("attn.c_attn.weight"), dqkv.data(), dxn1.data(), G("attn.c_attn.weight"),
                  G("attn.c_attn.bias"), N, d, 3 * d);
  for (i64 i = 0; i < N * d; ++i) dx[i] += dx1[i];
  layernorm_backward(x, P("ln_1.weight"), dxn1.data(), dx, G("ln_1.weight"), G("ln_1.bias"), N, d, eps);
}

// Head: final norm, logits with W [V, d] (lm_head or the tied embedding), summed cross-entropy.
// Returns the loss sum; with dx non-null, dx/dnorm grads/dW += their gradients.
template <class T>
T head_loss(const ModelConfig& c, const T* head, const T* W, const T* x, const std::int32_t* targets, i64 N, T* dx,
            T* dhead, T* dW) {
  const ParamLayout l = head_layout(c);
  const i64 d = c.hidden_size, V = c.vocab_size;
  const T eps = T(c.norm_eps);
  Vec<T> xn = zeros<T>(N * d), logits = zeros<T>(N * V), dlogits = zeros<T>(N * V), dxn = zeros<T>(N * d);
  if (c.is_gpt2())
    layernorm(x, tensor(l, head, "ln_f.weight"), tensor(l, head, "ln_f.bias"), xn.data(), N, d, eps);
  else
    rmsnorm(x, tensor(l, head, "model.norm.weight"), xn.data(), N, d, eps);
  linear(xn.data(), W, static_cast<const T*>(nullptr), logits.data(), N, d, V);
  const T loss = cross_entropy(logits.data(), targets, dx ? dlogits.data() : static_cast<T*>(nullptr), N, V);
  if (!dx) return loss;
  linear_backward(xn.data(), W, dlogits.data(), dxn.data(), dW, static_cast<T*>(nullptr), N, d, V);
  if (c.is_gpt2())
    layernorm_backward(x, tensor(l, head, "ln_f.weight"), dxn.data(), dx, tensor(l, dhead, "ln_f.weight"),
                       tensor(l, dhead, "ln_f.bias"), N, d, eps);
  else
    rmsnorm_backward(x, tensor(l, head, "model.norm.weight"), dxn.data(), dx, tensor(l, dhead, "model.norm.weight"), N,
                     d, eps);
  return loss;
}

}  // namespace mt::ref
