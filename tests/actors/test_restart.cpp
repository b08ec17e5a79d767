// Restart: a crash of any one pipeline actor mid-step (the test-only fault hook makes it throw at a
// chosen (step, micro-batch, stage, phase)) is supervised: the node restarts the actor, re-issues its
// in-flight work, and the final weights, moments and losses are bit-identical to an uninterrupted run
// (the reference trainer). Also run under the ASan/UBSan preset and, with a TSan-built CAF, under
// ThreadSanitizer (tools/test-tsan-actors, part of the README's test command).
#include <catch2/catch.hpp>

#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;

namespace {

// documents: the batches packed as documents (with_documents).
void check_restart(const Tiny& t, Role role, std::int64_t step, std::int64_t mb, std::int64_t stage, Phase phase,
                   bool documents = false) {
  const TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = documents ? with_documents(tiny_batches(t, 16)) : tiny_batches(t, 16);
  FaultPlan plan(role, step, mb, stage, static_cast<int>(phase));
  INFO("fault: " << plan.describe() << "; arch " << arch_name(t.arch) << " clip " << t.max_grad_norm << " K "
                 << t.weight_slots);
  EngineRun eng = run_pipeline(cfg, model, batches, &plan);
  RefRun ref = run_reference(cfg, model, batches, t.steps);
  REQUIRE(eng.result.error.empty());
  CHECK(plan.fired.load() == 1);
  CHECK(eng.result.restarts == 1);
  INFO("restart log: " << restart_log_text(eng.result));
  REQUIRE(eng.result.steps_done == t.steps);
  REQUIRE(eng.result.steps.size() == static_cast<std::size_t>(t.steps));
  for (std::int64_t s = 0; s < t.steps; ++s) {
    INFO("step " << s + 1);
    CHECK(eng.result.steps[static_cast<std::size_t>(s)].loss == ref.losses[static_cast<std::size_t>(s)]);
  }
  CHECK(equals_reference(*eng.host, *ref.trainer));
}

Tiny base() {
  Tiny t;
  t.micro_batches = 2;
  t.steps = 6;
  t.layers = 3;
  return t;
}

}  // namespace

TEST_CASE("restart: data loader crash mid-step", "[actors][restart]") {
  check_restart(base(), Role::loader, 3, 1, -1, Phase::data);
}

TEST_CASE("restart: prefetcher crash mid-step", "[actors][restart]") {
  check_restart(base(), Role::prefetcher, 3, 1, 2, Phase::prefetch);
  Tiny t = base();
  t.weight_slots = 3;
  check_restart(t, Role::prefetcher, 2, 0, 3, Phase::prefetch);
}

TEST_CASE("restart: compute crash mid-step", "[actors][restart]") {
  check_restart(base(), Role::compute, 3, 1, 2, Phase::backward);  // mid-backward
  check_restart(base(), Role::compute, 3, 0, 2, Phase::forward);   // mid-forward
  Tiny g = base();
  g.arch = Arch::gpt2;  // tied embeddings: stage 0 staging held
  check_restart(g, Role::compute, 2, 1, 0, Phase::backward);
  check_restart(g, Role::compute, 2, 1, g.layers + 1, Phase::head);
}

TEST_CASE("restart: compute crash with the last layers' intermediates kept", "[actors][restart]") {
  const Tiny t = with_kept_layers(base(), 2);  // layers 2 and 3 of 3 keep theirs
  REQUIRE(plan_engine(tiny_config(t), tiny_config(t).model_config_from_keys()).kept_layers == 2);
  check_restart(t, Role::compute, 3, 1, 3, Phase::backward);  // a kept layer's backward
  check_restart(t, Role::compute, 3, 0, 2, Phase::forward);   // a kept layer's forward
  check_restart(t, Role::collector, 2, 1, 2, Phase::collect);
}

TEST_CASE("restart: documents continue bit-identically after a crash of the loader or compute",
          "[actors][restart][documents]") {
  check_restart(base(), Role::loader, 3, 1, -1, Phase::data, true);
  check_restart(base(), Role::compute, 3, 1, 2, Phase::backward, true);
  Tiny g = base();
  g.arch = Arch::gpt2;  // learned positions at the documents' positions
  check_restart(g, Role::compute, 2, 1, 0, Phase::backward, true);
}

TEST_CASE("restart: boundaries on the host and the sequential order", "[actors][restart]") {
  Tiny t = base();
  t.keep = "boundary_host";
  // Micro-batch 1's forward runs interleaved with micro-batch 0's backward: its ring entries and
  // their copies to the host are in flight at the crash.
  check_restart(t, Role::compute, 3, 1, 2, Phase::forward);
  check_restart(t, Role::compute, 3, 0, 1, Phase::backward);
  check_restart(t, Role::prefetcher, 3, 1, 2, Phase::prefetch);           // a weights load
  check_restart(t, Role::prefetcher, 3, 0, 2, Phase::prefetch_boundary);  // layer 2's input boundary
  // A limited link keeps copies to the host in flight while another actor crashes and the barrier
  // runs (compute queued them; its reset waits for them).
  Tiny slow = t;
  slow.bandwidth_gbps = 0.02;
  check_restart(slow, Role::collector, 3, 1, 2, Phase::collect);
  check_restart(slow, Role::prefetcher, 3, 1, 1, Phase::prefetch_boundary);
  Tiny g = t;
  g.arch = Arch::gpt2;  // tied embeddings: the head's embedding gradient staged until the embed backward
  check_restart(g, Role::compute, 2, 1, 0, Phase::backward);
  check_restart(g, Role::compute, 2, 1, g.layers + 1, Phase::head);
  t.schedule = "sequential";
  check_restart(t, Role::compute, 3, 1, 2, Phase::backward);
  check_restart(t, Role::prefetcher, 2, 0, 1, Phase::prefetch_boundary);
}

TEST_CASE("restart: bf16 runs continue bit-identically after a crash of any actor", "[actors][restart][bf16]") {
  Tiny t = base();
  t.bf16 = true;
  check_restart(t, Role::compute, 3, 1, 2, Phase::backward);
  check_restart(t, Role::prefetcher, 3, 1, 2, Phase::prefetch);
  check_restart(t, Role::collector, 3, 1, 2, Phase::collect);
  check_restart(t, Role::optimizer, 3, -1, 2, Phase::optimize);  // mid-update burst: some copies new, some old
  check_restart(t, Role::loader, 3, 1, -1, Phase::data);
  Tiny g = t;
  g.arch = Arch::gpt2;
  g.keep = "boundary_host";
  check_restart(g, Role::compute, 2, 1, g.layers + 1, Phase::head);
}

TEST_CASE("restart: the MoE families continue bit-identically after a crash of compute or the optimizer",
          "[actors][restart][moe]") {
  for (const Arch arch : {Arch::mixtral, Arch::gpt_oss}) {
    Tiny t = base();
    t.arch = arch;
    t.sliding_window = arch == Arch::gpt_oss ? 3 : 0;
    t.bf16 = arch == Arch::gpt_oss;
    check_restart(t, Role::compute, 3, 1, 2, Phase::backward);
    check_restart(t, Role::compute, 2, 0, 1, Phase::forward);
    check_restart(t, Role::optimizer, 3, -1, 2, Phase::optimize);
  }
  // The load-balancing loss: a crash between a micro-batch's forward and its backward, and in the head.
  Tiny lb = base();
  lb.arch = Arch::mixtral;
  lb.output_router_logits = true;
  lb.router_aux_loss_coef = 0.3;
  check_restart(lb, Role::compute, 3, 1, 2, Phase::backward);
  check_restart(lb, Role::compute, 3, 0, lb.layers + 1, Phase::head);
  check_restart(lb, Role::compute, 2, 1, 2, Phase::forward);
}

TEST_CASE("restart: gradient collector crash mid-step", "[actors][restart]") {
  check_restart(base(), Role::collector, 3, 1, 2, Phase::collect);
  check_restart(base(), Role::collector, 3, 0, 4, Phase::collect);
}

TEST_CASE("restart: optimizer crash mid-step", "[actors][restart]") {
  // With clipping: stages 0 is updated, the crash hits stage 2, while the next forward streams.
  check_restart(base(), Role::optimizer, 3, -1, 2, Phase::optimize);
  // Without clipping: updates happen during backward, as each stage completes.
  Tiny t = base();
  t.max_grad_norm = 0.0;
  check_restart(t, Role::optimizer, 3, -1, 2, Phase::optimize);
}

// train.gradient_buffer=stage with clipping: a step is two passes over its one micro-batch (fault points
// count the pass as the micro-batch: 0 sums the squares, 1 replays the head and backward from pass 0's
// activations and updates each stage from its slot). A crash of any actor in either pass, and without
// clipping (one pass), continues bit-identically.
TEST_CASE("restart: stage gradients, a crash of each actor in either pass", "[actors][restart][stage_gradients]") {
  Tiny t = base();
  t.micro_batches = 1;
  t.gradient_buffer = "stage";
  for (std::int64_t pass : {0, 1}) {
    INFO("pass " << pass);
    check_restart(t, Role::compute, 3, pass, 2, Phase::backward);
    check_restart(t, Role::compute, 3, pass, t.layers + 1, Phase::head);
    check_restart(t, Role::prefetcher, 3, pass, 2, Phase::prefetch);
    check_restart(t, Role::collector, 3, pass, 2, Phase::collect);
    check_restart(t, Role::collector, 3, pass, 0, Phase::collect);
  }
  check_restart(t, Role::compute, 3, 0, 1, Phase::forward);      // only the first pass runs a forward
  check_restart(t, Role::optimizer, 3, -1, 2, Phase::optimize);  // the second pass's updates, in backward order
  check_restart(t, Role::optimizer, 3, -1, 0, Phase::optimize);
  check_restart(t, Role::loader, 3, 0, -1, Phase::data);
  Tiny g = t;
  g.arch = Arch::gpt2;  // tied embeddings: the head's embedding gradient staged until the embed backward
  g.bf16 = true;
  g.keep = "boundary_host";
  check_restart(g, Role::compute, 2, 1, 0, Phase::backward);
  check_restart(g, Role::compute, 2, 1, g.layers + 1, Phase::head);
  check_restart(g, Role::prefetcher, 2, 1, 2, Phase::prefetch_boundary);
  check_restart(g, Role::collector, 2, 0, 0, Phase::collect);
  check_restart(g, Role::optimizer, 2, -1, 1, Phase::optimize);
  Tiny slow = t;  // over a link: the gradient lands in the slot's host buffer
  slow.bandwidth_gbps = 0.02;
  check_restart(slow, Role::collector, 3, 1, 2, Phase::collect);
  check_restart(slow, Role::optimizer, 3, -1, 2, Phase::optimize);
  Tiny one = t;
  one.max_grad_norm = 0.0;  // one pass
  check_restart(one, Role::collector, 3, 0, 2, Phase::collect);
  check_restart(one, Role::optimizer, 3, -1, 2, Phase::optimize);
  check_restart(one, Role::compute, 3, 0, 2, Phase::backward);
}

// Stage gradients of several micro-batches (layer-major, two stage accumulators): fault points count
// pass p of data micro-batch m as micro-batch p * M + m. A crash while a stage is half summed, while
// the optimizer holds an accumulator, or while work waits for one, continues bit-identically.
TEST_CASE("restart: stage gradients of several micro-batches, a crash of each actor in either pass",
          "[actors][restart][stage_gradients]") {
  Tiny t = base();
  t.micro_batches = 2;
  t.gradient_buffer = "stage";
  const std::int64_t M = t.micro_batches;
  for (std::int64_t pass : {0, 1})
    for (std::int64_t mb : {0, 1}) {
      INFO("pass " << pass << " micro-batch " << mb);
      const std::int64_t work = pass * M + mb;
      check_restart(t, Role::compute, 3, work, 2, Phase::backward);
      check_restart(t, Role::compute, 3, work, t.layers + 1, Phase::head);
      check_restart(t, Role::collector, 3, work, 2, Phase::collect);
      check_restart(t, Role::collector, 3, work, 0, Phase::collect);
    }
  check_restart(t, Role::prefetcher, 3, 1, 2, Phase::prefetch);
  check_restart(t, Role::prefetcher, 3, M + 1, 1, Phase::prefetch);
  check_restart(t, Role::compute, 3, 1, 1, Phase::forward);
  check_restart(t, Role::optimizer, 3, -1, 2, Phase::optimize);
  check_restart(t, Role::optimizer, 3, -1, 0, Phase::optimize);
  check_restart(t, Role::loader, 3, 1, -1, Phase::data);
  Tiny g = t;
  g.arch = Arch::gpt2;  // tied embeddings: every micro-batch's embedding gradient staged until its embed backward
  g.bf16 = true;
  g.keep = "boundary_host";
  check_restart(g, Role::compute, 2, M + 1, 0, Phase::backward);
  check_restart(g, Role::compute, 2, M, g.layers + 1, Phase::head);
  check_restart(g, Role::prefetcher, 2, M + 1, 2, Phase::prefetch_boundary);
  check_restart(g, Role::collector, 2, 1, 0, Phase::collect);
  check_restart(g, Role::optimizer, 2, -1, 1, Phase::optimize);
  Tiny slow = t;  // over a link: each gradient lands in the collector's host buffer first
  slow.bandwidth_gbps = 0.02;
  check_restart(slow, Role::collector, 3, M + 1, 2, Phase::collect);
  check_restart(slow, Role::optimizer, 3, -1, 2, Phase::optimize);
  Tiny one = t;
  one.max_grad_norm = 0.0;  // one pass
  one.micro_batches = 3;
  check_restart(one, Role::collector, 3, 2, 2, Phase::collect);
  check_restart(one, Role::optimizer, 3, -1, 2, Phase::optimize);
  check_restart(one, Role::compute, 3, 1, 2, Phase::backward);
}
