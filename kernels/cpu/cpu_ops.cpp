// CpuOps: each op is one call of the CPU kernels (cpu/ops.hpp, cpu/ops_bf16.hpp); what is specific to
// this backend is the bf16 operand handling: products round their fp32 operand into the stage's room
// first, small weights are widened into vector slots.
#include "kernels/cpu/cpu_ops.hpp"

#include <cstring>
#include <string>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "kernels/step_math.hpp"
#include "kernels/workspace.hpp"

namespace mt::cpu {

void CpuOps::use_operand_room(float* base, const OperandRoom& room) {
  room_ = room;
  if (!bf16()) return;
  detail::Carver cv(base);
  xb_ = reinterpret_cast<bf16_t*>(cv.take((room.activation + 1) / 2));
  gb_ = reinterpret_cast<bf16_t*>(cv.take((room.gradient + 1) / 2));
  vectors_ = cv.take(room.vector * OperandRoom::kVectorSlots);
}

void CpuOps::need_room(const char* op, std::int64_t have, std::int64_t need) const {
  if (need > have || !xb_)
    throw std::logic_error(std::string("cpu ops: ") + op + " needs room for " + std::to_string(need) +
                           " bf16 operands, the stage handed " + std::to_string(xb_ ? have : 0));
}

const float* CpuOps::widened(const void* w, std::int64_t n, int slot) const {
  if (!w || !bf16()) return static_cast<const float*>(w);
  need_room("a widened weight", room_.vector, n);
  float* dst = vectors_ + static_cast<std::int64_t>(slot) * room_.vector;
  from_bf16(static_cast<const bf16_t*>(w), dst, static_cast<std::size_t>(n), 1);
  return dst;
}

void CpuOps::round_bf16(const float* x, bf16_t* y, std::size_t n) { to_bf16(x, y, n, threads_); }

void CpuOps::linear_forward(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
                            std::int64_t out) {
  if (!bf16()) {
    cpu::linear_forward(x, static_cast<const float*>(W), static_cast<const float*>(b), y, N, in, out, threads_);
    return;
  }
  need_room("linear_forward", room_.activation, N * in);
  to_bf16(x, xb_, static_cast<std::size_t>(N * in), threads_);
  linear_forward_bf16(xb_, static_cast<const bf16_t*>(W), static_cast<const bf16_t*>(b), y, N, in, out, threads_);
}

void CpuOps::linear_backward(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW_acc,
                             float* db_acc, std::int64_t N, std::int64_t in, std::int64_t out) {
  if (!bf16()) {
    if (dx) linear_backward_input(dy, static_cast<const float*>(W), dx, N, in, out, add, threads_);
    linear_backward_weight(dy, x, dW_acc, db_acc, N, in, out, threads_);
    return;
  }
  need_room("linear_backward", room_.gradient, N * out);
  need_room("linear_backward", room_.activation, N * in);
  to_bf16(dy, gb_, static_cast<std::size_t>(N * out), threads_);
  if (dx) linear_backward_input_bf16(gb_, static_cast<const bf16_t*>(W), dx, N, in, out, add, threads_);
  to_bf16(x, xb_, static_cast<std::size_t>(N * in), threads_);
  linear_backward_weight_bf16(gb_, xb_, dW_acc, N, in, out, threads_);
  if (db_acc) colsum_add(dy, db_acc, N, out, threads_);  // bias gradients from the fp32 dy
}

void CpuOps::grouped_linear_forward(const float* x, const void* W, std::int64_t w_stride, const void* b,
                                    std::int64_t b_stride, float* y, const std::int64_t* offsets, std::int64_t experts,
                                    std::int64_t in, std::int64_t out) {
  if (bf16()) {
    Ops::grouped_linear_forward(x, W, w_stride, b, b_stride, y, offsets, experts, in, out);
    return;
  }
  cpu::grouped_linear_forward(x, static_cast<const float*>(W), w_stride, static_cast<const float*>(b), b_stride, y,
                              offsets, experts, in, out, threads_);
}

void CpuOps::grouped_linear_backward(const float* dy, const float* x, const void* W, std::int64_t w_stride, float* dx,
                                     bool add, float* dW_acc, float* db_acc, std::int64_t b_stride,
                                     const std::int64_t* offsets, std::int64_t experts, std::int64_t in,
                                     std::int64_t out) {
  if (bf16()) {
    Ops::grouped_linear_backward(dy, x, W, w_stride, dx, add, dW_acc, db_acc, b_stride, offsets, experts, in, out);
    return;
  }
  cpu::grouped_linear_backward(dy, x, static_cast<const float*>(W), w_stride, dx, add, dW_acc, db_acc, b_stride,
                               offsets, experts, in, out, threads_);
}

void CpuOps::rmsnorm_forward(const float* x, const void* w, float* y, float* rstd, std::int64_t N, std::int64_t D,
                             float eps) {
  cpu::rmsnorm_forward(x, widened(w, D, 0), y, rstd, N, D, eps, threads_);
}

void CpuOps::rmsnorm_backward(const float* x, const void* w, const float* rstd, const float* dy, float* dx,
                              float* dw_acc, std::int64_t N, std::int64_t D, bool add) {
  cpu::rmsnorm_backward(x, widened(w, D, 0), rstd, dy, dx, dw_acc, N, D, add, threads_);
}

void CpuOps::layernorm_forward(const float* x, const void* w, const void* b, float* y, float* mean, float* rstd,
                               std::int64_t N, std::int64_t D, float eps) {
  cpu::layernorm_forward(x, widened(w, D, 0), widened(b, D, 1), y, mean, rstd, N, D, eps, threads_);
}

void CpuOps::layernorm_backward(const float* x, const void* w, const float* mean, const float* rstd, const float* dy,
                                float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add) {
  cpu::layernorm_backward(x, widened(w, D, 0), mean, rstd, dy, dx, dw_acc, db_acc, N, D, add, threads_);
}

RopeTables CpuOps::rope_tables(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_room,
                               float* sin_room) {
  rope_table(p, seq, head_dim, cos_room, sin_room);
  return {cos_room, sin_room};
}

void CpuOps::rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                        std::int64_t row_stride, const RopeTables& t, bool inverse) {
  cpu::rope_apply(x, rows, seq, heads, head_dim, row_stride, t.cos, t.sin, inverse, threads_, t.positions);
}

bool CpuOps::pair_attention() const {
  return bf16() && cpu::bf16_attention_products() == cpu::AttnProducts::bf16_pairs;
}

namespace {
cpu::AttnProducts attn_products(bool pairs) { return pairs ? cpu::AttnProducts::bf16_pairs : cpu::AttnProducts::fp32; }
}  // namespace

void CpuOps::attention_forward(const float* q, const float* k, const float* v, const void* sinks, float* out,
                               float* lse, const AttnShape& s) {
  cpu::attention_forward(q, k, v, sinks, bf16(), out, lse, s, threads_, attn_products(pair_attention()));
}

void CpuOps::attention_backward(const float* q, const float* k, const float* v, const void* sinks, const float* out,
                                const float* lse, const float* dout, float* dq, float* dk, float* dv, float* dsinks_acc,
                                const AttnShape& s) {
  cpu::attention_backward(q, k, v, sinks, bf16(), out, lse, dout, dq, dk, dv, dsinks_acc, s, threads_,
                          attn_products(pair_attention()));
}

void CpuOps::swiglu_forward(const float* g, const float* u, float* h, std::size_t n) {
  cpu::swiglu_forward(g, u, h, n, threads_);
}
void CpuOps::swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n) {
  cpu::swiglu_backward(g, u, dh, dg, du, n, threads_);
}
void CpuOps::clamped_swiglu_forward(const float* g, const float* u, float* h, std::size_t n, float alpha, float limit) {
  cpu::clamped_swiglu_forward(g, u, h, n, alpha, limit, threads_);
}
void CpuOps::clamped_swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du,
                                     std::size_t n, float alpha, float limit) {
  cpu::clamped_swiglu_backward(g, u, dh, dg, du, n, alpha, limit, threads_);
}
void CpuOps::gelu_forward(const float* x, float* y, std::size_t n) { cpu::gelu_forward(x, y, n, threads_); }
void CpuOps::gelu_backward(const float* x, const float* dy, float* dx, std::size_t n) {
  cpu::gelu_backward(x, dy, dx, n, threads_);
}

void CpuOps::add_into(float* y, const float* x, std::size_t n) { accumulate(y, x, n, threads_); }
void CpuOps::copy(float* dst, const float* src, std::size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void CpuOps::fill_zero(float* dst, std::size_t n) { zero(dst, n, threads_); }

void CpuOps::embedding_forward(const void* wte, const void* wpe, const token_t* tokens, std::int64_t N,
                               std::int64_t seq, std::int64_t d, float* x_out, const std::int32_t* positions) {
  if (bf16())
    embedding_gather(static_cast<const bf16_t*>(wte), static_cast<const bf16_t*>(wpe), tokens, N, seq, d, x_out,
                     threads_, positions);
  else
    embedding_gather(static_cast<const float*>(wte), static_cast<const float*>(wpe), tokens, N, seq, d, x_out, threads_,
                     positions);
}

void CpuOps::embedding_backward(const token_t* tokens, const float* dx, std::int64_t N, std::int64_t seq,
                                std::int64_t d, float* dwte_acc, float* dwpe_acc, const std::int32_t* positions) {
  embedding_scatter(tokens, dx, N, seq, d, dwte_acc, dwpe_acc, threads_, positions);
}

void CpuOps::cross_entropy_rows(float* logits, const token_t* targets, float* row_loss, std::int64_t rows,
                                std::int64_t V, bool want_grad) {
  cpu::cross_entropy_rows(logits, targets, row_loss, rows, V, want_grad, threads_);
}

LossSum CpuOps::loss_sum(const float* row_loss, const token_t* targets, std::int64_t N) {
  LossSum out;
  for (std::int64_t r = 0; r < N; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    out.loss_sum += row_loss[r];
    ++out.counted;
  }
  return out;
}

void CpuOps::moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight) {
  cpu::moe_route(logits, s, expert, weight, threads_);
}
void CpuOps::moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight,
                                const float* dweight, float* dlogits, const RouteShape& s) {
  cpu::moe_route_backward(logits, expert, weight, dweight, dlogits, s, threads_);
}
void CpuOps::moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order, std::int32_t* slot_pos,
                          std::int64_t* offsets_host) {
  cpu::moe_dispatch(expert, s, order, slot_pos, offsets_host);
}
void CpuOps::moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe) {
  cpu::moe_gather(x, order, s, d, xe, threads_);
}
void CpuOps::moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d,
                                 float* dx, bool add) {
  cpu::moe_gather_backward(dxe, slot_pos, s, d, dx, add, threads_);
}
void CpuOps::moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                         std::int64_t d, float* y) {
  cpu::moe_combine(ye, slot_pos, weight, s, d, y, threads_);
}
void CpuOps::moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                                  const RouteShape& s, std::int64_t d, float* dye, float* dweight) {
  cpu::moe_combine_backward(dy, ye, slot_pos, weight, s, d, dye, dweight, threads_);
}

void CpuOps::moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight,
                               const RouteShape& s, float* prob_sums_host) {
  cpu::moe_balance_stats(logits, expert, weight, s, prob_sums_host, threads_);
}
void CpuOps::moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight,
                                  const float* grad, const RouteShape& s, float* dlogits, float* dweight) {
  cpu::moe_balance_backward(logits, expert, weight, grad, s, dlogits, dweight, threads_);
}

}  // namespace mt::cpu
