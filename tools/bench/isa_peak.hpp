// The arithmetic peak of one core for the two instructions a bf16 GEMM can run on without AMX: fp32
// FMA (vfmadd231ps on zmm, 16 multiply-adds, and on ymm, 8, for CPUs without AVX-512 and those that
// split zmm into two halves) and the bf16 pair dot product (vdpbf16ps, 32 multiply-adds into 16 fp32
// lanes), each in a register-only loop of independent accumulators (no memory traffic), in
// FLOP/s counting a multiply-add as 2. It says what any bf16 GEMM on these units can reach at best:
// on the Xeons of this project without AMX (family 6 model 207) vdpbf16ps issues at half the FMA rate,
// so its peak is about half the fp32 one, and no library's bf16 kernel can beat fp32 there.
#pragma once

namespace mt::bench {

struct IsaPeaks {
  double fma_fp32 = 0;       // the faster of the two below
  const char* fma_isa = "";  // which: "avx512f" (zmm), "avx2" (ymm), "" (neither here)
  double fma_avx512 = 0;     // zmm FMA; 0 without AVX-512
  double fma_avx2 = 0;       // ymm FMA; 0 without AVX2 + FMA
  double dpbf16 = 0;         // 0 without AVX512-BF16
};
// Best of `reps` runs of ~0.1 s each, on the calling thread.
IsaPeaks isa_peaks(int reps = 3);

}  // namespace mt::bench
