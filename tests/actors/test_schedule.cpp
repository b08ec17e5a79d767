// The exact schedule the prefetcher and compute walk, and the fault hook's matching.
#include <catch2/catch.hpp>

#include "actors/fault.hpp"
#include "actors/schedule.hpp"

using namespace mt;
using namespace mt::actors;

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

  Pos p{0, 1, 6};
  p = next_pos(p, 7, 2);
  CHECK(p == Pos{1, 0, 0});
  p = next_pos(p, 7, 2);
  CHECK(p == Pos{1, 0, 1});
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
