// bf16 linear products: bf16 operands, fp32 accumulation, fp32 results (what torch.autocast does on the
// CPU, except that the outputs stay fp32 here). Shapes and conventions as in ops.hpp: N rows, weights
// W[out, in] (torch.nn.Linear), "_acc" outputs are added into. Activations and gradients reach these
// functions already rounded to bf16 (cpu::to_bf16), so a stage converts each tensor once.
//
// Two paths, picked once per process from the CPU (matmul_bf16.cpp says why and with what figures):
// - AMX: oneDNN's matmul primitive (bf16 source and weights, f32 destination; accumulation with a sum
//   post-op). The larger output extent is cut into tiles whose sizes depend only on the shape, never on
//   `threads`; tiles are spread over OpenMP threads and each runs single-threaded in oneDNN (created and
//   executed with omp max threads = 1, so oneDNN neither splits K across threads nor picks a different
//   kernel).
// - everywhere else (AVX512-BF16 without AMX, plain AVX-512, AVX2): both operands widened to fp32
//   (exact) into the calling thread's scratch, then the fp32 products of ops.hpp (dnnl_sgemm in
//   shape-only tiles). The products of two bf16 values are exact in fp32, so this is the same math
//   (bf16 operands, fp32 accumulation) in the fp32 kernel's summation order; on AVX512-BF16 without AMX
//   it runs at about twice oneDNN's bf16 rate, because vdpbf16ps issues at half the FMA rate there.
// Either way an output element is always computed by the same kernel on the same data, whatever the
// thread count. MEGATRAIN_BF16_GEMM=onednn|widened forces a path (for comparisons and tests).
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

// The implementation a product of this shape runs: the oneDNN primitive's name, or the widened path with
// the fp32 GEMM's name (diagnostics and benches).
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
