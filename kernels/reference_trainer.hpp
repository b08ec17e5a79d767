// The sequential reference trainer: forward every stage, loss, backward, AdamW, one thing after
// another, no actors, no overlap. It is the oracle the pipelined engine is compared against, so it
// makes exactly the kernel calls step_math.hpp prescribes, in that order: equal inputs, equal bits.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/stage_api.hpp"
#include "kernels/step_math.hpp"
#include "kernels/tile.hpp"

namespace mt {

struct ReferenceTrainerOptions {
  ModelConfig config;
  std::int64_t micro_batch = 1;  // sequences per micro-batch
  std::int64_t seq = 1;          // tokens per sequence
  std::int64_t grad_accum = 1;   // micro-batches per step
  AdamWHyper hyper;              // lr may be changed between steps with set_lr
  float max_grad_norm = 1.0f;    // <= 0: no clipping
  std::uint64_t seed = 0;        // init_stage_params(config, stage, seed, ...)
  ActivationMode mode = ActivationMode::recompute;
  int threads = 1;
  // bf16: the stages compute with a per-stage bf16 copy of the fp32 masters (built by cpu::to_bf16 at
  // construction, rewritten by every update through adamw_stage's fused adamw_bf16copy), so the copy
  // always equals RNE bf16(masters). Gradients, moments and masters stay fp32.
  Precision precision = Precision::fp32;
  std::int64_t seq_tile = 0;  // ComputeCtx::seq_tile: the engine's sequence tiles (long context), 0 = none
};

struct StepStats {
  std::int64_t step = 0;   // 1-based index of the update just made
  double loss = 0.0;       // mean over counted tokens of the step
  double grad_norm = 0.0;  // before clipping
  double clip = 1.0;
  std::int64_t counted = 0;
};

class ReferenceTrainer {
 public:
  explicit ReferenceTrainer(const ReferenceTrainerOptions& opt);

  // One optimizer step over grad_accum micro-batches; tokens and targets each hold
  // grad_accum * micro_batch * seq ids, micro-batch after micro-batch. Validates before computing.
  // positions (data.packing = documents; null: the stream): as many, each token's position within its
  // document (BatchRows::positions), micro-batch after micro-batch.
  StepStats step(const token_t* tokens, const token_t* targets, const std::int32_t* positions = nullptr);
  // Loss only (no gradients, no update): mean over counted tokens of one micro-batch.
  double eval_loss(const token_t* tokens, const token_t* targets, const std::int32_t* positions = nullptr);
  // The same as a sum over counted tokens, and the count (the engine's evaluation oracle).
  LossSum eval_loss_sum(const token_t* tokens, const token_t* targets, const std::int32_t* positions = nullptr);

  void set_lr(float lr) { opt_.hyper.lr = lr; }
  std::int64_t num_stages() const { return static_cast<std::int64_t>(layouts_.size()); }
  const ParamLayout& layout(std::int64_t stage) const { return layouts_[static_cast<std::size_t>(stage)]; }
  // The tile sections of a stage (params, gradient accumulator of the last step, AdamW moments).
  float* params(std::int64_t stage) { return section(stage, tile_.at(static_cast<std::size_t>(stage)).params); }
  float* grads(std::int64_t stage) { return section(stage, tile_.at(static_cast<std::size_t>(stage)).grads); }
  float* adam_m(std::int64_t stage) { return section(stage, tile_.at(static_cast<std::size_t>(stage)).adam_m); }
  float* adam_v(std::int64_t stage) { return section(stage, tile_.at(static_cast<std::size_t>(stage)).adam_v); }
  const ReferenceTrainerOptions& options() const { return opt_; }
  // The bf16 compute copy of a stage's params (same element offsets), nullptr in fp32 runs.
  const bf16_t* compute_copy(std::int64_t stage) const {
    return copies_.empty() ? nullptr : copies_[static_cast<std::size_t>(stage)].data();
  }
  // After writing params(stage) directly (e.g. loading weights), rebuild the bf16 copies from the
  // masters; a no-op in fp32.
  void refresh_compute_copies();

  // Forward and backward of one micro-batch adding into the gradient accumulators through zeroed
  // staging buffers (exactly the engine's sequence); returns its loss sum and counted tokens.
  LossSum forward_backward(const token_t* tokens, const token_t* targets, const std::int32_t* positions = nullptr);

 private:
  float* section(std::int64_t stage, std::size_t offset) {
    return tiles_[static_cast<std::size_t>(stage)].get() + offset;
  }
  // What the stage functions get as weights: the bf16 copy in bf16 runs, else the fp32 params.
  const void* weights(std::int64_t stage) {
    return copies_.empty() ? static_cast<const void*>(params(stage)) : compute_copy(stage);
  }
  ComputeCtx ctx() const {
    ComputeCtx c;
    c.threads = opt_.threads;
    c.precision = opt_.precision;
    c.seq_tile = opt_.seq_tile;
    return c;
  }

  ReferenceTrainerOptions opt_;
  std::vector<ParamLayout> layouts_;
  std::vector<TileLayout> tile_;
  std::vector<AlignedFloats> tiles_;         // one tile per stage
  std::vector<AlignedFloats> staging_;       // one gradient staging buffer per stage
  std::vector<AlignedFloats> acts_;          // layer-boundary hidden states, L + 1 of them
  std::vector<AlignedFloats> saved_;         // keep mode: each layer's intermediates
  std::vector<std::vector<bf16_t>> copies_;  // bf16 runs: each stage's compute copy (empty in fp32)
  AlignedFloats workspace_, grad_a_, grad_b_;
  std::int64_t step_ = 0;
};

}  // namespace mt
