// bf16 linear products: bf16 operands, fp32 accumulation, fp32 results (what torch.autocast does on the
// CPU, except that the outputs stay fp32 here). Shapes and conventions as in ops.hpp: N rows, weights
// W[out, in] (torch.nn.Linear), "_acc" outputs are added into. Activations and gradients reach these
// functions already rounded to bf16 (cpu::to_bf16), so a stage converts each tensor once.
//
// Two paths (Bf16Gemm), fixed once per process (matmul_bf16.cpp says why):
// - onednn: oneDNN's matmul primitive (bf16 source and weights, f32 destination; accumulation with a sum
//   post-op). The larger output extent is cut into tiles whose sizes depend only on the shape, never on
//   `threads`; tiles are spread over OpenMP threads and each runs single-threaded in oneDNN (created and
//   executed with omp max threads = 1, so oneDNN neither splits K across threads nor picks a different
//   kernel).
// - widened: both operands widened to fp32 (exact) into the calling thread's scratch, then the fp32
//   products of ops.hpp (dnnl_sgemm in shape-only tiles). The products of two bf16 values are exact in
//   fp32, so this is the same math (bf16 operands, fp32 accumulation) in the fp32 kernel's summation order.
// Which is faster depends on the CPU (twice as fast either way on the CPUs measured so far), so a run
// measures both (probe_bf16_gemm) and fixes the faster with set_bf16_gemm_path before its first product
// (plan/kernel_choice.hpp: probe, cache, checkpoint). Without a call the first product fixes the default
// (oneDNN on AMX CPUs, widened elsewhere). MEGATRAIN_BF16_GEMM=onednn|widened forces a path over both.
// Either way an output element is always computed by the same kernel on the same data, whatever the
// thread count; the two paths differ in summation order, so a run's bits depend on its path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
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

// The implementation a product of this shape runs on the process's path (fixing it): the oneDNN
// primitive's name, or "bf16 widened to fp32, " and the fp32 GEMM's name (diagnostics and benches).
const char* linear_bf16_impl_name(std::int64_t N, std::int64_t in, std::int64_t out);

enum class Bf16Gemm { onednn, widened };
const char* bf16_gemm_name(Bf16Gemm p);                            // "onednn" | "widened"
std::optional<Bf16Gemm> parse_bf16_gemm(const std::string& name);  // nullopt for anything else

// Whether oneDNN has bf16 matmul kernels here (AVX-512 and up; DNNL_MAX_CPU_ISA can hold it back).
bool bf16_gemm_onednn_available();
// The path MEGATRAIN_BF16_GEMM forces ("onednn" or "widened"; read once), nullopt when unset. Any other
// value throws std::invalid_argument naming the variable. A forced onednn without oneDNN bf16 kernels
// runs widened.
std::optional<Bf16Gemm> bf16_gemm_forced();
// oneDNN's version ("2.6.3") and the ISA its kernels dispatch to here ("avx512_core_bf16"; honours
// DNNL_MAX_CPU_ISA): with the CPU, what a measured choice is keyed by.
std::string onednn_version();
std::string onednn_isa();
// The default without a probe: oneDNN on AMX CPUs (bf16 tiles), widened elsewhere.
Bf16Gemm bf16_gemm_default();

// The path the products run (or will run, when none has yet): set, else forced, else the default.
Bf16Gemm bf16_gemm_path();
// Whether the path is fixed for this process: set_bf16_gemm_path was called or a product ran.
bool bf16_gemm_fixed();
// Fixes the path for the rest of the process and returns the one in effect: the forced path when
// MEGATRAIN_BF16_GEMM is set, widened when `p` is onednn and oneDNN has no bf16 kernels here, else `p`.
// Asking again for the path in effect is a no-op; asking for another once fixed throws std::logic_error
// (a run's products must not change path under it).
Bf16Gemm set_bf16_gemm_path(Bf16Gemm p);

// One linear layer of a run, for the probe (ops.hpp).
using Bf16ProbeShape = LinearShape;

// What probe_bf16_gemm measured: per path, the sum over the probed products of each product's best time.
struct Bf16Probe {
  std::vector<Bf16ProbeShape> shapes;  // as timed (rows and out capped, see probe_bf16_gemm)
  int threads = 1;
  int products = 0;               // timed products per path: 3 per shape (forward, backward-input, -weight)
  int rounds = 0;                 // timings of each product per path (the best counts)
  bool onednn_available = false;  // false: onednn_s = 0, only the widened path was timed
  double onednn_s = 0.0, widened_s = 0.0;
  double warmup_s = 0.0;  // the untimed first run of each product (oneDNN's JIT)
  double wall_s = 0.0;    // the whole probe, warm-up included
  Bf16Gemm choice = Bf16Gemm::widened;
  // widened_s / onednn_s (> 1: oneDNN faster); 0 without oneDNN bf16 kernels
  double onednn_speedup() const { return onednn_available && onednn_s > 0 ? widened_s / onednn_s : 0.0; }
};

// oneDNN's bf16 matmul is chosen when the widened path takes at least this much longer in all; within
// the margin the widened path stays (noise must not flip the choice).
inline constexpr double kBf16OnednnMargin = 1.10;

// Times the forward, backward-input and backward-weight products of each shape on both paths (one
// untimed warm-up each: oneDNN's JIT, scratch growth), with `threads` threads, alternating the paths in
// rounds while the probe has taken less than `budget_s` (at least one round, at most 5), and picks by
// kBf16OnednnMargin. Products are bounded so the probe stays near its budget on any model: rows are cut
// to at most 0.25 GFLOP a product (in multiples of 64, at least 64) and out to at most 8M weight
// elements. Fixes nothing and runs no product on the process's path.
Bf16Probe probe_bf16_gemm(const std::vector<Bf16ProbeShape>& shapes, int threads, double budget_s = 0.2);

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
