// layer_forward / layer_backward: validation and workspace split, then the Llama or GPT-2 template.
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/stage_api.hpp"

namespace mt {

namespace {

void check_pointers(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("layer: ") + what);
}

}  // namespace

std::size_t layer_saved_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  return c.is_gpt2() ? detail::gpt2_saved_floats(c, batch, seq) : detail::llama_saved_floats(c, batch, seq);
}

std::size_t layer_workspace_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, ActivationMode mode) {
  const std::size_t saved = layer_saved_floats(c, batch, seq);
  const std::size_t scratch =
      c.is_gpt2() ? detail::gpt2_scratch_floats(c, batch, seq) : detail::llama_scratch_floats(c, batch, seq);
  return scratch + (mode == ActivationMode::recompute ? saved : 0);
}

std::size_t stage_workspace_floats(const ModelConfig& c, std::int64_t stage, std::int64_t batch, std::int64_t seq,
                                   ActivationMode mode) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  if (stage < 0 || stage > c.num_hidden_layers + 1)
    throw std::invalid_argument("stage " + std::to_string(stage) + " out of range [0, " +
                                std::to_string(c.num_hidden_layers + 1) + "]");
  if (stage == 0) return 0;
  if (stage == c.num_hidden_layers + 1) return head_workspace_floats(c, batch, seq);
  return layer_workspace_floats(c, batch, seq, mode);
}

void layer_forward(const ModelConfig& c, const float* params, const float* x_in, float* x_out, std::int64_t batch,
                   std::int64_t seq, float* saved, float* workspace, const ComputeCtx& ctx) {
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);
  check_pointers(params && x_in && x_out && workspace, "params, x_in, x_out and workspace must be non-null");
  check_pointers(x_in != x_out, "x_out must not alias x_in");
  float* keep = saved ? saved : workspace;
  float* scratch = saved ? workspace : workspace + saved_n;
  if (c.is_gpt2())
    detail::gpt2_forward(c, params, x_in, x_out, batch, seq, keep, scratch, ctx.threads);
  else
    detail::llama_forward(c, params, x_in, x_out, batch, seq, keep, scratch, ctx.threads);
}

void layer_backward(const ModelConfig& c, const float* params, const float* x_in, const float* saved, const float* dy,
                    float* dx, float* grads, std::int64_t batch, std::int64_t seq, float* workspace,
                    const ComputeCtx& ctx) {
  const std::size_t saved_n = layer_saved_floats(c, batch, seq);
  check_pointers(params && dy && dx && grads && workspace, "params, dy, dx, grads and workspace must be non-null");
  check_pointers(saved || x_in, "recompute mode (saved == nullptr) needs the layer input x_in");
  check_pointers(dx != dy, "dx must not alias dy");
  const bool recompute = saved == nullptr;
  float* keep = recompute ? workspace : const_cast<float*>(saved);  // read-only when not recomputing
  float* scratch = recompute ? workspace + saved_n : workspace;
  if (c.is_gpt2())
    detail::gpt2_backward(c, params, x_in, keep, recompute, dy, dx, grads, batch, seq, scratch, ctx.threads);
  else
    detail::llama_backward(c, params, x_in, keep, recompute, dy, dx, grads, batch, seq, scratch, ctx.threads);
}

}  // namespace mt
