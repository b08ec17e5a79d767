// The node binary: `megatrain train` validates everything before starting (bad keys, values, files and
// budgets are clear errors naming the key, exit code 1), trains with one progress line and one JSONL
// line per step, and stops cleanly on SIGINT after the step in progress.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/actors/node_binary_fixture.hpp"

namespace fs = std::filesystem;
using mt::test::make_shard;
using mt::test::Outcome;
using mt::test::slurp;

namespace {

std::string tiny_args(const fs::path& dir, const fs::path& shard) {
  return "--model.arch=llama --model.hidden_size=32 --model.layers=2 --model.heads=4 --model.kv_heads=2 "
         "--model.intermediate_size=64 --model.vocab_size=64 --model.max_position_embeddings=64 "
         "--data.seq_length=16 --data.train_files=" +
         shard.string() +
         " --train.per_device_train_batch_size=2 --train.gradient_accumulation_steps=2 "
         "--train.warmup_steps=0 --train.output_dir=" +
         (dir / "out").string() + " --device.max_vram_gb=0.015625 --threads.total=2";
}

}  // namespace

TEST_CASE("megatrain train: bad input fails before training, naming the key", "[actors][node]") {
  const fs::path dir = fs::temp_directory_path() / ("mt_node_bad_" + std::to_string(::getpid()));
  const fs::path shard = make_shard(dir, 4096);
  const std::string base = tiny_args(dir, shard);
  SECTION("bad value") {
    const Outcome o = mt::test::run_node(base + " --train.learning_rate=-1");
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains("train.learning_rate"));
    CHECK_THAT(o.out, !Catch::Contains("step "));
  }
  SECTION("unknown key on the command line") {
    const Outcome o = mt::test::run_node(base + " --train.learning_rat=0.1");
    CHECK(o.code != 0);
    CHECK_THAT(o.out, Catch::Contains("learning_rat"));
  }
  SECTION("unknown key in the INI file") {
    const fs::path ini = dir / "bad.ini";
    std::ofstream(ini) << "[train]\nmax_stepz = 3\n";
    const Outcome o = mt::test::run_node("--config-file=" + ini.string() + " " + base);
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains("max_stepz"));
  }
  SECTION("missing data file") {
    const Outcome o = mt::test::run_node(base + " --data.train_files=" + (dir / "nope*.bin").string());
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains("data.train_files"));
  }
  SECTION("device budget too small") {
    const Outcome o = mt::test::run_node(base + " --device.max_vram_gb=0.00001");
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains("device.max_vram_gb"));
    CHECK_THAT(o.out, !Catch::Contains("step "));
  }
  SECTION("cuda backend on a machine without a usable GPU (or a build without CUDA)") {
    // The driver lists its GPUs here; where it does and the build has CUDA, the same command trains on
    // the GPU (exit 0, steps printed), so the case checks something on every machine.
    std::error_code ec;
    const bool gpu_here =
        fs::is_directory("/proc/driver/nvidia/gpus", ec) && !fs::is_empty("/proc/driver/nvidia/gpus", ec);
    const Outcome o = mt::test::run_node(base + " --device.backend=cuda");
    if (gpu_here && o.code == 0) {
      CHECK_THAT(o.out, Catch::Contains("step "));
    } else {
      CHECK(o.code == 1);
      CHECK_THAT(o.out, Catch::Contains("device.backend"));
      CHECK_THAT(o.out, !Catch::Contains("step "));
      CHECK_FALSE(fs::exists(dir / "out"));  // nothing written
    }
  }
  SECTION("a tokenizer larger than the model's vocabulary") {
    // Qwen3's tokenizer (151k ids) against a 64-entry model: refused before training, naming both keys.
    const Outcome o =
        mt::test::run_node(base + " --data.tokenizer_file=" MEGATRAIN_SHARED_DATA "/qwen3-tokenizer/tokenizer.json");
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains("model.vocab_size") && Catch::Contains("data.tokenizer_file") &&
                          Catch::Contains("smaller than the tokenizer's"));
    CHECK_THAT(o.out, !Catch::Contains("step "));
  }
  SECTION("a tokenizer file that is not JSON: the error starts with the key") {
    const fs::path not_json = dir / "passwd";
    std::ofstream(not_json) << "root:x:0:0:root:/root:/bin/bash\n";
    const Outcome o = mt::test::run_node(base + " --data.tokenizer_file=" + not_json.string());
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains("megatrain: data.tokenizer_file: " + not_json.string() + ": not valid JSON"));
    CHECK_THAT(o.out, !Catch::Contains("step "));
  }
  SECTION("token ids beyond the vocabulary (checked where read: the first micro-batch)") {
    const Outcome o = mt::test::run_node(base + " --model.vocab_size=32");
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains("model.vocab_size = 32") && Catch::Contains("data.train_files") &&
                          Catch::Contains(shard.string()) && Catch::Contains("is outside the vocabulary"));
    CHECK_THAT(o.out, !Catch::Contains("step "));
  }
  SECTION("validation token ids beyond the vocabulary: refused at start, naming the file") {
    const fs::path val = make_shard(dir / "val", 1024);
    const Outcome o = mt::test::run_node(base + " --model.vocab_size=32 --data.validation_files=" + val.string() +
                                         " --train.max_steps=2");
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains(val.string()) && Catch::Contains("outside the vocabulary"));
    CHECK_THAT(o.out, !Catch::Contains("step "));
  }
  fs::remove_all(dir);
}

TEST_CASE("megatrain train: trains, prints progress and writes JSONL", "[actors][node]") {
  const fs::path dir = fs::temp_directory_path() / ("mt_node_ok_" + std::to_string(::getpid()));
  const fs::path shard = make_shard(dir, 8192);
  const Outcome o = mt::test::run_node(tiny_args(dir, shard) + " --train.max_steps=12 --train.learning_rate=0.01");
  INFO(o.out);
  REQUIRE(o.code == 0);
  CHECK_THAT(o.out, Catch::Contains("step    12 | loss"));
  CHECK_THAT(o.out, Catch::Contains("weights wait"));
  std::ifstream jl(dir / "out" / "train.jsonl");
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(jl, line)) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 12);
  for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_s", "wait_weights_s", "compute_s",
                        "offload_s", "optimizer_s"})
    CHECK(rows.back().contains(k));
  CHECK(rows.back()["loss"].get<double>() < rows.front()["loss"].get<double>());
  fs::remove_all(dir);
}

TEST_CASE("megatrain train: the moments on the NVMe tier give the same losses as in RAM", "[actors][node][offload]") {
  const fs::path dir = fs::temp_directory_path() / ("mt_node_offload_" + std::to_string(::getpid()));
  const fs::path shard = make_shard(dir, 8192);
  // One kernel choice cache for the runs compared: the bf16 runs measure their GEMM path once and then
  // share it (plan/kernel_choice.hpp), so they compare the same products.
  auto losses = [&](const std::string& extra, const std::string& out) {
    const Outcome o = mt::test::run_node(tiny_args(dir / out, shard) + " --train.max_steps=4" + extra,
                                         "env -u MEGATRAIN_BF16_GEMM XDG_CACHE_HOME=" + (dir / "cache").string());
    INFO(o.out);
    REQUIRE(o.code == 0);
    std::ifstream jl(dir / out / "out" / "train.jsonl");
    std::vector<double> l;
    for (std::string line; std::getline(jl, line);) l.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return l;
  };
  const auto ram = losses("", "ram");
  const auto tier = losses(" --train.offload_dir=" + (dir / "nvme").string() + " --train.offload_staging_stages=3 " +
                               "--train.optimizer_compression=lossless",
                           "tier");
  REQUIRE(ram.size() == 4);
  CHECK(tier == ram);
  CHECK(fs::is_empty(dir / "nvme"));  // the working files are gone with the run
  // bf16 with the fp32 masters on the tier too (train.offload_params) equals bf16 in RAM.
  const auto ram_bf16 = losses(" --train.bf16=true", "ram_bf16");
  const auto params =
      losses(" --train.bf16=true --train.offload_params=true --train.offload_dir=" + (dir / "nvme").string() +
                 " --train.offload_staging_stages=3",
             "params");
  REQUIRE(ram_bf16.size() == 4);
  CHECK(params == ram_bf16);
  CHECK(fs::is_empty(dir / "nvme"));
  // A file-size limit (a full disk) in the child: no stage file can grow past its header, so the
  // first write of the masters fails; the run exits 1 naming the file and the errno.
  const Outcome full = mt::test::run_node(tiny_args(dir / "full", shard) +
                                              " --train.max_steps=4 --train.bf16=true --train.offload_params=true "
                                              "--train.offload_dir=" +
                                              (dir / "nvme").string(),
                                          "ulimit -f 8;");
  INFO(full.out);
  CHECK(full.code == 1);
  CHECK_THAT(full.out, Catch::Contains((dir / "nvme").string()) && Catch::Contains(".state") &&
                           Catch::Contains(std::strerror(EFBIG)));
  fs::remove_all(dir);
}

TEST_CASE("megatrain train: SIGINT stops cleanly after the step in progress", "[actors][node]") {
  const fs::path dir = fs::temp_directory_path() / ("mt_node_sig_" + std::to_string(::getpid()));
  const fs::path shard = make_shard(dir, 8192);
  const fs::path log = dir / "node.log";
  const std::string cmd = std::string("exec ") + MEGATRAIN_BINARY + " train " + tiny_args(dir, shard) +
                          " --train.max_steps=1000000 > " + log.string() + " 2>&1";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const fs::path jsonl = dir / "out" / "train.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::size_t lines = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(jsonl);
    std::string l;
    lines = 0;
    while (std::getline(in, l)) ++lines;
    if (lines >= 3) break;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) break;  // exited early: fails below
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (lines < 3) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    FAIL("no progress before the signal: " << slurp(log));
  }
  ::kill(pid, SIGINT);
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 1000 && !exited; ++i) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      exited = true;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  REQUIRE(exited);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string out = slurp(log);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("stopped by signal"));
  fs::remove_all(dir);
}

// Token ids are checked where the loader reads them, not by a scan of the corpus at start-up: a bad
// id in the middle of the data stops the run when a micro-batch holds it, naming the file and offset
// (exit 1), and a large corpus starts at once: the node must not touch the pages of a 2 GB shard
// before its first step (a sparse file: no disk used). Measured by the child's page faults, which a
// scan of every token would raise to at least one per 4 KiB page.
TEST_CASE("megatrain train: token ids checked where read, start-up does not scan the corpus", "[actors][node][data]") {
  const fs::path dir = fs::temp_directory_path() / ("mt_node_scan_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  SECTION("a bad token id mid-corpus") {
    const fs::path shard = make_shard(dir, 8192);
    {
      std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
      const std::uint16_t bad = 100;  // outside the 64-entry vocabulary
      for (std::size_t i = 4096; i < 8192; ++i) {
        f.seekp(static_cast<std::streamoff>(1024 + 2 * i));
        f.write(reinterpret_cast<const char*>(&bad), 2);
      }
    }
    const Outcome o = mt::test::run_node(tiny_args(dir, shard) + " --train.max_steps=50");
    INFO(o.out);
    CHECK(o.code == 1);
    CHECK_THAT(o.out, Catch::Contains(shard.string()) && Catch::Contains("token 100 at token offset") &&
                          Catch::Contains("model.vocab_size = 64"));
  }
  SECTION("a 2 GB shard starts without reading it") {
    const fs::path shard = dir / "big_000000.bin";
    const std::int64_t tokens = std::int64_t{1} << 30;  // 2 GiB of uint16 tokens, all id 0 (sparse)
    {
      std::vector<std::int32_t> header(256, 0);
      header[0] = 20240520;
      header[1] = 1;
      header[2] = static_cast<std::int32_t>(tokens);
      std::ofstream out(shard, std::ios::binary);
      out.write(reinterpret_cast<const char*>(header.data()), 1024);
    }
    fs::resize_file(shard, 1024 + 2 * static_cast<std::uintmax_t>(tokens));
    struct rusage before {
    }, after{};
    ::getrusage(RUSAGE_CHILDREN, &before);
    const Outcome o = mt::test::run_node(tiny_args(dir, shard) + " --train.max_steps=1 --data.seq_length=64");
    ::getrusage(RUSAGE_CHILDREN, &after);
    INFO(o.out);
    REQUIRE(o.code == 0);
    const long faults = (after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt);
    const long shard_pages = static_cast<long>(2 * tokens / 4096);
    INFO("page faults of the run: " << faults << ", pages of the shard: " << shard_pages);
    CHECK(faults < shard_pages / 4);
  }
  fs::remove_all(dir);
}
