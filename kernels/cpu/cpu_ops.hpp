// The CPU backend's ops: the kernels of cpu/ops.hpp (fp32) and cpu/ops_bf16.hpp (bf16 operands, the
// widened or native path chosen there by measurement) on `threads` OpenMP threads. Host memory is where
// they compute, so every op has finished when it returns. bf16: each product rounds its fp32 operand into
// the room the stage handed over (use_operand_room), norm weights and biases are widened into its vector
// slots; the results do not depend on the thread count (ops_bf16.hpp says how).
#pragma once
#include "kernels/ops.hpp"

namespace mt::cpu {

class CpuOps final : public Ops {
 public:
  CpuOps(Precision precision, int threads) : precision_(precision), threads_(threads < 1 ? 1 : threads) {}
  const char* backend() const override { return "cpu"; }
  Precision precision() const override { return precision_; }
  int threads() const { return threads_; }
  void set_threads(int threads) { threads_ = threads < 1 ? 1 : threads; }
  void use_operand_room(float* base, const OperandRoom& room) override;

  void linear_forward(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
                      std::int64_t out) override;
  void linear_backward(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW_acc,
                       float* db_acc, std::int64_t N, std::int64_t in, std::int64_t out) override;
  void round_bf16(const float* x, bf16_t* y, std::size_t n) override;
  // fp32: every expert's tiles in one parallel region (cpu::grouped_linear_*); bf16: one product each.
  void grouped_linear_forward(const float* x, const void* W, std::int64_t w_stride, const void* b,
                              std::int64_t b_stride, float* y, const std::int64_t* offsets, std::int64_t experts,
                              std::int64_t in, std::int64_t out) override;
  void grouped_linear_backward(const float* dy, const float* x, const void* W, std::int64_t w_stride, float* dx,
                               bool add, float* dW_acc, float* db_acc, std::int64_t b_stride,
                               const std::int64_t* offsets, std::int64_t experts, std::int64_t in,
                               std::int64_t out) override;
  void rmsnorm_forward(const float* x, const void* w, float* y, float* rstd, std::int64_t N, std::int64_t D,
                       float eps) override;
  void rmsnorm_backward(const float* x, const void* w, const float* rstd, const float* dy, float* dx, float* dw_acc,
                        std::int64_t N, std::int64_t D, bool add) override;
  void layernorm_forward(const float* x, const void* w, const void* b, float* y, float* mean, float* rstd,
                         std::int64_t N, std::int64_t D, float eps) override;
  void layernorm_backward(const float* x, const void* w, const float* mean, const float* rstd, const float* dy,
                          float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add) override;
  RopeTables rope_tables(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_room,
                         float* sin_room) override;
  void rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                  std::int64_t row_stride, const RopeTables& t, bool inverse) override;
  void attention_forward(const float* q, const float* k, const float* v, const void* sinks, float* out, float* lse,
                         const AttnShape& s) override;
  void attention_backward(const float* q, const float* k, const float* v, const void* sinks, const float* out,
                          const float* lse, const float* dout, float* dq, float* dk, float* dv, float* dsinks_acc,
                          const AttnShape& s) override;
  void swiglu_forward(const float* g, const float* u, float* h, std::size_t n) override;
  void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n) override;
  void clamped_swiglu_forward(const float* g, const float* u, float* h, std::size_t n, float alpha,
                              float limit) override;
  void clamped_swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n,
                               float alpha, float limit) override;
  void gelu_forward(const float* x, float* y, std::size_t n) override;
  void gelu_backward(const float* x, const float* dy, float* dx, std::size_t n) override;
  void add_into(float* y, const float* x, std::size_t n) override;
  void copy(float* dst, const float* src, std::size_t n) override;
  void fill_zero(float* dst, std::size_t n) override;
  void embedding_forward(const void* wte, const void* wpe, const token_t* tokens, std::int64_t N, std::int64_t seq,
                         std::int64_t d, float* x_out, const std::int32_t* positions) override;
  void embedding_backward(const token_t* tokens, const float* dx, std::int64_t N, std::int64_t seq, std::int64_t d,
                          float* dwte_acc, float* dwpe_acc, const std::int32_t* positions) override;
  void cross_entropy_rows(float* logits, const token_t* targets, float* row_loss, std::int64_t rows, std::int64_t V,
                          bool want_grad) override;
  LossSum loss_sum(const float* row_loss, const token_t* targets, std::int64_t N) override;
  void moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight) override;
  void moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* dweight,
                          float* dlogits, const RouteShape& s) override;
  void moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order, std::int32_t* slot_pos,
                    std::int64_t* offsets_host) override;
  void moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe) override;
  void moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight, const RouteShape& s,
                         float* prob_sums_host) override;
  void moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* grad,
                            const RouteShape& s, float* dlogits, float* dweight) override;
  void moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d,
                           float* dx, bool add) override;
  void moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                   std::int64_t d, float* y) override;
  void moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                            const RouteShape& s, std::int64_t d, float* dye, float* dweight) override;

 private:
  bool bf16() const { return precision_ == Precision::bf16; }
  // Whether the attention's block products run on bf16 pairs: a bf16 run's choice
  // (cpu::bf16_attention_products); fp32 otherwise.
  bool pair_attention() const;
  // A norm weight or bias as fp32: the pointer itself in fp32, widened into vector slot `slot` in bf16.
  const float* widened(const void* w, std::int64_t n, int slot) const;
  void need_room(const char* op, std::int64_t have, std::int64_t need) const;

  Precision precision_;
  int threads_;
  bf16_t* xb_ = nullptr;  // room for the rounded activation operand
  bf16_t* gb_ = nullptr;  // room for the rounded output gradient
  float* vectors_ = nullptr;
  OperandRoom room_{};
};

}  // namespace mt::cpu
