#include "actors/schedule.hpp"

namespace mt::actors {

Phase Op::phase() const {
  switch (kind) {
    case OpKind::embed_forward:
    case OpKind::layer_forward:
      return Phase::forward;
    case OpKind::head:
      return Phase::head;
    case OpKind::layer_backward:
    case OpKind::embed_backward:
      return Phase::backward;
  }
  return Phase::forward;
}

std::vector<Op> micro_batch_ops(const ModelConfig& c) {
  const std::int64_t L = c.num_hidden_layers;
  std::vector<Op> ops;
  Op e{OpKind::embed_forward, 0, 1, {0, -1}};
  ops.push_back(e);
  for (std::int64_t i = 1; i <= L; ++i) ops.push_back(Op{OpKind::layer_forward, i, 1, {i, -1}});
  const bool tied = c.tie_word_embeddings || c.is_gpt2();
  ops.push_back(Op{OpKind::head, L + 1, tied ? 2 : 1, {L + 1, tied ? 0 : -1}});
  for (std::int64_t i = L; i >= 1; --i) ops.push_back(Op{OpKind::layer_backward, i, 1, {i, -1}});
  ops.push_back(Op{OpKind::embed_backward, 0, 0, {-1, -1}});
  return ops;
}

Pos next_pos(Pos p, std::int64_t ops_per_mb, std::int64_t micro_batches) {
  if (++p.op < ops_per_mb) return p;
  p.op = 0;
  if (++p.micro_batch < micro_batches) return p;
  p.micro_batch = 0;
  ++p.step;
  return p;
}

}  // namespace mt::actors
