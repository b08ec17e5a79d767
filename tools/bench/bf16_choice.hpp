// The benches' bf16 products run the path a training run would take on this machine: measured on the
// bench's own shapes at its thread count (cpu::probe_bf16_gemm, as node/kernel_choice.hpp does, without
// the cache), unless MEGATRAIN_BF16_GEMM forces one (the old rule, for a before/after: =widened on a CPU
// without AMX). Call before the first bf16 product: the path is fixed once per process.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/ops_bf16.hpp"

namespace mt::bench {

// Fixes the path and returns how it was chosen, in words.
inline std::string choose_bf16_path(const std::vector<cpu::Bf16ProbeShape>& shapes, int threads) {
  if (cpu::bf16_gemm_forced())
    return std::string(cpu::bf16_gemm_name(cpu::set_bf16_gemm_path(*cpu::bf16_gemm_forced()))) +
           " (forced by MEGATRAIN_BF16_GEMM)";
  if (!cpu::bf16_gemm_onednn_available())
    return std::string(cpu::bf16_gemm_name(cpu::set_bf16_gemm_path(cpu::Bf16Gemm::widened))) +
           " (oneDNN has no bf16 kernels here)";
  const cpu::Bf16Probe p = cpu::probe_bf16_gemm(shapes, threads);
  cpu::set_bf16_gemm_path(p.choice);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s (probe: oneDNN at %.2fx the widened path's speed on %zu shapes at %d threads, %d rounds, %.0f ms; "
                "oneDNN needs %.2fx)",
                cpu::bf16_gemm_name(p.choice), p.onednn_speedup(), p.shapes.size(), p.threads, p.rounds, 1e3 * p.wall_s,
                cpu::kBf16OnednnMargin);
  return buf;
}

}  // namespace mt::bench
