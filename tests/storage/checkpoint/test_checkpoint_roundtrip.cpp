// Checkpoints written stage by stage (from background threads) read back bit for bit; publishing,
// `latest`, retention and misuse.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <thread>

#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"
#include "storage/checkpoint/checkpoint_writer.hpp"
#include "storage/checkpoint/manifest.hpp"
#include "tests/storage/checkpoint/ckpt_test_util.hpp"

using namespace mt;
using namespace mt::ckpt;
namespace fs = std::filesystem;

namespace {

fs::path write_checkpoint(const fs::path& root, const ModelConfig& c, std::int64_t step,
                          const CheckpointWriterOptions& o = {}, int salt = 0, bool moments = true) {
  CheckpointWriter w(root, step, c, o);
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const auto p = test::stage_values(c, s, 0 + salt), m = test::stage_values(c, s, 1 + salt),
               v = test::stage_values(c, s, 2 + salt);
    StageState st{p.data(), moments ? m.data() : nullptr, moments ? v.data() : nullptr};
    w.write_stage(s, st);
  }
  return w.finalize({{"step", step}, {"data_cursor", {{"shard", 3}, {"offset", 12345}}}, {"rng", "state-blob"}});
}

void expect_stage_equal(const CheckpointReader& r, const ModelConfig& c, std::int64_t s, int salt = 0) {
  const auto n = stage_layout(c, s).total_floats;
  std::vector<float> p(n), m(n), v(n);
  r.read_stage(s, p.data(), m.data(), v.data());
  CHECK(std::memcmp(p.data(), test::stage_values(c, s, 0 + salt).data(), n * 4) == 0);
  CHECK(std::memcmp(m.data(), test::stage_values(c, s, 1 + salt).data(), n * 4) == 0);
  CHECK(std::memcmp(v.data(), test::stage_values(c, s, 2 + salt).data(), n * 4) == 0);
}

}  // namespace

TEST_CASE("a checkpoint written from a background thread reads back bit for bit across several shards") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 3);
  CheckpointWriterOptions o;
  o.max_shard_bytes = 60'000;  // a few stages per file
  CheckpointWriter w(tmp.path(), 7, c, o);
  std::thread background([&] {
    for (std::int64_t s = 0; s < num_stages(c); ++s) {
      const auto p = test::stage_values(c, s, 0), m = test::stage_values(c, s, 1), v = test::stage_values(c, s, 2);
      w.write_stage(s, {p.data(), m.data(), v.data()});
    }
  });
  background.join();
  const fs::path dir = w.finalize({{"lr_schedule", {{"step", 7}}}, {"rng", "abc"}});
  CHECK(dir == tmp.path() / "step-00000007");
  CHECK(read_latest(tmp.path())->filename() == "step-00000007");

  const auto r = CheckpointReader::open(tmp.path());
  CHECK(r.step() == 7);
  CHECK(r.manifest().at("shards").size() >= 2);
  CHECK(r.run_state().at("rng") == "abc");
  CHECK(r.model_config().num_hidden_layers == 3);
  for (std::int64_t s = 0; s < num_stages(c); ++s) expect_stage_equal(r, c, s);
  r.verify_datasets();
  // Nothing temporary is left behind.
  for (const auto& e : fs::directory_iterator(tmp.path())) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
}

TEST_CASE("stages may be written concurrently and in any order") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::qwen3, 4);
  CheckpointWriter w(tmp.path(), 1, c);
  auto writer = [&](int parity) {
    for (std::int64_t s = num_stages(c) - 1; s >= 0; --s) {
      if (s % 2 != parity) continue;
      const auto p = test::stage_values(c, s, 0), m = test::stage_values(c, s, 1), v = test::stage_values(c, s, 2);
      w.write_stage(s, {p.data(), m.data(), v.data()});
    }
  };
  std::thread a(writer, 0), b(writer, 1);
  a.join();
  b.join();
  w.finalize();
  const auto r = CheckpointReader::open(tmp.path());
  for (std::int64_t s = 0; s < num_stages(c); ++s) expect_stage_equal(r, c, s);
}

TEST_CASE("a params-only checkpoint has no moments") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::gpt2);
  write_checkpoint(tmp.path(), c, 0, {}, 0, false);
  const auto r = CheckpointReader::open(tmp.path());
  CHECK(r.has_state("params"));
  CHECK_FALSE(r.has_state("exp_avg"));
  std::vector<float> buf(stage_layout(c, 1).total_floats);
  r.read_stage(1, buf.data());
  CHECK(std::memcmp(buf.data(), test::stage_values(c, 1, 0).data(), buf.size() * 4) == 0);
  CHECK_THROWS_WITH(r.read_stage(1, nullptr, buf.data()), Catch::Contains("no 'exp_avg' state"));
}

TEST_CASE("keep-last-N retention keeps the newest and never the only good checkpoint") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::mistral, 1);
  CheckpointWriterOptions o;
  o.keep_last = 2;
  for (int step = 1; step <= 5; ++step) write_checkpoint(tmp.path(), c, step, o);
  auto all = list_checkpoints(tmp.path());
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 4);
  CHECK(all[1].step == 5);
  CHECK(all[1].is_latest);

  // A damaged directory with a higher step must not push out the checkpoint just published.
  fs::create_directory(tmp.path() / "step-00000099");
  o.keep_last = 1;
  write_checkpoint(tmp.path(), c, 6, o);
  all = list_checkpoints(tmp.path());
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 6);
  CHECK(all[0].is_latest);
  CHECK_FALSE(all[1].has_manifest);
  CHECK(CheckpointReader::open(tmp.path()).step() == 6);
}

TEST_CASE("publishing the same step again replaces it atomically") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 1);
  write_checkpoint(tmp.path(), c, 5, {}, 0);
  write_checkpoint(tmp.path(), c, 5, {}, 10);
  const auto r = CheckpointReader::open(tmp.path());
  for (std::int64_t s = 0; s < num_stages(c); ++s) expect_stage_equal(r, c, s, 10);
  CHECK(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()) == 2);  // step dir + latest
}

TEST_CASE("a plan given to the writer is published as plan.json beside the manifest, not in it") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 1);
  const fs::path bare = write_checkpoint(tmp.path(), c, 1);
  CHECK_FALSE(fs::exists(bare / kPlanFile));
  CheckpointWriterOptions o;
  o.plan = {{"boundaries", "mapped"}, {"seq_tile", 128}};
  const fs::path dir = write_checkpoint(tmp.path(), c, 2, o);
  REQUIRE(fs::exists(dir / kPlanFile));
  std::ifstream in(dir / kPlanFile);
  CHECK(nlohmann::json::parse(in) == o.plan);
  CHECK_FALSE(read_manifest(dir / kManifestFile).contains("plan"));
  CHECK(read_manifest(dir / kManifestFile).size() == read_manifest(bare / kManifestFile).size());  // no key added
}

TEST_CASE("writer misuse is a clear error") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 1);
  const auto p = test::stage_values(c, 0, 0);
  {
    CheckpointWriter w(tmp.path(), 1, c);
    w.write_stage(0, {p.data(), nullptr, nullptr});
    CHECK_THROWS_WITH(w.write_stage(0, {p.data(), nullptr, nullptr}), Catch::Contains("stage 0 written twice"));
    CHECK_THROWS_WITH(w.write_stage(9, {p.data(), nullptr, nullptr}), Catch::Contains("stage 9 out of range"));
    const auto q = test::stage_values(c, 1, 0);
    CHECK_THROWS_WITH(w.write_stage(1, {q.data(), q.data(), nullptr}), Catch::Contains("same buffers"));
    CHECK_THROWS_WITH(w.finalize(), Catch::Contains("finalize before stage 1"));
  }
  CHECK(list_checkpoints(tmp.path()).empty());
  {  // a writer stays usable after a misuse error
    CheckpointWriter w(tmp.path() / "again", 1, c);
    w.write_stage(0, {p.data(), nullptr, nullptr});
    CHECK_THROWS(w.finalize());
    const auto q = test::stage_values(c, 1, 0), h = test::stage_values(c, 2, 0);
    w.write_stage(1, {q.data(), nullptr, nullptr});
    w.write_stage(2, {h.data(), nullptr, nullptr});
    w.finalize();
    CHECK(CheckpointReader::open(tmp.path() / "again").step() == 1);
  }
  fs::remove_all(tmp.path() / "again");
  CHECK(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()) == 0);  // temp dir removed
  CHECK_THROWS_WITH(CheckpointReader::open(tmp.path()), Catch::Contains("no `latest` pointer"));
}
