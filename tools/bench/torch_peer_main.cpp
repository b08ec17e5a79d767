// The PyTorch peer sweep alone (torch_peer.hpp): every available interpreter and configuration of the
// GPT-2-124M train step at the train-step benchmark's shapes, and the strongest one. bench_train_step
// compares our step against that best; this binary shows the whole table.
//
// usage: bench_torch_peer [threads=2] [batch=4] [seqs=64,256] [reps=2] [--no-debian] [--no-venv] [--full]
//                         [--no-compile] [--no-autotune]
//   --full: no cut-off, every configuration measured to the end (Debian's fp32 takes minutes at 4 x 256)
//   --no-compile / --no-autotune: leave out torch.compile altogether / its max-autotune run
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "tools/bench/bench_report.hpp"
#include "tools/bench/gemm_ceiling.hpp"
#include "tools/bench/torch_peer.hpp"

static int run(int argc, char** argv) {
  mt::bench::TorchPeerOptions opt;
  std::int64_t B = 4;
  std::vector<std::int64_t> seqs = {64, 256};
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-debian") == 0)
      opt.include_debian = false;
    else if (std::strcmp(argv[i], "--no-venv") == 0)
      opt.include_venv = false;
    else if (std::strcmp(argv[i], "--full") == 0)
      opt.cutoff = 0;
    else if (std::strcmp(argv[i], "--no-compile") == 0)
      opt.compile = false;
    else if (std::strcmp(argv[i], "--no-autotune") == 0)
      opt.autotune = false;
    else
      pos.emplace_back(argv[i]);
  }
  if (pos.size() > 0) opt.threads = std::atoi(pos[0].c_str());
  if (pos.size() > 1) B = std::atoll(pos[1].c_str());
  if (pos.size() > 2) {
    seqs.clear();
    std::stringstream ss(pos[2]);
    for (std::string t; std::getline(ss, t, ',');) seqs.push_back(std::atoll(t.c_str()));
  }
  if (pos.size() > 3) opt.reps = std::atoi(pos[3].c_str());
  if (opt.threads < 1 || B < 1 || opt.reps < 1 || seqs.empty()) {
    std::fprintf(stderr,
                 "usage: bench_torch_peer [threads=2] [batch=4] [seqs=64,256] [reps=2] [--no-debian] [--no-venv] "
                 "[--full] [--no-compile] [--no-autotune]\n");
    return 2;
  }

  mt::bench::Report report("torch-peer");
  std::printf("torch-peer: PyTorch's GPT-2 124M train step (train_step_torch.py), batch %lld, 1 and %d threads\n",
              static_cast<long long>(B), opt.threads);
  std::printf("  CPU: %s\n  ISA: %s\n", mt::bench::cpu_model().c_str(), mt::bench::cpu_isa_flags().c_str());
  for (const std::int64_t T : seqs) {
    const mt::bench::TorchPeerSweep s = mt::bench::torch_peer_sweep(B, T, opt);
    std::printf("\n%s", mt::bench::torch_peer_table(s).c_str());
    const std::string tag = "_t" + std::to_string(T);
    const mt::bench::TorchPeerRun* best = s.best_run();
    // Each configuration against the best (ratio = how many times slower than the strongest peer).
    for (const mt::bench::TorchPeerRun& r : s.runs)
      if (r.ok) report.add({"torch_step_s_" + r.config.name() + tag, r.seconds, "s", best->seconds});
    mt::bench::add_compile_figures(report, s, tag);
    if (best) report.add({"torch_step_s_best" + tag, best->seconds, "s", 0});
  }
  report.print();
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_torch_peer: %s\n", e.what());
    return 1;
  }
}
