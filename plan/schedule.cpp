#include "plan/schedule.hpp"

#include <stdexcept>
#include <string>

namespace mt::plan {

std::vector<Op> micro_batch_ops(const ModelConfig& c, BoundaryPlacement boundaries) {
  const std::int64_t L = c.num_hidden_layers;
  std::vector<Op> ops;
  ops.push_back(Op{OpKind::embed_forward, 0, 1, {0, -1}});
  for (std::int64_t i = 1; i <= L; ++i) ops.push_back(Op{OpKind::layer_forward, i, 1, {i, -1}});
  const bool tied = c.tie_word_embeddings || c.is_gpt2();
  ops.push_back(Op{OpKind::head, L + 1, tied ? 2 : 1, {L + 1, tied ? 0 : -1}});
  for (std::int64_t i = L; i >= 1; --i) {
    Op b{OpKind::layer_backward, i, 1, {i, -1}};
    if (boundaries == BoundaryPlacement::host_ring) {
      b.loads = 2;
      b.load_stage[1] = i - 1;  // the layer's input
      b.load_kind[1] = LoadKind::boundary;
    }
    ops.push_back(b);
  }
  ops.push_back(Op{OpKind::embed_backward, 0, 0, {-1, -1}});
  return ops;
}

std::vector<Op> forward_only_ops(const ModelConfig& c) {
  std::vector<Op> ops = micro_batch_ops(c, BoundaryPlacement::device);
  ops.resize(static_cast<std::size_t>(c.num_hidden_layers + 2));  // embed forward, layer forwards, head
  ops.back().kind = OpKind::head_loss;
  return ops;
}

Schedule Schedule::forward_only(const ModelConfig& c, std::int64_t micro_batches) {
  Schedule s(c, micro_batches, MicroBatchOrder::sequential, BoundaryPlacement::device);
  s.ops_ = forward_only_ops(c);
  s.forward_only_ = true;
  const std::int64_t n = s.ops_per_micro_batch();
  s.order_.clear();
  for (std::int64_t m = 0; m < micro_batches; ++m)
    for (std::int64_t j = 0; j < n; ++j) s.order_.emplace_back(m, j);
  s.index_.assign(static_cast<std::size_t>(micro_batches * n), -1);
  for (std::size_t i = 0; i < s.order_.size(); ++i)
    s.index_[static_cast<std::size_t>(s.order_[i].first * n + s.order_[i].second)] = static_cast<std::int64_t>(i);
  return s;
}

int activation_sets(MicroBatchOrder order, std::int64_t micro_batches) {
  if (order == MicroBatchOrder::layer_major) return static_cast<int>(micro_batches);
  return order == MicroBatchOrder::interleaved && micro_batches > 1 ? 2 : 1;
}

Schedule::Schedule(const ModelConfig& c, std::int64_t micro_batches, MicroBatchOrder order,
                   BoundaryPlacement boundaries, std::int64_t passes)
    : ops_(micro_batch_ops(c, boundaries)), micro_batches_(micro_batches), passes_(passes), kind_(order) {
  if (micro_batches < 1) throw std::invalid_argument("Schedule: micro_batches must be >= 1");
  if (passes < 1 || (passes > 1 && micro_batches != 1 && order != MicroBatchOrder::layer_major))
    throw std::invalid_argument("Schedule: replayed passes need one micro-batch per step, or the layer-major order");
  const std::int64_t L = c.num_hidden_layers;
  const std::int64_t n = ops_per_micro_batch();
  const std::int64_t fwd = L + 2;  // ops 0..L+1: forward and head
  const std::int64_t bwd = n - fwd;
  const std::int64_t M = micro_batches;
  auto forward = [&](std::int64_t m, std::int64_t j) { order_.emplace_back(m, j); };
  auto backward = [&](std::int64_t m, std::int64_t j) { order_.emplace_back(m, fwd + j); };
  in_flight_ = activation_sets(order, micro_batches);
  if (order == MicroBatchOrder::layer_major) {
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t j = 0; j < fwd; ++j) forward(m, j);
    for (std::int64_t j = 0; j < bwd; ++j)
      for (std::int64_t m = 0; m < M; ++m) backward(m, j);
  } else if (in_flight_ == 1) {
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t j = 0; j < n; ++j) order_.emplace_back(m, j);
  } else {
    for (std::int64_t j = 0; j < fwd; ++j) forward(0, j);
    for (std::int64_t m = 0; m + 1 < M; ++m) {
      // bwd == fwd - 1: the head of m + 1 goes last, after the embed backward of m (it refills dx).
      for (std::int64_t j = 0; j < bwd; ++j) {
        backward(m, j);
        forward(m + 1, j);
      }
      forward(m + 1, fwd - 1);
    }
    for (std::int64_t j = 0; j < bwd; ++j) backward(M - 1, j);
  }
  // The replays (micro-batch r * M + m is pass r of data micro-batch m): the heads, then the backward
  // in the first pass's order (layer-major: a layer at a time over every micro-batch).
  for (std::int64_t r = 1; r < passes; ++r) {
    for (std::int64_t m = 0; m < M; ++m) forward(r * M + m, fwd - 1);
    for (std::int64_t j = 0; j < bwd; ++j)
      for (std::int64_t m = 0; m < M; ++m) backward(r * M + m, j);
  }
  micro_batches_ = micro_batches * passes;
  index_.assign(static_cast<std::size_t>(micro_batches_ * n), -1);
  for (std::size_t i = 0; i < order_.size(); ++i)
    index_[static_cast<std::size_t>(order_[i].first * n + order_[i].second)] = static_cast<std::int64_t>(i);
}

Pos Schedule::at(std::int64_t step, std::int64_t index) const {
  if (index < 0 || index >= length())
    throw std::out_of_range("Schedule: index " + std::to_string(index) + " outside a step of " +
                            std::to_string(length()) + " ops");
  const auto& e = order_[static_cast<std::size_t>(index)];
  return Pos{step, e.first, e.second, index};
}

Pos Schedule::next(const Pos& p) const { return p.index + 1 < length() ? at(p.step, p.index + 1) : at(p.step + 1, 0); }

std::int64_t Schedule::index_of(std::int64_t micro_batch, std::int64_t op) const {
  if (micro_batch < 0 || micro_batch >= micro_batches_ || op < 0 || op >= ops_per_micro_batch())
    throw std::out_of_range("Schedule: no op " + std::to_string(op) + " of micro-batch " + std::to_string(micro_batch));
  return index_[static_cast<std::size_t>(micro_batch * ops_per_micro_batch() + op)];
}

std::int64_t Schedule::gradient_index(std::int64_t micro_batch, std::int64_t stage) const {
  for (std::size_t j = 0; j < ops_.size(); ++j) {
    const OpKind k = ops_[j].kind;
    const bool hands_over = k == OpKind::head || k == OpKind::layer_backward || k == OpKind::embed_backward;
    if (hands_over && ops_[j].stage == stage) return index_of(micro_batch, static_cast<std::int64_t>(j));
  }
  throw std::out_of_range("Schedule: no op hands over the gradient of stage " + std::to_string(stage));
}

}  // namespace mt::plan
