// megatrain-top and megatrain-ctl against a real node: `megatrain train` on a tiny model with the
// monitor on (any free port), attached by output_dir and by HOST:PORT. `megatrain-top --once` prints
// every actor, and flags the checkpointer STUCK while its write of step 100 is held for 4 s
// (MEGATRAIN_TEST_CKPT_STALL of the test node megatrain-with-faults); `megatrain-ctl checkpoint --wait`
// returns once the checkpoint is durable, and megatrain-ckpt (an independent reader) verifies every
// checksum of it; pause and resume take effect; refused requests exit non-zero with the node's reason;
// stop --wait returns when the node has stopped (exit 0, monitor.json removed).
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/actors/node_binary_fixture.hpp"

namespace fs = std::filesystem;

namespace {

const char* const kActors[] = {"loader", "prefetcher", "compute", "collector", "optimizer", "checkpointer", "node"};

struct Run {
  int code = -1;
  std::string out;  // stdout and stderr together
};

Run run(const std::string& cmd) {
  Run r;
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string top() { return MEGATRAIN_TOP; }
std::string ctl() { return MEGATRAIN_CTL; }

// A node training a tiny model far longer than the test lasts; stopped through the monitor at the end
// (or killed if the test fails before that).
struct Node {
  fs::path dir, out;
  pid_t pid = -1;

  // env: "VAR=value" set for the node only (empty: none); save_steps: train.save_steps (0: none).
  explicit Node(const std::string& name, const std::string& env = "", int save_steps = 0) {
    dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const fs::path shard = mt::test::make_shard(dir, 8192);
    out = dir / "out";
    const std::vector<std::string> args = {MEGATRAIN_BINARY,
                                           "train",
                                           "--model.arch=llama",
                                           "--model.hidden_size=32",
                                           "--model.layers=2",
                                           "--model.heads=4",
                                           "--model.kv_heads=2",
                                           "--model.intermediate_size=64",
                                           "--model.vocab_size=64",
                                           "--model.max_position_embeddings=64",
                                           "--data.seq_length=16",
                                           "--data.train_files=" + shard.string(),
                                           "--train.per_device_train_batch_size=2",
                                           "--train.gradient_accumulation_steps=2",
                                           "--train.warmup_steps=0",
                                           "--train.max_steps=1000000",
                                           "--train.save_steps=" + std::to_string(save_steps),
                                           "--train.save_total_limit=0",  // keep all: checked after later ones
                                           "--train.output_dir=" + out.string(),
                                           "--device.max_vram_gb=0.015625",
                                           "--threads.total=2",
                                           "--monitor.port=0"};
    const std::string log = (dir / "node.log").string();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::FILE* f = std::freopen(log.c_str(), "w", stdout);
      if (f == nullptr || ::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) ::_exit(127);
      if (!env.empty()) ::putenv(const_cast<char*>(env.c_str()));
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(out / "monitor.json")) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        FAIL("the node exited before writing monitor.json:\n" << mt::test::slurp(log));
      }
      if (std::chrono::steady_clock::now() > deadline) FAIL("no monitor.json within 60 s:\n" << mt::test::slurp(log));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  nlohmann::json info() const { return nlohmann::json::parse(mt::test::slurp(out / "monitor.json")); }

  // The node's exit code, waiting up to `seconds` (-1: still running or killed by a signal).
  int wait_exit(int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (pid > 0 && std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

  ~Node() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    fs::remove_all(dir);
  }
};

// megatrain-top's live view in a pseudo-terminal: waits until the screen shows `first`, types `keys`,
// waits for `after`, then types q. Returns the exit code and everything the screen received.
Run top_live(const std::string& target, const std::string& first, const std::string& keys, const std::string& after) {
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl(MEGATRAIN_TOP, MEGATRAIN_TOP, target.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  Run r;
  auto read_until = [&](const std::string& text, int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (r.out.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{master, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) break;
      r.out.append(buf, static_cast<std::size_t>(n));
    }
    return r.out.find(text) != std::string::npos;
  };
  const bool shown = read_until(first, 30);
  CHECK(shown);
  if (shown && !keys.empty()) {
    CHECK(::write(master, keys.data(), keys.size()) == static_cast<ssize_t>(keys.size()));
    CHECK(read_until(after, 30));
  }
  CHECK(::write(master, "q", 1) == 1);
  // Read whatever it writes until it exits (the pty then reports EOF / EIO), so it never blocks writing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char buf[4096];
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) break;
      r.out.append(buf, static_cast<std::size_t>(n));
    } else if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      break;
    }
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  ::close(master);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

long long status_step(const std::string& target) {
  const Run s = run(ctl() + " " + target + " status");
  REQUIRE(s.code == 0);
  return nlohmann::json::parse(s.out).at("step").get<long long>();
}

}  // namespace

TEST_CASE("megatrain-top and megatrain-ctl against a running node", "[tools][monitor]") {
  // Checkpoints every 100 steps; the write of step 100's is held 4 s inside the checkpointer's handler.
  Node node("mt_monitor_tools", "MEGATRAIN_TEST_CKPT_STALL=100:1:4", 100);
  const auto info = node.info();
  const std::string dir = node.out.string();
  const std::string hostport = info.at("host").get<std::string>() + ":" + std::to_string(info.at("port").get<int>());

  // A stuck actor: wait until the checkpointer has been in one handler for a second, then look.
  {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool held = false;
    std::string last;
    while (!held && std::chrono::steady_clock::now() < deadline) {
      const Run s = run(ctl() + " " + dir + " status");
      REQUIRE(s.code == 0);
      last = s.out;
      const auto status = nlohmann::json::parse(s.out);
      for (const auto& a : status.at("actors"))
        held |= a.at("name") == "checkpointer" && a.at("in_handler_s").get<double>() >= 1.0;
      if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    INFO("the last /status: " << last << "\nthe node's log:\n"
                              << mt::test::slurp(node.dir / "node.log").substr(0, 3000));
    REQUIRE(held);
    const Run r = run(top() + " " + dir + " --once --stuck-after=1");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(std::regex_search(r.out, std::regex("\ncheckpointer +running .* STUCK\n")));
    CHECK(std::regex_search(r.out, std::regex("\nSTUCK: checkpointer in [A-Za-z]+ for [1-9][0-9]* s\n")));
    // The default threshold (30 s) flags nothing.
    const Run calm = run(top() + " " + dir + " --once");
    CHECK_THAT(calm.out, !Catch::Contains("STUCK"));
  }

  // --once: every actor a line (name first, then its state), step progress; by output_dir and by HOST:PORT.
  for (const std::string& target : {dir, hostport}) {
    INFO("megatrain-top " << target << " --once");
    const Run r = run(top() + " " + target + " --once");
    INFO(r.out);
    REQUIRE(r.code == 0);
    for (const char* actor : kActors)
      CHECK(std::regex_search(r.out, std::regex(std::string("\n") + actor + " +(running|restarting|stopped) ")));
    // The model its [model] keys define, named once (not "[model] keys (llama)").
    CHECK_THAT(r.out, Catch::Contains("\nrun: llama (hidden 32, from [model] keys), 2 layers, "));
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, std::regex("\nstep ([0-9]+) / 1000000")));
    CHECK(std::stoll(m[1]) >= 3);
    CHECK_THAT(r.out, Catch::Contains("running"));
  }

  // checkpoint --wait: the id, then progress, returning once durable; the checkpoint verifies.
  {
    const Run r = run(ctl() + " " + dir + " checkpoint --wait --timeout=120");
    INFO(r.out);
    REQUIRE(r.code == 0);
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, std::regex("^(c-[0-9]+)\n")));
    const std::string id = m[1];
    REQUIRE(std::regex_search(r.out, m, std::regex(id + " durable at step ([0-9]+): ([^ \n]+)")));
    const fs::path ckpt = m[2].str();
    CHECK(fs::is_directory(ckpt));
    const Run v = run(std::string(MEGATRAIN_CKPT_TOOL) + " verify " + ckpt.string());
    INFO(v.out);
    CHECK(v.code == 0);
    const auto audit = mt::test::slurp(node.out / "audit.jsonl");
    CHECK_THAT(audit, Catch::Contains("checkpoint"));
  }

  // pause --wait: the step count stands still; resume --wait: it rises again.
  {
    const Run p = run(ctl() + " " + dir + " pause --wait --timeout=60");
    INFO(p.out);
    REQUIRE(p.code == 0);
    const Run s = run(ctl() + " " + dir + " status");
    CHECK(nlohmann::json::parse(s.out).at("state") == "paused");
    const long long paused_at = status_step(dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    CHECK(status_step(dir) == paused_at);
    const Run r = run(ctl() + " " + dir + " resume --wait --timeout=60");
    INFO(r.out);
    REQUIRE(r.code == 0);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (status_step(dir) == paused_at && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(status_step(dir) > paused_at);
  }

  // restart ACTOR --wait: the actor is restarted through the node's own restart path, counted in /status.
  {
    const Run r = run(ctl() + " " + dir + " restart compute --wait --timeout=60");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(std::regex_search(r.out, std::regex("c-[0-9]+ took_effect")));
    // Named: a range-for over parse(...).at(...) would iterate a temporary already destroyed (ASan).
    const auto status = nlohmann::json::parse(run(ctl() + " " + dir + " status").out);
    for (const auto& a : status.at("actors"))
      if (a.at("name") == "compute") CHECK(a.at("restarts").get<int>() >= 1);
  }

  // The live view in a terminal: the actor table, then key c sends a checkpoint request (its id shown), q quits.
  {
    const Run r = top_live(dir, "checkpointer", "c", "checkpoint: c-");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("\x1b[?1049h"));  // the alternate screen, and back
    CHECK_THAT(r.out, Catch::Contains("\x1b[?1049l"));
    for (const char* actor : kActors) CHECK_THAT(r.out, Catch::Contains(actor));
    CHECK(std::regex_search(r.out, std::regex("checkpoint: c-[0-9]+ accepted")));
  }

  // Refusals: the node's reason, exit code 1, nothing sent without a token.
  {
    const fs::path wrong = node.dir / "wrong.token";
    std::ofstream(wrong) << "0123456789abcdef\n";
    const Run w = run(ctl() + " " + dir + " checkpoint --token-file=" + wrong.string());
    CHECK(w.code == 1);
    CHECK_THAT(w.out, Catch::Contains("HTTP 403"));
    const Run u = run(ctl() + " " + dir + " restart no_such_actor");
    CHECK(u.code == 1);
    CHECK_THAT(u.out, Catch::Contains("HTTP 400"));
    const Run n = run(ctl() + " " + hostport + " pause");
    CHECK(n.code == 1);
    CHECK_THAT(n.out, Catch::Contains("--token-file"));
    CHECK(nlohmann::json::parse(run(ctl() + " " + dir + " status").out).at("state") == "running");
  }

  // stop --wait: returns when the node has stopped; it exits 0 and removes monitor.json.
  {
    const Run r = run(ctl() + " " + dir + " stop --wait --timeout=120");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(node.wait_exit(60) == 0);
    CHECK_FALSE(fs::exists(node.out / "monitor.json"));
  }
}

TEST_CASE("megatrain-top and megatrain-ctl: bad targets and usage", "[tools][monitor]") {
  const fs::path dir = fs::temp_directory_path() / ("mt_monitor_tools_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  SECTION("an output_dir without monitor.json") {
    const Run r = run(top() + " " + dir.string() + " --once");
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Catch::Contains("monitor.json"));
  }
  SECTION("a monitor.json left behind by a node that is gone") {
    // A pid that cannot be running: a child that has exited and been reaped.
    const pid_t gone = ::fork();
    if (gone == 0) ::_exit(0);
    ::waitpid(gone, nullptr, 0);
    std::ofstream(dir / "monitor.json") << nlohmann::json{
        {"pid", gone}, {"url", "http://127.0.0.1:9"}, {"host", "127.0.0.1"}, {"port", 9}, {"token_file", ""}};
    const Run r = run(ctl() + " " + dir.string() + " status");
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Catch::Contains("not running"));
  }
  SECTION("nothing listening") {
    const Run r = run(ctl() + " 127.0.0.1:9 status");  // port 9 (discard): nothing listens on loopback here
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Catch::Contains("cannot connect"));
  }
  SECTION("usage") {
    CHECK(run(ctl() + " " + dir.string()).code == 2);
    CHECK(run(ctl() + " " + dir.string() + " frobnicate").code == 2);
    CHECK(run(ctl() + " " + dir.string() + " restart").code == 2);
    CHECK(run(top()).code == 2);
  }
  fs::remove_all(dir);
}
