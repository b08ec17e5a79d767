// The stage operations on the GPU: the same templates as kernels/llama_layer.cpp, gpt2_layer.cpp,
// lm_head.cpp and embedding.cpp, step for step, with the CUDA kernels (ops.hpp) and cuBLASLt (gemm.hpp).
// Saved activations and the workspace are carved exactly as the CPU templates carve them (same fields,
// same order, same 64-byte alignment), so the sizes the engine plans with (layer_saved_floats,
// stage_workspace_floats) hold, and a saved buffer means the same on both backends. bf16 operand copies,
// column-sum partials and the attention row dots live in the backend's own scratch instead of the
// workspace's bf16 tail.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "device/cuda/cuda_backend_impl.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/stage_api.hpp"
#include "kernels/workspace.hpp"

namespace mt::cuda {

namespace {

using detail::Carver;

const void* at(const void* base, std::size_t elements, Precision p) {
  return static_cast<const char*>(base) + elements * bytes_per_param(p);
}

// How a stage runs its products on the device: fp32 operands as they are, or bf16 copies (RNE) of the
// fp32 activation / output gradient against the bf16 weights, fp32 accumulation and outputs.
struct DevMixed {
  Gemm* gemm;
  cudaStream_t st;
  bool bf16;
  bf16_t *xb, *gb;
  float* partial;

  void fwd(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
           std::int64_t out) const {
    const void* xin = x;
    if (bf16) {
      to_bf16(x, xb, static_cast<std::size_t>(N * in), st);
      xin = xb;
    }
    gemm->linear_forward(xin, W, y, N, in, out, bf16, st);
    if (b) add_bias(y, b, bf16, N, out, st);
  }
  // dx (= or +=) dy W (skipped when dx is null); dW += dy^T x; db += column sums of the fp32 dy.
  void bwd(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW, float* db, std::int64_t N,
           std::int64_t in, std::int64_t out) const {
    const void* g = dy;
    const void* xin = x;
    if (bf16) {
      to_bf16(dy, gb, static_cast<std::size_t>(N * out), st);
      g = gb;
    }
    if (dx) gemm->linear_backward_input(g, W, dx, N, in, out, add, bf16, st);
    if (bf16) {
      to_bf16(x, xb, static_cast<std::size_t>(N * in), st);
      xin = xb;
    }
    gemm->linear_backward_weight(g, xin, dW, N, in, out, bf16, st);
    if (db) colsum_add(dy, db, N, out, partial, st);
  }
};

void copy_d2d(float* dst, const float* src, std::int64_t n, cudaStream_t st) {
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, st));
}

// ---- Llama family (kernels/llama_layer.cpp) ----
struct LlamaW {
  const void *in_norm, *wq, *bq, *wk, *bk, *wv, *bv, *q_norm, *k_norm, *wo, *post_norm, *wg, *wu, *wd;
};
struct LlamaG {
  float *in_norm, *wq, *bq, *wk, *bk, *wv, *bv, *q_norm, *k_norm, *wo, *post_norm, *wg, *wu, *wd;
};
const char* const kLlamaNames[14] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.q_proj.bias",           "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",   "self_attn.v_proj.weight", "self_attn.v_proj.bias",           "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

void llama_offsets(const ModelConfig& c, std::ptrdiff_t (&o)[14]) {
  const ParamLayout& l = detail::cached_layer_layout(c);
  for (int i = 0; i < 14; ++i) {
    const TensorSpec* t = l.find(kLlamaNames[i]);
    o[i] = t ? static_cast<std::ptrdiff_t>(t->offset) : -1;
  }
}
LlamaW llama_weights(const ModelConfig& c, const void* base, Precision p) {
  std::ptrdiff_t o[14];
  llama_offsets(c, o);
  const void* v[14];
  for (int i = 0; i < 14; ++i) v[i] = o[i] >= 0 ? at(base, static_cast<std::size_t>(o[i]), p) : nullptr;
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13]};
}
LlamaG llama_grads(const ModelConfig& c, float* base) {
  std::ptrdiff_t o[14];
  llama_offsets(c, o);
  float* v[14];
  for (int i = 0; i < 14; ++i) v[i] = o[i] >= 0 ? base + o[i] : nullptr;
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13]};
}

struct LlamaSaved {
  float *x, *xn1, *rstd1, *q_raw, *k_raw, *rstd_q, *rstd_k, *q, *k, *v, *att, *lse, *x1, *xn2, *rstd2, *gate, *up, *h;
};
LlamaSaved llama_saved(const ModelConfig& c, std::int64_t N, float* base) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  LlamaSaved s{};
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
  return s;
}

struct LlamaScratch {
  float *cos_t, *sin_t, *dx1;
  float *dh, *dg, *du, *dxn2;
  float *datt, *dq, *dk, *dv, *dxn1, *dqn, *dkn;
};
LlamaScratch llama_scratch(const ModelConfig& c, std::int64_t N, std::int64_t T, float* base) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  LlamaScratch s{};
  s.cos_t = cv.take(T * c.head_dim / 2);  // unused on the GPU (the backend's cached tables), kept for the layout
  s.sin_t = cv.take(T * c.head_dim / 2);
  s.dx1 = cv.take(N * d);
  float* region = base + cv.used();
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
  return s;
}

AttnDims llama_dims(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  AttnDims a;
  a.batch = B, a.seq = T, a.q_heads = c.num_attention_heads, a.kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim, a.q_stride = c.q_dim(), a.kv_stride = c.kv_dim(), a.o_stride = c.q_dim();
  return a;
}

// ---- GPT-2 (kernels/gpt2_layer.cpp) ----
const char* const kGpt2Names[12] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
                                    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                                    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
struct Gpt2Ptrs {
  std::size_t o[12];
};
Gpt2Ptrs gpt2_offsets(const ModelConfig& c) {
  const ParamLayout& l = detail::cached_layer_layout(c);
  Gpt2Ptrs r{};
  for (int i = 0; i < 12; ++i) r.o[i] = l.at(kGpt2Names[i]).offset;
  return r;
}

struct Gpt2Saved {
  float *x, *xn1, *mean1, *rstd1, *qkv, *att, *lse, *x1, *xn2, *mean2, *rstd2, *fc, *act;
};
Gpt2Saved gpt2_saved(const ModelConfig& c, std::int64_t N, float* base) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  Gpt2Saved s{};
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
  return s;
}

struct Gpt2Scratch {
  float *dx1, *dact, *dfc, *dxn2, *datt, *dqkv, *dxn1;
};
Gpt2Scratch gpt2_scratch(const ModelConfig& c, std::int64_t N, float* base) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  Gpt2Scratch s{};
  s.dx1 = cv.take(N * d);
  float* region = base + cv.used();
  Carver mlp(region);
  s.dact = mlp.take(N * ff);
  s.dfc = mlp.take(N * ff);
  s.dxn2 = mlp.take(N * d);
  Carver attn(region);
  s.datt = attn.take(N * d);
  s.dqkv = attn.take(N * 3 * d);
  s.dxn1 = attn.take(N * d);
  return s;
}

AttnDims gpt2_dims(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  AttnDims a;
  a.batch = B, a.seq = T, a.q_heads = a.kv_heads = c.num_attention_heads, a.head_dim = c.head_dim;
  a.q_stride = a.kv_stride = 3 * c.hidden_size;
  a.o_stride = c.hidden_size;
  return a;
}

}  // namespace

// ---------------- Llama ----------------
void CudaBackend::llama_forward(const ModelConfig& c, const void* params, const float* x, float* x_out, std::int64_t B,
                                std::int64_t T, float* saved, float* /*scratch*/, const Scratch& ps) {
  const std::int64_t N = B * T, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const bool bf16 = options_.precision == Precision::bf16;
  const DevMixed mx{gemm_.get(), compute_, bf16, ps.xb, ps.gb, ps.partial};
  const LlamaW w = llama_weights(c, params, options_.precision);
  const LlamaSaved s = llama_saved(c, N, saved);
  const RopeTables& rope = rope_tables(c, T);
  cudaStream_t st = compute_;
  rmsnorm_forward(x, w.in_norm, bf16, s.xn1, s.rstd1, N, d, c.norm_eps, st);
  float* q_lin = c.qk_norm ? s.q_raw : s.q;
  float* k_lin = c.qk_norm ? s.k_raw : s.k;
  mx.fwd(s.xn1, w.wq, w.bq, q_lin, N, d, qd);
  mx.fwd(s.xn1, w.wk, w.bk, k_lin, N, d, kd);
  mx.fwd(s.xn1, w.wv, w.bv, s.v, N, d, kd);
  if (c.qk_norm) {
    rmsnorm_forward(s.q_raw, w.q_norm, bf16, s.q, s.rstd_q, N * Hq, hd, c.norm_eps, st);
    rmsnorm_forward(s.k_raw, w.k_norm, bf16, s.k, s.rstd_k, N * Hkv, hd, c.norm_eps, st);
  }
  rope_apply(s.q, N, T, Hq, hd, qd, rope.cos, rope.sin, false, st);
  rope_apply(s.k, N, T, Hkv, hd, kd, rope.cos, rope.sin, false, st);
  attention_forward(s.q, s.k, s.v, s.att, s.lse, llama_dims(c, B, T), st);
  mx.fwd(s.att, w.wo, nullptr, s.x1, N, qd, d);
  add_into(s.x1, x, static_cast<std::size_t>(N * d), st);
  rmsnorm_forward(s.x1, w.post_norm, bf16, s.xn2, s.rstd2, N, d, c.norm_eps, st);
  mx.fwd(s.xn2, w.wg, nullptr, s.gate, N, d, ff);
  mx.fwd(s.xn2, w.wu, nullptr, s.up, N, d, ff);
  swiglu_forward(s.gate, s.up, s.h, static_cast<std::size_t>(N * ff), st);
  if (x_out) {
    mx.fwd(s.h, w.wd, nullptr, x_out, N, ff, d);
    add_into(x_out, s.x1, static_cast<std::size_t>(N * d), st);
    copy_d2d(s.x, x, N * d, st);
  }
}

void CudaBackend::llama_backward(const ModelConfig& c, const void* params, const float* x_in, float* saved,
                                 bool recompute, const float* dy, float* dx, float* grads, std::int64_t B,
                                 std::int64_t T, float* scratch, const Scratch& ps) {
  const std::int64_t N = B * T, d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  const std::int64_t hd = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const bool bf16 = options_.precision == Precision::bf16;
  const DevMixed mx{gemm_.get(), compute_, bf16, ps.xb, ps.gb, ps.partial};
  const LlamaW w = llama_weights(c, params, options_.precision);
  const LlamaG g = llama_grads(c, grads);
  const LlamaSaved s = llama_saved(c, N, saved);
  const LlamaScratch sc = llama_scratch(c, N, T, scratch);
  cudaStream_t st = compute_;
  const float* x = x_in;
  if (recompute)
    llama_forward(c, params, x_in, nullptr, B, T, saved, scratch, ps);  // without the last projection
  else
    x = s.x;
  const RopeTables& rope = rope_tables(c, T);
  copy_d2d(sc.dx1, dy, N * d, st);
  mx.bwd(dy, s.h, w.wd, sc.dh, false, g.wd, nullptr, N, ff, d);
  swiglu_backward(s.gate, s.up, sc.dh, sc.dg, sc.du, static_cast<std::size_t>(N * ff), st);
  mx.bwd(sc.dg, s.xn2, w.wg, sc.dxn2, false, g.wg, nullptr, N, d, ff);
  mx.bwd(sc.du, s.xn2, w.wu, sc.dxn2, true, g.wu, nullptr, N, d, ff);
  rmsnorm_backward(s.x1, w.post_norm, bf16, s.rstd2, sc.dxn2, sc.dx1, g.post_norm, N, d, true, ps.partial, st);
  mx.bwd(sc.dx1, s.att, w.wo, sc.datt, false, g.wo, nullptr, N, qd, d);
  attention_backward(s.q, s.k, s.v, s.att, s.lse, sc.datt, sc.dq, sc.dk, sc.dv, ps.rowdot, llama_dims(c, B, T), st);
  rope_apply(sc.dq, N, T, Hq, hd, qd, rope.cos, rope.sin, true, st);
  rope_apply(sc.dk, N, T, Hkv, hd, kd, rope.cos, rope.sin, true, st);
  const float* dq_lin = sc.dq;
  const float* dk_lin = sc.dk;
  if (c.qk_norm) {
    rmsnorm_backward(s.q_raw, w.q_norm, bf16, s.rstd_q, sc.dq, sc.dqn, g.q_norm, N * Hq, hd, false, ps.partial, st);
    rmsnorm_backward(s.k_raw, w.k_norm, bf16, s.rstd_k, sc.dk, sc.dkn, g.k_norm, N * Hkv, hd, false, ps.partial, st);
    dq_lin = sc.dqn;
    dk_lin = sc.dkn;
  }
  mx.bwd(dq_lin, s.xn1, w.wq, sc.dxn1, false, g.wq, g.bq, N, d, qd);
  mx.bwd(dk_lin, s.xn1, w.wk, sc.dxn1, true, g.wk, g.bk, N, d, kd);
  mx.bwd(sc.dv, s.xn1, w.wv, sc.dxn1, true, g.wv, g.bv, N, d, kd);
  copy_d2d(dx, sc.dx1, N * d, st);
  rmsnorm_backward(x, w.in_norm, bf16, s.rstd1, sc.dxn1, dx, g.in_norm, N, d, true, ps.partial, st);
}

// ---------------- GPT-2 ----------------
void CudaBackend::gpt2_forward(const ModelConfig& c, const void* params, const float* x, float* x_out, std::int64_t B,
                               std::int64_t T, float* saved, const Scratch& ps) {
  const std::int64_t N = B * T, d = c.hidden_size, ff = c.intermediate_size;
  const bool bf16 = options_.precision == Precision::bf16;
  const DevMixed mx{gemm_.get(), compute_, bf16, ps.xb, ps.gb, ps.partial};
  const Gpt2Ptrs o = gpt2_offsets(c);
  auto w = [&](int i) { return at(params, o.o[i], options_.precision); };
  const Gpt2Saved s = gpt2_saved(c, N, saved);
  cudaStream_t st = compute_;
  layernorm_forward(x, w(0), w(1), bf16, s.xn1, s.mean1, s.rstd1, N, d, c.norm_eps, st);
  mx.fwd(s.xn1, w(2), w(3), s.qkv, N, d, 3 * d);
  attention_forward(s.qkv, s.qkv + d, s.qkv + 2 * d, s.att, s.lse, gpt2_dims(c, B, T), st);
  mx.fwd(s.att, w(4), w(5), s.x1, N, d, d);
  add_into(s.x1, x, static_cast<std::size_t>(N * d), st);
  layernorm_forward(s.x1, w(6), w(7), bf16, s.xn2, s.mean2, s.rstd2, N, d, c.norm_eps, st);
  mx.fwd(s.xn2, w(8), w(9), s.fc, N, d, ff);
  gelu_forward(s.fc, s.act, static_cast<std::size_t>(N * ff), st);
  if (x_out) {
    mx.fwd(s.act, w(10), w(11), x_out, N, ff, d);
    add_into(x_out, s.x1, static_cast<std::size_t>(N * d), st);
    copy_d2d(s.x, x, N * d, st);
  }
}

void CudaBackend::gpt2_backward(const ModelConfig& c, const void* params, const float* x_in, float* saved,
                                bool recompute, const float* dy, float* dx, float* grads, std::int64_t B,
                                std::int64_t T, float* scratch, const Scratch& ps) {
  const std::int64_t N = B * T, d = c.hidden_size, ff = c.intermediate_size;
  const bool bf16 = options_.precision == Precision::bf16;
  const DevMixed mx{gemm_.get(), compute_, bf16, ps.xb, ps.gb, ps.partial};
  const Gpt2Ptrs o = gpt2_offsets(c);
  auto w = [&](int i) { return at(params, o.o[i], options_.precision); };
  auto g = [&](int i) { return grads + o.o[i]; };
  const Gpt2Saved s = gpt2_saved(c, N, saved);
  const Gpt2Scratch sc = gpt2_scratch(c, N, scratch);
  cudaStream_t st = compute_;
  const float* x = x_in;
  if (recompute)
    gpt2_forward(c, params, x_in, nullptr, B, T, saved, ps);
  else
    x = s.x;
  copy_d2d(sc.dx1, dy, N * d, st);
  mx.bwd(dy, s.act, w(10), sc.dact, false, g(10), g(11), N, ff, d);
  gelu_backward(s.fc, sc.dact, sc.dfc, static_cast<std::size_t>(N * ff), st);
  mx.bwd(sc.dfc, s.xn2, w(8), sc.dxn2, false, g(8), g(9), N, d, ff);
  layernorm_backward(s.x1, w(6), bf16, s.mean2, s.rstd2, sc.dxn2, sc.dx1, g(6), g(7), N, d, true, ps.partial, st);
  mx.bwd(sc.dx1, s.att, w(4), sc.datt, false, g(4), g(5), N, d, d);
  attention_backward(s.qkv, s.qkv + d, s.qkv + 2 * d, s.att, s.lse, sc.datt, sc.dqkv, sc.dqkv + d, sc.dqkv + 2 * d,
                     ps.rowdot, gpt2_dims(c, B, T), st);
  mx.bwd(sc.dqkv, s.xn1, w(2), sc.dxn1, false, g(2), g(3), N, d, 3 * d);
  copy_d2d(dx, sc.dx1, N * d, st);
  layernorm_backward(x, w(0), bf16, s.mean1, s.rstd1, sc.dxn1, dx, g(0), g(1), N, d, true, ps.partial, st);
}

// ---------------- the Backend's stage operations ----------------
void CudaBackend::layer_forward(const ModelConfig& c, const void* weights, const float* x_in, float* x_out,
                                std::int64_t batch, std::int64_t seq, float* saved, float* workspace) {
  select_device();
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);  // validates the config and shape
  if (!weights || !x_in || !x_out || !workspace)
    throw std::invalid_argument("layer: params, x_in, x_out and workspace must be non-null");
  if (x_in == x_out) throw std::invalid_argument("layer: x_out must not alias x_in");
  float* keep = saved ? saved : workspace;
  float* scratch = saved ? workspace : workspace + saved_n;
  const Scratch ps = scratch_for(c, batch, seq, 0);
  if (c.is_gpt2())
    gpt2_forward(c, weights, x_in, x_out, batch, seq, keep, ps);
  else
    llama_forward(c, weights, x_in, x_out, batch, seq, keep, scratch, ps);
  finish_stage();
}

void CudaBackend::layer_backward(const ModelConfig& c, const void* weights, const float* x_in, const float* saved,
                                 const float* dy, float* dx, float* grads, std::int64_t batch, std::int64_t seq,
                                 float* workspace) {
  select_device();
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);
  if (!weights || !dy || !dx || !grads || !workspace)
    throw std::invalid_argument("layer: params, dy, dx, grads and workspace must be non-null");
  if (!saved && !x_in)
    throw std::invalid_argument("layer: recompute mode (saved == nullptr) needs the layer input x_in");
  if (dx == dy) throw std::invalid_argument("layer: dx must not alias dy");
  const bool recompute = saved == nullptr;
  float* keep = recompute ? workspace : const_cast<float*>(saved);  // read-only when not recomputing
  float* scratch = recompute ? workspace + saved_n : workspace;
  const Scratch ps = scratch_for(c, batch, seq, 0);
  if (c.is_gpt2())
    gpt2_backward(c, weights, x_in, keep, recompute, dy, dx, grads, batch, seq, scratch, ps);
  else
    llama_backward(c, weights, x_in, keep, recompute, dy, dx, grads, batch, seq, scratch, ps);
  finish_stage();
}

void CudaBackend::embedding_forward(const ModelConfig& c, const void* weights, const token_t* tokens,
                                    std::int64_t batch, std::int64_t seq, float* x_out) {
  select_device();
  c.validate();
  validate_batch_shape(c, batch, seq);
  const std::int64_t N = batch * seq;
  {
    std::lock_guard<std::mutex> lock(token_mu_);
    TokenSlot& s = slot_of(tokens, "embedding_forward");
    if (static_cast<std::int64_t>(s.host.size()) < N)
      throw std::invalid_argument("CUDA embedding_forward: fewer uploaded tokens than batch x seq");
    validate_tokens(c, s.host.data(), static_cast<std::size_t>(N));
  }
  const ParamLayout& l = detail::cached_embedding_layout(c);
  const Precision p = options_.precision;
  const void* wte = at(weights, l.tensors[0].offset, p);
  const void* wpe = c.is_gpt2() ? at(weights, l.at("wpe.weight").offset, p) : nullptr;
  cuda::embedding_forward(wte, wpe, p == Precision::bf16, tokens, N, seq, c.hidden_size, x_out, compute_);
  finish_stage();
}

void CudaBackend::embedding_backward(const ModelConfig& c, const token_t* tokens, std::int64_t batch, std::int64_t seq,
                                     const float* dx, float* grads) {
  select_device();
  c.validate();
  validate_batch_shape(c, batch, seq);
  const std::int64_t N = batch * seq;
  std::lock_guard<std::mutex> lock(token_mu_);
  TokenSlot& s = slot_of(tokens, "embedding_backward");
  if (static_cast<std::int64_t>(s.host.size()) != N)
    throw std::invalid_argument("CUDA embedding_backward: the uploaded tokens are not batch x seq ids");
  validate_tokens(c, s.host.data(), static_cast<std::size_t>(N));
  build_token_rows(s);
  const ParamLayout& l = detail::cached_embedding_layout(c);
  float* dwte = grads + l.tensors[0].offset;
  embedding_backward_tokens(dx, s.unique, s.offsets, s.rows, s.n_unique, c.hidden_size, dwte, compute_);
  if (c.is_gpt2())
    embedding_backward_positions(dx, batch, seq, c.hidden_size, grads + l.at("wpe.weight").offset, compute_);
  finish_stage();
}

LossSum CudaBackend::head_forward_backward(const ModelConfig& c, const void* head_weights, const void* embed_weights,
                                           const float* x_in, const token_t* targets, std::int64_t batch,
                                           std::int64_t seq, float* dx, float* head_grads, float* embed_grads,
                                           float* workspace) {
  select_device();
  c.validate();
  validate_batch_shape(c, batch, seq);
  const std::int64_t N = batch * seq, d = c.hidden_size, V = c.vocab_size;
  const bool grad = dx != nullptr;
  const bool tied = c.is_gpt2() || c.tie_word_embeddings;
  if (grad && (!head_grads || (tied && !embed_grads)))
    throw std::invalid_argument("head: backward needs head_grads (and embed_grads when embeddings are tied)");
  if (!x_in || !targets || !workspace || !head_weights)
    throw std::invalid_argument("head: head_params, x_in, targets and workspace must be non-null");
  if (tied && !embed_weights)
    throw std::invalid_argument("head: tied embeddings need embed_params (stage 0's parameters)");
  {
    std::lock_guard<std::mutex> lock(token_mu_);
    TokenSlot& s = slot_of(targets, "head_forward_backward");
    if (static_cast<std::int64_t>(s.host.size()) < N)
      throw std::invalid_argument("CUDA head: fewer uploaded targets than batch x seq");
    validate_targets(c, s.host.data(), static_cast<std::size_t>(N));
  }
  const Precision p = options_.precision;
  const bool bf16 = p == Precision::bf16;
  const ParamLayout& hl = detail::cached_head_layout(c);
  const void* norm_w = at(head_weights, hl.at(c.is_gpt2() ? "ln_f.weight" : "model.norm.weight").offset, p);
  const void* norm_b = c.is_gpt2() ? at(head_weights, hl.at("ln_f.bias").offset, p) : nullptr;
  float* g_norm_w = head_grads ? head_grads + hl.at(c.is_gpt2() ? "ln_f.weight" : "model.norm.weight").offset : nullptr;
  float* g_norm_b = head_grads && c.is_gpt2() ? head_grads + hl.at("ln_f.bias").offset : nullptr;
  const std::size_t lm_off =
      tied ? detail::cached_embedding_layout(c).tensors[0].offset : hl.at("lm_head.weight").offset;
  const void* lm = at(tied ? embed_weights : head_weights, lm_off, p);
  float* g_lm = tied ? (embed_grads ? embed_grads + lm_off : nullptr) : (head_grads ? head_grads + lm_off : nullptr);

  const std::int64_t chunk =
      options_.head_chunk > 0 ? std::min(options_.head_chunk, N) : head_chunk_tokens(c, batch, seq);
  // The CPU head's carving (lm_head.cpp): xn, mean, rstd, dxn, one chunk of logits, the row losses.
  Carver cv(workspace);
  float* xn = cv.take(N * d);
  float* mean = cv.take(N);
  float* rstd = cv.take(N);
  float* dxn = cv.take(N * d);
  float* logits = cv.take(chunk * V);
  float* row_loss = cv.take(N);
  const Scratch ps = scratch_for(c, batch, seq, chunk);
  const DevMixed mx{gemm_.get(), compute_, bf16, ps.xb, ps.gb, ps.partial};
  cudaStream_t st = compute_;
  if (c.is_gpt2())
    layernorm_forward(x_in, norm_w, norm_b, bf16, xn, mean, rstd, N, d, c.norm_eps, st);
  else
    rmsnorm_forward(x_in, norm_w, bf16, xn, rstd, N, d, c.norm_eps, st);
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk) {
    const std::int64_t n = std::min(chunk, N - r0);
    mx.fwd(xn + r0 * d, lm, nullptr, logits, n, d, V);
    cross_entropy_rows(logits, targets + r0, row_loss + r0, n, V, grad, st);
    if (grad) mx.bwd(logits, xn + r0 * d, lm, dxn + r0 * d, false, g_lm, nullptr, n, d, V);
  }
  loss_sum(row_loss, targets, N, loss_device_, st);
  MT_CUDA_CHECK(cudaMemcpyAsync(loss_host_, loss_device_, 2 * sizeof(double), cudaMemcpyDeviceToHost, st));
  if (grad) {
    if (c.is_gpt2())
      layernorm_backward(x_in, norm_w, bf16, mean, rstd, dxn, dx, g_norm_w, g_norm_b, N, d, false, ps.partial, st);
    else
      rmsnorm_backward(x_in, norm_w, bf16, rstd, dxn, dx, g_norm_w, N, d, false, ps.partial, st);
  }
  finish_stage();  // the loss is on the host after this
  LossSum out;
  out.loss_sum = loss_host_[0];
  out.counted = static_cast<std::int64_t>(loss_host_[1]);
  return out;
}

}  // namespace mt::cuda
