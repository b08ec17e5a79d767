// Checkpoints through the node binary `megatrain train`: exact resume (10 + 10 = 20 steps, bit for
// bit: losses, weights, moments, data cursor), kill -9 during a checkpoint write (the incomplete one is
// never loaded), a damaged checkpoint (clear error naming the file; previous_good fallback), SIGTERM
// (final checkpoint, exit 0), SIGUSR1 (checkpoint at the next step boundary), Hugging Face in and out, the
// bf16 products' path kept across a resume.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/run_state.hpp"
#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "kernels/param_layout.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"

#include "tests/actors/node_binary_fixture.hpp"
#include "tests/actors/run_dir_fixture.hpp"

namespace fs = std::filesystem;
using mt::test::make_shard;
using mt::test::Outcome;
using mt::test::same_checkpoints;
using mt::test::slurp;
using mt::test::TempDir;

// LeakSanitizer (asan preset): HDF5's global state is never freed because storage/checkpoint turns
// HDF5's exit handler off (H5dont_atexit; see storage/checkpoint/README.md), which LSan would report
// as a leak in every process that wrote or read a checkpoint. Inert in other builds.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name is LSan's interface
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

namespace {

std::string model_args() {
  return "--model.arch=llama --model.hidden_size=32 --model.layers=2 --model.heads=4 --model.kv_heads=2 "
         "--model.intermediate_size=64 --model.vocab_size=64 --model.max_position_embeddings=64 ";
}

std::string train_args(const fs::path& out, const fs::path& shard) {
  return "--data.seq_length=16 --data.train_files=" + shard.string() +
         " --train.per_device_train_batch_size=2 --train.gradient_accumulation_steps=2 --train.warmup_steps=2 "
         "--train.learning_rate=0.01 --train.output_dir=" +
         out.string() + " --device.max_vram_gb=0.015625 --threads.total=2";
}

std::string tiny_args(const fs::path& out, const fs::path& shard) { return model_args() + train_args(out, shard); }

std::vector<nlohmann::json> jsonl(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

struct Child {
  pid_t pid = -1;
  fs::path log;
};

Child start(const std::string& args, const fs::path& log, const std::string& env = "") {
  const std::string cmd = "exec env " + (env.empty() ? std::string("X=1") : env) + " " + MEGATRAIN_BINARY + " train " +
                          args + " > " + log.string() + " 2>&1";
  Child c;
  c.log = log;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return c;
}

// Waits until pred() or the child exits or 60 s pass.
template <class P>
bool wait_until(const Child& c, P pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    int st = 0;
    if (::waitpid(c.pid, &st, WNOHANG) == c.pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int wait_exit(const Child& c) {
  int status = 0;
  for (int i = 0; i < 6000; ++i) {
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, &status, 0);
  return -2;
}

}  // namespace

TEST_CASE("megatrain train: 10 steps + resume + 10 steps equals 20 steps bit for bit", "[actors][checkpoint][node]") {
  TempDir dir("exact");
  const fs::path shard = make_shard(dir.path, 8192);
  const Outcome a = mt::test::run_node(tiny_args(dir.path / "a", shard) + " --train.max_steps=20");
  INFO(a.out);
  REQUIRE(a.code == 0);
  const Outcome b1 =
      mt::test::run_node(tiny_args(dir.path / "b", shard) + " --train.max_steps=20 --train.stop_after_steps=10");
  INFO(b1.out);
  REQUIRE(b1.code == 0);
  CHECK(fs::is_directory(dir.path / "b" / "step-00000010"));
  const Outcome b2 = mt::test::run_node(tiny_args(dir.path / "b", shard) +
                                        " --train.max_steps=20 --train.resume_from_checkpoint=latest");
  INFO(b2.out);
  REQUIRE(b2.code == 0);
  CHECK_THAT(b2.out, Catch::Contains("resumed from") && Catch::Contains("step-00000010 at step 10"));
  const auto ra = jsonl(dir.path / "a" / "train.jsonl");
  const auto rb = jsonl(dir.path / "b" / "train.jsonl");
  REQUIRE(ra.size() == 20);
  REQUIRE(rb.size() == 20);
  for (std::size_t i = 0; i < 20; ++i) {
    CHECK(rb[i]["step"] == ra[i]["step"]);
    CHECK(rb[i]["loss"].get<double>() == ra[i]["loss"].get<double>());
    CHECK(rb[i]["grad_norm"].get<double>() == ra[i]["grad_norm"].get<double>());
  }
  CHECK(same_checkpoints(dir.path / "a" / "step-00000020", dir.path / "b" / "step-00000020"));
  const auto ma = mt::ckpt::CheckpointReader::open(dir.path / "a").run_state();
  const auto mb = mt::ckpt::CheckpointReader::open(dir.path / "b").run_state();
  CHECK(ma["data"]["cursor"] == mb["data"]["cursor"]);
  CHECK(ma["data"]["cursor"]["batches"] == 40);
}

TEST_CASE("megatrain train: kill -9 during a checkpoint write resumes from the previous complete one",
          "[actors][checkpoint][node]") {
  TempDir dir("kill");
  const fs::path shard = make_shard(dir.path, 8192);
  const fs::path out = dir.path / "out";
  // Checkpoint 8 stalls for a minute inside the write of stage 1 (stage 0 is already in its .tmp dir).
  const Child c = start(tiny_args(out, shard) + " --train.max_steps=12 --train.save_steps=4", dir.path / "run.log",
                        "MEGATRAIN_TEST_CKPT_STALL=8:1:60");
  auto tmp_exists = [&] {
    std::error_code ec;
    if (!fs::is_directory(out / "step-00000004", ec)) return false;
    for (const auto& e : fs::directory_iterator(out, ec))
      if (e.path().filename().string().rfind(".tmp-step-00000008", 0) == 0) return true;
    return false;
  };
  const bool in_write = wait_until(c, tmp_exists);
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, nullptr, 0);
  INFO(slurp(dir.path / "run.log"));
  REQUIRE(in_write);
  CHECK(slurp(out / "latest") == "step-00000004\n");
  CHECK(!fs::exists(out / "step-00000008"));
  const Outcome r = mt::test::run_node(
      tiny_args(out, shard) + " --train.max_steps=12 --train.save_steps=4 --train.resume_from_checkpoint=latest");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("step-00000004 at step 4"));
  // The resumed run equals an uninterrupted one.
  const Outcome u = mt::test::run_node(tiny_args(dir.path / "u", shard) + " --train.max_steps=12");
  REQUIRE(u.code == 0);
  CHECK(same_checkpoints(out / "step-00000012", dir.path / "u" / "step-00000012"));
  for (const auto& e : fs::directory_iterator(out)) CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
}

TEST_CASE("megatrain train: a damaged checkpoint is refused naming the file, previous_good falls back",
          "[actors][checkpoint][node]") {
  TempDir dir("damage");
  const fs::path shard = make_shard(dir.path, 8192);
  const fs::path out = dir.path / "out";
  const Outcome a = mt::test::run_node(tiny_args(out, shard) +
                                       " --train.max_steps=10 --train.save_steps=5 --train.save_total_limit=0");
  INFO(a.out);
  REQUIRE(a.code == 0);
  const fs::path victim = out / "step-00000010" / "shard-00000.h5";
  REQUIRE(fs::is_regular_file(victim));
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = fs::file_size(victim);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char ch = 0;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x5A);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.write(&ch, 1);
  }
  const std::string resume = tiny_args(out, shard) + " --train.max_steps=12 --train.resume_from_checkpoint=latest";
  const Outcome bad = mt::test::run_node(resume);
  INFO(bad.out);
  CHECK(bad.code == 1);
  CHECK_THAT(bad.out, Catch::Contains("step-00000010/shard-00000.h5"));
  CHECK_THAT(bad.out, !Catch::Contains("step    11"));
  const Outcome fb = mt::test::run_node(resume + " --train.resume_fallback=previous_good");
  INFO(fb.out);
  CHECK(fb.code == 0);
  CHECK_THAT(fb.out, Catch::Contains("step-00000005 at step 5"));
  CHECK_THAT(fb.out, Catch::Contains("skipped damaged checkpoint"));
  CHECK_THAT(fb.out, Catch::Contains("step     6 | loss"));
}

TEST_CASE("megatrain train: SIGTERM writes a final checkpoint and exits 0, SIGUSR1 checkpoints at the next step",
          "[actors][checkpoint][node]") {
  TempDir dir("sig");
  const fs::path shard = make_shard(dir.path, 65536);
  const fs::path out = dir.path / "out";
  const Child c = start(tiny_args(out, shard) + " --train.max_steps=1000000", dir.path / "run.log");
  auto lines = [&] { return jsonl(out / "train.jsonl").size(); };
  REQUIRE(wait_until(c, [&] { return lines() >= 2; }));
  ::kill(c.pid, SIGUSR1);
  REQUIRE(wait_until(c, [&] { return slurp(dir.path / "run.log").find("checkpoint step") != std::string::npos; }));
  ::kill(c.pid, SIGTERM);
  const int code = wait_exit(c);
  const std::string log = slurp(dir.path / "run.log");
  INFO(log);
  CHECK(code == 0);
  CHECK_THAT(log, Catch::Contains("stopped by signal"));
  // events.jsonl: the checkpoints (and, from the monitor, the stop: {"event": "stopping"}).
  std::vector<nlohmann::json> events;
  bool stopping = false;
  for (const auto& e : jsonl(out / "events.jsonl")) {
    stopping = stopping || e["event"] == "stopping";
    if (e["event"].get<std::string>().rfind("checkpoint_", 0) == 0) events.push_back(e);
  }
  CHECK(stopping);
  REQUIRE(events.size() >= 2);
  for (const auto& e : events) {
    CHECK(e["event"] == "checkpoint_saved");
    // The writer's CPU time: some, and never more than the checkpoint's wall time (one thread's clock).
    CHECK(e["cpu_seconds"].get<double>() > 0.0);
    CHECK(e["cpu_seconds"].get<double>() <= e["seconds"].get<double>());
  }
  const std::int64_t done = static_cast<std::int64_t>(lines());
  const auto r = mt::ckpt::CheckpointReader::open(out);
  CHECK(r.step() == done);
  CHECK(events.back()["step"] == done);
  CHECK(events.front()["step"].get<std::int64_t>() < done);
}

TEST_CASE("megatrain train: Hugging Face weights in (model_name_or_path) and out (export_hf_dir)",
          "[actors][checkpoint][node]") {
  TempDir dir("hf");
  const fs::path shard = make_shard(dir.path, 8192);
  const Outcome a = mt::test::run_node(tiny_args(dir.path / "a", shard) +
                                       " --train.max_steps=3 --train.export_hf_dir=" + (dir.path / "hf1").string());
  INFO(a.out);
  REQUIRE(a.code == 0);
  REQUIRE(fs::is_regular_file(dir.path / "hf1" / "config.json"));
  // The export equals the final checkpoint's fp32 params, and loads back into tiles bit for bit.
  const auto ck = mt::ckpt::CheckpointReader::open(dir.path / "a");
  mt::HostModel host(ck.model_config());
  mt::actors::load_hf_weights(dir.path / "hf1", host);
  for (std::int64_t s = 0; s < host.num_stages(); ++s) {
    const std::size_t n = static_cast<std::size_t>(mt::stage_layout(ck.model_config(), s).total_floats);
    std::vector<float> p(n);
    ck.read_stage(s, p.data());
    CHECK(std::memcmp(p.data(), host.tile(s).params(), n * sizeof(float)) == 0);
  }
  // A fine-tuning run from the exported directory (config and weights from it; no model keys).
  const Outcome b = mt::test::run_node(train_args(dir.path / "b", shard) +
                                       " --model.model_name_or_path=" + (dir.path / "hf1").string() +
                                       " --train.max_steps=2 --train.export_hf_dir=" + (dir.path / "hf2").string());
  INFO(b.out);
  REQUIRE(b.code == 0);
  CHECK_THAT(b.out, Catch::Contains("initial weights from"));
  CHECK(fs::is_regular_file(dir.path / "hf2" / "config.json"));
  const auto rows_a = jsonl(dir.path / "a" / "train.jsonl");
  const auto rows_b = jsonl(dir.path / "b" / "train.jsonl");
  REQUIRE(rows_b.size() == 2);
  // It starts where run a ended: its first loss is below run a's first loss.
  CHECK(rows_b.front()["loss"].get<double>() < rows_a.front()["loss"].get<double>());
}

// Evaluation through the node (data.validation_files, train.eval_steps): an "eval" progress line and
// a train.jsonl row per evaluation, each checkpoint's run state holds the evaluations so far, and a
// run stopped at an evaluation point and resumed evaluates each point once, with the uninterrupted
// run's losses bit for bit.
TEST_CASE("megatrain train: evaluation every eval_steps, in the run state, once across a resume",
          "[actors][checkpoint][node][evaluation]") {
  TempDir dir("eval");
  const fs::path shard = make_shard(dir.path, 8192);
  const fs::path val = make_shard(dir.path / "val", 1024);
  const std::string eval_args = " --data.validation_files=" + val.string() +
                                " --train.eval_steps=4 --train.eval_max_batches=3 --train.save_steps=4"
                                " --train.max_steps=8";
  const Outcome a = mt::test::run_node(tiny_args(dir.path / "a", shard) + eval_args);
  INFO(a.out);
  REQUIRE(a.code == 0);
  CHECK_THAT(a.out, Catch::Contains("eval      4 | val loss") && Catch::Contains("eval      8 | val loss") &&
                        Catch::Contains("validation loss"));
  const Outcome b1 = mt::test::run_node(tiny_args(dir.path / "b", shard) + eval_args + " --train.stop_after_steps=4");
  INFO(b1.out);
  REQUIRE(b1.code == 0);
  const Outcome b2 =
      mt::test::run_node(tiny_args(dir.path / "b", shard) + eval_args + " --train.resume_from_checkpoint=latest");
  INFO(b2.out);
  REQUIRE(b2.code == 0);
  CHECK_THAT(b2.out, !Catch::Contains("eval      4 |"));
  auto evals = [](const std::vector<nlohmann::json>& rows) {
    std::vector<nlohmann::json> e;
    for (const auto& r : rows)
      if (r.contains("eval_loss")) e.push_back(r);
    return e;
  };
  const auto ea = evals(jsonl(dir.path / "a" / "train.jsonl"));
  const auto eb = evals(jsonl(dir.path / "b" / "train.jsonl"));
  REQUIRE(ea.size() == 2);
  REQUIRE(eb.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(ea[i]["step"] == 4 * (i + 1));
    CHECK(eb[i]["step"] == ea[i]["step"]);
    CHECK(eb[i]["eval_loss"].get<double>() == ea[i]["eval_loss"].get<double>());
    CHECK(ea[i]["eval_batches"] == 3);
  }
  CHECK(ea[1]["eval_loss"].get<double>() < ea[0]["eval_loss"].get<double>());
  // Run state: the checkpoint of step 4 holds the evaluation at 4; the final one both.
  const auto rs4 = mt::ckpt::CheckpointReader::open(dir.path / "a" / "step-00000004").run_state();
  const auto rs8 = mt::ckpt::CheckpointReader::open(dir.path / "a" / "step-00000008").run_state();
  REQUIRE(rs4["evaluations"].size() == 1);
  CHECK(rs4["evaluations"][0]["loss"].get<double>() == ea[0]["eval_loss"].get<double>());
  REQUIRE(rs8["evaluations"].size() == 2);
  CHECK(rs8["evaluations"][1]["loss"].get<double>() == ea[1]["eval_loss"].get<double>());
  CHECK(same_checkpoints(dir.path / "a" / "step-00000008", dir.path / "b" / "step-00000008"));
}

// The bf16 products' path and the attention's products are part of the run state
// (plan/kernel_choice.hpp): a resume takes the checkpoint's choices, not the cache's, and continues bit for bit; a
// fresh run takes the cache's; the other path gives other bits (so the comparison can fail); a CPU that cannot run the
// recorded path says so.
TEST_CASE("megatrain train: a bf16 resume keeps the checkpoint's kernel choices, bit for bit",
          "[actors][checkpoint][node][bf16]") {
  TempDir dir("bf16path");
  const fs::path shard = make_shard(dir.path, 8192);
  const fs::path cache = dir.path / "cache";
  const std::string env = "env -u MEGATRAIN_BF16_GEMM -u MEGATRAIN_BF16_ATTENTION XDG_CACHE_HOME=" + cache.string();
  const std::string bf16 = " --train.bf16=true --train.max_steps=12";
  const bool onednn = mt::cpu::bf16_gemm_onednn_available();
  // b: 6 steps with the path measured (and cached), then resumed to 12.
  const Outcome b1 = mt::test::run_node(tiny_args(dir.path / "b", shard) + bf16 + " --train.stop_after_steps=6", env);
  INFO(b1.out);
  REQUIRE(b1.code == 0);
  const auto rs6 = mt::ckpt::CheckpointReader::open(dir.path / "b").run_state();
  REQUIRE(rs6.contains("kernel_choices"));
  const std::string p = rs6["kernel_choices"]["bf16_gemm"].get<std::string>();
  const std::string q = p == "onednn" ? "widened" : "onednn";
  CHECK_THAT(b1.out, Catch::Contains("bf16 products: " + p + (onednn ? " (probe: " : " (oneDNN has no bf16 kernels")));
  // The attention's products too (pairs only where the CPU has AVX512-BF16).
  const bool pairs = mt::cpu::bf16_pairs_available();
  const std::string at = rs6["kernel_choices"]["bf16_attention"].get<std::string>();
  CHECK_THAT(b1.out, Catch::Contains("attention products: " + at + (pairs ? " (probe: " : " (no AVX512-BF16")));
  if (onednn) {  // the cache now says p (and at): make it say q (and the other), which the resume must not follow
    const fs::path file = cache / "megatrain" / "kernel_choices.json";
    auto j = nlohmann::json::parse(slurp(file));
    REQUIRE(j["entries"].size() == 1);
    CHECK(j["entries"][0]["bf16_gemm"] == p);
    j["entries"][0]["bf16_gemm"] = q;
    if (pairs) {
      CHECK(j["entries"][0]["bf16_attention"] == at);
      j["entries"][0]["bf16_attention"] = at == "pairs" ? "fp32" : "pairs";
    }
    std::ofstream(file) << j.dump();
  }
  const Outcome b2 =
      mt::test::run_node(tiny_args(dir.path / "b", shard) + bf16 + " --train.resume_from_checkpoint=latest", env);
  INFO(b2.out);
  REQUIRE(b2.code == 0);
  CHECK_THAT(b2.out, Catch::Contains("bf16 products: " + p + " (from the checkpoint)"));
  CHECK_THAT(b2.out, Catch::Contains("attention products: " + at + " (from the checkpoint)"));
  // a: 12 steps uninterrupted on p (and at).
  const Outcome a = mt::test::run_node(tiny_args(dir.path / "a", shard) + bf16,
                                       env + " MEGATRAIN_BF16_GEMM=" + p + " MEGATRAIN_BF16_ATTENTION=" + at);
  INFO(a.out);
  REQUIRE(a.code == 0);
  CHECK_THAT(a.out, Catch::Contains("bf16 products: " + p + " (forced by MEGATRAIN_BF16_GEMM)"));
  const auto ra = jsonl(dir.path / "a" / "train.jsonl");
  const auto rb = jsonl(dir.path / "b" / "train.jsonl");
  REQUIRE(ra.size() == 12);
  REQUIRE(rb.size() == 12);
  for (std::size_t i = 0; i < 12; ++i) {
    CHECK(rb[i]["loss"].get<double>() == ra[i]["loss"].get<double>());
    CHECK(rb[i]["grad_norm"].get<double>() == ra[i]["grad_norm"].get<double>());
  }
  CHECK(same_checkpoints(dir.path / "a" / "step-00000012", dir.path / "b" / "step-00000012"));
  CHECK(mt::ckpt::CheckpointReader::open(dir.path / "b").run_state()["kernel_choices"]["bf16_gemm"] == p);
  CHECK(mt::ckpt::CheckpointReader::open(dir.path / "b").run_state()["kernel_choices"]["bf16_attention"] == at);
  // Logged: events.jsonl has the choice of each run.
  int logged = 0;
  for (const auto& e : jsonl(dir.path / "b" / "events.jsonl"))
    if (e["event"] == "kernel_choice") {
      ++logged;
      CHECK(e["bf16_gemm"]["path"] == p);
      CHECK(e["bf16_attention"]["path"] == at);
    }
  CHECK(logged == 2);
  if (!onednn) return;
  // A fresh run takes the cache's path without probing.
  const Outcome c =
      mt::test::run_node(tiny_args(dir.path / "c", shard) + " --train.bf16=true --train.max_steps=1", env);
  INFO(c.out);
  REQUIRE(c.code == 0);
  CHECK_THAT(c.out, Catch::Contains("bf16 products: " + q + " (measured earlier on this machine"));
  // The other path's bits differ: the bit-for-bit comparison above can fail.
  const Outcome d = mt::test::run_node(tiny_args(dir.path / "d", shard) + bf16,
                                       env + " MEGATRAIN_BF16_GEMM=" + q + " MEGATRAIN_BF16_ATTENTION=" + at);
  REQUIRE(d.code == 0);
  CHECK_FALSE(same_checkpoints(dir.path / "a" / "step-00000012", dir.path / "d" / "step-00000012"));
  // A checkpoint recorded on onednn, resumed where oneDNN has no bf16 kernels (held to AVX2): said, and
  // continued on the widened path.
  const fs::path e = dir.path / (p == "onednn" ? "a" : "d");
  const Outcome held = mt::test::run_node(
      tiny_args(e, shard) + " --train.bf16=true --train.max_steps=14 --train.resume_from_checkpoint=latest",
      env + " DNNL_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX2");
  INFO(held.out);
  CHECK(held.code == 0);
  CHECK_THAT(held.out, Catch::Contains("bf16 products: widened (the checkpoint's run used onednn, which this CPU "
                                       "cannot run") &&
                           Catch::Contains("continuing on the widened path") && Catch::Contains("step    14 | loss"));
}

// The fp32 products' libraries are part of the run state too: a resume takes the checkpoint's, not the
// cache's, and continues bit for bit; a fresh run takes the cache's; the other libraries give other bits.
TEST_CASE("megatrain train: an fp32 resume keeps the checkpoint's GEMM libraries, bit for bit",
          "[actors][checkpoint][node]") {
  TempDir dir("fp32gemm");
  const fs::path shard = make_shard(dir.path, 8192);
  const fs::path cache = dir.path / "cache", file = cache / "megatrain" / "kernel_choices.json";
  const std::string env = "env -u MEGATRAIN_FP32_GEMM XDG_CACHE_HOME=" + cache.string();
  const std::string steps = " --train.max_steps=12";
  // b: 6 steps with the libraries measured (and cached), then resumed to 12.
  const Outcome b1 = mt::test::run_node(tiny_args(dir.path / "b", shard) + steps + " --train.stop_after_steps=6", env);
  INFO(b1.out);
  REQUIRE(b1.code == 0);
  const nlohmann::json chosen =
      mt::ckpt::CheckpointReader::open(dir.path / "b").run_state()["kernel_choices"]["fp32_gemm"];
  REQUIRE(chosen.is_object());
  CHECK_THAT(b1.out, Catch::Contains("fp32 products: ") && Catch::Contains(" (probe: OpenBLAS at "));
  // The cache says what b measured; make it say the opposite for every product, which the resume must not follow.
  auto j = nlohmann::json::parse(slurp(file));
  REQUIRE(j["entries"].size() == 1);
  CHECK(j["entries"][0]["fp32_gemm"] == chosen);
  nlohmann::json flipped = chosen;
  flipped.erase("shapes");  // the products alone, each on the other library
  for (auto& [product, lib] : flipped.items()) lib = lib == "onednn" ? "openblas" : "onednn";
  j["entries"][0]["fp32_gemm"] = flipped;
  std::ofstream(file) << j.dump();
  const Outcome b2 =
      mt::test::run_node(tiny_args(dir.path / "b", shard) + steps + " --train.resume_from_checkpoint=latest", env);
  INFO(b2.out);
  REQUIRE(b2.code == 0);
  CHECK_THAT(b2.out, Catch::Contains("(from the checkpoint)"));
  CHECK(mt::ckpt::CheckpointReader::open(dir.path / "b").run_state()["kernel_choices"]["fp32_gemm"] == chosen);
  // c: a fresh run takes the cache's (flipped) libraries without probing; its bits differ from b's.
  const Outcome c = mt::test::run_node(tiny_args(dir.path / "c", shard) + steps, env);
  INFO(c.out);
  REQUIRE(c.code == 0);
  CHECK_THAT(c.out, Catch::Contains("(measured earlier on this machine"));
  CHECK(mt::ckpt::CheckpointReader::open(dir.path / "c").run_state()["kernel_choices"]["fp32_gemm"] == flipped);
  CHECK_FALSE(same_checkpoints(dir.path / "b" / "step-00000012", dir.path / "c" / "step-00000012"));
  // a: 12 steps uninterrupted on b's libraries (the cache put back): the same bits as the resumed b.
  j["entries"][0]["fp32_gemm"] = chosen;
  std::ofstream(file) << j.dump();
  const Outcome a = mt::test::run_node(tiny_args(dir.path / "a", shard) + steps, env);
  INFO(a.out);
  REQUIRE(a.code == 0);
  const auto ra = jsonl(dir.path / "a" / "train.jsonl");
  const auto rb = jsonl(dir.path / "b" / "train.jsonl");
  REQUIRE(ra.size() == 12);
  REQUIRE(rb.size() == 12);
  for (std::size_t i = 0; i < 12; ++i) CHECK(rb[i]["loss"].get<double>() == ra[i]["loss"].get<double>());
  CHECK(same_checkpoints(dir.path / "a" / "step-00000012", dir.path / "b" / "step-00000012"));
  int logged = 0;
  for (const auto& e : jsonl(dir.path / "b" / "events.jsonl"))
    if (e["event"] == "kernel_choice") {
      ++logged;
      CHECK(e["fp32_gemm"]["backward_weight"] == chosen["backward_weight"]);
    }
  CHECK(logged == 2);
}
