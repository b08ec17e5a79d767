// One checkpoint written by several writers into a shared directory (a job of several ranks, each
// writing the stages it owns): part writers hand their shards to the publishing writer, whose manifest
// lists them all; the checkpoint reads back bit for bit, and failures leave nothing published.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"
#include "storage/checkpoint/checkpoint_writer.hpp"
#include "tests/storage/checkpoint/ckpt_test_util.hpp"

using namespace mt;
using namespace mt::ckpt;
namespace fs = std::filesystem;

namespace {

constexpr const char* kShared = ".tmp-step-00000005-4242-ranks";

CheckpointWriterOptions part_options(int rank) {
  CheckpointWriterOptions o;
  o.temp_name = kShared;
  if (rank > 0) {
    o.part = true;
    o.shard_prefix = "shard-rank" + std::to_string(rank) + "-";
  }
  return o;
}

void write_values(CheckpointWriter& w, const ModelConfig& c, std::int64_t s) {
  const auto p = test::stage_values(c, s, 0), m = test::stage_values(c, s, 1), v = test::stage_values(c, s, 2);
  w.write_stage(s, {p.data(), m.data(), v.data()});
}

// Stage s is written by writer s % ranks (as cluster::stage_owner deals them).
std::vector<std::unique_ptr<CheckpointWriter>> write_parts(const fs::path& root, const ModelConfig& c, int ranks,
                                                           std::uint64_t max_shard_bytes = std::uint64_t{2} << 30) {
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (int r = 0; r < ranks; ++r) {
    CheckpointWriterOptions o = part_options(r);
    o.max_shard_bytes = max_shard_bytes;
    writers.push_back(std::make_unique<CheckpointWriter>(root, 5, c, o));
  }
  std::vector<std::thread> threads;  // the ranks write at once
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      for (std::int64_t s = r; s < num_stages(c); s += ranks) write_values(*writers[static_cast<std::size_t>(r)], c, s);
    });
  for (auto& t : threads) t.join();
  return writers;
}

}  // namespace

TEST_CASE("writers of one checkpoint in a shared directory: one manifest, every stage bit for bit") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 3);
  for (const std::uint64_t shard_bytes : {std::uint64_t{2} << 30, std::uint64_t{40'000}}) {
    auto writers = write_parts(tmp.path(), c, 3, shard_bytes);
    for (int r = 1; r < 3; ++r) writers[0]->add_part(writers[static_cast<std::size_t>(r)]->close_part());
    const fs::path dir = writers[0]->finalize({{"rng", "x"}});
    CHECK(dir == tmp.path() / "step-00000005");
    CHECK_FALSE(fs::exists(tmp.path() / kShared));
    const auto r = CheckpointReader::open(tmp.path());  // every shard verified
    for (std::int64_t s = 0; s < num_stages(c); ++s) {
      const auto n = stage_layout(c, s).total_floats;
      std::vector<float> p(n), m(n), v(n);
      r.read_stage(s, p.data(), m.data(), v.data());
      CHECK(std::memcmp(p.data(), test::stage_values(c, s, 0).data(), n * 4) == 0);
      CHECK(std::memcmp(v.data(), test::stage_values(c, s, 2).data(), n * 4) == 0);
      const std::string shard = r.manifest()["stages"][static_cast<std::size_t>(s)]["shard"];
      const int writer = static_cast<int>(s % 3);
      CHECK(shard.rfind(writer == 0 ? "shard-0" : "shard-rank" + std::to_string(writer) + "-", 0) == 0);
    }
    CHECK(r.manifest()["shards"].size() >= 3);
  }
}

TEST_CASE("a part's stage written twice, a missing part file or a part writer's misuse are errors") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 2);
  {
    auto writers = write_parts(tmp.path(), c, 2);
    nlohmann::json part = writers[1]->close_part();
    CHECK_THROWS_AS(writers[1]->close_part(), CheckpointError);
    CHECK_THROWS_AS(writers[1]->finalize(), CheckpointError);
    nlohmann::json twice = part;
    twice["shards"] = nlohmann::json::array();
    twice["stages"].push_back(part["stages"][0]);
    CHECK_THROWS_WITH(writers[0]->add_part(twice), Catch::Contains("written twice"));
  }
  CHECK_FALSE(fs::exists(tmp.path() / kShared));  // the publishing writer's abort removed the directory
  {
    auto writers = write_parts(tmp.path(), c, 2);
    nlohmann::json part = writers[1]->close_part();
    fs::remove(tmp.path() / kShared / part["shards"][0]["file"].get<std::string>());
    CHECK_THROWS_WITH(writers[0]->add_part(part), Catch::Contains("not in the checkpoint's directory"));
    CHECK_THROWS_AS(writers[0]->finalize(), CheckpointError);  // the failure sticks: nothing is published
  }
  CHECK_FALSE(read_latest(tmp.path()).has_value());
  {
    auto writers = write_parts(tmp.path(), c, 2);
    CHECK_THROWS_WITH(writers[0]->finalize(), Catch::Contains("before stage 1"));  // rank 1's stages missing
  }
}

TEST_CASE("a part writer that gives up removes only its own files") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::gpt2, 2);
  auto writers = write_parts(tmp.path(), c, 2);
  writers[1]->abort();
  for (const auto& e : fs::directory_iterator(tmp.path() / kShared))
    CHECK(e.path().filename().string().rfind("shard-rank1-", 0) != 0);
  CHECK(fs::exists(tmp.path() / kShared / shard_file_name(0)));
  CHECK_THROWS_AS(writers[1]->close_part(), CheckpointError);
  writers[0]->abort();
  CHECK_FALSE(fs::exists(tmp.path() / kShared));
}

TEST_CASE("a shared temporary name must be a .tmp- name in the root") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 1);
  CheckpointWriterOptions o;
  o.temp_name = "step-00000005";
  CHECK_THROWS_WITH(CheckpointWriter(tmp.path(), 5, c, o), Catch::Contains("must start with .tmp-"));
  o.temp_name = ".tmp-a/b";
  CHECK_THROWS_AS(CheckpointWriter(tmp.path(), 5, c, o), CheckpointError);
}

// A temporary directory outlives its writer when the writer is killed. The sweep removes it once the
// writer is gone, also when the writer is a zombie nobody reaps (a container whose first process reaps no
// orphans: kill(pid, 0) still succeeds there), and keeps a running writer's.
TEST_CASE("stale temporary directories go, also a zombie writer's, and a running writer's stay") {
  test::TempDir tmp;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  for (int i = 0; i < 500 && !fs::exists("/proc/" + std::to_string(child) + "/stat"); ++i) ::usleep(1000);
  ::usleep(50'000);  // the child has exited and is not reaped: a zombie
  const fs::path zombie = tmp / (".tmp-step-00000008-" + std::to_string(child) + "-ranks");
  const fs::path running = tmp / (".tmp-step-00000009-" + std::to_string(::getpid()) + "-0");
  fs::create_directory(zombie);
  fs::create_directory(running);
  remove_stale_temp_dirs(tmp.path());
  CHECK_FALSE(fs::exists(zombie));
  CHECK(fs::exists(running));
  ::waitpid(child, nullptr, 0);
}
