// Damage and crashes: a flipped byte in any shard, a truncated shard, a deleted manifest, a writer
// killed with SIGKILL mid-write, a full disk. Each is detected (the error names the file) or leaves
// the previous checkpoint as the one that loads.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"
#include "storage/checkpoint/checkpoint_writer.hpp"
#include "tests/storage/checkpoint/ckpt_test_util.hpp"

using namespace mt;
using namespace mt::ckpt;
namespace fs = std::filesystem;

namespace {

const ModelConfig kConfig = test::tiny_config(Arch::qwen2, 3);

fs::path write_checkpoint(const fs::path& root, std::int64_t step, std::uint64_t shard_bytes = 50'000) {
  CheckpointWriterOptions o;
  o.max_shard_bytes = shard_bytes;
  CheckpointWriter w(root, step, kConfig, o);
  for (std::int64_t s = 0; s < num_stages(kConfig); ++s) {
    const auto p = test::stage_values(kConfig, s, 0), m = test::stage_values(kConfig, s, 1),
               v = test::stage_values(kConfig, s, 2);
    w.write_stage(s, {p.data(), m.data(), v.data()});
  }
  return w.finalize({{"step", step}});
}

std::vector<fs::path> shards_of(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string open_error(const fs::path& path, Verify verify = Verify::full) {
  try {
    CheckpointReader::open(path, Fallback::none, verify);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a flipped byte anywhere in any shard is detected and the error names the shard") {
  test::TempDir tmp;
  const fs::path dir = write_checkpoint(tmp.path(), 1);
  const auto shards = shards_of(dir);
  REQUIRE(shards.size() >= 2);
  for (const auto& shard : shards) {
    const auto size = fs::file_size(shard);
    for (std::uint64_t offset : {std::uint64_t{100}, size / 2, size - 1}) {
      test::flip_byte(shard, offset);
      const std::string err = open_error(dir);
      INFO(shard << " offset " << offset << ": " << err);
      CHECK_THAT(err, Catch::Contains(shard.string()));
      CHECK_THAT(err, Catch::Contains("checksum"));
      test::flip_byte(shard, offset);  // undo
      CHECK(open_error(dir).empty());
    }
  }
}

TEST_CASE("a flipped data byte is caught per dataset even without the whole-file check") {
  test::TempDir tmp;
  const fs::path dir = write_checkpoint(tmp.path(), 1, 1u << 30);
  const auto shard = shards_of(dir).at(0);
  // The embedding's params dataset is the first large object: 4 KiB aligned after the metadata.
  test::flip_byte(shard, fs::file_size(shard) / 3);
  const auto r = CheckpointReader::open(dir, Fallback::none, Verify::manifest);
  std::string err;
  try {
    r.verify_datasets();
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  CHECK_THAT(err, Catch::Contains(shard.string()));
}

// The normal resume path: open (whole-file check) then read_stage. Bytes that change after open has
// verified the file (the disk, another process) are only seen by read_stage's per-dataset checksum.
TEST_CASE("read_stage finds a dataset damaged after open verified the shard, and names the dataset") {
  test::TempDir tmp;
  const fs::path dir = write_checkpoint(tmp.path(), 1);
  const auto r = CheckpointReader::open(tmp.path());
  const std::int64_t stage = 1;
  const auto& entry = r.manifest().at("stages").at(stage);
  const std::string shard_name = entry.at("shard").get<std::string>();
  const std::string params_group = entry.at("group").get<std::string>() + "/params/";
  std::string dataset;
  std::uint64_t offset = 0;
  for (const auto& s : r.manifest().at("shards"))
    if (s.at("file").get<std::string>() == shard_name)
      for (const auto& d : s.at("datasets"))
        if (dataset.empty() && d.at(0).get<std::string>().find(params_group) != std::string::npos) {
          dataset = d.at(0).get<std::string>();
          offset = d.at(1).get<std::uint64_t>() + d.at(2).get<std::uint64_t>() / 2;
        }
  REQUIRE(!dataset.empty());
  const std::string dataset_in_group = dataset.substr(dataset.find(params_group));
  std::vector<float> params(stage_layout(kConfig, stage).total_floats);

  test::flip_byte(dir / shard_name, offset);
  std::string err;
  try {
    r.read_stage(stage, params.data());
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  INFO(err);
  CHECK_THAT(err, Catch::Contains(shard_name) && Catch::Contains(dataset_in_group) && Catch::Contains("checksum"));

  test::flip_byte(dir / shard_name, offset);  // undo: the same reader now reads the stage bit for bit
  r.read_stage(stage, params.data());
  CHECK(params == test::stage_values(kConfig, stage, 0));
}

TEST_CASE("a truncated shard is detected and named") {
  test::TempDir tmp;
  const fs::path dir = write_checkpoint(tmp.path(), 1);
  for (const auto& shard : shards_of(dir)) {
    const auto size = fs::file_size(shard);
    const fs::path backup = tmp.path() / "backup";
    fs::copy_file(shard, backup);
    fs::resize_file(shard, size - 10);
    const std::string err = open_error(dir, Verify::manifest);
    CHECK_THAT(err, Catch::Contains(shard.string()) && Catch::Contains("truncated"));
    fs::remove(shard);
    CHECK_THAT(open_error(dir, Verify::manifest), Catch::Contains(shard.string()) && Catch::Contains("missing"));
    fs::rename(backup, shard);
  }
  CHECK(open_error(dir).empty());
}

TEST_CASE("a deleted or damaged manifest is detected and named with fallback only when asked") {
  test::TempDir tmp;
  write_checkpoint(tmp.path(), 1);
  const fs::path dir2 = write_checkpoint(tmp.path(), 2);
  const fs::path manifest = dir2 / "manifest.json";

  fs::copy_file(manifest, tmp.path() / "m.json");
  test::flip_byte(manifest, fs::file_size(manifest) / 2);
  CHECK_THAT(open_error(tmp.path()), Catch::Contains(manifest.string()));
  fs::remove(manifest);
  CHECK_THAT(open_error(tmp.path()), Catch::Contains(manifest.string()) && Catch::Contains("missing"));
  CHECK_THAT(open_error(dir2), Catch::Contains(manifest.string()));

  const auto r = CheckpointReader::open(tmp.path(), Fallback::previous_good);
  CHECK(r.step() == 1);
  REQUIRE(r.skipped().size() == 1);
  CHECK_THAT(r.skipped()[0], Catch::Contains(manifest.string()));
  fs::copy_file(tmp.path() / "m.json", manifest);
  CHECK(CheckpointReader::open(tmp.path()).step() == 2);
}

TEST_CASE("a writer killed with SIGKILL mid-checkpoint leaves the previous checkpoint as latest") {
  test::TempDir tmp;
  write_checkpoint(tmp.path(), 10);
  for (int stages_before_kill : {0, 2, static_cast<int>(num_stages(kConfig))}) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the doomed writer
      CheckpointWriter w(tmp.path(), 20, kConfig);
      for (int s = 0; s < stages_before_kill; ++s) {
        const auto p = test::stage_values(kConfig, s, 0);
        w.write_stage(s, {p.data(), p.data(), p.data()});
      }
      ::raise(SIGKILL);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    bool temp_left = false;
    for (const auto& e : fs::directory_iterator(tmp.path()))
      temp_left |= e.path().filename().string().rfind(".tmp-step-00000020", 0) == 0;
    CHECK(temp_left);
    const auto all = list_checkpoints(tmp.path());
    REQUIRE(all.size() == 1);
    CHECK(all[0].step == 10);
    CHECK(CheckpointReader::open(tmp.path()).step() == 10);
  }
  // The next successful publish sweeps the dead writers' temporary directories.
  write_checkpoint(tmp.path(), 30);
  for (const auto& e : fs::directory_iterator(tmp.path())) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
  CHECK(CheckpointReader::open(tmp.path()).step() == 30);
}

TEST_CASE("a full disk fails the checkpoint with an exception and keeps the previous one intact") {
  test::TempDir tmp;
  write_checkpoint(tmp.path(), 1);
  // RLIMIT_FSIZE makes writes past 64 KiB fail with EFBIG, as a full disk fails them with ENOSPC.
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ::setrlimit(RLIMIT_FSIZE, &small);
  std::string err;
  {
    CheckpointWriterOptions o;
    o.max_shard_bytes = 1u << 30;
    CheckpointWriter w(tmp.path(), 2, kConfig, o);
    try {
      for (std::int64_t s = 0; s < num_stages(kConfig); ++s) {
        const auto p = test::stage_values(kConfig, s, 0);
        w.write_stage(s, {p.data(), p.data(), p.data()});
      }
      w.finalize();
    } catch (const CheckpointError& e) {
      err = e.what();
    }
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  CHECK_THAT(err, Catch::Contains("shard-00000.h5"));
  CHECK(list_checkpoints(tmp.path()).size() == 1);
  CHECK(CheckpointReader::open(tmp.path()).step() == 1);
  CHECK(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()) == 2);  // step-1 + latest
  // Space is back: the same process writes the next checkpoint normally.
  write_checkpoint(tmp.path(), 3);
  CHECK(CheckpointReader::open(tmp.path()).step() == 3);
}
