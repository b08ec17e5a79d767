// Internal: the two layer kinds behind layer_forward/layer_backward (stage_api.hpp), and the precision
// helper every stage template computes through. "saved" holds the forward's intermediates (the caller's
// keep buffer, or the front of the workspace when recomputing); "scratch" is the rest of the workspace;
// in bf16 mode the Mixed scratch (converted operands, widened norm weights) follows it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/model_config.hpp"
#include "kernels/precision.hpp"

namespace mt::detail {

// A tensor `elements` into a parameter buffer of the run's precision (weights) or fp32 (gradients).
inline const void* elem_offset(const void* base, std::size_t elements, Precision p) {
  return static_cast<const char*>(base) + elements * bytes_per_param(p);
}
inline float* elem_offset(float* base, std::size_t elements, Precision) { return base + elements; }

// How a stage runs its matrix products and reads its small weights. fp32: weights are float, products are
// cpu::linear_*. bf16: weights are bf16_t; each product's fp32 activation (or output gradient) is rounded
// to bf16 into xb (gb) first, then the bf16 products accumulate in fp32; norm weights and biases are
// widened to fp32 into `small` slots. Gradients and outputs are fp32 in both.
struct Mixed {
  Precision precision = Precision::fp32;
  int threads = 1;
  bf16_t* xb = nullptr;    // room for one activation operand (xb_n elements)
  bf16_t* gb = nullptr;    // room for one output-gradient operand (gb_n elements)
  float* small = nullptr;  // kSmallSlots slots of small_n floats
  std::int64_t small_n = 0;
  static constexpr int kSmallSlots = 4;

  bool bf16() const { return precision == Precision::bf16; }
  // y[N, out] = x W^T (+ b)
  void fwd(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
           std::int64_t out) const;
  // dx (= or +=) dy W (dx may be nullptr: skipped); dW += dy^T x; db += column sums of dy (fp32) when non-null.
  void bwd(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW, float* db, std::int64_t N,
           std::int64_t in, std::int64_t out) const;
  // A small weight vector (norm weight or bias) as fp32: the pointer itself in fp32, widened into slot `slot`.
  const float* vec(const void* w, std::int64_t n, int slot) const;
};

// Carves the Mixed scratch at `base` (nullptr: sizes only, via *used). fp32 needs none.
Mixed carve_mixed(Precision p, int threads, float* base, std::int64_t xb_n, std::int64_t gb_n, std::int64_t small_n,
                  std::size_t* used = nullptr);

std::size_t llama_saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
std::size_t llama_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
void llama_forward(const ModelConfig& c, const void* params, const float* x_in, float* x_out, std::int64_t B,
                   std::int64_t T, float* saved, float* scratch, const Mixed& mx);
void llama_backward(const ModelConfig& c, const void* params, const float* x_in, float* saved, bool recompute,
                    const float* dy, float* dx, float* grads, std::int64_t B, std::int64_t T, float* scratch,
                    const Mixed& mx);

std::size_t gpt2_saved_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
std::size_t gpt2_scratch_floats(const ModelConfig& c, std::int64_t B, std::int64_t T);
void gpt2_forward(const ModelConfig& c, const void* params, const float* x_in, float* x_out, std::int64_t B,
                  std::int64_t T, float* saved, float* scratch, const Mixed& mx);
void gpt2_backward(const ModelConfig& c, const void* params, const float* x_in, float* saved, bool recompute,
                   const float* dy, float* dx, float* grads, std::int64_t B, std::int64_t T, float* scratch,
                   const Mixed& mx);

// The Mixed carving of a layer's workspace tail for this shape (nullptr base: sizes only).
Mixed layer_mixed(const ModelConfig& c, std::int64_t B, std::int64_t T, Precision p, int threads, float* base,
                  std::size_t* used = nullptr);

}  // namespace mt::detail
