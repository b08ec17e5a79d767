// The step math shared by the reference trainer and the engine (see step_math.hpp for the contract).
#include "kernels/step_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "kernels/host_memory.hpp"
#include "kernels/profile.hpp"
#include "kernels/tile.hpp"

namespace mt {

AlignedFloats make_aligned_floats(std::size_t n) {
  const std::size_t bytes = std::max<std::size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
  void* p = allocate_host_bytes(bytes, host_alignment(bytes));
  if (!p) throw std::bad_alloc();
  std::fill_n(static_cast<float*>(p), bytes / sizeof(float), 0.0f);
  return AlignedFloats(static_cast<float*>(p));
}

double stage_grad_sumsq(const ParamLayout& layout, const float* grads, int threads) {
  double total = 0.0;
  for (const auto& t : layout.tensors) total += cpu::sum_squares(grads + t.offset, t.numel, threads);
  return total;
}

StepScale compute_step_scale(const std::vector<double>& stage_sumsq, std::int64_t counted, float max_grad_norm,
                             double loss_sum) {
  StepScale s;
  if (counted <= 0) return s;  // nothing counted: no gradient enters the update
  double sumsq = 0.0;
  for (double x : stage_sumsq) sumsq += x;
  const double n = static_cast<double>(counted);
  s.loss = loss_sum / n;
  s.grad_norm = std::sqrt(sumsq) / n;
  s.clip = max_grad_norm > 0.0f ? std::min(1.0, static_cast<double>(max_grad_norm) / (s.grad_norm + 1e-6)) : 1.0;
  s.grad_scale = static_cast<float>(s.clip / n);
  return s;
}

namespace {

// The two AdamW constant sets of a stage: tensors with weight decay and without (TensorSpec::weight_decay).
struct StageSteps {
  AdamWStep with_wd, without_wd;
  StageSteps(const AdamWHyper& hyper, std::int64_t step, float grad_scale)
      : with_wd(make_adamw_step(hyper, step, grad_scale)),
        without_wd(make_adamw_step(no_decay(hyper), step, grad_scale)) {}
  static AdamWHyper no_decay(AdamWHyper h) {
    h.weight_decay = 0.0f;
    return h;
  }
  const AdamWStep& of(const TensorSpec& t) const { return t.weight_decay ? with_wd : without_wd; }
};

}  // namespace

void adamw_stage(const ParamLayout& layout, float* params, const float* grads, float* m, float* v,
                 const AdamWHyper& hyper, std::int64_t step, float grad_scale, int threads, bf16_t* compute_copy) {
  prof::Scope prof_scope(prof::optimizer);
  const StageSteps steps(hyper, step, grad_scale);
  for (const auto& t : layout.tensors) {
    const std::size_t o = t.offset;
    const AdamWStep& st = steps.of(t);
    if (compute_copy)
      cpu::adamw_bf16copy(params + o, grads + o, m + o, v + o, compute_copy + o, t.numel, st, threads);
    else
      cpu::adamw(params + o, grads + o, m + o, v + o, t.numel, st, threads);
  }
}

void adamw_stage_split_master(const ParamLayout& layout, bf16_t* high, std::uint16_t* low, const float* grads, float* m,
                              float* v, const AdamWHyper& hyper, std::int64_t step, float grad_scale, int threads) {
  prof::Scope prof_scope(prof::optimizer);
  const StageSteps steps(hyper, step, grad_scale);
  for (const auto& t : layout.tensors) {
    const std::size_t o = t.offset;
    cpu::adamw_split_master(high + o, low + o, grads + o, m + o, v + o, t.numel, steps.of(t), threads);
  }
}

MoeBalanceTerm moe_balance(const std::vector<std::vector<std::int64_t>>& counts,
                           const std::vector<std::vector<float>>& prob_sums, std::int64_t tokens, double coef,
                           std::int64_t counted) {
  MoeBalanceTerm t;
  if (counts.size() != prob_sums.size() || tokens <= 0) return t;
  std::size_t E = 0, layers = 0;
  for (const auto& l : counts)
    if (!l.empty()) E = l.size(), ++layers;
  if (layers == 0) return t;
  const double R = static_cast<double>(layers) * static_cast<double>(tokens);
  std::vector<std::int64_t> C(E, 0);
  std::vector<double> P(E, 0.0);
  for (std::size_t l = 0; l < counts.size(); ++l)
    for (std::size_t e = 0; e < counts[l].size(); ++e) {
      C[e] += counts[l][e];
      P[e] += static_cast<double>(prob_sums[l][e]);
    }
  double sum = 0.0;
  for (std::size_t e = 0; e < E; ++e) sum += static_cast<double>(C[e]) / R * (P[e] / R);
  t.aux = static_cast<double>(E) * sum;
  t.loss_add = coef * static_cast<double>(counted) * t.aux;
  t.grad.resize(E);
  for (std::size_t e = 0; e < E; ++e)
    t.grad[e] = static_cast<float>(coef * static_cast<double>(counted) * static_cast<double>(E) *
                                   (static_cast<double>(C[e]) / R) / R);
  return t;
}

}  // namespace mt
