// AdamW, the optimizer of every megatrain run: the per-step constants (shared by all backends) and
// the CPU entry points. The update follows PyTorch's torch.optim.AdamW exactly:
//   p <- p * (1 - lr * wd)                       (decoupled weight decay)
//   m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with g = grad_scale * stored gradient (grad_scale folds in clipping and loss normalisation).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/precision.hpp"

namespace mt {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// Constants of one update, derived once per step and tensor group so every element does the same work.
struct AdamWStep {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  float decay_factor;    // 1 - lr * wd
  float step_size;       // lr / (1 - b1^t)
  float inv_sqrt_bias2;  // 1 / sqrt(1 - b2^t)
  float grad_scale;      // multiplies every gradient element
};

// step is 1-based (the first update is step 1), as in PyTorch. Throws std::invalid_argument on bad values.
AdamWStep make_adamw_step(const AdamWHyper& h, std::int64_t step, float grad_scale = 1.0f);

namespace cpu {

// Plain scalar loop: the readable reference the fast kernel is tested against.
void adamw_reference(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s);

// Vectorised (AVX2/FMA where built for it) and split over `threads` OpenMP threads. Results do not
// depend on the thread count: every element runs the same instruction sequence wherever it lands.
void adamw(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s, int threads);

// bf16 runs: the same update as adamw, bit for bit on p, m and v, and in the same pass
// p_bf16[i] = RNE bf16 of the updated p[i] (cpu::bf16_round_reference), so the compute copy the next
// forward streams never needs a separate conversion pass over the masters.
void adamw_bf16copy(float* p, const float* g, float* m, float* v, bf16_t* p_bf16, std::size_t n, const AdamWStep& s,
                    int threads);
// Reference: adamw_reference, then the scalar rounding.
void adamw_bf16copy_reference(float* p, const float* g, float* m, float* v, bf16_t* p_bf16, std::size_t n,
                              const AdamWStep& s);

// train.master_weights=split (kernels/master_halves.hpp): the master as its bf16 high half (the compute
// copy) and its low half, the tie bit in v's sign. Joins, updates with adamw's very instructions and splits
// again in one pass, so the joined p, m and plain v are the bits adamw_bf16copy gives and `high` is its
// copy. It moves 28 bytes per parameter (gradient included) where adamw_bf16copy moves 30.
void adamw_split_master(bf16_t* high, std::uint16_t* low, const float* g, float* m, float* v, std::size_t n,
                        const AdamWStep& s, int threads);
// Reference: the scalar join, adamw_reference and the scalar split, element by element.
void adamw_split_master_reference(bf16_t* high, std::uint16_t* low, const float* g, float* m, float* v, std::size_t n,
                                  const AdamWStep& s);

}  // namespace cpu
}  // namespace mt
