// Evaluation (train.eval_steps): the engine evaluates the weights after every eval_steps steps and at
// the end, forward only through the streamed pipeline. Oracle: the sequential reference trainer,
// trained on the same batches, evaluated with the same weights on the same evaluation batches (its
// loss-only forward): the losses must be equal bit for bit, and evaluating must not change training
// (weights, moments and step losses still equal the reference's). A crash of any pipeline actor during
// an evaluation pass is restarted like one during training, with the same results.
#include <catch2/catch.hpp>

#include <cmath>

#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;

namespace {

// The reference's evaluation after each of `points` steps: loss sum and count over `eval` in order.
std::vector<LossSum> reference_evaluations(const TrainConfig& cfg, const ModelConfig& model,
                                           const std::vector<data::Batch>& train, const std::vector<data::Batch>& eval,
                                           const std::vector<std::int64_t>& points, RefRun& ref_out) {
  std::vector<LossSum> out;
  std::int64_t done = 0;
  for (std::int64_t p : points) {
    // Train up to p steps (a fresh reference each time keeps run_reference's step loop as is).
    ref_out = run_reference(cfg, model, train, p);
    done = p;
    LossSum total;
    for (const auto& b : eval) {
      const LossSum l = ref_out.trainer->eval_loss_sum(b.inputs.data(), b.targets.data());
      total.loss_sum += l.loss_sum;
      total.counted += l.counted;
    }
    out.push_back(total);
  }
  (void)done;
  return out;
}

struct EvalRun {
  std::unique_ptr<HostModel> host;
  EngineResult result;
  std::vector<EvalRecord> reported;  // through on_eval
};

EvalRun run_with_evaluation(const TrainConfig& cfg, const ModelConfig& model, const std::vector<data::Batch>& train,
                            const std::vector<data::Batch>& eval, FaultPlan* fault = nullptr) {
  EvalRun r;
  r.host = std::make_unique<HostModel>(model, host_tile_options(cfg));
  init_host_model(*r.host, static_cast<std::uint64_t>(cfg.train.seed));
  VectorBatchSource source(train);
  VectorBatchSource eval_source(eval);
  EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = r.host.get();
  job.fault = fault;
  job.eval_data = &eval_source;
  job.eval_batches = static_cast<std::int64_t>(eval.size());
  job.on_eval = [&](const EvalRecord& e) { r.reported.push_back(e); };
  r.result = run_engine(std::move(job));
  return r;
}

void check_evaluation(const Tiny& t, std::int64_t eval_steps) {
  TrainConfig cfg = tiny_config(t);
  cfg.train.eval_steps = eval_steps;
  const ModelConfig model = cfg.model_config_from_keys();
  const auto train = tiny_batches(t, 16);
  const auto eval = tiny_batches(t, 3, 7);
  std::vector<std::int64_t> points;
  for (std::int64_t s = 1; s <= t.steps; ++s)
    if ((eval_steps > 0 && s % eval_steps == 0) || s == t.steps) points.push_back(s);
  INFO("arch " << arch_name(t.arch) << (t.bf16 ? " bf16" : " fp32") << " keep=" << t.keep << " M=" << t.micro_batches
               << " eval_steps=" << eval_steps);
  EvalRun eng = run_with_evaluation(cfg, model, train, eval);
  RefRun ref;
  const auto expected = reference_evaluations(cfg, model, train, eval, points, ref);
  REQUIRE(eng.result.error.empty());
  REQUIRE(eng.result.steps_done == t.steps);
  REQUIRE(eng.result.steps.size() == static_cast<std::size_t>(t.steps));
  REQUIRE(eng.result.evaluations.size() == points.size());
  REQUIRE(eng.reported.size() == points.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    const EvalRecord& e = eng.result.evaluations[i];
    INFO("evaluation after step " << points[i]);
    CHECK(e.step == points[i]);
    CHECK(e.batches == 3);
    CHECK(e.tokens == expected[i].counted);
    CHECK(e.loss == expected[i].loss_sum / static_cast<double>(expected[i].counted));
    CHECK(e.perplexity == std::exp(e.loss));
    CHECK(eng.reported[i].loss == e.loss);
  }
  // The weights learned: the evaluation loss fell (against the first evaluation, or the initial
  // weights' loss on the same batches).
  const ModelConfig& mc = model;
  RefRun fresh = run_reference(cfg, mc, train, 0);
  LossSum initial;
  for (const auto& b : eval) {
    const LossSum l = fresh.trainer->eval_loss_sum(b.inputs.data(), b.targets.data());
    initial.loss_sum += l.loss_sum;
    initial.counted += l.counted;
  }
  CHECK(eng.result.evaluations.back().loss < initial.loss_sum / static_cast<double>(initial.counted));
  // Training is unaffected: the reference trained to the end (the last point) equals the engine.
  for (std::int64_t s = 0; s < t.steps; ++s) {
    INFO("step " << s + 1);
    CHECK(eng.result.steps[static_cast<std::size_t>(s)].loss == ref.losses[static_cast<std::size_t>(s)]);
  }
  CHECK(equals_reference(*eng.host, *ref.trainer));
}

Tiny base() {
  Tiny t;
  t.steps = 6;
  t.layers = 3;
  return t;
}

}  // namespace

TEST_CASE("evaluation equals the reference trainer's loss-only forward, and leaves training unchanged",
          "[actors][evaluation]") {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (std::int64_t m : {1, 2}) {
      Tiny t = base();
      t.arch = arch;
      t.micro_batches = m;
      check_evaluation(t, 2);
    }
}

TEST_CASE("evaluation: only at the end, bf16, kept intermediates and boundaries on the host", "[actors][evaluation]") {
  Tiny t = base();
  check_evaluation(t, 0);
  t.bf16 = true;
  check_evaluation(t, 4);  // steps 4 and 6 (the end)
  t.bf16 = false;
  t.keep = "all";
  check_evaluation(t, 3);
  t.keep = "boundary_host";
  t.micro_batches = 2;
  check_evaluation(t, 3);
}

TEST_CASE("evaluation: a crash of any pipeline actor during an evaluation pass is restarted, same results",
          "[actors][evaluation][restart]") {
  Tiny t = base();
  TrainConfig cfg = tiny_config(t);
  cfg.train.eval_steps = 2;
  const ModelConfig model = cfg.model_config_from_keys();
  const auto train = tiny_batches(t, 16);
  const auto eval = tiny_batches(t, 3, 7);
  const EvalRun clean = run_with_evaluation(cfg, model, train, eval);
  REQUIRE(clean.result.error.empty());
  // Evaluation micro-batch 2 exists only in the passes (training has one micro-batch per step); the
  // pass after step 4 runs at schedule step 4.
  struct Case {
    Role role;
    std::int64_t stage;
    Phase phase;
  };
  for (const Case& c : {Case{Role::loader, -1, Phase::data}, Case{Role::prefetcher, 2, Phase::prefetch},
                        Case{Role::compute, 2, Phase::forward}, Case{Role::compute, 4, Phase::head}}) {
    FaultPlan plan(c.role, 4, 2, c.stage, static_cast<int>(c.phase));
    INFO("fault: " << plan.describe());
    const EvalRun eng = run_with_evaluation(cfg, model, train, eval, &plan);
    REQUIRE(eng.result.error.empty());
    CHECK(plan.fired.load() == 1);
    CHECK(eng.result.restarts == 1);
    REQUIRE(eng.result.evaluations.size() == clean.result.evaluations.size());
    for (std::size_t i = 0; i < clean.result.evaluations.size(); ++i)
      CHECK(eng.result.evaluations[i].loss == clean.result.evaluations[i].loss);
    CHECK(tiles_equal(*eng.host, *clean.host));
  }
}
