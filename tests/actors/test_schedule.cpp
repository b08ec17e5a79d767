// The exact schedule the prefetcher and compute walk, and the fault hook's matching.
#include <map>
#include <set>

#include <catch2/catch.hpp>

#include "actors/fault.hpp"
#include "plan/schedule.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;

TEST_CASE("schedule: ops of a micro-batch and their weight loads", "[actors][schedule]") {
  ModelConfig c;
  c.num_hidden_layers = 2;
  auto ops = micro_batch_ops(c);
  REQUIRE(ops.size() == 7);  // E, L1, L2, H, L2', L1', E'
  CHECK(ops[0].kind == OpKind::embed_forward);
  CHECK(ops[2].kind == OpKind::layer_forward);
  CHECK(ops[2].load_stage[0] == 2);
  CHECK(ops[3].kind == OpKind::head);
  CHECK(ops[3].loads == 1);
  CHECK(ops[4].kind == OpKind::layer_backward);
  CHECK(ops[4].stage == 2);
  CHECK(ops[6].kind == OpKind::embed_backward);
  CHECK(ops[6].loads == 0);
  c.tie_word_embeddings = true;
  ops = micro_batch_ops(c);
  CHECK(ops[3].loads == 2);
  CHECK(ops[3].load_stage[1] == 0);

  ops = micro_batch_ops(
      c, BoundaryPlacement::host_ring);  // boundaries on the host: a layer's backward also loads its input
  CHECK(ops[4].loads == 2);
  CHECK(ops[4].load_kind[0] == LoadKind::weights);
  CHECK(ops[4].load_kind[1] == LoadKind::boundary);
  CHECK(ops[4].load_stage[1] == 1);
  CHECK(ops[5].load_stage[1] == 0);
  CHECK(ops[1].loads == 1);
}

TEST_CASE("schedule: sequential order walks micro-batches one after another", "[actors][schedule]") {
  ModelConfig c;
  c.num_hidden_layers = 2;
  const Schedule s(c, 2, MicroBatchOrder::sequential, BoundaryPlacement::device);
  REQUIRE(s.length() == 14);
  CHECK(s.in_flight() == 1);
  Pos p = s.at(0, 6);
  CHECK(p.micro_batch == 0);
  CHECK(p.op == 6);
  p = s.next(p);
  CHECK(p.micro_batch == 1);
  CHECK(p.op == 0);
  p = s.at(0, 13);
  p = s.next(p);
  CHECK(p.step == 1);
  CHECK(p.index == 0);
  CHECK(p.micro_batch == 0);
  CHECK(s.index_of(1, 3) == 10);
  CHECK_THROWS_AS(s.at(0, 14), std::out_of_range);
}

// Stage gradients with clipping: the second pass replays the head and the backward of the one
// micro-batch from the first pass's activations (its set), after the first pass's embed backward.
TEST_CASE("schedule: a second pass replays the head and the backward only", "[actors][schedule][stage_gradients]") {
  ModelConfig c;
  c.num_hidden_layers = 2;
  for (MicroBatchOrder order : {MicroBatchOrder::interleaved, MicroBatchOrder::sequential}) {
    const Schedule s(c, 1, order, BoundaryPlacement::host_ring, 2);
    CHECK(s.micro_batches() == 2);
    CHECK(s.passes() == 2);
    CHECK(s.in_flight() == 1);
    REQUIRE(s.length() == 7 + 4);  // E L1 L2 H L2' L1' E', then H L2' L1' E'
    for (std::int64_t i = 0; i < 7; ++i) CHECK(s.at(0, i).micro_batch == 0);
    const std::vector<OpKind> replay{OpKind::head, OpKind::layer_backward, OpKind::layer_backward,
                                     OpKind::embed_backward};
    for (std::int64_t i = 7; i < 11; ++i) {
      const Pos p = s.at(0, i);
      CHECK(p.micro_batch == 1);
      CHECK(s.op(p).kind == replay[static_cast<std::size_t>(i - 7)]);
    }
    CHECK(s.activation_set(1) == s.activation_set(0));
    CHECK(s.index_of(1, 0) == -1);  // no forward in the replay
    CHECK(s.index_of(1, 3) == 7);
    CHECK(s.op(s.at(0, 9)).load_stage[1] == 0);  // the replay's backward streams the first pass's boundary
  }
  CHECK_THROWS_AS(Schedule(c, 2, MicroBatchOrder::sequential, BoundaryPlacement::device, 2), std::invalid_argument);
  CHECK_THROWS_AS(Schedule(c, 2, MicroBatchOrder::interleaved, BoundaryPlacement::device, 2), std::invalid_argument);
}

// Layer-major (stage gradients of several micro-batches): every forward and head, then each backward
// op over every micro-batch in micro-batch order, so a stage's last gradient of a pass comes before
// any gradient of the next stage; a second pass replays the heads and that backward.
TEST_CASE("schedule: layer-major order completes each stage's gradient before the next stage's",
          "[actors][schedule][stage_gradients]") {
  for (std::int64_t layers : {1, 3})
    for (std::int64_t M : {1, 2, 3})
      for (std::int64_t passes : {1, 2}) {
        INFO("layers " << layers << " M " << M << " passes " << passes);
        ModelConfig c;
        c.num_hidden_layers = layers;
        const Schedule s(c, M, MicroBatchOrder::layer_major, BoundaryPlacement::host_ring, passes);
        const std::int64_t n = s.ops_per_micro_batch(), fwd = layers + 2, bwd = n - fwd;
        CHECK(s.in_flight() == M);
        CHECK(s.micro_batches() == M * passes);
        REQUIRE(s.length() == M * n + (passes - 1) * M * (bwd + 1));
        for (std::int64_t m = 0; m < M; ++m) {
          CHECK(s.activation_set(m) == m);
          if (passes == 2) CHECK(s.activation_set(M + m) == m);  // the replay reads the first pass's set
        }
        std::map<std::int64_t, std::int64_t> next_op;  // schedule micro-batch -> its next op
        std::set<std::int64_t> finished;               // stages whose gradient of this pass is complete
        std::int64_t stage_open = -1, arrivals = 0, pass = 0;
        Pos p = s.first(0);
        for (std::int64_t i = 0; i < s.length(); ++i, p = s.next(p)) {
          INFO("index " << i);
          REQUIRE(s.index_of(p.micro_batch, p.op) == i);
          const bool replay = p.micro_batch >= M;
          auto it = next_op.find(p.micro_batch);
          const std::int64_t expected = it != next_op.end() ? it->second : replay ? fwd - 1 : 0;
          CHECK(p.op == expected);  // each micro-batch's ops in their own order
          next_op[p.micro_batch] = p.op + 1;
          const Op& op = s.op(p);
          if (op.kind == OpKind::layer_forward || op.kind == OpKind::embed_forward) CHECK_FALSE(replay);
          const bool grads =
              op.kind == OpKind::head || op.kind == OpKind::layer_backward || op.kind == OpKind::embed_backward;
          if (!grads) continue;
          // Where the collector gets this gradient (a restart re-issues staged ones in that order).
          CHECK(s.gradient_index(p.micro_batch, op.stage) == i);
          if (p.micro_batch / M != pass) {  // a new pass: every stage again
            pass = p.micro_batch / M;
            finished.clear();
            stage_open = -1;
          }
          if (op.stage != stage_open) {  // the previous stage had all its micro-batches
            if (stage_open >= 0) CHECK(arrivals == M);
            CHECK(finished.count(op.stage) == 0);
            finished.insert(op.stage);
            stage_open = op.stage;
            arrivals = 0;
          }
          CHECK(p.micro_batch % M == arrivals);  // micro-batch order within the stage: the accumulation order
          ++arrivals;
        }
        CHECK(arrivals == M);
        CHECK(finished.size() == static_cast<std::size_t>(layers + 2));
        for (const auto& kv : next_op) CHECK(kv.second == n);
        CHECK(p.step == 1);
      }
}

// The interleaved order, checked by its properties rather than by a copy of the generator.
TEST_CASE("schedule: interleaved order keeps every dependency and the accumulation order", "[actors][schedule]") {
  for (std::int64_t layers : {1, 2, 5}) {
    for (std::int64_t M : {1, 2, 4}) {
      ModelConfig c;
      c.num_hidden_layers = layers;
      const Schedule s(
          c, M, MicroBatchOrder::interleaved,
          layers != 2 ? BoundaryPlacement::host_ring : BoundaryPlacement::device);  // boundary loads change no order
      const std::int64_t n = s.ops_per_micro_batch();
      REQUIRE(s.length() == M * n);
      CHECK(s.in_flight() == (M > 1 ? 2 : 1));
      std::vector<std::int64_t> done(static_cast<std::size_t>(M), 0);  // ops done per micro-batch
      std::int64_t last_head_mb = -1, last_embed_bwd_mb = -1, alive_max = 0;
      Pos p = s.first(3);
      for (std::int64_t i = 0; i < s.length(); ++i, p = s.next(p)) {
        INFO("layers " << layers << " M " << M << " index " << i);
        REQUIRE(p.step == 3);
        REQUIRE(p.index == i);
        REQUIRE(s.index_of(p.micro_batch, p.op) == i);
        // Each micro-batch's ops in their own order.
        CHECK(p.op == done[static_cast<std::size_t>(p.micro_batch)]);
        ++done[static_cast<std::size_t>(p.micro_batch)];
        const Op& op = s.op(p);
        if (op.kind == OpKind::head) {
          // Heads in micro-batch order, each after the previous micro-batch's embed backward (dx).
          CHECK(p.micro_batch == last_head_mb + 1);
          CHECK(last_embed_bwd_mb == p.micro_batch - 1);
          last_head_mb = p.micro_batch;
        }
        // Backward ops (every stage's gradients) in micro-batch order: the accumulation order.
        if (op.kind == OpKind::layer_backward || op.kind == OpKind::embed_backward)
          CHECK(p.micro_batch == last_embed_bwd_mb + 1);
        if (op.kind == OpKind::embed_backward) last_embed_bwd_mb = p.micro_batch;
        std::int64_t alive = 0;
        for (std::int64_t m = 0; m < M; ++m)
          if (done[static_cast<std::size_t>(m)] > 0 && done[static_cast<std::size_t>(m)] < n) ++alive;
        alive_max = std::max(alive_max, alive);
      }
      for (auto d : done) CHECK(d == n);
      CHECK(alive_max <= s.in_flight());
      CHECK(p.step == 4);
      // Interleaving: right after the first head, backward ops of micro-batch 0 alternate with
      // forward ops of micro-batch 1.
      if (M > 1) {
        const Pos a = s.at(0, layers + 2), b = s.next(a);
        CHECK(a.micro_batch == 0);
        CHECK(s.op(a).kind == OpKind::layer_backward);
        CHECK(b.micro_batch == 1);
        CHECK(s.op(b).kind == OpKind::embed_forward);
      }
    }
  }
}

TEST_CASE("fault hook: matches its point once, inert otherwise", "[actors][schedule]") {
  fault_point(nullptr, Role::compute, 1, 0, 2, Phase::forward);  // no plan: nothing
  FaultPlan plan(Role::collector, 3, -1, 2, -1);
  CHECK_NOTHROW(fault_point(&plan, Role::compute, 3, 0, 2, Phase::collect));
  CHECK_NOTHROW(fault_point(&plan, Role::collector, 2, 0, 2, Phase::collect));
  CHECK_NOTHROW(fault_point(&plan, Role::collector, 3, 0, 1, Phase::collect));
  CHECK_THROWS_AS(fault_point(&plan, Role::collector, 3, 1, 2, Phase::collect), InjectedFault);
  CHECK_NOTHROW(fault_point(&plan, Role::collector, 3, 1, 2, Phase::collect));  // fired already
  CHECK(parse_role("optimizer") == Role::optimizer);
  CHECK_THROWS_AS(parse_role("gpu"), std::invalid_argument);
}
