// bf16 linear products: bf16 operands, fp32 accumulation, fp32 results (what torch.autocast does on the
// CPU, except that the outputs stay fp32 here). Shapes and conventions as in ops.hpp: N rows, weights
// W[out, in] (torch.nn.Linear), "_acc" outputs are added into. Activations and gradients reach these
// functions already rounded to bf16 (cpu::to_bf16), so a stage converts each tensor once.
//
// Through oneDNN's matmul primitive (bf16 source and weights, f32 destination; accumulation with a sum
// post-op). Determinism: the larger output extent is cut into tiles whose sizes depend only on the
// shape, never on `threads`; tiles are spread over OpenMP threads and each runs single-threaded in
// oneDNN (the primitive is created and executed with omp max threads = 1, so oneDNN neither splits K
// across threads nor picks a different kernel). An output element is therefore always computed by the
// same primitive on the same data, whatever the thread count. CPUs with AVX-512 but without AVX512-BF16
// run oneDNN's bf16 emulation. Below AVX-512 oneDNN 2.6 has no bf16 matmul at all (checked with
// DNNL_MAX_CPU_ISA=AVX2): the operands are then widened to fp32 (exact) and oneDNN's fp32 matmul runs
// through the same tiles: the same products and fp32 accumulation, a different summation order, still
// independent of the thread count.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/bf16.hpp"
#include "kernels/precision.hpp"

namespace mt::cpu {

// y[N, out] = x[N, in] W^T (+ bias widened to fp32, when non-null)
void linear_forward_bf16(const bf16_t* x, const bf16_t* W, const bf16_t* bias, float* y, std::int64_t N,
                         std::int64_t in, std::int64_t out, int threads);
// dx[N, in] (= or +=) dy[N, out] W
void linear_backward_input_bf16(const bf16_t* dy, const bf16_t* W, float* dx, std::int64_t N, std::int64_t in,
                                std::int64_t out, bool add, int threads);
// dW_acc[out, in] += dy^T x  (fp32 accumulator; bias gradients stay with cpu::colsum_add on fp32 dy)
void linear_backward_weight_bf16(const bf16_t* dy, const bf16_t* x, float* dW_acc, std::int64_t N, std::int64_t in,
                                 std::int64_t out, int threads);

// Name of the oneDNN implementation a product of this shape runs (diagnostics and benches).
const char* linear_bf16_impl_name(std::int64_t N, std::int64_t in, std::int64_t out);

// ---- Plain references (exact products of the bf16 inputs, summed in double; written as T) ----
template <class T>
void linear_forward_bf16_reference(const bf16_t* x, const bf16_t* W, const bf16_t* bias, T* y, std::int64_t N,
                                   std::int64_t in, std::int64_t out) {
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = bias ? bf16_to_float(bias[o]) : 0.0;
      for (std::int64_t k = 0; k < in; ++k)
        acc += static_cast<double>(bf16_to_float(x[r * in + k])) * bf16_to_float(W[o * in + k]);
      y[r * out + o] = static_cast<T>(acc);
    }
}
template <class T>
void linear_backward_input_bf16_reference(const bf16_t* dy, const bf16_t* W, T* dx, std::int64_t N, std::int64_t in,
                                          std::int64_t out, bool add) {
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t k = 0; k < in; ++k) {
      double acc = add ? static_cast<double>(dx[r * in + k]) : 0.0;
      for (std::int64_t o = 0; o < out; ++o)
        acc += static_cast<double>(bf16_to_float(dy[r * out + o])) * bf16_to_float(W[o * in + k]);
      dx[r * in + k] = static_cast<T>(acc);
    }
}
template <class T>
void linear_backward_weight_bf16_reference(const bf16_t* dy, const bf16_t* x, T* dW_acc, std::int64_t N,
                                           std::int64_t in, std::int64_t out) {
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t k = 0; k < in; ++k) {
      double acc = static_cast<double>(dW_acc[o * in + k]);
      for (std::int64_t r = 0; r < N; ++r)
        acc += static_cast<double>(bf16_to_float(dy[r * out + o])) * bf16_to_float(x[r * in + k]);
      dW_acc[o * in + k] = static_cast<T>(acc);
    }
}

}  // namespace mt::cpu
