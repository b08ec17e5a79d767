// layer_forward / layer_backward: validation and workspace split, then the Llama or GPT-2 template.
// Also the Mixed precision helper the stage templates compute through (layer_impl.hpp).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/stage_api.hpp"
#include "kernels/workspace.hpp"

namespace mt {

namespace detail {

void Mixed::fwd(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
                std::int64_t out) const {
  if (!bf16()) {
    cpu::linear_forward(x, static_cast<const float*>(W), static_cast<const float*>(b), y, N, in, out, threads);
    return;
  }
  cpu::to_bf16(x, xb, static_cast<std::size_t>(N * in), threads);
  cpu::linear_forward_bf16(xb, static_cast<const bf16_t*>(W), static_cast<const bf16_t*>(b), y, N, in, out, threads);
}

void Mixed::bwd(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW, float* db,
                std::int64_t N, std::int64_t in, std::int64_t out) const {
  if (!bf16()) {
    if (dx) cpu::linear_backward_input(dy, static_cast<const float*>(W), dx, N, in, out, add, threads);
    cpu::linear_backward_weight(dy, x, dW, db, N, in, out, threads);
    return;
  }
  cpu::to_bf16(dy, gb, static_cast<std::size_t>(N * out), threads);
  if (dx) cpu::linear_backward_input_bf16(gb, static_cast<const bf16_t*>(W), dx, N, in, out, add, threads);
  cpu::to_bf16(x, xb, static_cast<std::size_t>(N * in), threads);
  cpu::linear_backward_weight_bf16(gb, xb, dW, N, in, out, threads);
  if (db) cpu::colsum_add(dy, db, N, out, threads);  // bias gradients from the fp32 dy
}

const float* Mixed::vec(const void* w, std::int64_t n, int slot) const {
  if (!w || !bf16()) return static_cast<const float*>(w);
  float* dst = small + static_cast<std::int64_t>(slot) * small_n;
  cpu::from_bf16(static_cast<const bf16_t*>(w), dst, static_cast<std::size_t>(n), 1);
  return dst;
}

Mixed carve_mixed(Precision p, int threads, float* base, std::int64_t xb_n, std::int64_t gb_n, std::int64_t small_n,
                  std::size_t* used) {
  Mixed m;
  m.precision = p;
  m.threads = threads;
  Carver cv(base);
  if (p == Precision::bf16) {
    m.xb = reinterpret_cast<bf16_t*>(cv.take((xb_n + 1) / 2));  // two bf16 per float of the workspace
    m.gb = reinterpret_cast<bf16_t*>(cv.take((gb_n + 1) / 2));
    m.small = cv.take(small_n * Mixed::kSmallSlots);
    m.small_n = small_n;
  }
  if (used) *used = cv.used();
  return m;
}

Mixed layer_mixed(const ModelConfig& c, std::int64_t B, std::int64_t T, Precision p, int threads, float* base,
                  std::size_t* used) {
  const std::int64_t N = B * T;
  const std::int64_t widest =
      std::max({c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size, c.is_gpt2() ? 3 * c.hidden_size : 0});
  return carve_mixed(p, threads, base, N * widest, N * widest, std::max(c.hidden_size, c.head_dim), used);
}

}  // namespace detail

namespace {

void check_pointers(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("layer: ") + what);
}

std::size_t scratch_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq) {
  return c.is_gpt2() ? detail::gpt2_scratch_floats(c, batch, seq) : detail::llama_scratch_floats(c, batch, seq);
}

}  // namespace

std::size_t layer_saved_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  return c.is_gpt2() ? detail::gpt2_saved_floats(c, batch, seq) : detail::llama_saved_floats(c, batch, seq);
}

std::size_t layer_workspace_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, ActivationMode mode,
                                   Precision precision) {
  const std::size_t saved = layer_saved_floats(c, batch, seq);
  std::size_t mixed = 0;
  detail::layer_mixed(c, batch, seq, precision, 1, nullptr, &mixed);
  return scratch_floats(c, batch, seq) + (mode == ActivationMode::recompute ? saved : 0) + mixed;
}

std::size_t stage_workspace_floats(const ModelConfig& c, std::int64_t stage, std::int64_t batch, std::int64_t seq,
                                   ActivationMode mode, Precision precision) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  if (stage < 0 || stage > c.num_hidden_layers + 1)
    throw std::invalid_argument("stage " + std::to_string(stage) + " out of range [0, " +
                                std::to_string(c.num_hidden_layers + 1) + "]");
  if (stage == 0) return 0;
  if (stage == c.num_hidden_layers + 1) return head_workspace_floats(c, batch, seq, 0, precision);
  return layer_workspace_floats(c, batch, seq, mode, precision);
}

void layer_forward(const ModelConfig& c, const void* params, const float* x_in, float* x_out, std::int64_t batch,
                   std::int64_t seq, float* saved, float* workspace, const ComputeCtx& ctx) {
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);
  check_pointers(params && x_in && x_out && workspace, "params, x_in, x_out and workspace must be non-null");
  check_pointers(x_in != x_out, "x_out must not alias x_in");
  float* keep = saved ? saved : workspace;
  float* scratch = saved ? workspace : workspace + saved_n;
  const detail::Mixed mx =
      detail::layer_mixed(c, batch, seq, ctx.precision, ctx.threads, scratch + scratch_floats(c, batch, seq));
  if (c.is_gpt2())
    detail::gpt2_forward(c, params, x_in, x_out, batch, seq, keep, scratch, mx);
  else
    detail::llama_forward(c, params, x_in, x_out, batch, seq, keep, scratch, mx);
}

void layer_backward(const ModelConfig& c, const void* params, const float* x_in, const float* saved, const float* dy,
                    float* dx, float* grads, std::int64_t batch, std::int64_t seq, float* workspace,
                    const ComputeCtx& ctx) {
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);
  check_pointers(params && dy && dx && grads && workspace, "params, dy, dx, grads and workspace must be non-null");
  check_pointers(saved || x_in, "recompute mode (saved == nullptr) needs the layer input x_in");
  check_pointers(dx != dy, "dx must not alias dy");
  const bool recompute = saved == nullptr;
  float* keep = recompute ? workspace : const_cast<float*>(saved);  // read-only when not recomputing
  float* scratch = recompute ? workspace + saved_n : workspace;
  const detail::Mixed mx =
      detail::layer_mixed(c, batch, seq, ctx.precision, ctx.threads, scratch + scratch_floats(c, batch, seq));
  if (c.is_gpt2())
    detail::gpt2_backward(c, params, x_in, keep, recompute, dy, dx, grads, batch, seq, scratch, mx);
  else
    detail::llama_backward(c, params, x_in, keep, recompute, dy, dx, grads, batch, seq, scratch, mx);
}

}  // namespace mt
