// The Adam moments outside the tiles (train.offload_dir: files on the NVMe tier; train.
// optimizer_compression): with moments on disk, fp32 or lossless, and lossless in RAM, the engine
// equals the all-in-RAM engine (the reference trainer, which the in-RAM engine equals) bit for bit,
// through a crash and restart of each actor and through a checkpoint resume, whatever the offload
// settings of either run. int8 trains: its loss falls and ends close to fp32's. Damage to an offload
// file mid-run is detected and named, the run stops with that error, and the checkpoints already
// written resume to the same bits as an uninterrupted run. train.offload_params (the fp32 masters on
// the tier too) equals the in-RAM engine likewise; a full disk or a truncated file ends the run with
// an error that names the file, the errno and the newest checkpoint.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <filesystem>
#include <fstream>

#include "actors/run_state.hpp"
#include "plan/tier_bytes.hpp"
#include "storage/offload/staged_moment_store.hpp"
#include "tests/actors/engine_fixture.hpp"
#include "tests/actors/run_dir_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::actors::test;
namespace fs = std::filesystem;
using mt::test::TempDir;

namespace {

Tiny base() {
  Tiny t;
  t.micro_batches = 2;
  t.steps = 6;
  t.layers = 4;  // 6 stages through 3 staging slots: every step loads moments from the files
  return t;
}

// offload: "" or a directory; compression: none | lossless | int8.
TrainConfig with_tier(TrainConfig cfg, const std::string& offload, const std::string& compression) {
  cfg.train.offload_dir = offload;
  cfg.train.optimizer_compression = compression;
  cfg.train.offload_staging_stages = 3;
  cfg.train.offload_io_threads = 2;
  return cfg;
}

offload::StagedMomentStore& staged(HostModel& host) {
  return dynamic_cast<offload::StagedMomentStore&>(host.moments());
}

struct Run {
  std::unique_ptr<HostModel> host;
  EngineResult result;
  std::vector<CheckpointEvent> events;
};

Run train(const TrainConfig& cfg, const ModelConfig& model, const std::vector<data::Batch>& batches,
          const std::string& root, std::int64_t stop_after, const fs::path& resume,
          const std::function<void(const StepRecord&, HostModel&)>& on_step = {},
          std::uint64_t snapshot_budget_bytes = std::uint64_t{1} << 30) {
  Run r;
  r.host = std::make_unique<HostModel>(model, host_tile_options(cfg), nullptr, moment_store_for(cfg, model));
  init_host_model(*r.host, static_cast<std::uint64_t>(cfg.train.seed));
  VectorBatchSource source(batches);
  EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = r.host.get();
  job.stop_after = stop_after;
  if (!resume.empty()) job.first_step = load_checkpoint(resume, false, cfg, model, *r.host, &source).step;
  job.checkpoint.root = root;
  job.checkpoint.save_steps = 2;
  job.checkpoint.snapshot_budget_bytes = snapshot_budget_bytes;
  job.on_checkpoint = [&](const CheckpointEvent& e) { r.events.push_back(e); };
  HostModel* host = r.host.get();
  if (on_step) job.on_step = [&, host](const StepRecord& rec) { on_step(rec, *host); };
  r.result = run_engine(std::move(job));
  return r;
}

// One fault in each actor role (step 3): what a restart must survive with the state on the tier.
struct ActorFault {
  Role role;
  std::int64_t mb, stage;
  Phase phase;
};
const ActorFault kActorFaults[] = {{Role::optimizer, -1, 3, Phase::optimize},
                                   {Role::compute, 1, 2, Phase::backward},
                                   {Role::prefetcher, 1, 2, Phase::prefetch},
                                   {Role::collector, 1, 2, Phase::collect},
                                   {Role::loader, 1, -1, Phase::data}};

// The fault fired once, the run restarted once and still ended equal to the reference, loss by loss
// and bit for bit in every tile.
void check_one_restart_equals_reference(const EngineRun& eng, const FaultPlan& plan, const RefRun& ref,
                                        std::int64_t steps) {
  REQUIRE(eng.result.error.empty());
  CHECK(plan.fired.load() == 1);
  CHECK(eng.result.restarts == 1);
  REQUIRE(eng.result.steps_done == steps);
  for (std::int64_t s = 0; s < steps; ++s)
    CHECK(eng.result.steps[static_cast<std::size_t>(s)].loss == ref.losses[static_cast<std::size_t>(s)]);
  CHECK(equals_reference(*eng.host, *ref.trainer));
}

}  // namespace

TEST_CASE(
    "offload: moments on disk (fp32, lossless) and lossless in RAM equal the in-RAM engine through a "
    "restart of each actor",
    "[actors][offload]") {
  TempDir dir("restart");
  const Tiny t = base();
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  const RefRun ref = run_reference(tiny_config(t), model, batches, t.steps);
  const std::pair<std::string, std::string> tiers[] = {
      {dir.path.string(), "none"}, {dir.path.string(), "lossless"}, {"", "lossless"}};
  for (const auto& [where, codec] : tiers)
    for (const ActorFault& f : kActorFaults) {
      const TrainConfig cfg = with_tier(tiny_config(t), where, codec);
      FaultPlan plan(f.role, 3, f.mb, f.stage, static_cast<int>(f.phase));
      EngineRun eng = run_pipeline(cfg, model, batches, &plan);
      INFO(eng.host->moments().describe() << "; fault: " << plan.describe());
      check_one_restart_equals_reference(eng, plan, ref, t.steps);
      const auto st = staged(*eng.host).stats();
      CHECK(st.stores >= static_cast<std::uint64_t>(t.steps * num_stages(model)));
      if (!where.empty()) CHECK(st.file_bytes_read > 0);  // moments really came back from the files
    }
  {
    // Without clipping the optimizer visits stages during the backward (the reverse order).
    Tiny nc = t;
    nc.max_grad_norm = 0.0;
    const TrainConfig cfg = with_tier(tiny_config(nc), dir.path.string(), "none");
    const RefRun ref_nc = run_reference(cfg, model, batches, nc.steps);
    EngineRun eng = run_pipeline(cfg, model, batches);
    REQUIRE(eng.result.error.empty());
    CHECK(equals_reference(*eng.host, *ref_nc.trainer));
  }  // every store removed its own files
}

TEST_CASE(
    "offload_params: the fp32 masters on disk with the moments equal the in-RAM engine through a restart of "
    "each actor",
    "[actors][offload][params]") {
  TempDir dir("params");
  Tiny t = base();
  t.bf16 = true;  // offload_params keeps the bf16 compute copy in RAM and moves the masters
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 16);
  const RefRun ref = run_reference(tiny_config(t), model, batches, t.steps);
  for (const std::string codec : {"none", "lossless"})
    for (const ActorFault& f : kActorFaults) {
      TrainConfig cfg = with_tier(tiny_config(t), dir.path.string(), codec);
      cfg.train.offload_params = true;
      FaultPlan plan(f.role, 3, f.mb, f.stage, static_cast<int>(f.phase));
      EngineRun eng = run_pipeline(cfg, model, batches, &plan);
      INFO(eng.host->moments().describe() << "; fault: " << plan.describe());
      check_one_restart_equals_reference(eng, plan, ref, t.steps);
      for (std::int64_t s = 0; s < eng.host->num_stages(); ++s) CHECK_FALSE(eng.host->tile(s).has_params());
      CHECK(eng.host->moments().holds_masters());
      const auto st = staged(*eng.host).stats();
      CHECK(st.file_bytes_read > 0);  // masters and moments really came back from the files
      // RAM per parameter: the bf16 copy (2 bytes) and the grad (4): the masters are not in the tiles.
      std::size_t floats = 0;
      for (std::int64_t s = 0; s < eng.host->num_stages(); ++s) floats += eng.host->tile(s).floats();
      std::size_t tile_bytes = 0;
      for (std::int64_t s = 0; s < eng.host->num_stages(); ++s) tile_bytes += eng.host->tile(s).bytes();
      CHECK(tile_bytes <= floats * 6 + 64 * static_cast<std::size_t>(eng.host->num_stages()));
      // The planner's figures (StagedMomentStore::footprint) equal the store's own accounting.
      offload::StagedMomentStoreOptions o;
      o.codec = offload::parse_moment_codec(codec);
      o.dir = dir.path.string();
      o.staging_stages = 3;
      o.with_masters = true;
      std::vector<std::size_t> stage_floats;
      for (std::int64_t s = 0; s < eng.host->num_stages(); ++s) stage_floats.push_back(eng.host->tile(s).floats());
      const auto fp = offload::StagedMomentStore::footprint(stage_floats, o);
      CHECK(fp.ram == eng.host->moments().ram_bytes());
      CHECK(fp.disk == eng.host->moments().disk_bytes());
      CHECK(host_model_bytes(model, host_tile_options(cfg)) == tile_bytes);
      const TierBytes tiers = tier_bytes(cfg, model);  // from the config alone: the planner's query
      CHECK(tiers.tiles == tile_bytes);
      CHECK(tiers.staging == eng.host->moments().ram_bytes());
      CHECK(tiers.disk == eng.host->moments().disk_bytes());
    }
}

TEST_CASE("offload_params: checkpoint resume to and from the masters on disk equals an uninterrupted run",
          "[actors][offload][params][checkpoint]") {
  TempDir dir("params_resume"), ckpts("params_resume_ckpt");
  Tiny t = base();
  t.steps = 8;
  t.bf16 = true;
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 32);
  const RefRun ref = run_reference(tiny_config(t), model, batches, t.steps);
  const TrainConfig ram = tiny_config(t);
  TrainConfig params = with_tier(tiny_config(t), dir.path.string(), "none");
  params.train.offload_params = true;
  TrainConfig params_z = with_tier(tiny_config(t), dir.path.string(), "lossless");
  params_z.train.offload_params = true;
  const std::pair<const TrainConfig*, const TrainConfig*> pairs[] = {
      {&params, &ram}, {&ram, &params_z}, {&params_z, &params}};
  int k = 0;
  for (const auto& [first, second] : pairs) {
    const fs::path root = ckpts.path / std::to_string(k++);
    const Run a = train(*first, model, batches, root.string(), 4, {});
    REQUIRE(a.result.error.empty());
    REQUIRE_FALSE(a.events.empty());
    for (const auto& e : a.events) CHECK(e.ok);
    REQUIRE(a.result.steps_done == 4);
    const Run b = train(*second, model, batches, root.string(), -1, root);
    REQUIRE(b.result.error.empty());
    REQUIRE(b.result.steps_done == t.steps);
    CHECK(equals_reference(*b.host, *ref.trainer));
  }
}

TEST_CASE("offload: checkpoint resume across tier settings equals an uninterrupted run bit for bit",
          "[actors][offload][checkpoint]") {
  TempDir dir("resume"), ckpts("resume_ckpt");
  Tiny t = base();
  t.steps = 8;
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 32);
  const RefRun ref = run_reference(tiny_config(t), model, batches, t.steps);
  const TrainConfig ram = tiny_config(t);
  const TrainConfig disk = with_tier(tiny_config(t), dir.path.string(), "none");
  const TrainConfig disk_z = with_tier(tiny_config(t), dir.path.string(), "lossless");
  const std::pair<const TrainConfig*, const TrainConfig*> pairs[] = {{&disk, &ram}, {&ram, &disk_z}, {&disk_z, &disk}};
  int k = 0;
  for (const auto& [first, second] : pairs) {
    const fs::path root = ckpts.path / std::to_string(k++);
    const Run a = train(*first, model, batches, root.string(), 4, {});
    for (const auto& e : a.events) INFO("checkpoint " << e.step << ": " << (e.ok ? e.path : e.error));
    REQUIRE(a.result.error.empty());
    REQUIRE_FALSE(a.events.empty());
    for (const auto& e : a.events) CHECK(e.ok);
    REQUIRE(a.result.steps_done == 4);
    const Run b = train(*second, model, batches, root.string(), -1, root);
    REQUIRE(b.result.error.empty());
    REQUIRE(b.result.steps_done == t.steps);
    CHECK(equals_reference(*b.host, *ref.trainer));
  }
}

TEST_CASE("offload: int8 moments train close to fp32 moments", "[actors][offload][int8]") {
  Tiny t;
  t.steps = 40;
  t.layers = 3;
  t.hidden = 64;
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 40);
  EngineRun fp32 = run_pipeline(tiny_config(t), model, batches);
  for (const std::string where : {"", "disk"}) {
    TempDir dir("int8");
    EngineRun q =
        run_pipeline(with_tier(tiny_config(t), where.empty() ? "" : dir.path.string(), "int8"), model, batches);
    REQUIRE(q.result.error.empty());
    const double first = q.result.steps.front().loss, last = q.result.steps.back().loss;
    const double ref_last = fp32.result.steps.back().loss;
    INFO("int8 " << where << ": first " << first << " last " << last << ", fp32 last " << ref_last);
    CHECK(last < first - 0.5);
    CHECK(std::abs(last - ref_last) < 0.05 * ref_last + 0.02);
    const auto st = staged(*q.host).stats();
    CHECK(static_cast<double>(st.encoded_bytes) / static_cast<double>(st.raw_bytes) < 0.27);  // ~2 of 8 bytes
  }
}

TEST_CASE("offload: int8 training does not depend on which stages stay in their staging slots",
          "[actors][offload][int8]") {
  // A stage found still in its slot is served without a load; a lossy code must give it the same
  // moments a load would (the slot keeps the decoded values), or the run would follow the workers'
  // timing. 3 slots for 6 stages (every step loads), a slot for every stage (nothing is ever loaded
  // again), and the files on disk: the same bits.
  Tiny t = base();
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 32);
  TempDir dir("int8_slots");
  TrainConfig few = with_tier(tiny_config(t), "", "int8");
  TrainConfig all = few;
  all.train.offload_staging_stages = model.num_hidden_layers + 2;
  const TrainConfig disk = with_tier(tiny_config(t), dir.path.string(), "int8");
  EngineRun a = run_pipeline(few, model, batches), b = run_pipeline(all, model, batches),
            c = run_pipeline(disk, model, batches);
  for (EngineRun* r : {&a, &b, &c}) REQUIRE(r->result.error.empty());
  CHECK(staged(*a.host).stats().loads > staged(*b.host).stats().loads);
  CHECK(tiles_equal(*a.host, *b.host));
  CHECK(tiles_equal(*a.host, *c.host));
}

TEST_CASE("offload: a damaged offload file mid-run is named, the run stops, the checkpoints resume exactly",
          "[actors][offload][damage]") {
  TempDir dir("damage"), ckpts("damage_ckpt");
  Tiny t = base();
  t.steps = 8;
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 32);
  const TrainConfig cfg = with_tier(tiny_config(t), dir.path.string(), "none");
  std::vector<std::string> files;
  // After step 5 a byte of every stage file flips: the stages not held in a staging slot are read
  // from their files during step 6 and fail their block checksums.
  const Run a = train(cfg, model, batches, ckpts.path.string(), -1, {}, [&](const StepRecord& rec, HostModel& host) {
    if (rec.step != 5) return;
    for (std::int64_t s = 0; s < host.num_stages(); ++s) {
      const std::string p = staged(host).file_path(s);
      files.push_back(p);
      std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4096 + 100);  // inside the payload (after the header region)
      f.put('\x7f');
    }
  });
  INFO(a.result.error);
  REQUIRE_FALSE(a.result.error.empty());
  CHECK_THAT(a.result.error, Catch::Contains("offload file") && Catch::Contains("checksum"));
  bool named = false;
  for (const auto& p : files) named = named || a.result.error.find(p) != std::string::npos;
  CHECK(named);
  CHECK(a.result.steps_done < t.steps);
  // What the checkpoints hold is intact: resuming from the latest one (in RAM) ends where an
  // uninterrupted run ends.
  const RefRun ref = run_reference(tiny_config(t), model, batches, t.steps);
  const Run b = train(tiny_config(t), model, batches, ckpts.path.string(), -1, ckpts.path);
  REQUIRE(b.result.error.empty());
  CHECK(equals_reference(*b.host, *ref.trainer));
}

TEST_CASE(
    "offload: a full disk (file-size limit) or a truncated file mid-run ends the run naming the file, the "
    "errno and the newest checkpoint, which resumes exactly",
    "[actors][offload][damage]") {
  Tiny t = base();
  t.steps = 8;
  t.bf16 = true;
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  const auto batches = tiny_batches(t, 32);
  const RefRun ref = run_reference(tiny_config(t), model, batches, t.steps);
  // A file-size limit makes a write past it fail with EFBIG (SIGXFSZ would kill the process: the
  // node binary ignores it too, training_run.cpp).
  struct sigaction ignore {
  }, saved{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGXFSZ, &ignore, &saved);
  for (const std::string damage : {"full", "truncated"}) {
    TempDir dir("fail_" + damage), ckpts("fail_ckpt_" + damage);
    TrainConfig cfg = with_tier(tiny_config(t), dir.path.string(), "none");
    cfg.train.offload_params = true;
    struct rlimit before {};
    ::getrlimit(RLIMIT_FSIZE, &before);
    std::vector<std::string> files;
    // After step 5: no file may grow past its 4096-byte header region (every write of a stage's state
    // fails: EFBIG), or every stage file loses its payload (the next reads fail: truncated).
    // Budget 0: the optimizer waits for each checkpoint (no copy on write), so the checkpoint of step 4
    // is durable before the failure at step 5; with copies a checkpoint may still be writing then.
    const Run a = train(
        cfg, model, batches, ckpts.path.string(), -1, {},
        [&](const StepRecord& rec, HostModel& host) {
          if (rec.step != 5) return;
          for (std::int64_t s = 0; s < host.num_stages(); ++s) files.push_back(staged(host).file_path(s));
          if (damage == "full") {
            struct rlimit lim = before;
            lim.rlim_cur = 4096;
            ::setrlimit(RLIMIT_FSIZE, &lim);
          } else {
            for (const auto& p : files) fs::resize_file(p, 4096);
          }
        },
        0);
    ::setrlimit(RLIMIT_FSIZE, &before);
    INFO(damage << ": " << a.result.error);
    REQUIRE_FALSE(a.result.error.empty());
    CHECK(a.result.steps_done < t.steps);
    CHECK_THAT(a.result.error, Catch::StartsWith("the NVMe tier failed: offload file "));
    bool named = false;
    for (const auto& p : files) named = named || a.result.error.find(p) != std::string::npos;
    CHECK(named);
    if (damage == "full")
      CHECK_THAT(a.result.error, Catch::Contains(std::strerror(EFBIG)));  // the errno, also after a short write
    else
      CHECK_THAT(a.result.error, Catch::Contains("truncated"));
    const CheckpointEvent* newest = nullptr;
    for (const auto& e : a.events)
      if (e.ok && (newest == nullptr || e.step > newest->step)) newest = &e;
    REQUIRE(newest != nullptr);
    CHECK_THAT(a.result.error,
               Catch::Contains("the newest checkpoint, step " + std::to_string(newest->step) + " at " + newest->path));
    // Nothing a checkpoint holds was lost: resuming from the newest (with the masters on the tier
    // again) ends where an uninterrupted run ends.
    const Run b = train(cfg, model, batches, ckpts.path.string(), -1, newest->path);
    REQUIRE(b.result.error.empty());
    CHECK(equals_reference(*b.host, *ref.trainer));
  }
  ::sigaction(SIGXFSZ, &saved, nullptr);
}
