// tools/bench/torch_peer.hpp: what the PyTorch peer's result lines become (a step, a compile time, a
// stop, a failure to compile or run), the table and figures made of them, the best taken over the runs
// that ran. No torch needed: the lines are the script's (train_step_torch.py documents them).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include "tools/bench/torch_peer.hpp"

using mt::bench::TorchCompile;
using mt::bench::TorchPeerConfig;
using mt::bench::TorchPeerLimits;
using mt::bench::TorchPeerRun;

namespace {

TorchPeerConfig config(bool bf16, bool sdpa, TorchCompile compile) {
  mt::bench::TorchInterpreter in;
  in.label = "pypi";
  in.python = "/nonexistent/python3";
  in.torch_version = "2.15.0";
  in.sdpa = in.autocast_bf16 = in.compile = true;
  return {in, 2, bf16, sdpa, compile};
}

TorchPeerLimits limits(double stop_above = 4.0, double stop_warmup = 300.0) {
  TorchPeerLimits l;
  l.reps = 2;
  l.warmup = 1;
  l.stop_above_s = stop_above;
  l.stop_warmup_above_s = stop_warmup;
  l.timeout_s = 720;
  return l;
}

const std::string kHead = "torch_peer torch 2.15.0 threads 2 batch 4 seq 64 precision bf16 attention sdpa\n";

// Runs fn with stdout sent to a temporary file and returns what it printed (Report::print writes there).
template <class Fn>
std::string captured_stdout(Fn fn) {
  std::fflush(stdout);
  FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int saved = dup(fileno(stdout));
  dup2(fileno(tmp), fileno(stdout));
  fn();
  std::fflush(stdout);
  dup2(saved, fileno(stdout));
  close(saved);
  std::string out;
  std::rewind(tmp);
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, tmp)) > 0;) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

}  // namespace

TEST_CASE("an eager and a compiled result line", "[bench][torch_peer]") {
  const TorchPeerRun eager =
      mt::bench::parse_torch_peer(config(true, true, TorchCompile::eager), 0,
                                  kHead + "torch_warmup_seconds 3.5\ntorch_step_seconds 2.25 cpu 4.4\n", limits());
  CHECK(eager.ok);
  CHECK(eager.seconds == 2.25);
  CHECK(eager.cpu_seconds == 4.4);
  CHECK(eager.warmup_seconds == 3.5);
  CHECK(eager.compile_seconds == 0);
  CHECK(eager.config.name() == "pypi_2thr_bf16_sdpa");

  const TorchPeerRun compiled = mt::bench::parse_torch_peer(
      config(false, false, TorchCompile::default_mode), 0,
      kHead +
          "torch_first_step_seconds 97.5\ntorch_warmup_seconds 97.5\ntorch_compile_seconds 95.25\n"
          "torch_step_seconds 2.25 cpu 4.4\n",
      limits());
  CHECK(compiled.ok);
  CHECK(compiled.seconds == 2.25);
  CHECK(compiled.compile_seconds == 95.25);  // apart from the step
  CHECK(compiled.config.name() == "pypi_2thr_fp32_masked_compile");
  CHECK(config(true, false, TorchCompile::max_autotune).name() == "pypi_2thr_bf16_masked_autotune");
  CHECK(config(true, false, TorchCompile::max_autotune).compile_arg() == "max-autotune");

  // A compiled run whose output lacks the compile time is not a result: its compile would go unreported.
  const TorchPeerRun no_compile_line = mt::bench::parse_torch_peer(
      config(true, true, TorchCompile::default_mode), 0, kHead + "torch_step_seconds 2.25 cpu 4.4\n", limits());
  CHECK_FALSE(no_compile_line.ok);
  CHECK(no_compile_line.error.rfind("exit 0: ", 0) == 0);
}

TEST_CASE("a configuration that fails to compile or to run is reported with its first line", "[bench][torch_peer]") {
  const TorchPeerRun c =
      mt::bench::parse_torch_peer(config(true, false, TorchCompile::default_mode), 4,
                                  kHead + "torch_compile_failed CppCompileError: C++ compile error\n", limits());
  CHECK_FALSE(c.ok);
  CHECK(c.compile_failed);
  CHECK_FALSE(c.stopped);
  CHECK(c.error == "failed to compile: CppCompileError: C++ compile error");

  const TorchPeerRun s = mt::bench::parse_torch_peer(
      config(false, true, TorchCompile::eager), 4,
      kHead + "torch_step_failed RuntimeError: could not allocate 68719476736 bytes\n", limits());
  CHECK_FALSE(s.ok);
  CHECK_FALSE(s.compile_failed);
  CHECK(s.error == "failed to run: RuntimeError: could not allocate 68719476736 bytes");

  const TorchPeerRun t = mt::bench::parse_torch_peer(config(true, true, TorchCompile::max_autotune), 124,
                                                     kHead + "torch_first_step_seconds 97.5\n", limits());
  CHECK_FALSE(t.ok);
  CHECK(t.error == "timed out after 720 s");

  const TorchPeerRun crash = mt::bench::parse_torch_peer(config(true, true, TorchCompile::eager), 139,
                                                         kHead + "line one\nSegmentation fault\n", limits());
  CHECK_FALSE(crash.ok);
  CHECK(crash.error == "exit 139: line one | Segmentation fault");
}

TEST_CASE("a compile past its budget and a compiled step past the cut-off are stops", "[bench][torch_peer]") {
  const TorchPeerRun in_compile =
      mt::bench::parse_torch_peer(config(true, true, TorchCompile::max_autotune), 3,
                                  kHead + "torch_step_stopped above 420.0 at step 0\n", limits(4.0, 420.0));
  CHECK(in_compile.stopped);
  CHECK_FALSE(in_compile.ok);
  CHECK(in_compile.stopped_above == 420.0);
  CHECK(in_compile.error == "stopped: compile + warm-up step 1 ran past its budget of 420 s");

  const TorchPeerRun timed = mt::bench::parse_torch_peer(
      config(true, true, TorchCompile::default_mode), 3,
      kHead + "torch_first_step_seconds 95.5\ntorch_step_stopped above 4.0 at step 1\n", limits(4.0, 300.0));
  CHECK(timed.stopped);
  CHECK(timed.stopped_above == 4.0);
  CHECK(timed.error == "stopped: its timed step ran past 4.0 s, cannot be the best (compile + first step 95.5 s)");

  // The sweep gives a compiled run two warm-up steps: a stop in the second is still under the budget.
  TorchPeerLimits two = limits(4.0, 300.0);
  two.warmup = 2;
  const TorchPeerRun second = mt::bench::parse_torch_peer(
      config(true, false, TorchCompile::default_mode), 3,
      kHead + "torch_first_step_seconds 95.5\ntorch_step_stopped above 300.0 at step 1\n", two);
  CHECK(second.stopped);
  CHECK(second.stopped_above == 300.0);
  CHECK(second.error == "stopped: compile + warm-up step 2 ran past its budget of 300 s");

  const TorchPeerRun eager =
      mt::bench::parse_torch_peer(config(false, false, TorchCompile::eager), 3,
                                  kHead + "torch_step_stopped above 9.0 at step 0\n", limits(4.0, 9.0));
  CHECK(eager.error == "stopped: its warm-up step ran past 9.0 s, cannot be the best");
}

TEST_CASE("the best is taken over what ran, failures stay in the table and out of the figures", "[bench][torch_peer]") {
  mt::bench::TorchPeerSweep s;
  s.batch = 4;
  s.seq = 64;
  const TorchPeerLimits l = limits();
  s.runs.push_back(mt::bench::parse_torch_peer(config(true, true, TorchCompile::eager), 0,
                                               kHead + "torch_warmup_seconds 3\ntorch_step_seconds 2.5 cpu 5\n", l));
  // The fastest step of all, but it failed: it must not be the best.
  s.runs.push_back(mt::bench::parse_torch_peer(config(true, false, TorchCompile::default_mode), 4,
                                               kHead + "torch_step_seconds 0.1 cpu 0.2\n"
                                                       "torch_compile_failed CppCompileError: C++ compile error\n",
                                               l));
  s.runs.push_back(mt::bench::parse_torch_peer(config(true, true, TorchCompile::default_mode), 0,
                                               kHead + "torch_warmup_seconds 90\ntorch_compile_seconds 88.5\n"
                                                       "torch_step_seconds 2.0 cpu 4\n",
                                               l));
  s.runs.push_back(mt::bench::parse_torch_peer(config(true, true, TorchCompile::max_autotune), 3,
                                               kHead + "torch_step_stopped above 420 at step 0\n", limits(4, 420)));
  REQUIRE(s.runs[1].compile_failed);
  s.best = mt::bench::fastest_run(s.runs);
  CHECK(s.best == 2);
  CHECK(mt::bench::fastest_run({s.runs[1], s.runs[3]}) == -1);

  const std::string table = mt::bench::torch_peer_table(s);
  CAPTURE(table);
  auto line_of = [&](const std::string& name) {
    const auto at = table.find("    " + name + " ");
    REQUIRE(at != std::string::npos);
    return table.substr(at, table.find('\n', at) - at);
  };
  CHECK(line_of("pypi_2thr_bf16_masked_compile").find("failed to compile: CppCompileError: C++ compile error") !=
        std::string::npos);
  CHECK(line_of("pypi_2thr_bf16_sdpa_compile").find("<- best") != std::string::npos);
  CHECK(line_of("pypi_2thr_bf16_sdpa_compile").find("88.5") != std::string::npos);
  CHECK(line_of("pypi_2thr_bf16_sdpa_autotune").find("compile + warm-up step 1 ran past its budget of 420 s") !=
        std::string::npos);
  CHECK(line_of("pypi_2thr_bf16_sdpa").find("<- best") == std::string::npos);

  mt::bench::Report report("torch-peer");
  mt::bench::add_compile_figures(report, s, "_t64");
  const std::string json = captured_stdout([&] { report.print(); });
  CAPTURE(json);
  // One figure, the compiled run that ran: none for the eager, the failed or the stopped one.
  CHECK(json ==
        "{\"bench\":\"torch-peer\",\"better\":\"lower\",\"ceiling\":null,\"metric\":"
        "\"torch_compile_s_pypi_2thr_bf16_sdpa_compile_t64\",\"ratio\":null,\"target\":null,\"unit\":\"s\","
        "\"value\":88.5}\n");
}

TEST_CASE("the sweep's eager configurations: ordered by the interpreter's probe, the far slower cut",
          "[bench][torch_peer]") {
  mt::bench::TorchInterpreter in = config(true, true, TorchCompile::eager).interp;
  std::vector<std::string> notes;
  auto names = [&](const mt::bench::TorchInterpreter& i) {
    std::string s;
    for (const auto& c : mt::bench::eager_configs(i, {1, 2}, 4.0, notes)) s += (s.empty() ? "" : " ") + c.name();
    return s;
  };
  // No probe: the old order, bf16 and SDPA first.
  CHECK(names(in) ==
        "pypi_2thr_bf16_sdpa pypi_2thr_bf16_masked pypi_2thr_fp32_sdpa pypi_2thr_fp32_masked "
        "pypi_1thr_bf16_sdpa pypi_1thr_bf16_masked pypi_1thr_fp32_sdpa pypi_1thr_fp32_masked");
  // fp32 faster, masked faster, within the cut: both kept, the faster first.
  in.probe_fp32_s = 0.1, in.probe_bf16_s = 0.2, in.probe_masked_s = 0.01, in.probe_sdpa_s = 0.02;
  CHECK(names(in) ==
        "pypi_2thr_fp32_masked pypi_2thr_fp32_sdpa pypi_2thr_bf16_masked pypi_2thr_bf16_sdpa "
        "pypi_1thr_fp32_masked pypi_1thr_fp32_sdpa pypi_1thr_bf16_masked pypi_1thr_bf16_sdpa");
  CHECK(notes.empty());
  // bf16 without native support: 60x fp32, never run, said.
  in.probe_bf16_s = 6.0;
  CHECK(names(in) == "pypi_2thr_fp32_masked pypi_2thr_fp32_sdpa pypi_1thr_fp32_masked pypi_1thr_fp32_sdpa");
  REQUIRE(notes.size() == 1);
  CHECK_THAT(notes[0], Catch::Contains("pypi: bf16 not run (its probe took 60"));
}
