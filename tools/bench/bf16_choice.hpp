// The benches' bf16 products run the path a training run would take on this machine: measured on the
// bench's own shapes at its thread count (cpu::probe_bf16_gemm, as plan/kernel_choice.hpp does, without
// the cache), unless MEGATRAIN_BF16_GEMM forces one (the old rule, for a before/after: =widened on a CPU
// without AMX). Call before the first bf16 product: the path is fixed once per process. The attention's
// products are chosen the same way (choose_bf16_attention; MEGATRAIN_BF16_ATTENTION forces them), and so
// are the fp32 products' libraries (choose_fp32_gemm, before any product; MEGATRAIN_FP32_GEMM forces them).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"

namespace mt::bench {

// Fixes the fp32 products' library per product and returns how it was chosen, in words.
inline std::string choose_fp32_gemm(const std::vector<cpu::LinearShape>& shapes, int threads) {
  if (const auto f = cpu::fp32_gemm_forced())
    return cpu::set_fp32_gemm_choice(cpu::Fp32GemmChoice::all(*f)).str() + " (forced by MEGATRAIN_FP32_GEMM)";
  const cpu::Fp32Probe p = cpu::probe_fp32_gemm(shapes, threads);
  cpu::set_fp32_gemm_choice(p.choice);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                " (probe: OpenBLAS at %.2fx forward, %.2fx backward_input, %.2fx backward_weight of oneDNN's speed on "
                "%zu shapes at %d threads, %d rounds, %.0f ms; OpenBLAS needs %.2fx)",
                p.openblas_speedup(cpu::LinearProduct::forward), p.openblas_speedup(cpu::LinearProduct::backward_input),
                p.openblas_speedup(cpu::LinearProduct::backward_weight), p.shapes.size(), p.threads, p.rounds,
                1e3 * p.wall_s, cpu::kFp32OpenblasMargin);
  return p.choice.str() + buf;
}

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

// The attention's products likewise (cpu::probe_bf16_attention on the bench's heads), unless
// MEGATRAIN_BF16_ATTENTION forces them. Sets them and returns how they were chosen, in words.
inline std::string choose_bf16_attention(const AttnShape& heads, int threads) {
  if (const auto f = cpu::bf16_attention_forced())
    return std::string(cpu::attn_products_name(cpu::set_bf16_attention_products(*f))) +
           " (forced by MEGATRAIN_BF16_ATTENTION)";
  if (!cpu::bf16_pairs_available())
    return std::string(cpu::attn_products_name(cpu::set_bf16_attention_products(cpu::AttnProducts::fp32))) +
           " (no AVX512-BF16 here)";
  const cpu::AttnProbe p = cpu::probe_bf16_attention(heads, threads);
  cpu::set_bf16_attention_products(p.choice);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s (probe: bf16 pairs at %.2fx fp32's speed, %lld heads over %lld positions at %d threads, %d rounds, "
                "%.0f ms; pairs need %.2fx)",
                cpu::attn_products_name(p.choice), p.pairs_speedup(), static_cast<long long>(p.shape.q_heads),
                static_cast<long long>(p.shape.seq), p.threads, p.rounds, 1e3 * p.wall_s, cpu::kBf16PairsMargin);
  return buf;
}

}  // namespace mt::bench
