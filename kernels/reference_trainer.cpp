#include "kernels/reference_trainer.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/bf16.hpp"

namespace mt {

ReferenceTrainer::ReferenceTrainer(const ReferenceTrainerOptions& opt) : opt_(opt) {
  const ModelConfig& c = opt_.config;
  c.validate();
  validate_batch_shape(c, opt_.micro_batch, opt_.seq);
  if (opt_.grad_accum < 1) throw std::invalid_argument("grad_accum must be >= 1");
  if (opt_.threads < 1) throw std::invalid_argument("threads must be >= 1");
  const std::int64_t S = mt::num_stages(c), L = c.num_hidden_layers, B = opt_.micro_batch, T = opt_.seq;
  for (std::int64_t s = 0; s < S; ++s) {
    layouts_.push_back(stage_layout(c, s));
    tile_.push_back(tile_layout(layouts_.back()));
    tiles_.push_back(make_aligned_floats(tile_.back().total_floats));
    staging_.push_back(make_aligned_floats(layouts_.back().total_floats));
    init_stage_params(c, s, opt_.seed, tiles_.back().get() + tile_.back().params, opt_.threads);
  }
  if (opt_.precision == Precision::bf16) {
    for (std::int64_t s = 0; s < S; ++s) copies_.emplace_back(layouts_[static_cast<std::size_t>(s)].total_floats);
    refresh_compute_copies();
  }
  const std::size_t act = static_cast<std::size_t>(B * T * c.hidden_size);
  for (std::int64_t i = 0; i <= L; ++i) acts_.push_back(make_aligned_floats(act));
  if (opt_.mode == ActivationMode::keep)
    for (std::int64_t i = 0; i < L; ++i) saved_.push_back(make_aligned_floats(layer_saved_floats(c, B, T)));
  // Sized for recompute mode in every mode (eval_loss runs forwards without keep buffers), and for keep
  // mode's whole-sequence scratch when it keeps.
  workspace_ = make_aligned_floats(
      std::max({layer_workspace_floats(c, B, T, ActivationMode::recompute, opt_.precision, opt_.seq_tile),
                opt_.mode == ActivationMode::keep ? layer_workspace_floats(c, B, T, opt_.mode, opt_.precision) : 0,
                head_workspace_floats(c, B, T, 0, opt_.precision, opt_.seq_tile)}));
  grad_a_ = make_aligned_floats(act);
  grad_b_ = make_aligned_floats(act);
}

void ReferenceTrainer::refresh_compute_copies() {
  for (std::size_t s = 0; s < copies_.size(); ++s)
    cpu::to_bf16(params(static_cast<std::int64_t>(s)), copies_[s].data(), copies_[s].size(), opt_.threads);
}

LossSum ReferenceTrainer::forward_backward(const token_t* tokens, const token_t* targets,
                                           const std::int32_t* positions) {
  const ModelConfig& c = opt_.config;
  const std::int64_t L = c.num_hidden_layers, B = opt_.micro_batch, T = opt_.seq, S = L + 2;
  const BatchRows rows{B, T, positions};
  const ComputeCtx ctx = this->ctx();
  const bool keep = opt_.mode == ActivationMode::keep;
  // Layer l's buffers: its input and output activations, its kept intermediates, the shared workspace.
  auto layer_buffers = [&](std::int64_t l) {
    LayerBuffers b;
    b.x_in = acts_[l].get();
    b.x_out = acts_[l + 1].get();
    b.saved = keep ? saved_[l].get() : nullptr;
    b.workspace = workspace_.get();
    return b;
  };
  // The load-balancing loss: each MoE layer's statistics from its forward (step_math.hpp).
  const bool balanced = c.output_router_logits;
  std::vector<std::vector<std::int64_t>> counts;
  std::vector<std::vector<float>> prob_sums;
  // Forward: stage 0, layers, and the head (which also runs its backward, fused).
  embedding_forward(c, weights(0), tokens, rows, acts_[0].get(), ctx);
  for (std::int64_t l = 0; l < L; ++l) {
    MoeBalance stats;
    if (balanced && c.layer_is_moe(l)) {
      counts.emplace_back(static_cast<std::size_t>(c.num_experts));
      prob_sums.emplace_back(static_cast<std::size_t>(c.num_experts));
      stats.counts = counts.back().data();
      stats.prob_sums = prob_sums.back().data();
    }
    LayerBuffers b = layer_buffers(l);
    b.balance = stats.counts ? &stats : nullptr;
    layer_forward(c.layer_config(l), weights(l + 1), rows, b, ctx);
  }
  for (std::int64_t s = 0; s < S; ++s) cpu::zero(staging_[s].get(), layouts_[s].total_floats, opt_.threads);
  float* dx = grad_a_.get();
  float* dy = grad_b_.get();
  HeadBuffers hb;
  hb.x_in = acts_[L].get();
  hb.targets = targets;
  hb.dx = dy;
  hb.head_grads = staging_[S - 1].get();
  hb.embed_grads = staging_[0].get();
  hb.workspace = workspace_.get();
  LossSum loss = head_forward_backward(c, weights(S - 1), weights(0), rows, hb, ctx);
  MoeBalanceTerm term;
  if (balanced) {
    term = moe_balance(counts, prob_sums, B * T, c.router_aux_loss_coef, loss.counted);
    loss.loss_sum += term.loss_add;
  }
  cpu::accumulate(grads(S - 1), staging_[S - 1].get(), layouts_[S - 1].total_floats, opt_.threads);
  for (std::int64_t l = L - 1; l >= 0; --l) {
    MoeBalance grad;
    if (balanced && c.layer_is_moe(l)) grad.grad = term.grad.data();
    LayerBuffers b = layer_buffers(l);
    b.dy = dy;
    b.dx = dx;
    b.grads = staging_[l + 1].get();
    b.balance = grad.grad ? &grad : nullptr;
    layer_backward(c.layer_config(l), weights(l + 1), rows, b, ctx);
    cpu::accumulate(grads(l + 1), staging_[l + 1].get(), layouts_[l + 1].total_floats, opt_.threads);
    std::swap(dx, dy);
  }
  embedding_backward(c, tokens, rows, dy, staging_[0].get(), ctx);
  cpu::accumulate(grads(0), staging_[0].get(), layouts_[0].total_floats, opt_.threads);
  return loss;
}

StepStats ReferenceTrainer::step(const token_t* tokens, const token_t* targets, const std::int32_t* positions) {
  const ModelConfig& c = opt_.config;
  const std::int64_t S = mt::num_stages(c);
  const std::size_t per_micro = static_cast<std::size_t>(opt_.micro_batch * opt_.seq);
  validate_tokens(c, tokens, per_micro * static_cast<std::size_t>(opt_.grad_accum));
  validate_targets(c, targets, per_micro * static_cast<std::size_t>(opt_.grad_accum));
  for (std::int64_t s = 0; s < S; ++s) cpu::zero(grads(s), layouts_[s].total_floats, opt_.threads);
  double loss_sum = 0.0;
  std::int64_t counted = 0;
  for (std::int64_t m = 0; m < opt_.grad_accum; ++m) {
    const LossSum l = forward_backward(tokens + m * per_micro, targets + m * per_micro,
                                       positions ? positions + m * per_micro : nullptr);
    loss_sum += l.loss_sum;
    counted += l.counted;
  }
  std::vector<double> sumsq;
  for (std::int64_t s = 0; s < S; ++s) sumsq.push_back(stage_grad_sumsq(layouts_[s], grads(s), opt_.threads));
  const StepScale scale = compute_step_scale(sumsq, counted, opt_.max_grad_norm, loss_sum);
  ++step_;
  for (std::int64_t s = 0; s < S; ++s)
    adamw_stage(layouts_[s], params(s), grads(s), adam_m(s), adam_v(s), opt_.hyper, step_, scale.grad_scale,
                opt_.threads, copies_.empty() ? nullptr : copies_[static_cast<std::size_t>(s)].data());
  return StepStats{step_, scale.loss, scale.grad_norm, scale.clip, counted};
}

double ReferenceTrainer::eval_loss(const token_t* tokens, const token_t* targets, const std::int32_t* positions) {
  const LossSum loss = eval_loss_sum(tokens, targets, positions);
  return loss.counted ? loss.loss_sum / static_cast<double>(loss.counted) : 0.0;
}

LossSum ReferenceTrainer::eval_loss_sum(const token_t* tokens, const token_t* targets, const std::int32_t* positions) {
  const ModelConfig& c = opt_.config;
  const std::int64_t L = c.num_hidden_layers, B = opt_.micro_batch, T = opt_.seq;
  const BatchRows rows{B, T, positions};
  const ComputeCtx ctx = this->ctx();
  embedding_forward(c, weights(0), tokens, rows, acts_[0].get(), ctx);
  for (std::int64_t l = 0; l < L; ++l) {
    LayerBuffers b;
    b.x_in = acts_[l].get();
    b.x_out = acts_[l + 1].get();
    b.workspace = workspace_.get();
    layer_forward(c.layer_config(l), weights(l + 1), rows, b, ctx);
  }
  HeadBuffers hb;  // loss only
  hb.x_in = acts_[L].get();
  hb.targets = targets;
  hb.workspace = workspace_.get();
  return head_forward_backward(c, weights(L + 1), weights(0), rows, hb, ctx);
}

}  // namespace mt
