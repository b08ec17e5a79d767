// The monitor endpoint of a running node binary `megatrain train`, driven by an outside client
// (monitor_client.py: Python's http.client and socket, prometheus_client's text parser, from the test
// venv): the API and bad input while training; each pipeline actor restarted on request, random injected
// faults and the watchdog's escalation, each run's final weights bit-identical to an uninterrupted run;
// the restart budget (final checkpoint, error naming the actor). Exit 77 (skipped) without the venv.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/param_layout.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"
#include "tests/actors/node_binary_fixture.hpp"
#include "tests/actors/run_dir_fixture.hpp"

namespace fs = std::filesystem;
using mt::test::same_checkpoints;
using mt::test::slurp;
using mt::test::TempDir;

// LeakSanitizer (asan preset): HDF5's global state is never freed (storage/checkpoint/README.md).
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name is LSan's interface
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

namespace {

const std::string kVenv = MEGATRAIN_VENV_PYTHON;
const std::string kClient = MEGATRAIN_SOURCE_DIR "/tests/actors/monitor/monitor_client.py";

void require_venv() {
  static const bool ok = std::system((kVenv + " -c 'import prometheus_client' 2>/dev/null").c_str()) == 0;
  if (!ok) {  // reported as skipped (ctest's SKIP_RETURN_CODE 77), never as passed
    std::fprintf(stderr, "venv with prometheus_client not found at %s (tools/install-deps --test): skipped\n",
                 kVenv.c_str());
    std::exit(77);
  }
}

// The tiny model of the node binary tests; `link_gbps` slows the copy engine so that a run lasts long
// enough to act on (the results do not depend on it).
std::string tiny_args(const fs::path& out, const fs::path& shard, std::int64_t steps, double link_gbps) {
  return "--model.arch=llama --model.hidden_size=32 --model.layers=2 --model.heads=4 --model.kv_heads=2 "
         "--model.intermediate_size=64 --model.vocab_size=64 --model.max_position_embeddings=64 "
         "--data.seq_length=16 --data.train_files=" +
         shard.string() +
         " --train.per_device_train_batch_size=2 --train.gradient_accumulation_steps=2 --train.warmup_steps=2 "
         "--train.learning_rate=0.01 --train.max_steps=" +
         std::to_string(steps) + " --train.output_dir=" + out.string() +
         " --device.max_vram_gb=0.015625 --threads.total=2 --test.copy_bandwidth_gbps=" + std::to_string(link_gbps);
}

// How /status names the model tiny_args defines by [model] keys.
const std::string kKeysModel = "llama (hidden 32, from [model] keys)";

struct Child {
  pid_t pid = -1;
  fs::path log;
};

Child start_node(const std::string& args, const fs::path& log, const std::string& env = "") {
  const std::string cmd =
      "exec env X=1 " + env + " " + std::string(MEGATRAIN_BINARY) + " train " + args + " > " + log.string() + " 2>&1";
  Child c;
  c.log = log;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return c;
}

// The node's exit code (-1 killed by a signal, -2 still running after `seconds`: then killed).
// `seconds` = 0: kill it now (its client failed).
int wait_exit(const Child& c, int seconds = 120) {
  int status = 0;
  if (seconds == 0) {
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, &status, 0);
    return -2;
  }
  for (int i = 0; i < seconds * 100; ++i) {
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, &status, 0);
  return -2;
}

// Runs the client against the node writing to `out`; its exit code, its output in `text`.
int run_client(const std::string& command, const fs::path& out, std::string& text, const std::string& extra = "") {
  const fs::path log = out.parent_path() / ("client_" + command + ".log");
  const std::string cmd =
      kVenv + " " + kClient + " " + command + " --out " + out.string() + " " + extra + " > " + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  text = slurp(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::vector<double> losses(const fs::path& jsonl) {
  std::ifstream in(jsonl);
  std::string line;
  std::vector<double> out;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

constexpr std::int64_t kSteps = 60;

// An uninterrupted run of kSteps (full speed): the reference for the interrupted ones.
fs::path reference_run(const fs::path& dir, const fs::path& shard) {
  const fs::path out = dir / "reference";
  const auto o = mt::test::run_node(tiny_args(out, shard, kSteps, 0.0) + " --monitor.enabled=false");
  INFO(o.out);
  REQUIRE(o.code == 0);
  return out;
}

void require_identical(const fs::path& ref, const fs::path& out) {
  const std::string last = "step-000000" + std::to_string(kSteps);
  REQUIRE(fs::exists(out / last));
  CHECK(same_checkpoints(ref / last, out / last));
  CHECK(losses(ref / "train.jsonl") == losses(out / "train.jsonl"));
  CHECK_FALSE(fs::exists(out / "monitor.json"));  // removed at exit
}

}  // namespace

TEST_CASE("monitor: /metrics, /status, /history, /events, control and bad input on a running node", "[monitor]") {
  require_venv();
  TempDir dir("api");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 20000);
  const fs::path out = dir.path / "out";
  // Long enough for the client (it stops the run itself); the link slowed to a few steps per second.
  const Child node = start_node(tiny_args(out, shard, 100000, 0.002), dir.path / "node.log");
  std::string text;
  const int rc = run_client("api", out, text);
  const int code = wait_exit(node, rc == 0 ? 60 : 0);
  INFO(text << "\n--- node:\n" << slurp(dir.path / "node.log"));
  CHECK(rc == 0);
  CHECK(code == 0);
  CHECK_THAT(slurp(dir.path / "node.log"), Catch::Contains("megatrain: monitor listening on http://127.0.0.1:"));
  CHECK_FALSE(fs::exists(out / "monitor.json"));
}

TEST_CASE("monitor: after an evaluation the training actors read running, and the model is named by its keys",
          "[monitor]") {
  require_venv();
  TempDir dir("evaluation");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 20000);
  const fs::path out = dir.path / "out";
  // An evaluation after steps 4, 8 and 12 (each its own pipeline between training segments).
  const Child node = start_node(tiny_args(out, shard, 12, 0.002) + " --data.validation_files=" + shard.string() +
                                    " --train.eval_steps=4 --train.eval_max_batches=2",
                                dir.path / "node.log");
  std::string text;
  const int rc = run_client("evaluation", out, text, "--every 4 --model '" + kKeysModel + "'");
  const int code = wait_exit(node, rc == 0 ? 120 : 0);
  const std::string log = slurp(dir.path / "node.log");
  INFO(text << "\n--- node:\n" << log);
  CHECK(rc == 0);
  CHECK(code == 0);
  CHECK(std::regex_search(log, std::regex("\neval +4 \\| val loss")));  // the first evaluation was run
}

TEST_CASE("monitor: each pipeline actor restarted on request, weights bit-identical", "[monitor]") {
  require_venv();
  TempDir dir("restart");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 20000);
  const fs::path ref = reference_run(dir.path, shard);
  const fs::path out = dir.path / "out";
  const Child node = start_node(tiny_args(out, shard, kSteps, 0.004), dir.path / "node.log");
  std::string text;
  const int rc = run_client("restart", out, text);
  const int code = wait_exit(node, rc == 0 ? 120 : 0);
  const std::string log = slurp(dir.path / "node.log");
  INFO(text << "\n--- node:\n" << log);
  REQUIRE(rc == 0);
  REQUIRE(code == 0);
  for (const char* a : {"loader", "prefetcher", "compute", "collector", "optimizer"})
    CHECK_THAT(log, Catch::Contains(std::string(a) + " restarted on request"));
  require_identical(ref, out);
}

TEST_CASE("monitor: random injected faults, weights bit-identical", "[monitor]") {
  require_venv();
  TempDir dir("faults");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 20000);
  const fs::path ref = reference_run(dir.path, shard);
  const fs::path out = dir.path / "out";
  const unsigned seed = std::random_device{}();
  const Child node =
      start_node(tiny_args(out, shard, kSteps, 0.004) + " --test.allow_fault_injection --restart.max_restarts=100",
                 dir.path / "node.log");
  std::string text;
  const int rc = run_client("faults", out, text, "--count 6 --seed " + std::to_string(seed));
  const int code = wait_exit(node, rc == 0 ? 120 : 0);
  INFO("seed " << seed << "\n" << text << "\n--- node:\n" << slurp(dir.path / "node.log"));
  REQUIRE(rc == 0);
  REQUIRE(code == 0);
  require_identical(ref, out);
}

TEST_CASE("monitor: a restart waits out its backoff, past its budget an actor stops the run with a final checkpoint",
          "[monitor]") {
  require_venv();
  TempDir dir("budget");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 20000);
  const fs::path out = dir.path / "out";
  const Child node =
      start_node(tiny_args(out, shard, 100000, 0.004) +
                     " --test.allow_fault_injection --restart.per_actor=compute:1 --restart.backoff_s=0.5",
                 dir.path / "node.log");
  std::string text;
  const int rc = run_client("budget", out, text, "--actor compute --backoff 0.5");
  const int code = wait_exit(node, rc == 0 ? 120 : 0);
  const std::string log = slurp(dir.path / "node.log");
  INFO(text << "\n--- node:\n" << log);
  CHECK(rc == 0);
  CHECK(code == 1);
  CHECK_THAT(log, Catch::Contains("compute failed 2 times within 600 s (restart.max_restarts=1); last failure: "));
  CHECK_THAT(log, Catch::Contains("injected fault"));
  CHECK_THAT(log, Catch::Contains("checkpoint step"));  // the final checkpoint
  CHECK(fs::exists(out / "latest"));
}

TEST_CASE("monitor: the watchdog warns, dumps and restarts a stuck actor, weights bit-identical", "[monitor]") {
  require_venv();
  TempDir dir("watchdog");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 20000);
  const fs::path ref = reference_run(dir.path, shard);
  const fs::path out = dir.path / "out";
  // The checkpoint of step 10 stalls 4 s writing stage 1: the optimizer (which may copy no stage aside:
  // save_snapshot_mib 0) waits in its handler before updating stage 1 again, and no step finishes.
  const Child node = start_node(tiny_args(out, shard, kSteps, 0.0) +
                                    " --train.save_steps=10 --train.save_snapshot_mib=0 --monitor.watchdog_warn_s=0.5 "
                                    "--monitor.watchdog_dump_s=1 --monitor.watchdog_restart_s=1.5",
                                dir.path / "node.log", "MEGATRAIN_TEST_CKPT_STALL=10:1:4");
  std::string text;
  const int rc = run_client("watchdog", out, text);
  const int code = wait_exit(node, rc == 0 ? 120 : 0);
  const std::string log = slurp(dir.path / "node.log");
  INFO(text << "\n--- node:\n" << log);
  REQUIRE(rc == 0);
  REQUIRE(code == 0);
  CHECK_THAT(log, Catch::Contains("megatrain: watchdog: no step or compute op finished for"));
  require_identical(ref, out);
}

TEST_CASE("monitor: a port in use or a missing token file is an error naming the key, before training", "[monitor]") {
  TempDir dir("errors");
  const fs::path shard = mt::test::make_shard(dir.path / "data", 20000);
  // A port held by someone else.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const auto busy =
      mt::test::run_node(tiny_args(dir.path / "out", shard, 5, 0.0) + " --monitor.port=" + std::to_string(port));
  ::close(fd);
  INFO(busy.out);
  CHECK(busy.code == 1);
  CHECK_THAT(busy.out,
             Catch::Contains("cannot listen on 127.0.0.1:" + std::to_string(port) + " (monitor.bind / monitor.port)"));
  CHECK_THAT(busy.out, !Catch::Contains("step     1"));
  const auto token = mt::test::run_node(tiny_args(dir.path / "out", shard, 5, 0.0) +
                                        " --monitor.token_file=" + (dir.path / "none").string());
  INFO(token.out);
  CHECK(token.code == 1);
  CHECK_THAT(token.out,
             Catch::Contains("monitor.token_file: '" + (dir.path / "none").string() + "' is not a readable file"));
}
