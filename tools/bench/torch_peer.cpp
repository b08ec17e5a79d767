#include "tools/bench/torch_peer.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#ifndef MEGATRAIN_SOURCE_DIR
#error "torch_peer.cpp needs MEGATRAIN_SOURCE_DIR and MEGATRAIN_PYTHON (tools/bench/CMakeLists.txt)"
#endif

namespace mt::bench {
namespace {

std::string source_dir() {
  const char* src = std::getenv("MEGATRAIN_SOURCE_DIR");  // override for out-of-tree builds
  return src ? src : MEGATRAIN_SOURCE_DIR;
}

std::string script() { return source_dir() + "/tools/bench/train_step_torch.py"; }

std::string quote(const std::string& s) {  // for /bin/sh: the paths are ours, but may hold spaces
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Child {
  int status = -1;  // the shell's exit status: 124 when `timeout` stopped it
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

// Runs `args` under `timeout` (coreutils) so a hung child cannot stall the benchmark.
Child run_child(const std::string& args, double timeout_s) {
  const std::string cmd = "timeout -k 5 " + std::to_string(static_cast<long>(timeout_s)) + " " + args + " 2>&1";
  Child c;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    c.out = "popen failed";
    return c;
  }
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) c.out.append(buf, n);
  const int st = pclose(p);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.status = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return c;
}

std::string last_lines(const std::string& out, int n) {  // the end of a failed child's output, one line
  std::vector<std::string> lines;
  std::stringstream ss(out);
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) lines.push_back(l);
  std::string r;
  for (std::size_t i = lines.size() > static_cast<std::size_t>(n) ? lines.size() - n : 0; i < lines.size(); ++i)
    r += (r.empty() ? "" : " | ") + lines[i];
  return r.empty() ? "no output" : r;
}

// Every configuration, the likeliest fastest first (most threads, bf16, SDPA) so that the cut-off for
// the rest (TorchPeerOptions::cutoff) is tight from the start.
std::vector<TorchPeerConfig> configs(const TorchInterpreter& in, const std::vector<int>& threads,
                                     std::vector<std::string>& notes) {
  std::vector<TorchPeerConfig> cs;
  for (auto t = threads.rbegin(); t != threads.rend(); ++t)
    for (bool bf16 : {true, false}) {
      if (bf16 && !in.autocast_bf16) continue;
      // Debian's torch 1.13 runs fp32 GEMMs through a slow BLAS path on these CPUs (bf16 goes through
      // oneDNN): at 4 x 64 its fp32 step took 24.7 s on 1 thread and 15.0 s on 2, its bf16 4.3 s and
      // 3.1 s. So its fp32 runs only at the most threads, under the cut-off (where it cannot be the
      // best it costs one cut step), and not on 1 thread, which is slower still.
      if (in.slow && !bf16 && in.autocast_bf16 && *t != threads.back()) {
        notes.push_back(in.label + "_" + std::to_string(*t) + "thr_fp32_masked: not run (torch " + in.torch_version +
                        "'s fp32 is slower than its bf16 and on 1 thread slower than on " +
                        std::to_string(threads.back()) + ")");
        continue;
      }
      if (in.sdpa) cs.push_back({in, *t, bf16, true});
      cs.push_back({in, *t, bf16, false});
    }
  return cs;
}

}  // namespace

std::string TorchPeerConfig::name() const {
  return interp.label + "_" + std::to_string(threads) + "thr_" + (bf16 ? "bf16" : "fp32") +
         (sdpa ? "_sdpa" : "_masked");
}

std::vector<TorchInterpreter> torch_interpreters(std::vector<std::string>& notes, const TorchPeerOptions& opt) {
  std::vector<TorchInterpreter> found;
  auto probe = [&](const std::string& label, const std::string& python, bool slow) {
    const Child c = run_child(quote(python) + " " + quote(script()) + " --info", 120);
    char ver[128] = {0};
    int sdpa = 0, bf16 = 0;
    const auto at = c.out.find("torch_version ");
    if (c.status != 0 || at == std::string::npos ||
        std::sscanf(c.out.c_str() + at, "torch_version %127s sdpa %d autocast_bf16 %d", ver, &sdpa, &bf16) != 3) {
      notes.push_back(label + " (" + python + "): no usable torch: " + last_lines(c.out, 2));
      return;
    }
    found.push_back({label, python, ver, sdpa != 0, bf16 != 0, slow});
  };
  if (opt.include_debian) probe("debian", MEGATRAIN_PYTHON, true);
  if (opt.include_venv) {
    const std::string venv = source_dir() + "/.venv-bench/bin/python3";
    if (access(venv.c_str(), X_OK) == 0)
      probe("pypi", venv, false);
    else
      notes.push_back("pypi: no " + venv + " (tools/bench/setup-torch-peer makes it): only Debian's torch compared");
  }
  return found;
}

TorchPeerRun run_torch_peer(const TorchPeerConfig& config, std::int64_t batch, std::int64_t seq, int reps, int warmup,
                            double stop_above_s, double stop_warmup_above_s, double timeout_s) {
  TorchPeerRun r;
  r.config = config;
  r.reps = reps;
  r.warmup = warmup;
  std::string cmd = quote(config.interp.python) + " " + quote(script()) + " " + std::to_string(config.threads) + " " +
                    std::to_string(batch) + " " + std::to_string(seq) + " " + std::to_string(reps) + " --warmup " +
                    std::to_string(warmup);
  if (config.bf16) cmd += " --bf16";
  if (config.sdpa) cmd += " --sdpa";
  if (stop_above_s > 0)
    cmd += " --stop-above " + std::to_string(stop_above_s) +
           (stop_warmup_above_s > 0 ? " " + std::to_string(stop_warmup_above_s) : std::string());
  const Child c = run_child(cmd, timeout_s);
  r.wall_seconds = c.seconds;
  const auto at = c.out.find("torch_step_seconds ");
  if (c.status == 0 && at != std::string::npos &&
      std::sscanf(c.out.c_str() + at, "torch_step_seconds %lf cpu %lf", &r.seconds, &r.cpu_seconds) == 2 &&
      r.seconds > 0) {
    r.ok = true;
    const auto w = c.out.find("torch_warmup_seconds ");
    if (w != std::string::npos) std::sscanf(c.out.c_str() + w, "torch_warmup_seconds %lf", &r.warmup_seconds);
  } else if (c.status == 3 && c.out.find("torch_step_stopped above") != std::string::npos) {
    r.stopped = true;
    r.stopped_above = stop_above_s;
    const bool in_warmup = c.out.find("at step 0") != std::string::npos && warmup > 0;
    char why[128];
    std::snprintf(why, sizeof why, "stopped: its %s step ran past %.1f s, cannot be the best",
                  in_warmup ? "warm-up" : "timed",
                  in_warmup && stop_warmup_above_s > 0 ? stop_warmup_above_s : stop_above_s);
    r.error = why;
  } else if (c.status == 124 || c.status == 137) {
    r.error = "timed out after " + std::to_string(static_cast<long>(timeout_s)) + " s";
  } else {
    r.error = "exit " + std::to_string(c.status) + ": " + last_lines(c.out, 2);
  }
  return r;
}

TorchPeerSweep torch_peer_sweep(std::int64_t batch, std::int64_t seq, const TorchPeerOptions& opt) {
  TorchPeerSweep s;
  s.batch = batch;
  s.seq = seq;
  s.interpreters = torch_interpreters(s.notes, opt);
  // The fast interpreter first: its best sets a tight cut-off for the slow one's long steps.
  std::stable_sort(s.interpreters.begin(), s.interpreters.end(),
                   [](const TorchInterpreter& a, const TorchInterpreter& b) { return !a.slow && b.slow; });
  std::vector<int> threads{1};
  if (opt.threads > 1) threads.push_back(opt.threads);
  for (const TorchInterpreter& in : s.interpreters) {
    for (const TorchPeerConfig& c : configs(in, threads, s.notes)) {
      const TorchPeerRun* best = s.best_run();
      const bool cut = best && opt.cutoff > 0;
      const double stop_above = cut ? opt.cutoff * best->seconds + opt.cutoff_slack_s : 0;
      // Warm-up steps against the best's warm-up step: they can be several times a steady step.
      const double stop_warmup =
          cut && best->warmup_seconds > 0 ? opt.cutoff * best->warmup_seconds + opt.cutoff_slack_s : 0;
      // One timed step where steps are long (Debian's): best-of-2 would double minutes of runtime.
      TorchPeerRun r = run_torch_peer(c, batch, seq, in.slow ? 1 : opt.reps, 1, stop_above, stop_warmup, opt.timeout_s);
      if (opt.progress) {
        if (r.ok)
          std::printf("  torch-peer t%lld %-24s torch %-14s %7.2f s/step (cpu %.2f s, %d+%d steps, %.0f s in all)\n",
                      static_cast<long long>(seq), c.name().c_str(), in.torch_version.c_str(), r.seconds, r.cpu_seconds,
                      r.warmup, r.reps, r.wall_seconds);
        else
          std::printf("  torch-peer t%lld %-24s torch %-14s %s (%.0f s in all)\n", static_cast<long long>(seq),
                      c.name().c_str(), in.torch_version.c_str(), r.error.c_str(), r.wall_seconds);
        std::fflush(stdout);
      }
      s.runs.push_back(std::move(r));
      const auto i = s.runs.size() - 1;
      if (s.runs[i].ok && (s.best < 0 || s.runs[i].seconds < s.runs[static_cast<std::size_t>(s.best)].seconds))
        s.best = static_cast<int>(i);
    }
  }
  return s;
}

std::string torch_peer_table(const TorchPeerSweep& s) {
  std::string t;
  char line[512];
  std::snprintf(line, sizeof line, "  PyTorch peer, GPT-2 124M, batch %lld x seq %lld:\n",
                static_cast<long long>(s.batch), static_cast<long long>(s.seq));
  t += line;
  std::snprintf(line, sizeof line, "    %-28s %-14s %4s %-5s %-7s %10s %10s %10s\n", "config", "torch", "thr", "prec",
                "attn", "s/step", "tokens/s", "cpu s");
  t += line;
  const double tokens = static_cast<double>(s.batch * s.seq);
  for (std::size_t i = 0; i < s.runs.size(); ++i) {
    const TorchPeerRun& r = s.runs[i];
    const TorchPeerConfig& c = r.config;
    if (r.ok)
      std::snprintf(line, sizeof line, "    %-28s %-14s %4d %-5s %-7s %10.2f %10.1f %10.2f%s\n", c.name().c_str(),
                    c.interp.torch_version.c_str(), c.threads, c.bf16 ? "bf16" : "fp32", c.sdpa ? "sdpa" : "masked",
                    r.seconds, tokens / r.seconds, r.cpu_seconds, static_cast<int>(i) == s.best ? "  <- best" : "");
    else if (r.stopped)  // a lower bound: it was stopped mid-step
      std::snprintf(line, sizeof line, "    %-28s %-14s %4d %-5s %-7s %9s%-.2f   (stopped: cannot be the best)\n",
                    c.name().c_str(), c.interp.torch_version.c_str(), c.threads, c.bf16 ? "bf16" : "fp32",
                    c.sdpa ? "sdpa" : "masked", "> ", r.stopped_above);
    else
      std::snprintf(line, sizeof line, "    %-28s %-14s %4d %-5s %-7s failed: %s\n", c.name().c_str(),
                    c.interp.torch_version.c_str(), c.threads, c.bf16 ? "bf16" : "fp32", c.sdpa ? "sdpa" : "masked",
                    r.error.c_str());
    t += line;
  }
  for (const std::string& n : s.notes) t += "    note: " + n + "\n";
  if (s.best < 0) t += "    no PyTorch configuration ran\n";
  return t;
}

}  // namespace mt::bench
