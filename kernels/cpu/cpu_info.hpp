// What /proc/cpuinfo says about this machine, in the words every report uses (the benchmarks' header
// lines, the kernel-choice cache's key): the model name with its family and model, and the SIMD flags
// that decide which kernels the libraries pick.
#pragma once
#include <string>

namespace mt::cpu {

// e.g. "AMD EPYC (family 25 model 17)"; "unknown CPU" without /proc/cpuinfo.
std::string cpu_model();
// The present ones of avx2 fma avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8, in
// that order, space-separated; "(none of avx2/avx512/amx)" when none is.
std::string cpu_isa_flags();

}  // namespace mt::cpu
