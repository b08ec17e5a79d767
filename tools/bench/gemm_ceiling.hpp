// The GEMM ceilings the benchmarks measure against: the fastest matrix product this machine's libraries
// deliver (fp32: OpenBLAS as loaded, oneDNN's sgemm, oneDNN's matmul primitive; bf16 operands with fp32
// accumulation: oneDNN's bf16 matmul primitive, oneDNN's dnnl_gemm_bf16bf16f32, OpenBLAS's cblas_sbgemm
// where the loaded library has it, and the operands widened to fp32 then dnnl_sgemm, widening timed),
// on the same shapes and thread count as the code under test, measured in the same run. A ceiling is the best
// over libraries, so a slow default path (Debian's OpenBLAS on a CPU it does not know) cannot make our
// own figures look good.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_info.hpp"

namespace mt::bench {

// C[m, n] = op(A) op(B); ta / tb as in BLAS (row-major). The three orientations of a linear layer:
// forward x W^T (tb), backward input dy W (none), backward weight dy^T x (ta).
struct GemmShape {
  std::int64_t m, n, k;
  bool ta = false, tb = false;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::string name() const;  // e.g. "1024x3072x768 NT"
};

// The linear layers' shapes of a transformer with hidden size d and MLP size ff at `tokens` rows, in
// all three orientations (the QKV projection as 3d).
std::vector<GemmShape> transformer_shapes(std::int64_t tokens, std::int64_t d, std::int64_t ff);

enum class GemmLib {
  openblas,
  onednn_sgemm,
  onednn_matmul_f32,
  onednn_matmul_bf16,
  onednn_gemm_bf16,    // dnnl_gemm_bf16bf16f32: exported by oneDNN 2.x, not in its public headers
  openblas_sbgemm,     // 0 when the loaded OpenBLAS lacks it (Debian's 0.3.21 is built without bf16)
  bf16_widened_sgemm,  // bf16 operands widened to fp32 (exact), then dnnl_sgemm; the widening is timed
  kNum
};
const char* lib_name(GemmLib lib);
bool is_bf16(GemmLib lib);  // bf16 operands (the bf16 ceiling's candidates)

// FLOP/s of one library on one shape at `threads` threads (best of `reps` after a warm-up); 0 when the
// library cannot run it. Restores OpenBLAS's and OpenMP's thread settings afterwards. With cpu_rate,
// also the best rate per CPU-second x threads (what the code achieves when other processes share the
// machine and inflate wall-clock time).
double gemm_rate(GemmLib lib, const GemmShape& s, int threads, int reps = 3, double* cpu_rate = nullptr);

struct Ceiling {
  double rate = 0;      // FLOP/s
  double cpu_rate = 0;  // FLOP per CPU-second x threads, best over the same runs
  GemmLib lib = GemmLib::openblas;
  GemmShape shape{0, 0, 0};
};
// The best rate over the fp32 libraries (or the bf16 candidates) and the given shapes.
Ceiling best_fp32_gemm(const std::vector<GemmShape>& shapes, int threads, int reps = 3);
Ceiling best_bf16_gemm(const std::vector<GemmShape>& shapes, int threads, int reps = 3);

// "/proc/cpuinfo" facts for the report (kernels/cpu/cpu_info.hpp).
using cpu::cpu_isa_flags;
using cpu::cpu_model;
// OpenBLAS's chosen core (OPENBLAS_CORETYPE, read when the library loads, can override it).
std::string openblas_core();

}  // namespace mt::bench
