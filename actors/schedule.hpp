// The streaming schedule: the exact, known-in-advance sequence of compute operations of a run, and the
// weight loads each needs. Compute walks it; the prefetcher walks the same sequence K slots ahead, so
// every prefetch is exact. No CAF here.
//
// Per micro-batch (stages: 0 embedding, 1..L layers, L+1 head), the reference trainer's order:
//   op 0          embed forward      loads stage 0
//   op 1..L       layer forward      loads stage i
//   op L+1        head (fused fwd+bwd) loads stage L+1 (and stage 0 too when embeddings are tied)
//   op L+2..2L+1  layer backward     loads stage L..1 (recomputes the layer once, or uses kept intermediates)
//   op 2L+2       embed backward     loads nothing (a scatter of dx into the embedding gradient)
// Micro-batches follow each other; steps follow each other.
#pragma once
#include <cstdint>
#include <vector>

#include "actors/fault.hpp"
#include "kernels/model_config.hpp"

namespace mt::actors {

enum class OpKind { embed_forward, layer_forward, head, layer_backward, embed_backward };

struct Op {
  OpKind kind = OpKind::embed_forward;
  std::int64_t stage = 0;  // the stage this op computes
  int loads = 0;           // weight loads it needs (0, 1 or 2)
  std::int64_t load_stage[2] = {-1, -1};
  Phase phase() const;
};

// The ops of one micro-batch, in order.
std::vector<Op> micro_batch_ops(const ModelConfig& c);

// A point in the schedule: the op `op` of micro-batch `micro_batch` of step `step`.
struct Pos {
  std::int64_t step = 0;
  std::int64_t micro_batch = 0;
  std::int64_t op = 0;
  bool operator==(const Pos& o) const { return step == o.step && micro_batch == o.micro_batch && op == o.op; }
  bool operator!=(const Pos& o) const { return !(*this == o); }
  bool operator<(const Pos& o) const {
    if (step != o.step) return step < o.step;
    if (micro_batch != o.micro_batch) return micro_batch < o.micro_batch;
    return op < o.op;
  }
};

// The position after `p` in a run with `ops_per_mb` ops per micro-batch and `micro_batches` per step.
Pos next_pos(Pos p, std::int64_t ops_per_mb, std::int64_t micro_batches);

}  // namespace mt::actors
