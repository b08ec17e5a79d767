// The step math shared by the reference trainer and the pipelined engine. Both must make literally the
// same calls in the same order so that equal inputs give equal bits:
//
//   per step: cpu::zero every stage's gradient accumulator, then for each micro-batch:
//     forward stages 0..L+1, backward L+1..0; each stage's backward adds into a *zeroed* staging
//     buffer, then   cpu::accumulate(accum_s, staging_s, n, threads)     (accum_s += staging_s)
//     (the head's backward also adds into stage 0's staging when embeddings are tied: stage 0 is
//      backpropagated last, so its staging holds head + embedding contributions before accumulate)
//     (stages may be accumulated in any order or concurrently; per stage, micro-batches in order)
//   after the last micro-batch:
//     sumsq_s = stage_grad_sumsq(layout_s, accum_s, threads)              for s = 0..L+1
//     scale   = compute_step_scale(sumsq (stage order), counted, max_grad_norm, loss_sum)
//     adamw_stage(layout_s, params_s, accum_s, m_s, v_s, hyper, step, scale.grad_scale, threads,
//                 copy_s)                         s = 0..L+1 (copy_s: the bf16 compute copy, nullptr in fp32)
//
// Loss normalisation and clipping, exactly:
//   accumulators hold G = d(sum of token losses over the whole step)/d(params)  (see stage_api.hpp);
//   counted  = number of targets != -100 over all micro-batches of the step;
//   loss     = loss_sum / counted                      (the mean over counted tokens, reported; loss_sum is
//                                                        the heads' LossSum::loss_sum added in micro-batch order)
//   norm     = sqrt(sum_s sumsq_s) / counted           (double; the norm of the mean-loss gradient)
//   clip     = max_grad_norm > 0 ? min(1, max_grad_norm / (norm + 1e-6)) : 1     (PyTorch's clip_grad_norm_)
//   grad_scale = float(clip / counted)                 (double arithmetic, one rounding to float)
//   AdamW uses g = grad_scale * G (inside the kernel); weight decay only on tensors whose
//   TensorSpec::weight_decay is true, the others get wd = 0; padding between tensors is not touched.
//   counted == 0: norm = 0, clip = 1, grad_scale = 0 (moments decay, no gradient enters).
// None of the `threads` arguments changes any bit.
//
// The load-balancing loss (ModelConfig::output_router_logits, MoE models): per micro-batch m, its MoE
// layers' statistics give transformers' aux_m (moe_balance below); the micro-batch's loss becomes
//   loss_sum_m + coef count_m aux_m     (so with one micro-batch: mean loss + coef aux, as transformers)
// and each of its MoE layers' backward adds coef count_m d(aux_m)/d(router output) (MoeBalance::grad).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/param_layout.hpp"

namespace mt {

namespace cpu {
// accum[i] += staging[i]. Threaded and vectorised; bit-identical whatever the thread count.
void accumulate(float* accum, const float* staging, std::size_t n, int threads);
// accum[i] = +0 + staging[i]: zero() then accumulate() in one pass, the same bits (-0 becomes +0).
void accumulate_first(float* accum, const float* staging, std::size_t n, int threads);
// x[i] = 0 (staging buffers before each backward), threaded.
void zero(float* x, std::size_t n, int threads);
// sum of x[i]^2 in double, in a fixed blocked order that does not depend on the thread count.
double sum_squares(const float* x, std::size_t n, int threads);
}  // namespace cpu

// Sum of squares of one stage's gradient buffer: cpu::sum_squares per tensor (padding excluded), added
// in layout order in double.
double stage_grad_sumsq(const ParamLayout& layout, const float* grads, int threads);

struct StepScale {
  double loss = 0.0;        // loss_sum / counted (0 when counted == 0)
  double grad_norm = 0.0;   // norm of the mean-loss gradient, before clipping
  double clip = 1.0;        // factor applied to the gradient (<= 1)
  float grad_scale = 0.0f;  // clip / counted, passed to AdamW
};

// stage_sumsq in stage order 0..L+1; combined left to right in double.
StepScale compute_step_scale(const std::vector<double>& stage_sumsq, std::int64_t counted, float max_grad_norm,
                             double loss_sum = 0.0);

// One micro-batch's load-balancing term from its MoE layers' statistics (MoeBalance, in layer order; a
// layer with empty vectors, a dense one, is skipped):
// R = layers x tokens rows, f_e = (sum of counts_e) / R, P_e = (sum of prob_sums_e, in layer order, in
// double) / R, aux = E sum_e f_e P_e; loss_add = coef counted aux (to add to the micro-batch's loss
// sum); grad[e] = float(coef counted E f_e / R) (d(loss_add)/d(p_e) of every row; the choices are
// constants, as transformers' one-hot).
struct MoeBalanceTerm {
  double aux = 0.0;       // transformers' aux_loss
  double loss_add = 0.0;  // coef counted aux
  std::vector<float> grad;
};
MoeBalanceTerm moe_balance(const std::vector<std::vector<std::int64_t>>& counts,
                           const std::vector<std::vector<float>>& prob_sums, std::int64_t tokens, double coef,
                           std::int64_t counted);

// AdamW over every tensor of one stage (each tensor's own make_adamw_step: wd from hyper when
// TensorSpec::weight_decay, else 0). `step` is 1-based.
// compute_copy: nullptr in fp32 runs; in bf16 runs the stage's bf16 compute copy (same element offsets as
// params), rewritten in the same pass by cpu::adamw_bf16copy so it always equals RNE bf16(params) after
// the update (params, m and v get the very bits of the fp32 call). Padding is touched in neither.
void adamw_stage(const ParamLayout& layout, float* params, const float* grads, float* m, float* v,
                 const AdamWHyper& hyper, std::int64_t step, float grad_scale, int threads,
                 bf16_t* compute_copy = nullptr);

// The same update of a stage whose masters are split (kernels/master_halves.hpp): `high` is the bf16
// compute copy, `low` the low halves, v carries the tie bits. cpu::adamw_split_master per tensor with the
// constants adamw_stage uses, so the joined masters, m and plain v are adamw_stage's bits.
void adamw_stage_split_master(const ParamLayout& layout, bf16_t* high, std::uint16_t* low, const float* grads, float* m,
                              float* v, const AdamWHyper& hyper, std::int64_t step, float grad_scale, int threads);

}  // namespace mt
