// The op seam: every stage (embedding.cpp, llama_layer.cpp, gpt2_layer.cpp, lm_head.cpp) is written once,
// as calls on an Ops; each backend supplies one Ops (cpu/cpu_ops.hpp on the host, cuda/cuda_ops.hpp on
// a GPU) and the memory the pointers point into. What a stage keeps between its forward and backward
// (its Saved carving) and its scratch are the stage's own, carved beside it from the workspace it is
// handed, so the sizes the engine plans with mean the same on every backend.
//
// Conventions (those of the CPU kernels, kernels/cpu/ops.hpp, which are the reference):
//   - tokens are rows: N = batch x seq rows of D features, row-major; matrices W are [out, in]
//     (torch.nn.Linear);
//   - weights arrive as `const void*` in the run's precision (precision()): float, or bf16_t laid out at
//     the fp32 element offsets. In bf16 a product rounds its fp32 activation (or output gradient) to
//     bf16 (RNE) and accumulates in fp32; norm weights and biases are widened. Activations, gradients,
//     statistics and the loss are fp32 in both;
//   - outputs named *_acc and gradients of weights are added into; others are overwritten unless `add`
//     says so; outputs never alias inputs;
//   - every op is enqueued on the backend's compute queue in call order and may return before it ran
//     (CUDA); only loss_sum returns a value, and it waits for the work before it;
//   - results do not depend on thread counts or launch shapes: same bits run after run.
// A backend that lacks an op inherits the default, which throws UnsupportedOp naming the backend and
// the op; tests/device/test_backend_ops.cpp runs every op of the table on every backend built.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/op_shapes.hpp"
#include "kernels/precision.hpp"
#include "kernels/stage_api.hpp"

namespace mt {

RopeParams rope_params_of(const ModelConfig& c);

// The converted operands a bf16 product needs, in elements, per stage call: the stage hands the CPU
// ops room for them at the tail of its workspace (use_operand_room); a backend with scratch of its own
// ignores it. The sizes are part of the planned workspace on every backend.
struct OperandRoom {
  std::int64_t activation = 0;  // the widest fp32 activation operand rounded to bf16
  std::int64_t gradient = 0;    // the widest output-gradient operand rounded to bf16
  std::int64_t vector = 0;      // the longest norm weight or bias widened to fp32
  static constexpr int kVectorSlots = 4;
};
// Floats of workspace an OperandRoom takes at precision p (none in fp32).
std::size_t operand_room_floats(Precision p, const OperandRoom& room);

// Every op of the interface below, by name: the op test (tests/device/test_backend_ops.cpp) requires
// a case for each on every backend it runs, so an op added here without a case fails it by name.
inline constexpr const char* kOpNames[] = {"linear_forward",
                                           "linear_backward",
                                           "rmsnorm_forward",
                                           "rmsnorm_backward",
                                           "layernorm_forward",
                                           "layernorm_backward",
                                           "rope_tables",
                                           "rope_apply",
                                           "attention_forward",
                                           "attention_backward",
                                           "swiglu_forward",
                                           "swiglu_backward",
                                           "clamped_swiglu_forward",
                                           "clamped_swiglu_backward",
                                           "gelu_forward",
                                           "gelu_backward",
                                           "add_into",
                                           "copy",
                                           "fill_zero",
                                           "embedding_forward",
                                           "embedding_backward",
                                           "cross_entropy_rows",
                                           "loss_sum",
                                           "moe_route",
                                           "moe_route_backward",
                                           "moe_dispatch",
                                           "moe_gather",
                                           "moe_gather_backward",
                                           "moe_combine",
                                           "moe_combine_backward",
                                           "moe_balance_stats",
                                           "moe_balance_backward",
                                           "grouped_linear_forward",
                                           "grouped_linear_backward",
                                           "round_bf16"};

class UnsupportedOp : public std::logic_error {
 public:
  UnsupportedOp(const std::string& backend, const std::string& op)
      : std::logic_error(backend + " ops: no " + op + " (this backend does not implement it)"), op_(op) {}
  const std::string& op() const { return op_; }

 private:
  std::string op_;
};

// The defaults name their parameters for the reader and use none of them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* backend() const = 0;  // "cpu", "cuda"
  virtual Precision precision() const = 0;
  // Room for converted operands at `base` (see OperandRoom); called by each stage before its ops.
  virtual void use_operand_room(float* /*base*/, const OperandRoom& /*room*/) {}

  // ---- matrix products (weights W, bias b in the run's precision) ----
  // y[N, out] = x[N, in] W^T (+ b)
  virtual void linear_forward(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
                              std::int64_t out) {
    unsupported("linear_forward");
  }
  // dx[N, in] (= or +=) dy W, skipped when dx is null; dW_acc += dy^T x; db_acc += column sums of the fp32
  // dy when non-null.
  virtual void linear_backward(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW_acc,
                               float* db_acc, std::int64_t N, std::int64_t in, std::int64_t out) {
    unsupported("linear_backward");
  }
  // y[0..n) = the bf16 operand a bf16 product reads of x[0..n) (RNE, NaN quieted), by the conversion the
  // products use: its own op so that the op test checks the rounding bit for bit where it happens (a
  // product's output cannot show it: a GPU's arithmetic returns its canonical NaN, not the operand's).
  virtual void round_bf16(const float* x, bf16_t* y, std::size_t n) { unsupported("round_bf16"); }

  // ---- norms over rows of D (w, b in the run's precision; dw_acc may be null) ----
  virtual void rmsnorm_forward(const float* x, const void* w, float* y, float* rstd, std::int64_t N, std::int64_t D,
                               float eps) {
    unsupported("rmsnorm_forward");
  }
  virtual void rmsnorm_backward(const float* x, const void* w, const float* rstd, const float* dy, float* dx,
                                float* dw_acc, std::int64_t N, std::int64_t D, bool add) {
    unsupported("rmsnorm_backward");
  }
  virtual void layernorm_forward(const float* x, const void* w, const void* b, float* y, float* mean, float* rstd,
                                 std::int64_t N, std::int64_t D, float eps) {
    unsupported("layernorm_forward");
  }
  virtual void layernorm_backward(const float* x, const void* w, const float* mean, const float* rstd, const float* dy,
                                  float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add) {
    unsupported("layernorm_backward");
  }

  // ---- rotary embeddings (Hugging Face's rotate_half layout) ----
  // The tables for `seq` positions: computed into cos_room / sin_room (seq x head_dim / 2 floats each, in
  // the stage's scratch) or taken from a cache of the backend's own.
  virtual RopeTables rope_tables(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_room,
                                 float* sin_room) {
    unsupported("rope_tables");
  }
  // In place on x[rows, heads, head_dim], `row_stride` floats between tokens, position = row % seq, or
  // t.positions[row] when non-null (documents); inverse applies the transpose rotation (the backward).
  virtual void rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                          std::int64_t row_stride, const RopeTables& t, bool inverse) {
    unsupported("rope_apply");
  }

  // ---- attention: out, lse[(b * q_heads + h) * seq + t]; the backward overwrites dq, dk, dv ----
  // sinks (gpt-oss; null for none): one logit per query head in the run's precision, an extra column of
  // each softmax row that takes probability and contributes no value (out = sum_j p_j v_j with the p_j
  // summing to 1 - p_sink); lse then includes it. dsinks_acc[q_heads] += d(loss)/d(sink), summed over
  // batch and rows in order (null when sinks is).
  virtual void attention_forward(const float* q, const float* k, const float* v, const void* sinks, float* out,
                                 float* lse, const AttnShape& s) {
    unsupported("attention_forward");
  }
  virtual void attention_backward(const float* q, const float* k, const float* v, const void* sinks, const float* out,
                                  const float* lse, const float* dout, float* dq, float* dk, float* dv,
                                  float* dsinks_acc, const AttnShape& s) {
    unsupported("attention_backward");
  }

  // ---- activations over n elements ----
  // h = silu(g) * u; gelu: the tanh form (gelu_new)
  virtual void swiglu_forward(const float* g, const float* u, float* h, std::size_t n) {
    unsupported("swiglu_forward");
  }
  virtual void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n) {
    unsupported("swiglu_backward");
  }
  // gpt-oss's expert activation: c = min(g, limit), h = (clamp(u, -limit, limit) + 1) * c * sigmoid(alpha c);
  // the backward passes no gradient through a clamped value (torch.clamp's: where g > limit, where |u| > limit).
  virtual void clamped_swiglu_forward(const float* g, const float* u, float* h, std::size_t n, float alpha,
                                      float limit) {
    unsupported("clamped_swiglu_forward");
  }
  virtual void clamped_swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du,
                                       std::size_t n, float alpha, float limit) {
    unsupported("clamped_swiglu_backward");
  }
  virtual void gelu_forward(const float* x, float* y, std::size_t n) { unsupported("gelu_forward"); }
  virtual void gelu_backward(const float* x, const float* dy, float* dx, std::size_t n) {
    unsupported("gelu_backward");
  }

  // ---- moves and sums ----
  // y += x (the residual connection); dst = src; dst = +0
  virtual void add_into(float* y, const float* x, std::size_t n) { unsupported("add_into"); }
  virtual void copy(float* dst, const float* src, std::size_t n) { unsupported("copy"); }
  virtual void fill_zero(float* dst, std::size_t n) { unsupported("fill_zero"); }

  // ---- embedding: x_out[r] = wte[tokens[r]] (+ wpe[r % seq]); the backward adds rows in token order ----
  // Tokens are ids the backend can read where it computes (Backend::upload_tokens), validated before.
  // positions (documents; null: r % seq): wpe's row for each of the N rows, where the tokens are.
  virtual void embedding_forward(const void* wte, const void* wpe, const token_t* tokens, std::int64_t N,
                                 std::int64_t seq, std::int64_t d, float* x_out,
                                 const std::int32_t* positions = nullptr) {
    unsupported("embedding_forward");
  }
  virtual void embedding_backward(const token_t* tokens, const float* dx, std::int64_t N, std::int64_t seq,
                                  std::int64_t d, float* dwte_acc, float* dwpe_acc,
                                  const std::int32_t* positions = nullptr) {
    unsupported("embedding_backward");
  }

  // ---- the loss ----
  // logits[rows, V] become d(sum of losses)/d(logits) = softmax - onehot(target) (0 for ignored rows)
  // when want_grad; row_loss[r] = lse - logit[target] (0 when ignored).
  virtual void cross_entropy_rows(float* logits, const token_t* targets, float* row_loss, std::int64_t rows,
                                  std::int64_t V, bool want_grad) {
    unsupported("cross_entropy_rows");
  }
  // The sum of row_loss over counted rows (targets != -100), in row order, and their count, on the host.
  virtual LossSum loss_sum(const float* row_loss, const token_t* targets, std::int64_t N) { unsupported("loss_sum"); }

  // ---- mixture of experts: route, group the choices by expert, run the experts, combine ----
  // A token's k choices are its "slots" n * k + j; the experts compute on P = N * k rows grouped by expert.
  // expert[N, k], weight[N, k] from the router's logits[N, E] (RouteShape says how).
  virtual void moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight) {
    unsupported("moe_route");
  }
  // dlogits[N, E] (overwritten) from dweight[N, k]: only the chosen experts' logits get a gradient in
  // topk_softmax and in renormalised softmax_topk; every logit does without renormalisation.
  virtual void moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight,
                                  const float* dweight, float* dlogits, const RouteShape& s) {
    unsupported("moe_route_backward");
  }
  // Groups the slots by expert, stably (by token within an expert): order[p] = the slot at row p,
  // slot_pos[slot] = its row; expert e owns rows offsets[e] .. offsets[e + 1], written to the host array
  // offsets_host[E + 1] (so the grouped products know their shapes): waits for the work before it.
  virtual void moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order,
                            std::int32_t* slot_pos, std::int64_t* offsets_host) {
    unsupported("moe_dispatch");
  }
  // xe[p] = x[order[p] / k] over rows of d.
  virtual void moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe) {
    unsupported("moe_gather");
  }
  // dx[n] (= or +=) the sum over j of dxe[slot_pos[n * k + j]], j ascending.
  virtual void moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d,
                                   float* dx, bool add) {
    unsupported("moe_gather_backward");
  }
  // y[n] = the sum over j of weight[n, j] * ye[slot_pos[n * k + j]], j ascending (overwritten).
  virtual void moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                           std::int64_t d, float* y) {
    unsupported("moe_combine");
  }
  // dye[slot_pos[n * k + j]] = weight[n, j] * dy[n]; dweight[n, j] = dy[n] . ye[slot_pos[n * k + j]].
  virtual void moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                                    const RouteShape& s, std::int64_t d, float* dye, float* dweight) {
    unsupported("moe_combine_backward");
  }
  // The load-balancing loss (transformers' load_balancing_loss_func, ModelConfig::output_router_logits):
  // z = the router logits, or gpt-oss's scores (the k weights scattered into zeros), p = softmax(z) per
  // token; prob_sums_host[e] = sum over tokens of p_e: chunks of 256 tokens each summed in order, then
  // the chunks in order, on every backend (on the host: waits for the work before it).
  virtual void moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight,
                                 const RouteShape& s, float* prob_sums_host) {
    unsupported("moe_balance_stats");
  }
  // Given grad[e] = d(objective)/d(p_e) (the same for every token, where the backend computes):
  // dz = p * (grad - p . grad) per token, added into dlogits[N, E] (softmax_topk) or, through the scores,
  // into dweight[N, k] at the chosen experts (topk_softmax).
  virtual void moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight,
                                    const float* grad, const RouteShape& s, float* dlogits, float* dweight) {
    unsupported("moe_balance_backward");
  }
  // Grouped products: rows offsets[e] .. offsets[e + 1] (host values) of x through expert e's matrix
  // W + e * w_stride elements ([out, in]) and bias b + e * b_stride (b may be null); an expert without
  // rows is skipped (its gradient stays as it was). The default runs one linear product per expert.
  virtual void grouped_linear_forward(const float* x, const void* W, std::int64_t w_stride, const void* b,
                                      std::int64_t b_stride, float* y, const std::int64_t* offsets,
                                      std::int64_t experts, std::int64_t in, std::int64_t out);
  virtual void grouped_linear_backward(const float* dy, const float* x, const void* W, std::int64_t w_stride, float* dx,
                                       bool add, float* dW_acc, float* db_acc, std::int64_t b_stride,
                                       const std::int64_t* offsets, std::int64_t experts, std::int64_t in,
                                       std::int64_t out);

 protected:
  [[noreturn]] void unsupported(const char* op) const { throw UnsupportedOp(backend(), op); }
};
#pragma GCC diagnostic pop

}  // namespace mt
