// The CUDA backend's ops: the CUDA kernels (ops.cu, attention.cu) and cuBLASLt products (gemm.hpp),
// enqueued on one stream in call order; each op returns at once except loss_sum, which waits for the stream. The
// scratch the kernels need beside the stage's workspace (bf16 operand copies, column-sum partials,
// attention row dots) and the RoPE tables are this object's own device buffers: the scratch reserved at
// start from the run's shapes (reserve, scratch_plan.hpp) or, without a plan (the op test), grown on
// first need (after the stream drained, so no queued kernel reads a freed buffer) and kept. The
// stage's operand room is not used.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/scratch_plan.hpp"
#include "kernels/ops.hpp"

namespace mt::cuda {

// For the embedding's deterministic scatter: rows[offsets[u] .. offsets[u+1]) are the positions of
// token unique[u], ascending (device arrays the backend built from its host copy of the ids).
struct TokenRows {
  const std::int32_t* unique = nullptr;
  const std::int32_t* offsets = nullptr;
  const std::int32_t* rows = nullptr;
  std::int64_t n_unique = 0;
};
using TokenRowsLookup = std::function<TokenRows(const token_t* device_tokens, std::int64_t n)>;

class CudaOps final : public Ops {
 public:
  CudaOps(Gemm& gemm, cudaStream_t stream, Precision precision, TokenRowsLookup token_rows);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  const char* backend() const override { return "cuda"; }
  Precision precision() const override { return precision_; }

  void linear_forward(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
                      std::int64_t out) override;
  void linear_backward(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW_acc,
                       float* db_acc, std::int64_t N, std::int64_t in, std::int64_t out) override;
  void round_bf16(const float* x, bf16_t* y, std::size_t n) override;
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
  // mixture of experts (moe.cu); the grouped products are Ops' default over linear_forward/backward
  void moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight) override;
  void moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* dweight,
                          float* dlogits, const RouteShape& s) override;
  void moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order, std::int32_t* slot_pos,
                    std::int64_t* offsets_host) override;  // waits: the offsets come back to the host
  void moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe) override;
  void moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight, const RouteShape& s,
                         float* prob_sums_host) override;  // waits: the sums come back to the host
  void moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* grad,
                            const RouteShape& s, float* dlogits, float* dweight) override;
  void moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d,
                           float* dx, bool add) override;
  void moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                   std::int64_t d, float* y) override;
  void moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                            const RouteShape& s, std::int64_t d, float* dye, float* dweight) override;

  // Allocates the scratch of a run's shapes now (cuda_scratch_plan), so no op allocates inside a step.
  void reserve(const ScratchPlan& plan);

 private:
  using Slot = ScratchSlot;
  void* room(Slot s, std::size_t bytes);                        // at least `bytes` of slot s
  const void* rounded(Slot s, const float* x, std::int64_t n);  // RNE bf16 of x[0..n) in slot s
  bool bf16() const { return precision_ == Precision::bf16; }
  float* partial(std::int64_t rows, std::int64_t cols);

  Gemm& gemm_;
  cudaStream_t st_;
  Precision precision_;
  TokenRowsLookup token_rows_;
  void* slots_[kSlots] = {};
  std::size_t slot_bytes_[kSlots] = {};
  bool reserved_ = false;  // reserve() ran: a larger take is a planning error (warned once, then grown)
  struct CachedRope {
    RopeParams p;
    std::int64_t seq = 0, head_dim = 0;
    float *cos = nullptr, *sin = nullptr;
    std::vector<float> host_cos, host_sin;  // the sources of the tables' copies
  } rope_;
  double* loss_device_ = nullptr;  // [sum, count]
  double* loss_host_ = nullptr;    // pinned
};

}  // namespace mt::cuda
