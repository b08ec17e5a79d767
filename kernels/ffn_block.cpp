// The feed-forward block (ffn_block.hpp): the dense SwiGLU MLP and the mixture of SwiGLU experts, each
// written once over the ops.
#include "kernels/ffn_block.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/layer_impl.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/workspace.hpp"

namespace mt::detail {

namespace {

// ---- the dense MLP: y = down(silu(gate(xn)) * up(xn)) ----

enum DenseTensor { wg, wu, wd, kDenseTensors };
const char* const kDenseNames[kDenseTensors] = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
struct DenseOffsets : TensorOffsets<kDenseTensors> {};  // a type of its own for per_shape's cache

template <class P>
BoundTensors<P, kDenseTensors> bind_dense(const ModelConfig& c, P base, Precision p) {
  const DenseOffsets& off = per_shape<DenseOffsets>(c, [&] {
    DenseOffsets o;
    static_cast<TensorOffsets<kDenseTensors>&>(o) = find_offsets(cached_layer_layout(c), kDenseNames);
    return o;
  });
  return bind_tensors(off, base, p);
}

// Kept: the two products' outputs. h = silu(gate) * up is not kept: the forward makes it in scratch for
// the down product, and the backward makes it again (one elementwise pass, the same bits) where dg will
// go, which frees n x ff floats of every kept layer.
struct DenseSaved {
  float *gate, *up;
};
DenseSaved carve_dense(const ModelConfig& c, std::int64_t n, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t ff = c.intermediate_size;
  DenseSaved s{cv.take(n * ff), cv.take(n * ff)};
  if (used) *used = cv.used();
  return s;
}
// The backward's dh, dg, du (h first, in dg's place), and the forward's h (in dh's place).
struct DenseScratch {
  float *dh, *dg, *du;
};
DenseScratch carve_dense_scratch(const ModelConfig& c, std::int64_t n, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t ff = c.intermediate_size;
  DenseScratch s{cv.take(n * ff), cv.take(n * ff), cv.take(n * ff)};
  if (used) *used = cv.used();
  return s;
}

void dense_forward(Ops& ops, const ModelConfig& c, const void* params, const float* xn, std::int64_t n, float* saved,
                   float* y, float* scratch) {
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  const auto w = bind_dense(c, params, ops.precision());
  const DenseSaved s = carve_dense(c, n, saved);
  ops.linear_forward(xn, w[wg], nullptr, s.gate, n, d, ff);
  ops.linear_forward(xn, w[wu], nullptr, s.up, n, d, ff);
  if (!y) return;  // a recomputing backward makes h itself
  float* h = carve_dense_scratch(c, n, scratch).dh;
  ops.swiglu_forward(s.gate, s.up, h, static_cast<std::size_t>(n * ff));
  ops.linear_forward(h, w[wd], nullptr, y, n, ff, d);
}

void dense_backward(Ops& ops, const ModelConfig& c, const void* params, float* grads, const float* xn, std::int64_t n,
                    const float* saved, const float* dy, float* dxn, float* scratch) {
  const std::int64_t d = c.hidden_size, ff = c.intermediate_size;
  const auto w = bind_dense(c, params, ops.precision());
  const auto g = bind_dense(c, grads, Precision::fp32);
  const DenseSaved s = carve_dense(c, n, const_cast<float*>(saved));
  const DenseScratch ds = carve_dense_scratch(c, n, scratch);
  float* h = ds.dg;  // h until swiglu_backward overwrites it with dg
  ops.swiglu_forward(s.gate, s.up, h, static_cast<std::size_t>(n * ff));
  ops.linear_backward(dy, h, w[wd], ds.dh, false, g[wd], nullptr, n, ff, d);
  ops.swiglu_backward(s.gate, s.up, ds.dh, ds.dg, ds.du, static_cast<std::size_t>(n * ff));
  ops.linear_backward(ds.dg, xn, w[wg], dxn, false, g[wg], nullptr, n, d, ff);
  ops.linear_backward(ds.du, xn, w[wu], dxn, true, g[wu], nullptr, n, d, ff);
}

// ---- the mixture of experts ----

// The router (and its bias), expert 0's matrix of each kind and (gpt-oss) its bias; expert e's is e
// strides after expert 0's. Absent biases bind to null.
enum MoeTensor { router, router_b, w1, w3, w2, b1, b3, b2, kMoeTensors };
struct MoeStrides {
  std::int64_t matrix = 0;   // elements between consecutive experts' matrices of one kind
  std::int64_t inner_b = 0;  // ... between their gate (or up) biases, [moe_intermediate_size]
  std::int64_t outer_b = 0;  // ... between their down biases, [hidden_size]
};
struct MoeOffsets {
  TensorOffsets<kMoeTensors> off;
  MoeStrides stride;
};

template <class P>
BoundTensors<P, kMoeTensors> bind_moe(const ModelConfig& c, P base, Precision p, MoeStrides* stride) {
  const MoeOffsets& m = per_shape<MoeOffsets>(c, [&] {
    const ParamLayout& l = cached_layer_layout(c);
    auto at = [&](const std::string& name) { return static_cast<std::ptrdiff_t>(l.at(name).offset); };
    auto between = [&](const std::string& first, const std::string& second) {
      return c.num_experts > 1 ? static_cast<std::int64_t>(at(second) - at(first)) : 0;
    };
    MoeOffsets o;
    for (int i = 0; i < kMoeTensors; ++i) o.off.at[i] = -1;
    o.off.at[router] = at(moe_router_tensor(c));
    o.off.at[w1] = at(moe_expert_tensor(c, 0, ExpertMatrix::gate));
    o.off.at[w3] = at(moe_expert_tensor(c, 0, ExpertMatrix::up));
    o.off.at[w2] = at(moe_expert_tensor(c, 0, ExpertMatrix::down));
    o.stride.matrix = between(moe_expert_tensor(c, 0, ExpertMatrix::gate), moe_expert_tensor(c, 1, ExpertMatrix::gate));
    if (c.moe_biases()) {
      o.off.at[router_b] = at(moe_router_bias_tensor(c));
      o.off.at[b1] = at(moe_expert_bias_tensor(c, 0, ExpertMatrix::gate));
      o.off.at[b3] = at(moe_expert_bias_tensor(c, 0, ExpertMatrix::up));
      o.off.at[b2] = at(moe_expert_bias_tensor(c, 0, ExpertMatrix::down));
      o.stride.inner_b =
          between(moe_expert_bias_tensor(c, 0, ExpertMatrix::gate), moe_expert_bias_tensor(c, 1, ExpertMatrix::gate));
      o.stride.outer_b =
          between(moe_expert_bias_tensor(c, 0, ExpertMatrix::down), moe_expert_bias_tensor(c, 1, ExpertMatrix::down));
    }
    return o;
  });
  *stride = m.stride;
  return bind_tensors(m.off, base, p);
}

RouteShape route_shape(const ModelConfig& c, std::int64_t n) {
  RouteShape r;
  r.tokens = n, r.experts = c.num_experts, r.top_k = c.num_experts_per_tok;
  r.kind = c.is_gpt_oss() ? RouterKind::topk_softmax : RouterKind::softmax_topk;
  r.renormalize = c.norm_topk_prob;
  return r;
}

// The experts' activation: SwiGLU, or gpt-oss's clamped form.
void expert_activation(Ops& ops, const ModelConfig& c, const float* g, const float* u, float* h, std::size_t n) {
  if (c.is_gpt_oss())
    ops.clamped_swiglu_forward(g, u, h, n, ModelConfig::kGptOssSwigluAlpha, c.swiglu_limit);
  else
    ops.swiglu_forward(g, u, h, n);
}
void expert_activation_backward(Ops& ops, const ModelConfig& c, const float* g, const float* u, const float* dh,
                                float* dg, float* du, std::size_t n) {
  if (c.is_gpt_oss())
    ops.clamped_swiglu_backward(g, u, dh, dg, du, n, ModelConfig::kGptOssSwigluAlpha, c.swiglu_limit);
  else
    ops.swiglu_backward(g, u, dh, dg, du, n);
}

// Indices live in float-sized slots of the same buffers (int32 and float are both 4 bytes).
std::int32_t* as_index(float* p) { return reinterpret_cast<std::int32_t*>(p); }
static_assert(sizeof(std::int32_t) == sizeof(float), "indices are carved as floats");

struct MoeSaved {
  float *logits, *weight, *xe, *gate, *up, *h, *ye;
  std::int32_t *expert, *order, *slot_pos;
};
MoeSaved carve_moe(const ModelConfig& c, std::int64_t n, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, P = n * k;
  const std::int64_t ff = c.moe_intermediate_size;
  MoeSaved s{};
  s.logits = cv.take(n * E);
  s.expert = as_index(cv.take(P));
  s.weight = cv.take(P);
  s.order = as_index(cv.take(P));
  s.slot_pos = as_index(cv.take(P));
  s.xe = cv.take(P * d);
  s.gate = cv.take(P * ff);
  s.up = cv.take(P * ff);
  s.h = cv.take(P * ff);
  s.ye = cv.take(P * d);
  if (used) *used = cv.used();
  return s;
}

struct MoeScratch {
  float *dye, *dh, *dg, *du, *dxe, *dweight, *dlogits;
  std::int32_t *order, *slot_pos;  // the dispatch again (its host offsets are what the backward needs)
};
MoeScratch carve_moe_scratch(const ModelConfig& c, std::int64_t n, float* base, std::size_t* used = nullptr) {
  Carver cv(base);
  const std::int64_t d = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok, P = n * k;
  const std::int64_t ff = c.moe_intermediate_size;
  MoeScratch s{};
  s.dye = cv.take(P * d);
  s.dh = cv.take(P * ff);
  s.dg = cv.take(P * ff);
  s.du = cv.take(P * ff);
  s.dxe = cv.take(P * d);
  s.dweight = cv.take(P);
  s.dlogits = cv.take(n * E);
  s.order = as_index(cv.take(P));
  s.slot_pos = as_index(cv.take(P));
  if (used) *used = cv.used();
  return s;
}

// Host room for an expert's row offsets (E + 1), grown once per thread.
std::int64_t* host_offsets(const ModelConfig& c) {
  thread_local std::vector<std::int64_t> offsets;
  offsets.resize(static_cast<std::size_t>(c.num_experts + 1));
  return offsets.data();
}

void moe_forward(Ops& ops, const ModelConfig& c, const void* params, const float* xn, std::int64_t n, float* saved,
                 float* y, const MoeBalance* balance) {
  const std::int64_t d = c.hidden_size, E = c.num_experts, ff = c.moe_intermediate_size;
  MoeStrides st;
  const auto w = bind_moe(c, params, ops.precision(), &st);
  const MoeSaved s = carve_moe(c, n, saved);
  const RouteShape r = route_shape(c, n);
  std::int64_t* offsets = host_offsets(c);
  ops.linear_forward(xn, w[router], w[router_b], s.logits, n, d, E);
  ops.moe_route(s.logits, r, s.expert, s.weight);
  ops.moe_dispatch(s.expert, r, s.order, s.slot_pos, offsets);
  if (balance && balance->counts)  // the choices per expert, from the grouping's host offsets
    for (std::int64_t e = 0; e < E; ++e) balance->counts[e] += offsets[e + 1] - offsets[e];
  if (balance && balance->prob_sums) {
    thread_local std::vector<float> sums;
    sums.resize(static_cast<std::size_t>(E));
    ops.moe_balance_stats(s.logits, s.expert, s.weight, r, sums.data());
    for (std::int64_t e = 0; e < E; ++e) balance->prob_sums[e] += sums[static_cast<std::size_t>(e)];
  }
  ops.moe_gather(xn, s.order, r, d, s.xe);
  ops.grouped_linear_forward(s.xe, w[w1], st.matrix, w[b1], st.inner_b, s.gate, offsets, E, d, ff);
  ops.grouped_linear_forward(s.xe, w[w3], st.matrix, w[b3], st.inner_b, s.up, offsets, E, d, ff);
  expert_activation(ops, c, s.gate, s.up, s.h, static_cast<std::size_t>(r.choices() * ff));
  ops.grouped_linear_forward(s.h, w[w2], st.matrix, w[b2], st.outer_b, s.ye, offsets, E, ff, d);
  if (y) ops.moe_combine(s.ye, s.slot_pos, s.weight, r, d, y);
}

void moe_backward(Ops& ops, const ModelConfig& c, const void* params, float* grads, const float* xn, std::int64_t n,
                  const float* saved, const float* dy, float* dxn, float* scratch, const MoeBalance* balance) {
  const std::int64_t d = c.hidden_size, E = c.num_experts, ff = c.moe_intermediate_size;
  MoeStrides st;
  const auto w = bind_moe(c, params, ops.precision(), &st);
  const auto g = bind_moe(c, grads, Precision::fp32, &st);
  const MoeSaved s = carve_moe(c, n, const_cast<float*>(saved));
  const MoeScratch sc = carve_moe_scratch(c, n, scratch);
  const RouteShape r = route_shape(c, n);
  std::int64_t* offsets = host_offsets(c);
  ops.moe_dispatch(s.expert, r, sc.order, sc.slot_pos, offsets);  // the forward's grouping, its offsets on the host
  ops.moe_combine_backward(dy, s.ye, s.slot_pos, s.weight, r, d, sc.dye, sc.dweight);
  ops.grouped_linear_backward(sc.dye, s.h, w[w2], st.matrix, sc.dh, false, g[w2], g[b2], st.outer_b, offsets, E, ff, d);
  expert_activation_backward(ops, c, s.gate, s.up, sc.dh, sc.dg, sc.du, static_cast<std::size_t>(r.choices() * ff));
  ops.grouped_linear_backward(sc.dg, s.xe, w[w1], st.matrix, sc.dxe, false, g[w1], g[b1], st.inner_b, offsets, E, d,
                              ff);
  ops.grouped_linear_backward(sc.du, s.xe, w[w3], st.matrix, sc.dxe, true, g[w3], g[b3], st.inner_b, offsets, E, d, ff);
  ops.moe_gather_backward(sc.dxe, s.slot_pos, r, d, dxn, false);
  // The load-balancing loss reaches the router through the logits (softmax_topk) or, for gpt-oss, through
  // its scores, i.e. the weights (topk_softmax); moe_route_backward overwrites dlogits, so after it.
  const bool balanced = balance && balance->grad;
  if (balanced && r.kind == RouterKind::topk_softmax)
    ops.moe_balance_backward(s.logits, s.expert, s.weight, balance->grad, r, nullptr, sc.dweight);
  ops.moe_route_backward(s.logits, s.expert, s.weight, sc.dweight, sc.dlogits, r);
  if (balanced && r.kind == RouterKind::softmax_topk)
    ops.moe_balance_backward(s.logits, s.expert, s.weight, balance->grad, r, sc.dlogits, nullptr);
  ops.linear_backward(sc.dlogits, xn, w[router], dxn, true, g[router], g[router_b], n, d, E);
}

}  // namespace

std::size_t ffn_saved_floats(const ModelConfig& c, std::int64_t n) {
  std::size_t used = 0;
  if (c.is_moe())
    carve_moe(c, n, nullptr, &used);
  else
    carve_dense(c, n, nullptr, &used);
  return used;
}

std::size_t ffn_scratch_floats(const ModelConfig& c, std::int64_t n) {
  std::size_t used = 0;
  if (c.is_moe())
    carve_moe_scratch(c, n, nullptr, &used);
  else
    carve_dense_scratch(c, n, nullptr, &used);
  return used;
}

std::int64_t ffn_operand_elements(const ModelConfig& c, std::int64_t n) {
  if (!c.is_moe()) return n * std::max(c.hidden_size, c.intermediate_size);
  // The router's product (n x d in, n x E out) and the experts' (P rows of d or of their width).
  const std::int64_t P = n * c.num_experts_per_tok;
  return std::max({n * c.hidden_size, n * c.num_experts, P * c.hidden_size, P * c.moe_intermediate_size});
}

void ffn_forward(Ops& ops, const ModelConfig& c, const void* params, const float* xn, std::int64_t n, float* saved,
                 float* y, float* scratch, const MoeBalance* balance) {
  if (c.is_moe())
    moe_forward(ops, c, params, xn, n, saved, y, balance);
  else
    dense_forward(ops, c, params, xn, n, saved, y, scratch);
}

void ffn_backward(Ops& ops, const ModelConfig& c, const void* params, float* grads, const float* xn, std::int64_t n,
                  const float* saved, const float* dy, float* dxn, float* scratch, const MoeBalance* balance) {
  if (c.is_moe())
    moe_backward(ops, c, params, grads, xn, n, saved, dy, dxn, scratch, balance);
  else
    dense_backward(ops, c, params, grads, xn, n, saved, dy, dxn, scratch);
}

}  // namespace mt::detail
