// The CUDA kernels under the backend's stage operations, each mirroring one CPU kernel of
// kernels/cpu/ops.hpp (same shapes, layouts and "added into" conventions; see there). All enqueue on
// `st` and return at once; launch errors throw (cuda_check.hpp). Deterministic: no atomics; reductions
// across rows go through fixed splits (plan.hpp's colsum_plan) summed in order.
//
// Weights of the run's precision arrive as `const void*` with `bf16` saying what they hold (norm
// weights and biases are widened on load); activations, gradients and statistics are fp32.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/precision.hpp"

namespace mt::cuda {

// y[i] = RNE(x[i]) as bf16 (NaN kept quiet, as cpu::bf16_round_reference)
void to_bf16(const float* x, bf16_t* y, std::size_t n, cudaStream_t st);
// y += x (the residual connection)
void add_into(float* y, const float* x, std::size_t n, cudaStream_t st);
// y[r, j] += b[j] for r < N, j < D
void add_bias(float* y, const void* b, bool bf16, std::int64_t N, std::int64_t D, cudaStream_t st);
// acc[j] += sum_r dy[r, j]; `partial`: colsum_scratch_floats(N, D) floats
void colsum_add(const float* dy, float* acc, std::int64_t N, std::int64_t D, float* partial, cudaStream_t st);

void rmsnorm_forward(const float* x, const void* w, bool bf16, float* y, float* rstd, std::int64_t N, std::int64_t D,
                     float eps, cudaStream_t st);
// dw_acc may be null (no weight gradient); partial as colsum_add
void rmsnorm_backward(const float* x, const void* w, bool bf16, const float* rstd, const float* dy, float* dx,
                      float* dw_acc, std::int64_t N, std::int64_t D, bool add, float* partial, cudaStream_t st);
void layernorm_forward(const float* x, const void* w, const void* b, bool bf16, float* y, float* mean, float* rstd,
                       std::int64_t N, std::int64_t D, float eps, cudaStream_t st);
void layernorm_backward(const float* x, const void* w, bool bf16, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add,
                        float* partial, cudaStream_t st);

// In place, tables [seq, head_dim / 2] on the device (computed by cpu::rope_table on the host)
void rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                std::int64_t row_stride, const float* cos_t, const float* sin_t, bool inverse, cudaStream_t st);

void swiglu_forward(const float* g, const float* u, float* h, std::size_t n, cudaStream_t st);
void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n,
                     cudaStream_t st);
void gelu_forward(const float* x, float* y, std::size_t n, cudaStream_t st);
void gelu_backward(const float* x, const float* dy, float* dx, std::size_t n, cudaStream_t st);

// x_out[r] = wte[tokens[r]] (+ wpe[r % seq]); tokens already validated on the host
void embedding_forward(const void* wte, const void* wpe, bool bf16, const std::int32_t* tokens, std::int64_t N,
                       std::int64_t seq, std::int64_t d, float* x_out, cudaStream_t st);
// dwte rows += dx rows, per distinct token in token order: rows[offsets[u] .. offsets[u+1]) are the positions
// of token unique[u], ascending (built on the host from the uploaded ids), so every row sums in the CPU's order.
void embedding_backward_tokens(const float* dx, const std::int32_t* unique, const std::int32_t* offsets,
                               const std::int32_t* rows, std::int64_t n_unique, std::int64_t d, float* dwte,
                               cudaStream_t st);
// dwpe[t] += sum over b of dx[b * seq + t], b ascending
void embedding_backward_positions(const float* dx, std::int64_t batch, std::int64_t seq, std::int64_t d, float* dwpe,
                                  cudaStream_t st);

// As cpu::cross_entropy_rows: logits [rows, V] become softmax - onehot (0 for ignored rows) when want_grad
void cross_entropy_rows(float* logits, const std::int32_t* targets, float* row_loss, std::int64_t rows, std::int64_t V,
                        bool want_grad, cudaStream_t st);
// out[0] = sum of row_loss over counted rows (double), out[1] = their count (as a double); one block
void loss_sum(const float* row_loss, const std::int32_t* targets, std::int64_t N, double* out, cudaStream_t st);

// ---- Causal GQA attention, flash-style (plan.hpp: tiles, head-dim dispatch) ----
struct AttnDims {
  std::int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t q_stride = 0, kv_stride = 0, o_stride = 0;
};
// out and lse[(b * q_heads + h) * seq + t] as cpu::attention_forward
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse, const AttnDims& a,
                       cudaStream_t st);
// dq, dk, dv overwritten; `rowdot`: batch * q_heads * seq floats of scratch
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, float* rowdot, const AttnDims& a,
                        cudaStream_t st);

}  // namespace mt::cuda
