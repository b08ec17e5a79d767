// The moment store reads ahead in optimizer_stage_order (tier_bytes.hpp): this checks that order against
// what the optimizer really does. A store that records every acquire for an update (the optimizer's
// leases; the checkpointer, the export and the engine's start read beside it, loading writes over it)
// sees the stages of optimizer_stage_order, step after step: in stage order with clipping, in backward
// order without, through a checkpoint every step.
#include <catch2/catch.hpp>

#include <mutex>

#include "plan/tier_bytes.hpp"
#include "tests/actors/engine_fixture.hpp"
#include "tests/actors/run_dir_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;

namespace {

// Forwards everything to the run's store; remembers the stages acquired for an update, once per visit
// (the optimizer's copy aside for a checkpoint leases the stage right before its update).
class UpdateOrderStore final : public MomentStore {
 public:
  explicit UpdateOrderStore(std::unique_ptr<MomentStore> inner) : inner_(std::move(inner)) {}
  MomentView acquire(std::int64_t stage) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (visits_.empty() || visits_.back() != stage) visits_.push_back(stage);
    }
    return inner_->acquire(stage);
  }
  MomentView acquire_to_overwrite(std::int64_t stage) override { return inner_->acquire_to_overwrite(stage); }
  MomentView acquire_to_read(std::int64_t stage) override { return inner_->acquire_to_read(stage); }
  void release(std::int64_t stage, bool modified) noexcept override { inner_->release(stage, modified); }
  void flush() override { inner_->flush(); }
  void reset(std::int64_t stage) override { inner_->reset(stage); }
  std::size_t ram_bytes() const override { return inner_->ram_bytes(); }
  std::string describe() const override { return inner_->describe(); }
  bool holds_masters() const override { return inner_->holds_masters(); }
  std::string failure() const override { return inner_->failure(); }
  std::size_t disk_bytes() const override { return inner_->disk_bytes(); }
  bool holds(std::int64_t stage) const override { return inner_->holds(stage); }
  std::vector<std::int64_t> visits() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return visits_;
  }

 private:
  std::unique_ptr<MomentStore> inner_;
  mutable std::mutex mutex_;
  std::vector<std::int64_t> visits_;
};

}  // namespace

TEST_CASE("offload: the optimizer acquires its stages in optimizer_stage_order every step", "[actors][offload]") {
  mt::test::TempDir dir("order"), ckpts("order_ckpt");
  Tiny t;
  t.layers = 4;  // 6 stages
  t.steps = 3;
  const std::vector<std::int64_t> forward{0, 1, 2, 3, 4, 5}, backward{5, 4, 3, 2, 1, 0};
  // Clipping or not, gradient accumulators in the tiles or stage gradients (with clipping: two passes,
  // the second updating each stage as its backward ends).
  const std::pair<double, std::string> modes[] = {{1.0, "model"}, {0.0, "model"}, {0.0, "stage"}, {1.0, "stage"}};
  for (const auto& [clip, buffer] : modes) {
    INFO("max_grad_norm " << clip << ", train.gradient_buffer=" << buffer);
    t.max_grad_norm = clip;
    TrainConfig cfg = tiny_config(t);
    cfg.train.offload_dir = dir.path.string();
    cfg.train.offload_staging_stages = 3;
    cfg.train.gradient_buffer = buffer;
    const ModelConfig model = cfg.model_config_from_keys();
    const std::vector<std::int64_t> order = optimizer_stage_order(cfg, model);
    CHECK(order == (clip > 0 && buffer == "model" ? forward : backward));
    auto store = std::make_unique<UpdateOrderStore>(moment_store_for(cfg, model));
    UpdateOrderStore* recorded = store.get();
    HostModel host(model, host_tile_options(cfg), nullptr, std::move(store));
    init_host_model(host, static_cast<std::uint64_t>(cfg.train.seed));
    const auto batches = tiny_batches(t, 8);
    VectorBatchSource source(batches);
    EngineJob job = engine_job(cfg, model, source, host);
    job.checkpoint.root = (ckpts.path / buffer / std::to_string(clip > 0)).string();
    job.checkpoint.save_steps = 1;  // the checkpointer reads every stage every step, beside the optimizer
    const EngineResult r = run_engine(std::move(job));
    REQUIRE(r.error.empty());
    CHECK(r.checkpoints.size() == 3);
    std::vector<std::int64_t> expected;
    for (std::int64_t step = 0; step < t.steps; ++step) expected.insert(expected.end(), order.begin(), order.end());
    CHECK(recorded->visits() == expected);
  }
}
