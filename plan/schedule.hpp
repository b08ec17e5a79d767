// The streaming schedule: the exact, known-in-advance sequence of compute operations of a run, and the
// loads each needs. Compute walks it; the prefetcher walks the same sequence K slots ahead, so every
// prefetch is exact. The planner's step model walks the same schedule. No CAF here.
//
// Per micro-batch (stages: 0 embedding, 1..L layers, L+1 head), the reference trainer's ops:
//   op 0          embed forward      loads stage 0
//   op 1..L       layer forward      loads stage i
//   op L+1        head (fused fwd+bwd) loads stage L+1 (and stage 0 too when embeddings are tied)
//   op L+2..2L+1  layer backward     loads stage L..1 (recomputes the layer once, or uses kept
//                                    intermediates); with boundaries on the host also the layer's
//                                    input boundary (boundary i-1) into an activation slot
//   op 2L+2       embed backward     loads nothing (a scatter of dx into the embedding gradient)
//
// A step orders its micro-batches' ops in one of three ways (MicroBatchOrder):
//   sequential:  F(0) B(0) F(1) B(1) ...  (F = ops 0..L+1, B = ops L+2..2L+2)
//   interleaved: F(0), then B(m) and F(m+1) alternating op by op (B first) for m = 0..M-2, with the
//                head of m+1 after the embed backward of m, then B(M-1).
//   layer_major: F(0) F(1) ... F(M-1), then each backward op j over every micro-batch in turn:
//                B_j(0) B_j(1) ... B_j(M-1), for j = layer L .. layer 1, embed. Every micro-batch's
//                activations are alive at once (M sets); a stage's gradient is complete when its
//                backward ends, and each layer's backward loads its weights once (the others find
//                the slot resident).
// A forward op streams a layer for 1 unit of compute and a backward op for about 3, so alone a
// forward is link-bound and a backward compute-bound; interleaved, each pair streams 2 layers for
// about 4 units and link and compute stay busy together. Per stage, gradients still arrive in
// micro-batch order, so the accumulation (and every result) is bit-identical to the sequential order.
// Steps follow each other.
//
// Stage gradients with clipping (train.gradient_buffer=stage, passes = 2; one micro-batch, or M
// layer-major): the step's micro-batches run again after the last embed backward, from the head on
// (ops L+1..2L+2): schedule micro-batch M + m is the second pass of data micro-batch m, its heads
// first, then the backward in the first pass's order. It replays from the activations the first
// pass's forward left (their activation sets; a backward reads them and writes none), so the second
// pass costs the heads and a backward, not a forward too.
//
// An evaluation pass (forward_only) is one "step" of forward ops per micro-batch, sequential:
//   op 0 embed forward, op 1..L layer forward, op L+1 head_loss (the head's loss only, no gradients).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "config/train_config.hpp"
#include "kernels/model_config.hpp"
#include "plan/placements.hpp"

namespace mt::plan {

enum class OpKind { embed_forward, layer_forward, head, layer_backward, embed_backward, head_loss };

// What one load of an op brings to the device: a stage's weights into a weight slot, or a saved
// layer-boundary activation (boundaries on the host) into an activation slot.
enum class LoadKind { weights, boundary };

struct Op {
  OpKind kind = OpKind::embed_forward;
  std::int64_t stage = 0;                 // the stage this op computes
  int loads = 0;                          // loads it needs (0, 1 or 2)
  std::int64_t load_stage[2] = {-1, -1};  // weights: the stage; boundary: the boundary index
  LoadKind load_kind[2] = {LoadKind::weights, LoadKind::weights};
};

// The ops of one micro-batch, in order. Boundaries in the host ring: layer backward ops also load their
// input boundary from the host.
std::vector<Op> micro_batch_ops(const ModelConfig& c, BoundaryPlacement boundaries = BoundaryPlacement::device);
// The ops of one micro-batch of an evaluation pass: forwards and the head's loss.
std::vector<Op> forward_only_ops(const ModelConfig& c);

// Micro-batches whose activations are alive at once in a step of this order: 2 when interleaved with
// more than one micro-batch, every one layer-major, else 1. The engine sizes its activation sets with it.
int activation_sets(MicroBatchOrder order, std::int64_t micro_batches);

// A point in the schedule: entry `index` of step `step`, which is op `op` of micro-batch
// `micro_batch` (both derived from index by the Schedule). Ordered by (step, index).
struct Pos {
  std::int64_t step = 0;
  std::int64_t micro_batch = 0;
  std::int64_t op = 0;
  std::int64_t index = 0;
  bool operator==(const Pos& o) const { return step == o.step && index == o.index; }
  bool operator!=(const Pos& o) const { return !(*this == o); }
  bool operator<(const Pos& o) const { return step != o.step ? step < o.step : index < o.index; }
};

class Schedule {
 public:
  Schedule() = default;
  // passes > 1 (needs micro_batches = 1 or layer_major): passes - 1 replays of the heads and the
  // backward follow (see above); micro_batches() then counts every pass.
  Schedule(const ModelConfig& c, std::int64_t micro_batches, MicroBatchOrder order, BoundaryPlacement boundaries,
           std::int64_t passes = 1);
  // An evaluation pass: forward_only_ops per micro-batch, in micro-batch order.
  static Schedule forward_only(const ModelConfig& c, std::int64_t micro_batches);

  const std::vector<Op>& ops() const { return ops_; }  // one micro-batch's ops
  std::int64_t ops_per_micro_batch() const { return static_cast<std::int64_t>(ops_.size()); }
  std::int64_t length() const { return static_cast<std::int64_t>(order_.size()); }  // ops per step
  std::int64_t micro_batches() const { return micro_batches_; }
  MicroBatchOrder order() const { return kind_; }
  // Micro-batches whose activations are alive at once: activation_sets(order, M).
  int in_flight() const { return in_flight_; }

  Pos at(std::int64_t step, std::int64_t index) const;  // index in [0, length())
  Pos first(std::int64_t step) const { return at(step, 0); }
  Pos next(const Pos& p) const;
  // Index within a step of op `op` of micro-batch `micro_batch` (-1: a replay does not run that op).
  std::int64_t index_of(std::int64_t micro_batch, std::int64_t op) const;
  const Op& op(const Pos& p) const { return ops_[static_cast<std::size_t>(p.op)]; }
  // Where a step's gradient of `stage` from micro-batch `micro_batch` is complete and goes to the
  // collector: the index of its head (stage L + 1), layer backward or embed backward (stage 0). The
  // collector gets a step's gradients in this order; a restart re-issues staged ones in it.
  std::int64_t gradient_index(std::int64_t micro_batch, std::int64_t stage) const;
  bool is_forward_only() const { return forward_only_; }
  // Which of the in-flight activation sets micro-batch `micro_batch` uses (a replay: its first pass's).
  int activation_set(std::int64_t micro_batch) const {
    return static_cast<int>((micro_batch % (micro_batches_ / passes_)) % in_flight_);
  }
  std::int64_t passes() const { return passes_; }

 private:
  std::vector<Op> ops_;
  std::vector<std::pair<std::int64_t, std::int64_t>> order_;  // per index: (micro-batch, op)
  std::vector<std::int64_t> index_;                           // micro_batch * ops + op -> index
  std::int64_t micro_batches_ = 1;
  std::int64_t passes_ = 1;
  MicroBatchOrder kind_ = MicroBatchOrder::sequential;
  int in_flight_ = 1;  // activation_sets(kind_, micro_batches_)
  bool forward_only_ = false;
};

}  // namespace mt::plan
