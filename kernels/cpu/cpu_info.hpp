// What /proc/cpuinfo says about this machine, in the words every report uses (the benchmarks' header
// lines, the kernel-choice cache's key): the model name with its family and model, and the SIMD flags
// that decide which kernels the libraries pick.
#pragma once
#include <string>

namespace mt::cpu {

// e.g. "AMD EPYC (family 25 model 17)"; "unknown CPU" without /proc/cpuinfo.
std::string cpu_model();
// The present ones of avx2 fma avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8, in
// that order, space-separated; "(none of avx2/avx512/amx)" when none is. Ends in " held:avx2" when
// MEGATRAIN_MAX_CPU_ISA holds our own kernels to AVX2 (a different set of kernels: a different cache key).
std::string cpu_isa_flags();

// Whether our own kernels may take their AVX-512 paths (bf16 narrowing, bf16 attention pairs, the split
// masters' AdamW). MEGATRAIN_MAX_CPU_ISA=avx2 holds them to the paths an AVX2-only CPU takes, as
// ONEDNN_MAX_CPU_ISA does for oneDNN, so one machine can prove both (the isa_avx2 test label); unset or
// avx512: whatever the CPU has. Read once; another value throws std::invalid_argument naming it.
bool avx512_allowed();

}  // namespace mt::cpu
