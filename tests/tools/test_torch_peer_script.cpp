// tools/bench/torch_peer.hpp with the real peer script (train_step_torch.py) under every interpreter
// with torch that the benchmark would use, its compile made to fail.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/bench/torch_peer.hpp"

using mt::bench::TorchCompile;
using mt::bench::TorchPeerConfig;
using mt::bench::TorchPeerLimits;
using mt::bench::TorchPeerRun;

// The real script under every interpreter found (Debian's torch; PyPI's in .venv-bench where made), its
// compile made to fail: with no C++ compiler Inductor cannot build its kernels (torch >= 2), and torch
// 1.13 has no torch.compile at all. Either is a "failed to compile" line, never a missing configuration.
TEST_CASE("the peer script's failed compile comes back as such", "[bench][torch_peer]") {
  std::vector<std::string> notes;
  mt::bench::TorchPeerOptions opt;
  const std::vector<mt::bench::TorchInterpreter> found = mt::bench::torch_interpreters(notes, opt);
  if (found.empty()) {
    std::fprintf(stderr, "no interpreter with torch (%s; tools/install-deps --test): skipped\n", MEGATRAIN_PYTHON);
    std::exit(77);  // ctest's SKIP_RETURN_CODE: reported as skipped, never as passed
  }
  REQUIRE(setenv("CXX", "/bin/false", 1) == 0);  // Inductor's compiler (torch._inductor.config.cpp.cxx)
  for (const mt::bench::TorchInterpreter& in : found) {
    TorchPeerConfig c{in, 1, false, false, TorchCompile::default_mode};
    TorchPeerLimits l;
    l.reps = 1;
    l.warmup = 1;
    l.timeout_s = 300;
    const TorchPeerRun r = mt::bench::run_torch_peer(c, 1, 8, l);
    CAPTURE(in.python, in.torch_version, r.error);
    CHECK_FALSE(r.ok);
    CHECK(r.compile_failed);
    CHECK(r.error.rfind("failed to compile: ", 0) == 0);
    if (!in.compile) CHECK(r.error.find("has no torch.compile") != std::string::npos);
  }
  unsetenv("CXX");
}

// Each interpreter found is probed (train_step_torch.py --probe): its fp32 and attention times, and bf16
// and SDPA where its torch has them.
TEST_CASE("the peer script's probe times each precision and attention the interpreter has", "[bench][torch_peer]") {
  std::vector<std::string> notes;
  mt::bench::TorchPeerOptions opt;
  opt.threads = 1;
  const std::vector<mt::bench::TorchInterpreter> found = mt::bench::torch_interpreters(notes, opt);
  if (found.empty()) std::exit(77);
  for (const mt::bench::TorchInterpreter& in : found) {
    CAPTURE(in.python, in.torch_version);
    CHECK(in.probe_fp32_s > 0);
    CHECK(in.probe_masked_s > 0);
    CHECK((in.probe_bf16_s > 0) == in.autocast_bf16);
    CHECK((in.probe_sdpa_s > 0) == in.sdpa);
  }
}
